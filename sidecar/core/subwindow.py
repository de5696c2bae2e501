"""Sub-windows, their ring, and the decayed window a series reads: the parts of
:class:`~sidecar.core.series.RouteStats`.

A :class:`SeriesWindow` is a ring of ``cfg.subwindows`` :class:`SubWindow` s of
``cfg.subwindow_s`` seconds; each holds a :class:`LogHistogram` per metric of
successful first attempts and ok/error/timeout/cancel counters.
:class:`DecayedWindow` keeps the completed sub-windows folded into one
histogram per metric, aged as below.

**Rate-following window** (what a decision reads). The current sub-window
counts in full; every newer sub-window ages the older evidence by one decay
step -- or by part of one, when it held fewer than ``min_samples`` requests::

    f_j = min(decay ** max(min_aging, min(1, r_j / min_samples)), 1 - r_j / enough_samples)
    w_i = prod_{j newer than i} f_j
    H   = H_current + sum_i w_i * H_i      (w_i < 0.05 and sub-windows beyond the ring dropped)

with ``r_j`` the requests of sub-window ``j`` (the current, partial one without
the ``min_aging`` floor). ``enough_samples`` (400) bounds a busy route's
window to about that many samples: a sub-window that alone holds a good share
of them makes the older evidence matter less (at 50 req/s over three routes,
~170 requests per 10 s sub-window keep ~0.57 of the older evidence per
sub-window instead of 0.85, so a slowdown dominates the window within a
sub-window or two instead of four or five; from 400 requests per sub-window on,
only the current and the last completed one are read). ``min_aging`` (0.5) makes time
age evidence too: without it a route whose share fell after a slowdown gets
few requests, so its pre-slowdown samples would age only with those few and
outweigh the slow new ones for minutes. At busy rates that is a short time
window (``1 - r / enough_samples`` per sub-window, at most ``decay``); at sparse
rates evidence is forgotten per ``min_samples`` newer requests, but every
completed sub-window ages it by at least ``decay ** min_aging`` (half a step
by default: a half-life of ~85 s), up to the maximum age. Counters are
weighted the same way. A quantile is ``None`` unless the *unweighted* window
holds ``>= min_samples`` samples (a percentile of a handful of samples is
noise); the effective sample weight ``sum w_i n_i`` is what the estimators
(:mod:`sidecar.core.evidence`) use as their sample size.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from sidecar.core.buckets import Buckets
from sidecar.core.config import Metric, StatsConfig
from sidecar.core.frozen import fast_init
from sidecar.core.histogram import Cumulative, LogHistogram
from sidecar.core.types import Observation

METRICS: Final[tuple[Metric, ...]] = ("ttft", "tpot", "e2e")
WEIGHT_CUTOFF: Final = 0.05  # older sub-windows weigh less than this: left out of the window
# SubWindow attributes, named as the outcomes.
COUNTERS: Final = ("ok", "error", "timeout", "cancel")
NEVER: Final = -(1 << 62)  # index of an unused ring slot: matches no real sub-window
NO_VALUE: Final = -(1 << 61)  # a latency_indices entry: the metric was not measured
Indices = tuple[int | None, int | None, int | None]


def latency_indices(obs: Observation, geometry: Buckets) -> Indices | None:
    """Bucket indices of an observation's (ttft, tpot, e2e), None unless it is latency
    evidence: an ``ok`` first attempt, or the TTFT alone of a cancelled one whose first
    token was measured and which the router judged within budget (``ttft_measured``,
    no longer ``censored``: :func:`sidecar.core.judging.judge_censored`); unmeasured or
    NaN metrics are skipped."""
    if obs.is_retry:
        return None
    index_of = geometry.index_of
    ttft, tpot, e2e = obs.ttft_s, obs.tpot_s, obs.e2e_s
    if obs.outcome != "ok":
        if (obs.outcome != "cancel" or not obs.ttft_measured or obs.censored
                or ttft is None or ttft != ttft):
            return None
        return index_of(ttft), NO_VALUE, NO_VALUE  # its end never came: TTFT only
    return (NO_VALUE if ttft is None or ttft != ttft else index_of(ttft),
            NO_VALUE if tpot is None or tpot != tpot else index_of(tpot),
            NO_VALUE if e2e is None or e2e != e2e else index_of(e2e))


# (ttft, tpot, e2e) in seconds and output tokens of one ``ok`` first attempt (None:
# not measured).
OkSample = tuple[float | None, float | None, float | None, int | None]
IndexLists = tuple[list[int | None], list[int | None], list[int | None]]


def ok_index_lists(samples: Sequence[OkSample], geometry: Buckets) -> IndexLists:
    """:func:`latency_indices` of many ``ok`` first attempts, per metric: the bucket
    index of each measured value in order (None: the zero bucket); unmeasured or NaN
    values are left out, as there."""
    index_of = geometry.indices_of
    return (index_of([v for v, _, _, _ in samples if v is not None and v == v]),
            index_of([v for _, v, _, _ in samples if v is not None and v == v]),
            index_of([v for _, _, v, _ in samples if v is not None and v == v]))


def aging(requests: int, decay: float, per: float, floor: float = 0.0,
          enough: float = 0.0) -> float:
    """How much one sub-window with ``requests`` ages older evidence:
    ``min(decay ** max(floor, min(1, requests / min_samples)), 1 - requests / enough)``
    (module docstring; ``floor`` is ``stats.min_aging`` for completed sub-windows, 0
    for the current one; ``enough`` is ``stats.enough_samples``, 0: no such bound)."""
    share = max(floor, min(1.0, requests / per)) if requests > 0 else floor
    f = 1.0 if decay >= 1.0 or share <= 0.0 else float(decay ** share)
    if enough > 0.0 and requests > 0:
        # Below the 0.05 cut-off the older evidence is dropped outright.
        f = min(f, max(1.0 - requests / enough, _DROPPED))
    return f


_DROPPED: Final = 0.01  # an aging factor that leaves older evidence below the 0.05 cut-off


def as_metric(name: str) -> Metric:
    """Narrow a metric name (the selection pipeline passes ``str``); ValueError if unknown."""
    if name not in METRICS:
        raise ValueError(f"unknown metric {name!r}; expected one of {', '.join(METRICS)}")
    return name


@fast_init
@dataclass(frozen=True, slots=True)
class WindowSummary:
    """One evaluation window of one series: what the health machine judges.
    ``requests`` excludes cancels: a client hanging up says nothing about the upstream
    (for TTFT, a cancel whose measured first token was kept is one: ``SubWindow.first``).
    ``cum`` is the window's latency distribution (ok first attempts; those cancels'
    TTFT), for counting samples beyond any threshold."""

    index: int  # absolute sub-window index of the newest sub-window it covers
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
    cum: Cumulative | None = None

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

    def samples_over(self, threshold_s: float) -> int:
        """Latency samples above ``threshold_s`` (within the histogram's accuracy)."""
        if self.cum is None or self.samples == 0:
            return 0
        return max(0, round(self.samples - self.cum.weight_at_most(threshold_s)))


@dataclass(frozen=True, slots=True)
class Evidence:
    """The rate-following window of one series and metric at one moment.

    The window's histogram is ``sum(scale * h for h, scale in parts)`` (the
    completed part and the current sub-window; kept apart so that whoever
    merges it -- the slice blend -- merges once; do not modify them),
    ``samples`` the unweighted latency sample count, ``weight`` the effective
    (weighted) one; ``ok``/``requests`` are weighted outcome counts (requests =
    ok + errors + timeouts; for TTFT also the cancels whose measured first token
    was kept, which count in ``ok`` there too: answers that came by it, whose end
    is unknown, so no outcome for e2e or TPOT)."""

    parts: tuple[tuple[LogHistogram, float], ...]
    samples: int
    weight: float
    ok: float
    requests: float

    # Written out for the compiled lab (one per plan's lookup; sidecar.core.frozen).
    def __init__(self, parts: tuple[tuple[LogHistogram, float], ...], samples: int,
                 weight: float, ok: float, requests: float) -> None:
        object.__setattr__(self, "parts", parts)
        object.__setattr__(self, "samples", samples)
        object.__setattr__(self, "weight", weight)
        object.__setattr__(self, "ok", ok)
        object.__setattr__(self, "requests", requests)

    def merged(self, accuracy: float) -> LogHistogram:
        """The window's histogram as one (a new object)."""
        return LogHistogram.weighted_sum(accuracy, self.parts)


fast_init(Evidence)


class SubWindow:
    """One sub-window: a histogram per metric (weights are all 1, so ``count`` is
    the sample count) and outcome counters."""

    __slots__ = ("cancel", "error", "first", "hists", "index", "ok", "timeout")

    def __init__(self, relative_accuracy: float) -> None:
        self.hists = {m: LogHistogram(relative_accuracy) for m in METRICS}
        self.reset(NEVER)

    def reset(self, index: int) -> None:
        self.index = index
        self.ok = self.error = self.timeout = self.cancel = self.first = 0
        for h in self.hists.values():
            h.clear()

    @property
    def requests(self) -> int:
        """Outcomes that are evidence: ok, error, timeout and the cancels whose
        measured first token is a sample (``first``: an outcome for TTFT only, but
        evidence that ages the older one); other cancels say nothing."""
        return self.ok + self.error + self.timeout + self.first

    def note(self, outcome: str, sample: bool) -> None:
        """Count one outcome; a cancel with a latency sample (its measured first token,
        :func:`latency_indices`) counts as a ``first`` too."""
        if outcome == "ok":
            self.ok += 1
        elif outcome == "error":
            self.error += 1
        elif outcome == "timeout":
            self.timeout += 1
        elif outcome == "cancel":
            self.cancel += 1
            if sample:
                self.first += 1

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

    def reset_slot(self, index: int) -> SubWindow:
        """The slot of sub-window ``index``, emptied for it (restoring a snapshot)."""
        slot = self._ring[index % len(self._ring)]
        slot.reset(index)
        return slot

    def resize(self, cfg: StatsConfig, relative_accuracy: float) -> None:
        """Take ``cfg`` (same ``subwindow_s``): a ring of ``cfg.subwindows`` holding the
        sub-windows of the old one that are still inside the new one (all, when it grew;
        the newest, when it shrank), each in its slot ``k % n``."""
        n, self.cfg = cfg.subwindows, cfg
        if n == len(self._ring):
            return
        ring = [SubWindow(relative_accuracy) for _ in range(n)]
        cur = self.current_index
        if cur is not None:
            oldest = cur - min(n, len(self._ring))
            for slot in self._ring:
                if oldest < slot.index <= cur:
                    ring[slot.index % n] = slot
        self._ring = ring

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


class DecayedWindow:
    """The completed part of the rate-following window, kept current incrementally.

    When sub-window ``j`` completes with ``r_j`` requests, every older one ages by
    the same factor, ``decay ** min(1, r_j / min_samples)``: one vector scale and one merge per
    rotation (and metric), not a merge of the whole ring per read. Sub-windows
    whose weight fell below the cutoff, or that leave the ring, are taken out
    again (:meth:`LogHistogram.remove`) before the ring reuses their slot.
    """

    __slots__ = ("first", "hists", "included", "k", "ok", "requests", "rotations",
                 "samples", "weights")

    def __init__(self, accuracy: float) -> None:
        self.hists = {m: LogHistogram(accuracy) for m in METRICS}
        self.samples = dict.fromkeys(METRICS, 0)
        self.weights = dict.fromkeys(METRICS, 0.0)
        self.ok = self.requests = self.first = 0.0
        self.included: deque[list[Any]] = deque()  # [slot, index, weight], oldest first
        self.k: int | None = None  # sub-windows below k are covered
        self.rotations = 0

    def add(
        self, slot: SubWindow | None, decay: float, per: float, floor: float, enough: float,
    ) -> None:
        """Fold in completed sub-window ``slot`` (None or empty: none was recorded;
        time still ages the older evidence by ``decay ** floor``)."""
        requests = 0 if slot is None else slot.requests
        f = aging(requests, decay, per, floor, enough)
        if f != 1.0:
            for m in METRICS:
                self.hists[m].scale(f)
                self.weights[m] *= f
            self.ok *= f
            self.requests *= f
            self.first *= f
            for inc in self.included:
                inc[2] *= f
        if slot is None or not requests:
            return
        for m in METRICS:
            if n := slot.samples(m):
                self.hists[m].merge(slot.hists[m])
                self.samples[m] += n
                self.weights[m] += n
        self.ok += slot.ok
        self.requests += slot.requests
        self.first += slot.first
        self.included.append([slot, slot.index, 1.0])

    def expire(self, oldest: int) -> None:
        """Take out sub-windows older than ``oldest`` or weighing less than the cutoff."""
        inc = self.included
        while inc and (inc[0][1] < oldest or inc[0][2] < WEIGHT_CUTOFF):
            slot, index, w = inc.popleft()
            if slot.index != index:  # already reused: cannot happen when synced in order
                raise RuntimeError("decayed window lost track of a sub-window")
            for m in METRICS:
                if n := slot.samples(m):
                    self.hists[m].remove(slot.hists[m], w)
                    self.samples[m] -= n
                    self.weights[m] = max(self.weights[m] - w * n, 0.0)
            self.ok = max(self.ok - w * slot.ok, 0.0)
            self.requests = max(self.requests - w * slot.requests, 0.0)
            self.first = max(self.first - w * slot.first, 0.0)
