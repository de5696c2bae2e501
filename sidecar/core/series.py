"""The rolling evidence of one (cluster, slice) series: :class:`RouteStats`.

A :class:`SeriesWindow` is a ring of ``cfg.subwindows`` sub-windows of
``cfg.subwindow_s`` seconds (the *maximum age* of any evidence:
``subwindows x subwindow_s``, 300 s by default); sub-window ``k =
floor(now / subwindow_s)`` is the current (partial) one. Each holds a
:class:`LogHistogram` per metric (ttft, tpot, e2e) of **successful first
attempts** and ok/error/timeout/cancel counters. The ring is the store of
evidence: replicas exchange and merge exactly these sub-windows.

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
and after :data:`~sidecar.core.router.PLAN_REUSE` decisions, see there): a
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
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sidecar.core.config import Metric, StatsConfig
from sidecar.core.frozen import fast_init
from sidecar.core.histogram import Cumulative, LogHistogram
from sidecar.core.shift import SHIFT_MIN_BEFORE, ShiftState, shift_factor
from sidecar.core.types import Observation

METRICS: tuple[Metric, ...] = ("ttft", "tpot", "e2e")
# Evidence read without a stated max age may be this share of a sub-window old.
REFRESH_SHARE_OF_SUBWINDOW = 0.5
_WEIGHT_CUTOFF = 0.05  # older sub-windows weigh less than this: left out of the window
_REBUILD_ROTATIONS = 1000  # rebuild the decayed window from the ring now and then (rounding)
_COUNTERS = ("ok", "error", "timeout", "cancel")  # SubWindow attributes, named as the outcomes
_NEVER = -(1 << 62)  # index of an unused ring slot: matches no real sub-window


_NO_VALUE = -(1 << 61)  # a latency_indices entry: the metric was not measured
Indices = tuple[int | None, int | None, int | None]


def latency_indices(obs: Observation, geometry: LogHistogram) -> Indices | None:
    """Bucket indices of an observation's (ttft, tpot, e2e), None unless it is latency
    evidence (an ``ok`` first attempt); unmeasured or NaN metrics are skipped."""
    if obs.is_retry or obs.outcome != "ok":
        return None
    index_of = geometry.index_of
    ttft, tpot, e2e = obs.ttft_s, obs.tpot_s, obs.e2e_s
    return (_NO_VALUE if ttft is None or ttft != ttft else index_of(ttft),
            _NO_VALUE if tpot is None or tpot != tpot else index_of(tpot),
            _NO_VALUE if e2e is None or e2e != e2e else index_of(e2e))


# (ttft, tpot, e2e) in seconds and output tokens of one ``ok`` first attempt (None:
# not measured).
OkSample = tuple[float | None, float | None, float | None, int | None]
IndexLists = tuple[list[int | None], list[int | None], list[int | None]]


def ok_index_lists(samples: Sequence[OkSample], geometry: LogHistogram) -> IndexLists:
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


_DROPPED = 0.01  # an aging factor that leaves older evidence below the 0.05 cut-off


def as_metric(name: str) -> Metric:
    """Narrow a metric name (the selection pipeline passes ``str``); ValueError if unknown."""
    if name not in METRICS:
        raise ValueError(f"unknown metric {name!r}; expected one of {', '.join(METRICS)}")
    return name


@fast_init
@dataclass(frozen=True, slots=True)
class WindowSummary:
    """One evaluation window of one series: what the health machine judges.
    ``requests`` excludes cancels: a client hanging up says nothing about the upstream.
    ``cum`` is the window's latency distribution (ok first attempts), for
    counting samples beyond any threshold."""

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


@fast_init
@dataclass(frozen=True, slots=True)
class Evidence:
    """The rate-following window of one series and metric at one moment.

    The window's histogram is ``sum(scale * h for h, scale in parts)`` (the
    completed part and the current sub-window; kept apart so that whoever
    merges it -- the slice blend -- merges once; do not modify them),
    ``samples`` the unweighted latency sample count, ``weight`` the effective
    (weighted) one; ``ok``/``requests`` are weighted outcome counts (requests =
    ok + errors + timeouts)."""

    parts: tuple[tuple[LogHistogram, float], ...]
    samples: int
    weight: float
    ok: float
    requests: float

    def merged(self, accuracy: float) -> LogHistogram:
        """The window's histogram as one (a new object)."""
        return LogHistogram.weighted_sum(accuracy, self.parts)


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


class _Decayed:
    """The completed part of the rate-following window, kept current incrementally.

    When sub-window ``j`` completes with ``r_j`` requests, every older one ages by
    the same factor, ``decay ** min(1, r_j / min_samples)``: one vector scale and one merge per
    rotation (and metric), not a merge of the whole ring per read. Sub-windows
    whose weight fell below the cutoff, or that leave the ring, are taken out
    again (:meth:`LogHistogram.remove`) before the ring reuses their slot.
    """

    __slots__ = ("hists", "included", "k", "ok", "requests", "rotations", "samples",
                 "weights")

    def __init__(self, accuracy: float) -> None:
        self.hists = {m: LogHistogram(accuracy) for m in METRICS}
        self.samples = dict.fromkeys(METRICS, 0)
        self.weights = dict.fromkeys(METRICS, 0.0)
        self.ok = self.requests = 0.0
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
        self.included.append([slot, slot.index, 1.0])

    def expire(self, oldest: int) -> None:
        """Take out sub-windows older than ``oldest`` or weighing less than the cutoff."""
        inc = self.included
        while inc and (inc[0][1] < oldest or inc[0][2] < _WEIGHT_CUTOFF):
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


