"""The per-request stage of a cached plan over flat tuples: the common case, exactly.

:func:`~sidecar.core.pipeline.run_request` copies every candidate of the plan,
runs the per-request filters (the class restriction's herding guard,
capacity) and the load scorer on the copies, combines the weights and lets
the picker choose; the result object then feeds admission, the decision's
labels and the recent-decision ring. Per request, only the in-flight counts
vary. A :class:`RequestLane` is built with the plan when its per-request stage
is the default one (picker ``weighted_random``, scorer ``load``, filters class
restriction, capacity, the failure run's trial limit and live misses, which the
router checks first: while either holds a route back the full stage runs) and
computes, from a snapshot of the counts, exactly what that stage would -- the
same operations in the same order, so weights and pick are bit-identical. For
each candidate the static stage kept, in order::

    restricted for this latency-sensitive class (the herding guard):
        dropped       if  free_alt >= HERD_HEADROOM * cap_alt   (alternatives' room)
        else health = degraded_weight
    load   = max(1 - inflight / max_concurrency, 0.02)
    w      = max(base * max(load, 1e-6) ** k_load * health, 1e-9)
    w      = max(w * q, 1e-9),  q = live latency score over the kept candidates from
                                    the counts and base * health * hold time
                                    (sidecar.core.live_latency; skipped at beta 0)
    then   w = max(w, explore_share * max w * f)    (exploration floor; f the candidate's
                                                     share of it, sidecar.core.light_load)
    pick   the first i with  u * sum_j w_j - sum_{j <= i} w_j < 0,  u = rng.random()

When a kept candidate is full (capacity would drop it) or none is kept
(panic), :meth:`RequestLane.pick` returns None before drawing and the caller
runs the full stage. A :class:`LanePick` keeps the counts and the draw;
:meth:`LanePick.result` replays the full stage on them to give the
:class:`~sidecar.core.selection.PipelineResult` whoever needs it (explain,
admission beyond its fast path), and only then. What depends on the chosen
candidate alone -- the decision reason, the fallback label, admission's
over-budget verdicts -- is static for the plan and computed once.

Pure like the rest of the core: the in-flight counts come from the caller.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import replace
from typing import Final, NamedTuple

from sidecar.core.config import ClassConfig
from sidecar.core.evidence import RouteEvidence
from sidecar.core.explain import decision_reason
from sidecar.core.filters import (
    HERD_HEADROOM,
    Capacity,
    ClassRestriction,
    FailureRun,
    LiveMissing,
)
from sidecar.core.live_latency import sum_in_order
from sidecar.core.pickers import WeightedRandom
from sidecar.core.pipeline import run_request
from sidecar.core.replayed_draw import ReplayedDraw
from sidecar.core.scorers import Load
from sidecar.core.selection import (
    FLOOR_SHARE,
    HealthView,
    LatencyValue,
    Picker,
    PipelineResult,
    Plan,
    RouteView,
    SelectionContext,
)
from sidecar.core.types import SliceKey

# FailureRun and LiveMissing drop nothing unless the request's context holds routes
# back (an open run of hard failures, live misses); the router runs the full stage then.
_LANE_FILTERS: Final = (ClassRestriction, Capacity, FailureRun, LiveMissing)


class _Row(NamedTuple):
    """One candidate the static stage kept, as the lane reads it."""

    name: str
    at: int  # where its in-flight count is in a pick's snapshot
    limit: int  # max_concurrency
    base: float  # the static stage's weight
    health: float  # health weight
    # The herding guard's alternatives, (snapshot index, max_concurrency), when the
    # class restriction applies to this candidate (else None: it passes).
    guard: tuple[tuple[int, int], ...] | None
    reason: str  # the decision reason when this candidate is chosen
    latency: dict[str, LatencyValue]  # looked up by the static stage (shared, read-only)
    hold: float  # the queue score's hold time (1.0 when the class has no queue score)
    floor: float  # its share of the exploration floor (sidecar.core.light_load)


class RequestLane:
    """The per-request stage of one plan (module docstring); build with :meth:`of`."""

    __slots__ = ("beta", "ctx", "degraded", "explore_share", "hot", "k_load", "names", "over",
                 "picker", "plan", "rows")

    def __init__(self, plan: Plan, ctx: SelectionContext, picker: Picker,
                 rows: tuple[_Row, ...], names: tuple[str, ...], k_load: float) -> None:
        self.plan, self.ctx, self.picker = plan, ctx, picker
        self.rows = rows
        self.hot = tuple((i, r.at, r.limit, r.base, r.health, r.guard, r.hold, r.floor)
                         for i, r in enumerate(rows))  # what pick() reads, unpacked fast
        self.names = names  # every route whose in-flight count a pick reads
        self.k_load = k_load
        self.beta = ctx.queue_weight
        self.explore_share = ctx.config.health.explore_share
        self.degraded = ctx.config.health.degraded_weight
        # Admission's over-budget verdict per row for a class (it reads only the
        # plan's scores); admission fills it in on first use (sidecar.core.admission).
        self.over: tuple[ClassConfig, tuple[bool, ...]] | None = None

    @classmethod
    def of(cls, plan: Plan, ctx: SelectionContext, picker: Picker) -> RequestLane | None:
        """The lane of ``plan``, or None when its per-request stage is not plain arithmetic."""
        if type(picker) is not WeightedRandom or not plan.eligible:
            return None
        if any(type(f) not in _LANE_FILTERS for f in plan.request_filters):
            return None
        if len(plan.request_scorers) != 1 or type(plan.request_scorers[0][0]) is not Load:
            return None
        restrict = ClassRestriction in {type(f) for f in plan.request_filters}
        names: dict[str, int] = {}
        rows = []
        for c in plan.candidates:
            if c.dropped is not None:
                continue
            guard = None
            if restrict and c.health.excluded_for_sensitive and ctx.klass.latency_sensitive \
                    and not c.health.quarantined:
                guard = tuple((names.setdefault(n, len(names)), limit)
                              for n, limit in _alternatives(ctx, c.name))
            reason = decision_reason(PipelineResult(c, plan.candidates, False, ()), ctx.model)
            rows.append(_Row(c.name, names.setdefault(c.name, len(names)),
                             c.cluster.max_concurrency, c.base, c.health.weight, guard, reason,
                             c.latency, c.scores.get("hold_s", 1.0),
                             c.scores.get(FLOOR_SHARE, 1.0)))
        if not rows:
            return None  # panic: the full stage picks the tier
        return cls(plan, ctx, picker, tuple(rows), tuple(names), plan.request_scorers[0][1])

    def pick(self, inflight: Callable[[str], int], rng: random.Random) -> LanePick | None:
        """Choose for one request (module docstring); None: the full stage must decide
        (a candidate is full, or the class restriction left none).

        Written for the compiled lab as well: float sums through
        :func:`~sidecar.core.live_latency.sum_in_order` (as the full stage adds), the
        minimum as a loop and powers as ``math.pow`` (the C ``pow`` that ``**`` calls
        for these positive bases) run as C arithmetic there, not as generic calls."""
        counts = tuple([inflight(name) for name in self.names])
        k = self.k_load
        beta = self.beta
        kept: list[int] = []
        shares: list[float] = []  # of the exploration floor
        weights: list[float] = []
        held: list[int] = []  # the queue score's inputs (only when beta)
        expected: list[float] = []
        top = 0.0
        for i, at, limit, base, health, guard, hold, share in self.hot:
            if guard is not None:
                # ClassRestriction's herding guard: leave only as fast as others have room.
                cap = free = 0
                for other, other_limit in guard:
                    cap += other_limit
                    room = other_limit - counts[other]
                    if room > 0:
                        free += room
                if cap and free >= HERD_HEADROOM * cap:
                    continue  # restricted for the class: dropped
                health = self.degraded
            n = counts[at]
            if n >= limit:
                return None  # capacity drops it: the full stage decides (no draw made)
            weight = base
            if k:
                load = 1.0 - n / limit
                if load < 0.02:
                    load = 0.02  # so max(load, 1e-6) is load itself
                weight *= math.pow(load, k)
            w = weight * health
            if w < 1e-9:
                w = 1e-9
            kept.append(i)
            shares.append(share)
            weights.append(w)
            if beta:
                held.append(n)
                expected.append(base * health * hold)
            if w > top:
                top = w
        if not kept:
            return None  # panic
        total_w = sum_in_order(expected)
        if beta and total_w > 0.0:
            # queue_scores() inlined, the same operations in the same order (it is
            # every 1.0 when no expected weight is positive: the weights stay as they are).
            total_held = 0
            for n in held:
                total_held += n
            scale = total_held / total_w
            xs = [(1.0 + n) / (1.0 + scale * e) for n, e in zip(held, expected, strict=True)]
            best = xs[0]
            for x in xs:
                if x < best:
                    best = x
            top = 0.0
            for j, x in enumerate(xs):
                w = weights[j] * math.pow(best / x, beta)
                if w < 1e-9:
                    w = 1e-9
                weights[j] = w
                if w > top:
                    top = w
        floor = self.explore_share * top
        for j, w in enumerate(weights):
            own = floor * shares[j]
            if w < own:
                weights[j] = own
        u = rng.random()
        x = u * sum_in_order(weights)
        chosen = kept[-1]
        for j, w in enumerate(weights):
            x -= w
            if x < 0:
                chosen = kept[j]
                break
        return LanePick(self, counts, tuple(kept), chosen, u)


def _alternatives(ctx: SelectionContext, name: str) -> list[tuple[str, int]]:
    """The routes the herding guard counts the room of, for candidate ``name``
    (as :class:`~sidecar.core.filters.ClassRestriction` selects them; health is
    the plan's)."""
    out = []
    for other in ctx.model.candidates:
        if other == name or not ctx.config.has_cluster(other):
            continue
        h = ctx.health_of(other)
        if h.excluded_for_sensitive or h.quarantined:
            continue
        out.append((other, ctx.config.cluster(other).max_concurrency))
    return out


class LanePick:
    """One request's choice through a :class:`RequestLane` (read-only).

    A plain slotted class, not a NamedTuple: one is made per request, and the
    compiled lab builds a native class without a Python-level ``__new__``."""

    __slots__ = ("chosen", "counts", "kept", "lane", "u")

    def __init__(self, lane: RequestLane, counts: tuple[int, ...], kept: tuple[int, ...],
                 chosen: int, u: float) -> None:
        self.lane = lane
        self.counts = counts  # the in-flight count of each of the lane's names, as read
        self.kept = kept  # rows that survived the per-request filters
        self.chosen = chosen  # the chosen row
        self.u = u  # the picker's uniform draw

    @property
    def name(self) -> str:
        return self.lane.rows[self.chosen].name

    @property
    def reason(self) -> str:
        return self.lane.rows[self.chosen].reason

    @property
    def chosen_latency(self) -> dict[str, LatencyValue]:
        """The chosen candidate's looked-up latencies (shared with the plan, read-only)."""
        return self.lane.rows[self.chosen].latency

    def result(self) -> PipelineResult:
        """The :class:`PipelineResult` :func:`~sidecar.core.pipeline.run_request` would
        have returned for this request: it runs again, on the in-flight counts the
        pick read and with the pick's draw (a new object each call)."""
        lane = self.lane
        counts = dict(zip(lane.names, self.counts, strict=True))
        ctx = replace(lane.ctx, view=_Counted(lane.ctx.view, counts))
        result = run_request(lane.plan, ctx, lane.picker, ReplayedDraw(self.u))
        assert result is not None and result.chosen.name == self.name
        return result


class _Counted:
    """A route view whose in-flight counts are a snapshot (the rest is the view's)."""

    def __init__(self, view: RouteView, counts: dict[str, int]) -> None:
        self._view, self._counts = view, counts

    def latency(self, cluster: str, slice: SliceKey, metric: str, percentile: float,
                now: float) -> LatencyValue:
        return self._view.latency(cluster, slice, metric, percentile, now)

    def evidence(self, cluster: str, slice: SliceKey, metric: str,
                 now: float) -> RouteEvidence | None:
        return self._view.evidence(cluster, slice, metric, now)

    def health(self, cluster: str, slice: SliceKey) -> HealthView:
        return self._view.health(cluster, slice)

    def inflight(self, cluster: str) -> int:
        return self._counts[cluster]

    def limit_note(self, cluster: str) -> str | None:
        return self._view.limit_note(cluster)  # as of now, not of the pick (counts are)


def full_result(result: PipelineResult | LanePick | None) -> PipelineResult | None:
    """The pipeline result behind a decision, rebuilt from a lane pick if need be."""
    return result.result() if isinstance(result, LanePick) else result


def chosen_latency(result: PipelineResult | LanePick | None) -> dict[str, LatencyValue] | None:
    """The latencies looked up for the chosen candidate (None without a pipeline result)."""
    if result is None:
        return None
    return result.chosen_latency if isinstance(result, LanePick) else result.chosen.latency
