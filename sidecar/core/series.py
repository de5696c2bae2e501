"""The rolling window of one (cluster, slice) series: :class:`RouteStats`.

A :class:`SeriesWindow` is a ring of ``cfg.subwindows`` sub-windows of
``cfg.subwindow_s`` seconds; sub-window ``k = floor(now / subwindow_s)`` is the
current (partial) one. Each holds a :class:`LogHistogram` per metric (ttft,
tpot, e2e) and ok/error/timeout/cancel counters. The window quantile merges
sub-window ``i`` back (``i = 0`` current) with weight ``decay**i``, so recent
behaviour dominates but one noisy sub-window does not flip a decision::

    H = sum_{i=0}^{n-1} decay**i * H_{k-i};   answer = nearest-rank quantile of H

and is ``None`` unless the *unweighted* window sample count is ``>=
min_samples`` (a percentile of a handful of samples is noise).

Accuracy: the exact nearest-rank quantile of the decay-weighted samples up to
relative error ``a`` (default 0.02: 1.00 s means the sample was in 0.98 .. 1.02 s).
Freshness: a decision may see a window quantile that misses the newest
observations, at most 2 % of the samples it was computed from (cached until
then; a merge per decision under steady traffic is what this buys back).
Memory per series (``a = 0.02``): ``3 x subwindows`` histograms of <= 4.6 KiB
(577 float64 buckets) plus 3 cached merges, ``(3 x 6 + 3) x 4.6 KiB ~= 97 KiB``
worst case with 6 sub-windows, typically ~1 KiB per non-empty histogram (only
the occupied bucket span is allocated).

Time only moves forward: a ``now`` in an older sub-window than one already
seen counts as the newest (closed sub-windows were evaluated and must not change).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sidecar.core.config import Metric, StatsConfig
from sidecar.core.histogram import LogHistogram
from sidecar.core.types import Observation

METRICS: tuple[Metric, ...] = ("ttft", "tpot", "e2e")
# A cached quantile is recomputed once new observations exceed this share of its samples.
_REFRESH_SHARE = 0.02
_COUNTERS = ("ok", "error", "timeout", "cancel")  # SubWindow attributes, named as the outcomes
_NEVER = -(1 << 62)  # index of an unused ring slot: matches no real sub-window
_QCACHE_MAX = 32  # distinct (metric, q) pairs cached per series; callers use a few


def as_metric(name: str) -> Metric:
    """Narrow a metric name (the selection pipeline passes ``str``); ValueError if unknown."""
    if name not in METRICS:
        raise ValueError(f"unknown metric {name!r}; expected one of {', '.join(METRICS)}")
    return name


@dataclass(frozen=True, slots=True)
class WindowSummary:
    """One completed sub-window of one series: what the health machine evaluates.
    ``requests`` excludes cancels: a client hanging up says nothing about the upstream."""

    index: int  # absolute sub-window index, floor(start / subwindow_s)
    start: float
    end: float
    metric: Metric
    q: float
    samples: int  # latency samples of ``metric``
    quantile: float | None  # seconds; None when samples < min_samples
    requests: int
    errors: int
    timeouts: int
    cancels: int

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.requests if self.requests else None

    @property
    def timeout_rate(self) -> float | None:
        return self.timeouts / self.requests if self.requests else None

    @property
    def failure_rate(self) -> float | None:
        """``(errors + timeouts) / requests``: what opens the circuit."""
        return (self.errors + self.timeouts) / self.requests if self.requests else None


class SubWindow:
    """One sub-window: a histogram per metric (weights are all 1, so ``count`` is
    the sample count) and outcome counters."""

    __slots__ = ("cancel", "error", "hists", "index", "ok", "timeout")

    def __init__(self, relative_accuracy: float) -> None:
        self.hists = {m: LogHistogram(relative_accuracy) for m in METRICS}
        self.reset(_NEVER)

    def reset(self, index: int) -> None:
        self.index = index
        self.ok = self.error = self.timeout = self.cancel = 0
        for h in self.hists.values():
            h.clear()

    @property
    def requests(self) -> int:
        return self.ok + self.error + self.timeout

    def samples(self, metric: Metric) -> int:
        return int(self.hists[metric].count)


class SeriesWindow:
    """Ring of ``cfg.subwindows`` sub-windows; sub-window ``k`` lives in slot ``k % n``."""

    __slots__ = ("_ring", "cfg", "current_index")

    def __init__(self, cfg: StatsConfig, relative_accuracy: float = 0.02) -> None:
        self.cfg = cfg
        self.current_index: int | None = None
        self._ring = [SubWindow(relative_accuracy) for _ in range(cfg.subwindows)]

    def advance(self, now: float) -> int:
        """Rotate to ``max(floor(now / subwindow_s), newest seen)``; clears expired slots."""
        k = math.floor(now / self.cfg.subwindow_s)
        if self.current_index is not None and k <= self.current_index:
            return self.current_index
        self.current_index = k
        for slot in self._ring:
            if slot.index <= k - len(self._ring) and (slot.requests or slot.cancel):
                slot.reset(slot.index)  # release the histogram arrays of expired data
        return k

    def current(self, now: float) -> SubWindow:
        """The sub-window that ``now`` writes into."""
        k = self.advance(now)
        slot = self._ring[k % len(self._ring)]
        if slot.index != k:
            slot.reset(k)
        return slot

    def get(self, index: int) -> SubWindow | None:
        """Sub-window ``index`` if it is still inside the window, else None."""
        cur = self.current_index
        if cur is None or not cur - len(self._ring) < index <= cur:
            return None
        slot = self._ring[index % len(self._ring)]
        return slot if slot.index == index else None

    def live(self, now: float) -> Iterator[tuple[int, SubWindow]]:
        """``(age, sub-window)`` for every sub-window in the window, newest first."""
        k = self.advance(now)
        for age in range(len(self._ring)):
            slot = self.get(k - age)
            if slot is not None:
                yield age, slot


class RouteStats:
    """Rolling statistics of one (cluster, slice)."""

    __slots__ = (
        "_past", "_qcache", "_unjudged", "_version", "accuracy", "cfg", "last_seen", "window",
    )  # fmt: skip

    def __init__(self, cfg: StatsConfig, relative_accuracy: float = 0.02) -> None:
        self.cfg = cfg
        self.accuracy = relative_accuracy
        self.window = SeriesWindow(cfg, relative_accuracy)
        self.last_seen: float | None = None  # ``now`` of the newest observation
        self._version = 0  # bumped by every observation; keys the quantile cache
        # Merge of the completed sub-windows: fixed until the window rotates.
        self._past: dict[Metric, tuple[int, LogHistogram, int]] = {}
        self._qcache: dict[tuple[Metric, float], tuple[int, int, float | None, int]] = {}
        # First completed sub-window not yet covered by a verdict (see window_summary).
        self._unjudged: int | None = None

    def observe(self, obs: Observation, now: float) -> None:
        """Count the outcome; add latency samples for ``ok`` first attempts, and the
        lower bounds of censored ones (timeouts: the route kept the caller
        waiting at least that long, which the tail must show).

        Errors and timeouts are counted, not latency samples (a fast 500 would
        make a failing route look quick). Retries (``is_retry``) are counted but
        add no latency evidence: the logical request already contributed via its
        first attempt, and a retry storm would let a few struggling requests
        dominate the percentile. Missing or NaN metric values are skipped."""
        slot = self.window.current(now)
        if obs.outcome in _COUNTERS:
            setattr(slot, obs.outcome, getattr(slot, obs.outcome) + 1)
        self.last_seen = now if self.last_seen is None else max(self.last_seen, now)
        self._version += 1
        if obs.is_retry or not (obs.outcome == "ok" or obs.censored):
            return
        values: tuple[tuple[Metric, float | None], ...] = (
            ("ttft", obs.ttft_s), ("tpot", obs.tpot_s), ("e2e", obs.e2e_s),
        )  # fmt: skip
        for metric, value in values:
            if value is not None and value == value:
                slot.hists[metric].add(value)

    def is_stale(self, now: float) -> bool:
        """No observation for more than ``stale_after_s``: everything reports no data."""
        return self.last_seen is None or now - self.last_seen > self.cfg.stale_after_s

    def _past_merged(self, metric: Metric, k: int) -> tuple[LogHistogram, int]:
        cached = self._past.get(metric)
        if cached is not None and cached[0] == k:
            return cached[1], cached[2]
        merged, n = LogHistogram(self.accuracy), 0
        for age in range(1, self.cfg.subwindows):
            slot = self.window.get(k - age)
            if slot is not None and (m := slot.samples(metric)):
                merged.merge(slot.hists[metric], self.cfg.decay**age)
                n += m
        self._past[metric] = (k, merged, n)
        return merged, n

    def quantile(self, metric: Metric, q: float, now: float) -> float | None:
        """Decay-weighted window quantile in seconds (module docstring); None when
        stale or the unweighted window sample count is ``< min_samples``."""
        return self.quantile_and_count(metric, q, now)[0]

    def count(self, metric: Metric, now: float) -> int:
        """Unweighted latency samples of ``metric`` in the window (0 when stale)."""
        if self.is_stale(now):
            return 0
        k = self.window.advance(now)
        cur = self.window.get(k)
        return self._past_merged(metric, k)[1] + (0 if cur is None else cur.samples(metric))

    def quantile_and_count(self, metric: Metric, q: float, now: float) -> tuple[float | None, int]:
        """``(quantile(...), count(...))`` in one pass; cached until the next
        observation or rotation (decisions ask for the same few percentiles)."""
        k = self.window.advance(now)
        if self.is_stale(now):
            return None, 0
        hit = self._qcache.get((metric, q))
        # Valid while the observations since it was computed are a small share of
        # its samples: with steady traffic every observation would otherwise force
        # a merge per decision. A handful of samples always recomputes.
        if hit is not None and hit[0] == k and (
            self._version - hit[1] <= hit[3] * _REFRESH_SHARE
        ):
            return hit[2], hit[3]
        past, n = self._past_merged(metric, k)
        cur = self.window.get(k)
        cur_n = 0 if cur is None else cur.samples(metric)
        value: float | None = None
        if cur is not None and cur_n and n + cur_n >= self.cfg.min_samples:
            h = past.copy()
            h.merge(cur.hists[metric])
            value = h.quantile(q)
        elif n >= self.cfg.min_samples:
            value = past.quantile(q)
        if len(self._qcache) >= _QCACHE_MAX:
            self._qcache.clear()
        self._qcache[(metric, q)] = (k, self._version, value, n + cur_n)
        return value, n + cur_n

    def _rate(self, now: float, field: str) -> float | None:
        live = [] if self.is_stale(now) else [s for _, s in self.window.live(now)]
        n = sum(s.requests for s in live)
        return sum(getattr(s, field) for s in live) / n if n else None

    def current_samples(self, now: float) -> int:
        """Outcomes recorded in the current (partial) sub-window."""
        k = self.window.advance(now)
        cur = self.window.get(k)
        return 0 if cur is None else cur.requests + cur.cancel

    def requests(self, now: float) -> int:
        """Requests (excluding cancels) recorded over the live window."""
        return 0 if self.is_stale(now) else sum(s.requests for _, s in self.window.live(now))

    def error_rate(self, now: float) -> float | None:
        """``errors / requests`` over the window; None without requests or when stale."""
        return self._rate(now, "error")

    def timeout_rate(self, now: float) -> float | None:
        """``timeouts / requests`` over the window; None without requests or when stale."""
        return self._rate(now, "timeout")

    def window_summary(self, now: float, metric: Metric, q: float) -> WindowSummary:
        """The next *evaluation window*: completed sub-windows not yet judged.

        Normally that is just the last completed sub-window ``k - 1``. A sparse
        route may not reach ``min_samples`` (latency) or ``error_min`` requests
        in one sub-window; its evaluation window then grows over the following
        sub-windows (unweighted merge, at most ``subwindows - 1`` of them) until
        it does. Windows never overlap, so no sample is judged twice and one
        spike cannot count as "sustained" across several verdicts. Until the
        span is complete the summary carries ``quantile=None`` (insufficient)
        and the span is kept for the next call.
        """
        k = self.window.advance(now)
        end = k * self.cfg.subwindow_s
        oldest = k - (self.cfg.subwindows - 1)
        first = k - 1 if self._unjudged is None else max(self._unjudged, oldest)
        first = min(first, k - 1)
        start = first * self.cfg.subwindow_s
        if self.is_stale(now):
            self._unjudged = k
            return WindowSummary(k - 1, start, end, metric, q, 0, None, 0, 0, 0, 0)
        merged: LogHistogram | None = None
        n = req = err = tmo = canc = 0
        for idx in range(first, k):
            slot = self.window.get(idx)
            if slot is None:
                continue
            if m := slot.samples(metric):
                if merged is None:
                    merged = slot.hists[metric].copy()
                else:
                    merged.merge(slot.hists[metric])
                n += m
            req, err, tmo, canc = (req + slot.requests, err + slot.error,
                                   tmo + slot.timeout, canc + slot.cancel)  # fmt: skip
        enough = n >= self.cfg.min_samples
        full_span = first <= oldest
        if enough or full_span or (req and (err + tmo) >= self.cfg.min_samples):
            self._unjudged = k  # verdict given: the next window starts fresh
        else:
            self._unjudged = first  # keep accumulating
        value = merged.quantile(q) if enough and merged is not None else None
        return WindowSummary(k - 1, start, end, metric, q, n, value, req, err, tmo, canc)

    def to_dict(self, now: float) -> dict[str, Any]:
        """JSON-safe snapshot; times are stored as ages relative to ``now``."""
        subs = [
            {"age": age, **{c: getattr(s, c) for c in _COUNTERS},
             "hists": {m: h.to_dict() for m, h in s.hists.items() if h.count}}
            for age, s in self.window.live(now)
            if s.requests or s.cancel
        ]  # fmt: skip
        age = None if self.last_seen is None else now - self.last_seen
        return {"last_seen_age": age, "subwindows": subs}

    @classmethod
    def from_dict(
        cls, data: dict[str, Any], cfg: StatsConfig, now: float, relative_accuracy: float = 0.02
    ) -> RouteStats:
        """Rebuild as if the snapshot were taken at ``now`` (ages are preserved)."""
        rs = cls(cfg, relative_accuracy)
        k = rs.window.advance(now)
        age = data.get("last_seen_age")
        rs.last_seen = None if age is None else now - float(age)
        for sub in data.get("subwindows", []):
            if not 0 <= (a := int(sub["age"])) < cfg.subwindows:
                continue
            slot = rs.window._ring[(k - a) % cfg.subwindows]
            slot.reset(k - a)
            for c in _COUNTERS:
                setattr(slot, c, int(sub[c]))
            for m, raw in sub.get("hists", {}).items():
                slot.hists[as_metric(m)] = h = LogHistogram.from_dict(raw)
                if h.relative_accuracy != relative_accuracy:
                    raise ValueError("snapshot histogram accuracy differs from the store's")
        return rs
