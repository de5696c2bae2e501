"""The rolling evidence of one (cluster, slice) series: :class:`RouteStats`.

A :class:`SeriesWindow` is a ring of ``cfg.subwindows`` sub-windows of
``cfg.subwindow_s`` seconds (the *maximum age* of any evidence:
``subwindows x subwindow_s``, 300 s by default); sub-window ``k =
floor(now / subwindow_s)`` is the current (partial) one. Each holds a
:class:`LogHistogram` per metric (ttft, tpot, e2e) of **successful first
attempts** and ok/error/timeout/cancel counters. The ring is the store of
evidence: replicas exchange and merge exactly these sub-windows.

**Rate-following window** (what a decision reads): the current sub-window
counts in full, the completed ones aged by the sub-windows newer than them
(formula and reasons: :mod:`sidecar.core.subwindow`).

**Shifts.** Every completed sub-window is also tested against the window
before it (:mod:`sidecar.core.shift`): when a few samples confidently left the
route's own distribution (a run of them beyond its p90 or below its p10), the
evidence from before the run is read moved by the ratio of medians since,
until it ages out -- a sparse route's window would otherwise take minutes of
aging to let a handful of new samples outweigh the old ones. The shift state is
the replica's own: a peer's sub-window merged after this replica folded that
index is not tested again, so two replicas may read a shift differently until
the evidence from before it ages out (the merged sub-windows themselves agree).

Accuracy: quantiles and CDF points within relative error ``a`` (default 0.02:
1.00 s means the sample was in 0.98 .. 1.02 s). Freshness: cached evidence is
rebuilt when the sub-window rotates, and when the series saw new observations
(:attr:`RouteStats.version`) and the cache is older than the caller's
``max_age_s`` (the router rebuilds its plans at least every ``subwindow_s / 2``
and after :data:`~sidecar.core.plan_cache.PLAN_REUSE` decisions, see there): a
merge per decision under steady traffic is what this buys back (hard failures
do not wait for it: see :mod:`sidecar.core.health`). Memory per series (``a =
0.02``): ``3 x (subwindows + 1)`` histograms (the ring and the decayed merge) of at
most 4.6 KiB (577 float64 buckets), typically ~1 KiB per non-empty histogram
(only the occupied bucket span is allocated; empty ones allocate nothing).

Time only moves forward: a ``now`` in an older sub-window than one already
seen counts as the newest (closed sub-windows were evaluated and must not change).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Final

from sidecar.core.buckets import buckets
from sidecar.core.config import Metric, StatsConfig
from sidecar.core.evaluation_span import EvaluationSpan
from sidecar.core.histogram import LogHistogram
from sidecar.core.shift import ShiftState, lapsed, reference, shifted_parts
from sidecar.core.subwindow import (
    METRICS,
    NEVER,
    NO_VALUE,
    DecayedWindow,
    Evidence,
    IndexLists,
    Indices,
    SeriesWindow,
    SubWindow,
    WindowSummary,
    aging,
    latency_indices,
)
from sidecar.core.types import Observation

# Evidence read without a stated max age may be this share of a sub-window old.
REFRESH_SHARE_OF_SUBWINDOW: Final = 0.5
_REBUILD_ROTATIONS: Final = 1000  # rebuild the decayed window from the ring now and then (rounding)


class RouteStats:
    """Rolling statistics of one (cluster, slice)."""

    __slots__ = (
        "_evidence", "_past", "_read", "_shift", "_slot", "accuracy", "cfg", "fence_index",
        "last_seen", "span", "version", "window",
    )  # fmt: skip

    def __init__(self, cfg: StatsConfig, relative_accuracy: float = 0.02) -> None:
        self.cfg = cfg
        self.accuracy = relative_accuracy
        self.window = SeriesWindow(cfg, relative_accuracy)
        self.last_seen: float | None = None  # ``now`` of the newest observation
        # Counts observations: caches built on this series compare it to know
        # whether anything changed since (see the module docstring's freshness).
        self.version = 0
        self._past = DecayedWindow(relative_accuracy)
        self._evidence: dict[Metric, tuple[int, int, float, Evidence | None]] = {}
        # _reading()'s answer: (k, version, f, ok, requests, firsts, current sub-window).
        self._read: tuple[int, int, float, float, float, float, SubWindow | None] | None = None
        self.span = EvaluationSpan()  # what the next verdict covers (window_summary)
        self.fence_index = NEVER  # sub-windows before this are not evidence any more (fence())
        self._slot: SubWindow | None = None  # the sub-window observations write into
        self._shift: dict[Metric, ShiftState] = {}  # per metric (sidecar.core.shift)

    def fence(self, now: float) -> None:
        """Forget the evidence of earlier sub-windows (kept in the ring for snapshots
        and replicas): a route whose circuit closes again starts afresh rather
        than being judged on the failures that opened it."""
        k = self._sync(now)
        self.fence_index = k
        self._past = DecayedWindow(self.accuracy)
        self._past.k = k
        self._shift = {}
        self._evidence.clear()
        self.version += 1
        self.span.fence(k)

    def reconfigure(self, cfg: StatsConfig) -> None:
        """Config reload, same ``subwindow_s``: keep the sub-windows (those inside a
        shorter ring) and the span; the decayed window is rebuilt from them by ``cfg``
        at the next read, and cached answers go."""
        self.window.resize(cfg, self.accuracy)
        self.cfg = cfg
        self._past, self._read, self._slot = DecayedWindow(self.accuracy), None, None
        self._evidence.clear()
        self.version += 1

    def observe(self, obs: Observation, now: float) -> None:
        """Count the outcome; add latency samples for ``ok`` first attempts (and the
        TTFT of a cancel whose first token was measured: :func:`latency_indices`).

        Errors, timeouts and other cancels are counted, never latency samples (a fast
        500 would make a failing route look quick; a timeout's waited time is a
        lower bound, and the failure itself is what the estimators count).
        Retries (``is_retry``) are counted but add no latency evidence: the
        logical request already contributed via its first attempt, and a retry
        storm would let a few struggling requests dominate the percentile.
        Missing or NaN metric values are skipped."""
        self.record(obs.outcome, latency_indices(obs, buckets(self.accuracy)), now)

    def record(
        self, outcome: str, indices: Indices | None, now: float, k: int | None = None,
    ) -> None:
        """:meth:`observe` with the bucket indices of (ttft, tpot, e2e) computed once
        (:func:`latency_indices`; None: no latency evidence), for every series the
        observation goes to; ``k``: ``floor(now / subwindow_s)`` if the caller has it."""
        slot = self._slot
        if k is None:
            k = math.floor(now / self.cfg.subwindow_s)
        if slot is None or slot.index != k:
            self._sync(now)
            slot = self._slot = self.window.current(now)
        slot.note(outcome, indices is not None)
        if self.last_seen is None or now > self.last_seen:
            self.last_seen = now
        self.version += 1
        if indices is None:
            return
        hists = slot.hists
        i_ttft, i_tpot, i_e2e = indices
        if i_ttft != NO_VALUE:
            hists["ttft"].add_index(i_ttft)
        if i_tpot != NO_VALUE:
            hists["tpot"].add_index(i_tpot)
        if i_e2e != NO_VALUE:
            hists["e2e"].add_index(i_e2e)

    def record_ok(self, n: int, indices: IndexLists, now: float) -> None:
        """:meth:`record` of ``n`` ``ok`` first attempts at ``now`` in one call, with
        their bucket indices per metric (:func:`ok_index_lists`): the same counts,
        version and histogram additions as ``n`` calls."""
        slot = self._slot
        if slot is None or slot.index != math.floor(now / self.cfg.subwindow_s):
            self._sync(now)
            slot = self._slot = self.window.current(now)
        slot.ok += n
        if self.last_seen is None or now > self.last_seen:
            self.last_seen = now
        self.version += n
        hists = slot.hists
        i_ttft, i_tpot, i_e2e = indices
        if i_ttft:
            hists["ttft"].add_indices(i_ttft)
        if i_tpot:
            hists["tpot"].add_indices(i_tpot)
        if i_e2e:
            hists["e2e"].add_indices(i_e2e)

    def is_stale(self, now: float) -> bool:
        """No observation for more than ``stale_after_s``: everything reports no data."""
        return self.last_seen is None or now - self.last_seen > self.cfg.stale_after_s

    # ------------------------------------------------------------ the decision window

    def _sync(self, now: float) -> int:
        """Rotate the ring to ``now``, folding newly completed sub-windows into the
        decayed window first (before the ring reuses expiring slots)."""
        k = math.floor(now / self.cfg.subwindow_s)
        cur = self.window.current_index
        if cur is not None and k < cur:
            k = cur  # time never goes backwards
        past = self._past
        if past.k == k:
            return k
        ring = self.cfg.subwindows
        start = past.k
        rebuilt = start is None or k - start >= ring or past.rotations >= _REBUILD_ROTATIONS
        if start is None or rebuilt:
            past = self._past = DecayedWindow(self.accuracy)
            start = max(k - ring + 1, self.fence_index)
        decay, per = self.cfg.decay, float(max(self.cfg.min_samples, 1))
        floor, enough = self.cfg.min_aging, self.cfg.enough_samples
        for j in range(start, k):
            slot = self.window.get(j)
            if slot is not None and not rebuilt and self.cfg.shift_alpha > 0.0:
                self._test_shift(j, slot)
            past.add(slot, decay, per, floor, enough)
        past.expire(k - ring + 1)
        past.k = k
        past.rotations += 1
        for m, st in self._shift.items():
            self._lapse(m, st)
        return self.window.advance(now)

    def evidence(
        self, metric: Metric, now: float, max_age_s: float | None = None
    ) -> Evidence | None:
        """The rate-following window of ``metric`` (None when stale or empty). A
        cached answer is reused within its sub-window while the series is
        unchanged or the answer is younger than ``max_age_s`` (default: half a
        sub-window)."""
        cfg = self.cfg
        # _sync() only when the sub-window moved: a plan build reads ~25 series'
        # evidence. (The decayed window is at the ring's index whenever it was synced.)
        k = math.floor(now / cfg.subwindow_s)
        if self._past.k != k:
            k = self._sync(now)
        if self.is_stale(now):
            return None
        hit = self._evidence.get(metric)
        if hit is not None and hit[0] == k and (hit[1] == self.version or now - hit[2] < (
                cfg.subwindow_s * REFRESH_SHARE_OF_SUBWINDOW if max_age_s is None
                else max_age_s)):
            return hit[3]
        f, ok, req, first, cur = self._reading(k)
        if metric == "ttft":
            ok += first  # a cancel's measured first token met the budget: an answer
        else:
            req -= first  # ... whose end is unknown: no outcome for e2e or TPOT
        n = self._past.samples[metric]
        parts: tuple[tuple[LogHistogram, float], ...] = ()
        eff = 0.0
        if n:
            done, w = self._past_parts(metric)
            parts, eff = tuple([(h, s * f) for h, s in done]), w * f
        if cur is not None and (cm := int(cur.hists[metric].count)):
            parts = (*parts, (cur.hists[metric], 1.0))
            n, eff = n + cm, eff + cm
        ev = None if req <= 0 and n == 0 else Evidence(parts, n, eff, ok, req)
        self._evidence[metric] = (k, self.version, now, ev)
        return ev

    def _reading(self, k: int) -> tuple[float, float, float, float, SubWindow | None]:
        """What every metric's :meth:`evidence` shares at sub-window ``k`` (synced):
        the current sub-window's aging factor ``f``, the window's weighted ok, request
        and ``first`` counts, and the current sub-window. Kept per (``k``, version): the
        decayed window and the current sub-window change only with either."""
        r = self._read
        if r is not None and r[0] == k and r[1] == self.version:
            return r[2], r[3], r[4], r[5], r[6]
        cfg = self.cfg
        past = self._past
        cur = self.window.get(k)
        # The current sub-window ages the completed ones too, by its requests so far.
        f = 1.0 if cur is None else aging(cur.requests, cfg.decay,
                                          float(max(cfg.min_samples, 1)),
                                          enough=cfg.enough_samples)
        ok, req, first = past.ok * f, past.requests * f, past.first * f
        if cur is not None:
            ok, req, first = ok + cur.ok, req + cur.requests, first + cur.first
        self._read = (k, self.version, f, ok, req, first, cur)
        return f, ok, req, first, cur

    def _past_parts(
        self, metric: Metric
    ) -> tuple[tuple[tuple[LogHistogram, float], ...], float]:
        """The completed window of ``metric`` as (histogram, scale) parts and its
        effective weight; after a detected shift the evidence from before it is
        moved by the shift's factor (:func:`sidecar.core.shift.shifted_parts`)."""
        past = self._past
        st = self._shift.get(metric)
        parts = None if st is None or st.since is None else shifted_parts(
            past, metric, st.since, self.accuracy)
        return ((past.hists[metric], 1.0),) if parts is None else parts, past.weights[metric]

    def _lapse(self, metric: Metric, st: ShiftState) -> None:
        """End ``metric``'s shift once :func:`~sidecar.core.shift.lapsed`. Run where
        the window changes (before a sub-window is tested, and after every fold),
        never on a read: what the window says must not depend on how often anyone
        reads it."""
        if st.since is not None and lapsed(self._past, metric, st.since):
            st.since = None

    def _test_shift(self, index: int, slot: SubWindow) -> None:
        """Test completed sub-window ``index`` against the window before it.

        Only sparse sub-windows (fewer than ``min_samples`` requests) are tested: a
        busy one ages the older evidence by a full decay step by itself, so the
        window is already a short time window there (and a run is broken)."""
        busy = slot.requests >= self.cfg.min_samples
        for m in METRICS:
            n = slot.samples(m)
            st = self._shift.get(m)
            if busy and st is not None:
                st.up = st.down = 0.0
            if busy or not n or self._past.samples[m] < self.cfg.min_samples:
                continue
            if st is None:
                st = self._shift[m] = ShiftState()
            self._lapse(m, st)
            done, _ = self._past_parts(m)
            st.update(index, reference(done, self.accuracy).cumulative(),
                      slot.hists[m].cumulative(), n, self.cfg.shift_alpha)

    def quantile(self, metric: Metric, q: float, now: float) -> float | None:
        """Window quantile in seconds (module docstring); None when stale or the
        unweighted window sample count is ``< min_samples``."""
        return self.quantile_and_count(metric, q, now)[0]

    def count(self, metric: Metric, now: float) -> int:
        """Unweighted latency samples of ``metric`` in the window (0 when stale)."""
        ev = self.evidence(metric, now, 0.0)
        return 0 if ev is None else ev.samples

    def quantile_and_count(self, metric: Metric, q: float, now: float) -> tuple[float | None, int]:
        """``(quantile(...), count(...))`` in one pass (always current)."""
        values, n = self.quantiles(metric, (q,), now)
        return values[0], n

    def quantiles(self, metric: Metric, qs: tuple[float, ...], now: float
                  ) -> tuple[tuple[float | None, ...], int]:
        """Several window quantiles and the count from one merge of the window (what
        the admin views read: the merge, not the lookup, is the cost)."""
        ev = self.evidence(metric, now, 0.0)
        if ev is None or ev.samples < self.cfg.min_samples:
            return (None,) * len(qs), 0 if ev is None else ev.samples
        merged = ev.merged(self.accuracy)
        return tuple(merged.quantile(q) for q in qs), ev.samples

    # ------------------------------------------------------------ plain counts

    def live(self, now: float) -> Iterator[tuple[int, SubWindow]]:
        """``(age, sub-window)`` of the ring at ``now``, newest first, after folding
        what completed into the decayed window (as every read does)."""
        self._sync(now)
        return self.window.live(now)

    def _rate(self, now: float, field: str) -> float | None:
        self._sync(now)
        live = [] if self.is_stale(now) else [s for _, s in self.window.live(now)]
        n = sum(s.requests for s in live)
        return sum(getattr(s, field) for s in live) / n if n else None

    def current_samples(self, now: float) -> int:
        """Outcomes recorded in the current (partial) sub-window."""
        k = self._sync(now)
        cur = self.window.get(k)
        return 0 if cur is None else cur.requests - cur.first + cur.cancel

    def requests(self, now: float) -> int:
        """Requests (excluding cancels) recorded over the live ring."""
        self._sync(now)
        return 0 if self.is_stale(now) else sum(s.requests for _, s in self.window.live(now))

    def error_rate(self, now: float) -> float | None:
        """``errors / requests`` over the ring; None without requests or when stale."""
        return self._rate(now, "error")

    def timeout_rate(self, now: float) -> float | None:
        """``timeouts / requests`` over the ring; None without requests or when stale."""
        return self._rate(now, "timeout")

    def outcomes_in(self, first: int, last: int, now: float) -> tuple[int, int]:
        """``(requests, errors + timeouts)`` over sub-windows ``first..last`` (inclusive)."""
        self._sync(now)
        req = fail = 0
        for idx in range(first, last + 1):
            slot = self.window.get(idx)
            if slot is not None:
                req += slot.requests
                fail += slot.error + slot.timeout
        return req, fail

    # ------------------------------------------------------------ evaluation windows

    def window_summary(self, now: float, metric: Metric, q: float) -> WindowSummary:
        """The next *evaluation window*: completed sub-windows not yet judged
        (:mod:`sidecar.core.evaluation_span`)."""
        k = self._sync(now)
        return self.span.next_summary(self.window, self.cfg, k, self.is_stale(now), metric, q)

    def close_span(self, now: float) -> None:
        """Nothing before the current sub-window is judged again (its failures were)."""
        self.span.fence(self._sync(now))
