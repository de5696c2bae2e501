"""Selection pipeline: filters -> scorers -> one picker.

Shape (after the Gateway API Inference Extension's scheduler):

1. **Filters** (``sidecar.core.filters``) run in order; each returns ``None``
   to keep a candidate or a short reason to drop it. Mandatory filters come
   first (model served, region policy), then health (quarantine, class
   restriction), then capacity.
2. If every candidate is dropped by a *soft* filter (health, capacity), the
   pipeline enters **panic mode**: it serves the least-bad tier (routes whose
   circuit is closed, else all) and says so; scoring, health weights and the
   load score then spread traffic across that tier instead of herding it onto
   one route. Hard filters (model served, region) are never relaxed.
3. **Scorers** (``sidecar.core.scorers``) give each survivor a goodness in
   (0, 1] per dimension.
4. The candidate's **weight** combines them log-linearly with the class's
   weights: ``w = health * prod_i s_i ** k_i``; a class weight k_i = 0 ignores
   the dimension. Each survivor keeps at least ``probe_share x max w``
   (exploration floor) so its statistics stay fresh.
5. One **picker** (``sidecar.core.pickers``) chooses, with the injected RNG.

Everything here is pure: the route view supplies statistics, health and load
as of ``now``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Protocol

from sidecar.core.config import ClassConfig, ClusterConfig, Config, ModelConfig
from sidecar.core.types import RequestInfo, SliceKey


@dataclass(frozen=True, slots=True)
class LatencyValue:
    """A percentile looked up through the slice hierarchy."""

    value: float | None  # seconds
    used: SliceKey | None
    fell_back: bool
    samples: int


@dataclass(frozen=True, slots=True)
class HealthView:
    """What selection needs from one route's health state."""

    state: str
    weight: float  # 0..1, already resolved for the slice's class
    excluded_for_sensitive: bool  # restricted: latency-sensitive classes must not use it
    quarantined: bool  # circuit open (includes probing, except chosen probes)


class RouteView(Protocol):
    """Read-only view of routes as of ``now`` (implemented by the router)."""

    def latency(
        self, cluster: str, slice: SliceKey, metric: str, percentile: float, now: float
    ) -> LatencyValue: ...

    def health(self, cluster: str, slice: SliceKey) -> HealthView: ...

    def inflight(self, cluster: str) -> int: ...


@dataclass(slots=True)
class Candidate:
    """One cluster as it moves through the pipeline (mutable scratch state)."""

    cluster: ClusterConfig
    health: HealthView
    verdicts: dict[str, str] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)
    latency: dict[str, LatencyValue] = field(default_factory=dict)
    weight: float = 1.0
    dropped: str | None = None  # the first filter that rejected it, if any
    soft_drop: bool = False

    @property
    def name(self) -> str:
        return self.cluster.name


@dataclass(frozen=True, slots=True)
class SelectionContext:
    """Everything a filter, scorer or picker may consult."""

    config: Config
    model: ModelConfig
    klass: ClassConfig
    request: RequestInfo
    view: RouteView
    now: float


class Filter(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def soft(self) -> bool: ...


    def __call__(self, ctx: SelectionContext, cand: Candidate) -> str | None: ...


class Scorer(Protocol):
    @property
    def name(self) -> str: ...


    def __call__(self, ctx: SelectionContext, cands: list[Candidate]) -> None: ...


class Picker(Protocol):
    @property
    def name(self) -> str: ...


    def __call__(
        self, ctx: SelectionContext, cands: list[Candidate], rng: random.Random
    ) -> Candidate: ...


@dataclass(frozen=True, slots=True)
class PipelineResult:
    chosen: Candidate
    candidates: tuple[Candidate, ...]
    panic: bool
    notes: tuple[str, ...]


# Panic tiers by the soft filter that dropped a candidate: lower is less bad.
_PANIC_TIER = {"capacity": 0, "class_restriction": 1, "quarantine": 2}


def _apply_exploration_floor(cands: list[Candidate], floor: float) -> None:
    """Every surviving route keeps at least ``floor x`` the best weight.

    Without it a route that was slow once would get almost no traffic, its
    statistics would never refresh, and neither the health machine nor the
    latency score could see it recover. Routes the health machine excluded
    never get here (they are filtered; probes reach them instead).
    """
    best = max(c.weight for c in cands)
    for c in cands:
        c.weight = max(c.weight, floor * best)


def run_pipeline(
    ctx: SelectionContext,
    filters: tuple[Filter, ...],
    scorers: tuple[Scorer, ...],
    picker: Picker,
    rng: random.Random,
) -> PipelineResult | None:
    """Run the pipeline; None only when hard filters leave nothing (caller uses the default)."""
    cands = [
        Candidate(ctx.config.cluster(n), ctx.view.health(n, ctx.request.slice))
        for n in ctx.model.candidates
        if ctx.config.has_cluster(n)
    ]
    for cand in cands:
        for f in filters:
            verdict = f(ctx, cand)
            if verdict is None:
                cand.verdicts[f.name] = "pass"
                continue
            cand.verdicts[f.name] = verdict
            cand.dropped = f.name
            cand.soft_drop = f.soft
            break
    survivors = [c for c in cands if c.dropped is None]
    notes: list[str] = []
    panic = False
    if not survivors:
        soft = [c for c in cands if c.soft_drop]
        if not soft:
            return None
        # Panic: never leave a class without a route. Serve the least-bad tier
        # (healthy but full, then restricted, then circuit open) and let scoring
        # spread the load across it: sending the whole class to one route herds.
        best = min(_PANIC_TIER.get(c.dropped or "", 9) for c in soft)
        survivors = [c for c in soft if _PANIC_TIER.get(c.dropped or "", 9) == best]
        panic = True
        names = ", ".join(c.name for c in survivors)
        notes.append(f"panic: every candidate was excluded; serving least-bad tier {names}")
    for s in scorers:
        s(ctx, survivors)
    w = ctx.klass.weights
    # Scores not listed here (e.g. the raw "latency_ratio") are informational only.
    exponents = {"latency": w.latency, "headroom": w.latency, "cost": w.cost,
                 "quality": w.quality, "load": w.capacity}
    for cand in survivors:
        weight = 1.0
        for name, k in exponents.items():
            score = cand.scores.get(name)
            if score is not None and k:
                weight *= max(score, 1e-6) ** k
        # The view already resolved the health weight for this class (tolerant
        # classes ignore latency states, never an open circuit).
        cand.weight = max(weight * cand.health.weight, 1e-9)
    _apply_exploration_floor(survivors, ctx.config.health.probe_share)
    chosen = picker(ctx, survivors, rng)
    return PipelineResult(chosen, tuple(cands), panic, tuple(notes))