class RouteStats:
    """Rolling statistics of one (cluster, slice)."""

    __slots__ = (
        "_evidence", "_fence", "_past", "_read", "_shift", "_slot", "_unjudged", "accuracy",
        "cfg", "last_seen", "version", "window",
    )  # fmt: skip

    def __init__(self, cfg: StatsConfig, relative_accuracy: float = 0.02) -> None:
        self.cfg = cfg
        self.accuracy = relative_accuracy
        self.window = SeriesWindow(cfg, relative_accuracy)
        self.last_seen: float | None = None  # ``now`` of the newest observation
        # Counts observations: caches built on this series compare it to know
        # whether anything changed since (see the module docstring's freshness).
        self.version = 0
        self._past = _Decayed(relative_accuracy)
        self._evidence: dict[Metric, tuple[int, int, float, Evidence | None]] = {}
        # _reading()'s answer: (k, version, f, ok, requests, current sub-window).
        self._read: tuple[int, int, float, float, float, SubWindow | None] | None = None
        # First completed sub-window not yet covered by a verdict (see window_summary).
        self._unjudged: int | None = None
        self._fence = _NEVER  # sub-windows before this are not evidence any more (fence())
        self._slot: SubWindow | None = None  # the sub-window observations write into
        self._shift: dict[Metric, ShiftState] = {}  # per metric (sidecar.core.shift)

    def fence(self, now: float) -> None:
        """Forget the evidence of earlier sub-windows (kept in the ring for snapshots
        and replicas): a route whose circuit closes again starts afresh rather
        than being judged on the failures that opened it."""
        k = self._sync(now)
        self._fence = k
        self._past = _Decayed(self.accuracy)
        self._past.k = k
        self._shift = {}
        self._evidence.clear()
        self.version += 1
        if self._unjudged is None or self._unjudged < k:
            self._unjudged = k

    def observe(self, obs: Observation, now: float) -> None:
        """Count the outcome; add latency samples for ``ok`` first attempts.

        Errors, timeouts and cancels are counted, never latency samples (a fast
        500 would make a failing route look quick; a timeout's waited time is a
        lower bound, and the failure itself is what the estimators count).
        Retries (``is_retry``) are counted but add no latency evidence: the
        logical request already contributed via its first attempt, and a retry
        storm would let a few struggling requests dominate the percentile.
        Missing or NaN metric values are skipped."""
        self.record(obs.outcome, latency_indices(obs, self.window._ring[0].hists["ttft"]), now)

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
        if outcome == "ok":
            slot.ok += 1
        elif outcome == "error":
            slot.error += 1
        elif outcome == "timeout":
            slot.timeout += 1
        elif outcome == "cancel":
            slot.cancel += 1
        if self.last_seen is None or now > self.last_seen:
            self.last_seen = now
        self.version += 1
        if indices is None:
            return
        hists = slot.hists
        i_ttft, i_tpot, i_e2e = indices
        if i_ttft != _NO_VALUE:
            hists["ttft"].add_index(i_ttft)
        if i_tpot != _NO_VALUE:
            hists["tpot"].add_index(i_tpot)
        if i_e2e != _NO_VALUE:
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
            past = self._past = _Decayed(self.accuracy)
            start = max(k - ring + 1, self._fence)
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
        f, ok, req, cur = self._reading(k)
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

    def _reading(self, k: int) -> tuple[float, float, float, SubWindow | None]:
        """What every metric's :meth:`evidence` shares at sub-window ``k`` (synced):
        the current sub-window's aging factor ``f``, the window's weighted ok and
        request counts, and the current sub-window. Kept per (``k``, version): the
        decayed window and the current sub-window change only with either."""
        r = self._read
        if r is not None and r[0] == k and r[1] == self.version:
            return r[2], r[3], r[4], r[5]
        cfg = self.cfg
        past = self._past
        cur = self.window.get(k)
        # The current sub-window ages the completed ones too, by its requests so far.
        f = 1.0 if cur is None else aging(cur.requests, cfg.decay,
                                          float(max(cfg.min_samples, 1)),
                                          enough=cfg.enough_samples)
        ok, req = past.ok * f, past.requests * f
        if cur is not None:
            ok += cur.ok
            req += cur.requests
        self._read = (k, self.version, f, ok, req, cur)
        return f, ok, req, cur

    def _past_parts(
        self, metric: Metric
    ) -> tuple[tuple[tuple[LogHistogram, float], ...], float]:
        """The completed window of ``metric`` as (histogram, scale) parts and its
        effective weight; after a detected shift the evidence from before it is
        moved by the shift's factor (:mod:`sidecar.core.shift`)."""
        past = self._past
        plain = ((past.hists[metric], 1.0),), past.weights[metric]
        st = self._shift.get(metric)
        if st is None or st.since is None:
            return plain
        since = LogHistogram(self.accuracy)
        for slot, index, w in past.included:
            if index >= st.since and slot.samples(metric):
                since.merge(slot.hists[metric], w)
        if since.count <= 0.0:  # not after _lapse(); kept so a read never raises
            return plain
        before = past.hists[metric].copy()
        before.remove(since)
        factor = shift_factor(before, since)
        return ((before.shifted(factor), 1.0), (since, 1.0)), past.weights[metric]

    def _lapse(self, metric: Metric, st: ShiftState) -> None:
        """End ``metric``'s shift once the evidence from before it has (nearly) aged
        out of the decayed window: fewer than ``SHIFT_MIN_BEFORE`` samples from
        before, or nothing weighted since. Run where the window changes (before a
        sub-window is tested, and after every fold), never on a read: what the
        window says must not depend on how often anyone reads it."""
        if st.since is None:
            return
        older = 0  # unweighted samples from before the shift
        since = 0.0  # weighted samples from its start on
        for slot, index, w in self._past.included:
            if n := slot.samples(metric):
                if index >= st.since:
                    since += w * n
                else:
                    older += n
        if older < SHIFT_MIN_BEFORE or since <= 0.0:
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
            if len(done) == 1 and done[0][1] == 1.0:
                # One part at scale 1 (no shift in force): its own cumulative answers the
                # reference quantiles as a merged copy's would (same buckets, same sums).
                ref = done[0][0]
            else:
                ref = LogHistogram(self.accuracy)
                for h, scale in done:
                    ref.merge(h, scale)
            st.update(index, ref.cumulative(), slot.hists[m].cumulative(), n,
                      self.cfg.shift_alpha)

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
        ev = self.evidence(metric, now, 0.0)
        if ev is None:
            return None, 0
        if ev.samples < self.cfg.min_samples:
            return None, ev.samples
        return ev.merged(self.accuracy).quantile(q), ev.samples

    # ------------------------------------------------------------ plain counts

    def _rate(self, now: float, field: str) -> float | None:
        self._sync(now)
        live = [] if self.is_stale(now) else [s for _, s in self.window.live(now)]
        n = sum(s.requests for s in live)
        return sum(getattr(s, field) for s in live) / n if n else None

    def current_samples(self, now: float) -> int:
        """Outcomes recorded in the current (partial) sub-window."""
        k = self._sync(now)
        cur = self.window.get(k)
        return 0 if cur is None else cur.requests + cur.cancel

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
        """The next *evaluation window*: completed sub-windows not yet judged.

        Normally that is just the last completed sub-window ``k - 1``. A sparse
        route may not reach ``min_samples`` (latency) or ``error_min`` requests
        in one sub-window; its evaluation window then grows over the following
        sub-windows (unweighted merge, at most ``subwindows - 1`` of them: the
        maximum age) until it does. Windows never overlap, so no sample is
        judged twice and one spike cannot count as "sustained" across several
        verdicts. Until the span is complete the summary carries
        ``quantile=None`` (insufficient) and the span is kept for the next call.
        """
        k = self._sync(now)
        end = k * self.cfg.subwindow_s
        oldest = k - (self.cfg.subwindows - 1)
        first = k - 1 if self._unjudged is None else max(self._unjudged, oldest)
        first = min(first, k - 1)
        start = first * self.cfg.subwindow_s
        if self.is_stale(now):
            self._unjudged = k
            return WindowSummary(k - 1, start, end, metric, q, 0, None, 0, 0, 0, 0)
        merged: LogHistogram | None = None  # the first sub-window's own until a second comes
        copied = False
        n = req = err = tmo = canc = 0
        for idx in range(first, k):
            slot = self.window.get(idx)
            if slot is None:
                continue
            if m := slot.samples(metric):
                if merged is None:
                    merged = slot.hists[metric]
                else:
                    if not copied:
                        merged, copied = merged.copy(), True
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
        cum = None if merged is None else merged.cumulative()
        value = cum.quantile(q) if enough and cum is not None else None
        return WindowSummary(k - 1, start, end, metric, q, n, value, req, err, tmo, canc, cum)

    # ------------------------------------------------------------ snapshots

    def to_dict(self, now: float) -> dict[str, Any]:
        """JSON-safe snapshot; times are stored as ages relative to ``now``."""
        self._sync(now)
        subs = [
            {"age": age, **{c: getattr(s, c) for c in _COUNTERS},
             "hists": {m: h.to_dict() for m, h in s.hists.items() if h.count}}
            for age, s in self.window.live(now)
            if s.requests or s.cancel
        ]  # fmt: skip
        age = None if self.last_seen is None else now - self.last_seen
        out: dict[str, Any] = {"last_seen_age": age, "subwindows": subs}
        if self._fence != _NEVER and self.window.current_index is not None:
            out["fence_age"] = self.window.current_index - self._fence
        return out

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
        if data.get("fence_age") is not None:
            rs._fence = rs._unjudged = k - int(data["fence_age"])
        return rs
