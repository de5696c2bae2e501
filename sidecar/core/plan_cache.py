"""Cached selection plans: the static stage once per refresh, not once per request.

The static stage of the selection pipeline (:func:`~sidecar.core.pipeline.build_plan`:
health views, blended evidence, latency, attainment, cost and quality scores)
depends on the request only through its model, slice, step budget and
fan-out, so the router caches its result per such key as a :class:`CachedPlan`.
A cached plan is current while::

    board version and stats layout unchanged       (health or the series set moved: rebuild)
    and (uses < PLAN_REUSE and age < PLAN_SUBWINDOWS sub-windows
         or age < the whole window and none of its series saw an observation since)

so its evidence is at most two sub-windows old at low rates (where that is a
handful of requests) and a few dozen decisions old at high ones. Hard failures
do not wait for a refresh: the fast path changes health, which moves the board
version. Step budgets are keyed in ~5 % steps on a log scale, so a workflow's
shrinking deadline shares plans with its neighbours.

Probes belong to the plan too: which routes take a small share of the slice's
traffic to show recovery (:func:`probes`), as does the route whose open run of hard
failures is on trial (:func:`trial_route`).

**Evidence and admission.** A probe or a trial goes where evidence is needed, not
where the scores point, so admission, which judges a request on the routes its
selection offered, saw only the evidence route -- typically over budget, since that
is why it is probed or on trial -- and deferred a low-priority request as if every
route were. A trial that never went out kept the next request's trial due, so the
class was deferred for as long as the run stayed open (family seed 307's
`error_mix-s307-003`: 58 batch requests rejected while three healthy routes held 8-41
of their slots). So a request admission may refuse (below
``admission.shed_below_priority``) carries no evidence to a route that admission,
judging it there alone, would find over the class's budget
(:meth:`~sidecar.core.admission.AdmissionControl.over`): it takes the scores' route
instead, and the evidence comes from the classes admission does not refuse. Admitted
to the evidence route instead, such requests failed there, and in the lab that cost
more than their evidence bought (`error_mix-s7-007`: 61 -> 85 violations). The same
holds for a request with a deadline, whatever its priority: judged on a slow evidence
route alone, it was rejected as ``deadline_unreachable`` ("best route needs 5930ms"
beside routes needing one second) instead of moved, and again at every request while
the trial stayed due. It carries evidence only to a route whose e2e median and tail
fit what is left (:meth:`~sidecar.core.admission.AdmissionControl.fits`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Final

from sidecar.core.config import ClassConfig, Config, ModelConfig, StatsConfig
from sidecar.core.health_board import HealthBoard
from sidecar.core.request_lane import RequestLane
from sidecar.core.selection import Plan, SelectionContext
from sidecar.core.series import RouteStats
from sidecar.core.types import Decision, RequestInfo, SliceKey
from sidecar.core.viability import probe_share

PLAN_REUSE: Final = 48  # decisions a plan serves before new evidence is folded in
PLAN_SUBWINDOWS: Final = 2  # sub-windows a plan may serve before new evidence is folded in
# Plans kept before the cache starts over. Not bounded by config alone: a key also holds
# the caller's deadline (in ~5 % steps) and fan-out (1..256), so clients that vary both
# make most requests build a plan (4,000 builds in 5,000 such requests: 341 against
# 146 us a decision, in memory); bounded in cost per request, not in requests.
PLAN_CACHE_MAX: Final = 4096
LOW_VARIANTS_MAX = 1024  # decisions whose low variant is kept (LowVariants)
BUDGET_STEPS_PER_E: Final = 20  # step budgets are cached in ~5 % steps (log scale)

#: (model, slice, step budget key or None for the class's, fan-out)
PlanKey = tuple[str, SliceKey, int | None, int]


@dataclass(slots=True)
class Probe:
    """A route that takes ``share`` of a slice's traffic as probes."""

    cluster: str
    share: float


@dataclass(slots=True)
class CachedPlan:
    """A plan and what it was built from (see the module docstring)."""

    plan: Plan
    ctx: SelectionContext
    probes: tuple[Probe, ...]
    built: float
    uses: int
    board: int
    layout: int
    deps: tuple[RouteStats, ...]
    versions: tuple[int, ...]
    lane: RequestLane | None  # the per-request stage as arithmetic, when exact
    # Decisions without explain are a function of (cluster, reason) for a plan: reused.
    decisions: dict[tuple[str, str], Decision] = field(default_factory=dict)


def step_key(req: RequestInfo, klass: ClassConfig) -> tuple[int | None, int]:
    """Plan key parts of a request's step: budget (None: the class's) and fan-out."""
    fanout = max(1, min(req.fanout, 256))
    budget_ms = klass.slo.budget_ms
    if req.deadline_ms is None or req.deadline_ms >= budget_ms:
        return None, fanout
    return round(math.log(max(req.deadline_ms, 1.0) / 1000.0) * BUDGET_STEPS_PER_E), fanout


def step_budget_s(budget_key: int | None) -> float | None:
    """The step budget a key stands for, in seconds (None: the class's)."""
    return None if budget_key is None else math.exp(budget_key / BUDGET_STEPS_PER_E)


class PlanCache:
    """The current plan per :data:`PlanKey` (module docstring for "current")."""

    __slots__ = ("entries", "max_age_s", "refresh_s")

    def __init__(self, stats: StatsConfig) -> None:
        self.entries: dict[PlanKey, CachedPlan] = {}
        self.refresh_s = self.max_age_s = 0.0
        self.configure(stats)

    def configure(self, stats: StatsConfig) -> None:
        """Forget every plan and take the window lengths of ``stats``."""
        self.entries.clear()
        self.refresh_s = stats.subwindow_s * PLAN_SUBWINDOWS
        self.max_age_s = stats.subwindow_s * stats.subwindows

    def clear(self) -> None:
        self.entries.clear()

    def current(self, key: PlanKey, board: int, layout: int, now: float) -> CachedPlan | None:
        """The cached plan for ``key`` if it is still current (counting this use)."""
        hit = self.entries.get(key)
        if hit is None or hit.board != board or hit.layout != layout:
            return None
        hit.uses += 1
        age = now - hit.built
        if hit.uses < PLAN_REUSE and age < self.refresh_s:
            return hit
        if age < self.max_age_s and all(
                rs.version == v for rs, v in zip(hit.deps, hit.versions, strict=True)):
            hit.uses = 0  # nothing observed since: still current
            return hit
        return None

    def store(self, key: PlanKey, cached: CachedPlan) -> None:
        if len(self.entries) >= PLAN_CACHE_MAX:
            self.entries.clear()
        self.entries[key] = cached


class LowVariants:
    """``replace(decision, low=True)``, kept per decision object: a plan reuses its
    decisions (:attr:`CachedPlan.decisions`), so admitted low-priority requests
    would otherwise pay ``dataclasses.replace`` -- more than the rest of a
    decision -- for the same answer each time. Bounded: starts over at
    :data:`LOW_VARIANTS_MAX` entries."""

    __slots__ = ("_memo",)

    def __init__(self) -> None:
        # id(decision) -> (decision, its low variant); the entry keeps the decision
        # alive, so its id cannot be reused by another object while it is here.
        self._memo: dict[int, tuple[Decision, Decision]] = {}

    def of(self, decision: Decision) -> Decision:
        if decision.explain is not None:  # made for one request: nothing to reuse
            return replace(decision, low=True)
        memo = self._memo
        hit = memo.get(id(decision))
        if hit is not None and hit[0] is decision:
            return hit[1]
        low = replace(decision, low=True)
        if len(memo) >= LOW_VARIANTS_MAX:
            memo.clear()
        memo[id(decision)] = (decision, low)
        return low


def probes(board: HealthBoard, config: Config, slice: SliceKey, klass: ClassConfig,
           model: ModelConfig, price: Callable[[str], float] | None = None
           ) -> tuple[Probe, ...]:
    """Where a small share of a slice's traffic goes as probes.

    Probes go to routes whose cooldown has ended (probing; the cluster-wide
    entry or the slice's) and, for latency-sensitive classes, to restricted
    routes (the slice's entry or the cluster-wide one), which otherwise see
    no such traffic and could never show recovery. Shares shrink with the
    route's relapses; capacity still applies.

    ``price`` (the router's light-load book) scales a restricted route's share the
    way the exploration floor is scaled for an unmoved one
    (:func:`~sidecar.core.light_load.route_price`): probes to a route that keeps
    missing under light load cost what the floor may, down to a quarter of the
    share (``PROBE_PRICE_MIN``: the probes are its only way back), so a restricted
    route does not see much more of the slice than a watching one would. A
    probing circuit keeps its share (its probes decide the cooldown's end).
    """
    out: list[Probe] = []
    for c in model.candidates:
        share = probe_share(board, config, c, slice, klass.latency_sensitive, price)
        if share is not None:
            out.append(Probe(c, share))
    return tuple(out)


def trial_route(cached: CachedPlan, board: HealthBoard, slice: SliceKey, now: float,
                has_room: Callable[[str], bool]) -> str | None:
    """The route, if any, whose open run is on trial with no trial pending (trial pace,
    :mod:`sidecar.core.health`): it takes this request, so a dead route is judged
    within its ``K`` requests whatever share the scores left it. Only a route no
    static filter dropped, and with room."""
    for cand in cached.plan.candidates:
        c = cand.name
        if cand.dropped is None and board.trial_due(c, slice, now) and has_room(c):
            return c
    return None
