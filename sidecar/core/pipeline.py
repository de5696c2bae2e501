"""Selection pipeline: filters -> scorers -> one picker, in two stages.

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
3. **Scorers** (``sidecar.core.scorers``) give each candidate a goodness in
   (0, 1] per dimension.
4. The candidate's **weight** combines them log-linearly with the class's
   weights: ``w = health * prod_i s_i ** k_i``; a class weight k_i = 0 ignores
   the dimension (:func:`exponent_of` maps scores to class weights); routes
   clearly worse than the best pool that static weight, so their number does not
   add up against it (:mod:`sidecar.core.pooling`). Then the
   live latency score ``q = (min x / x) ** weights.queue`` from the in-flight
   counts against the static weights (:mod:`sidecar.core.live_latency`)
   multiplies each survivor's weight. Each survivor keeps at least
   ``explore_share x max w`` (exploration floor) so its statistics stay fresh --
   or its share ``f`` of that when it misses its budget more than the best
   route under light load (:mod:`sidecar.core.light_load`).
5. One **picker** (``sidecar.core.pickers``) chooses, with the injected RNG.

**Stages.** Filters and scorers that read only statistics and health
(``per_request = False``) run once per :class:`~sidecar.core.selection.Plan` -- per (model, slice,
step budget, fan-out) and evidence refresh, see :class:`~sidecar.core.router.Router`
-- on every candidate a hard filter kept. The rest (capacity, the herding
guard, load: they read in-flight counts) run per request on a light copy of
the plan's candidates (:func:`run_request`). Scorers are relative to the
best candidate they see; scoring the static stage over a superset of the
final survivors scales every survivor's weight by the same factor, which
neither the picker nor the exploration floor can tell apart.
:func:`run_pipeline` runs both stages at once.

Everything here is pure: the route view supplies statistics, health and load
as of ``now``. The types the stages share (candidate, context, route view,
protocols, plan, result) are in :mod:`sidecar.core.selection`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Final

from sidecar.core.config import ClassConfig
from sidecar.core.live_latency import queue_scores
from sidecar.core.pooling import pool_worse
from sidecar.core.selection import (
    FLOOR_SHARE,
    Candidate,
    Filter,
    Picker,
    PipelineResult,
    Plan,
    Scorer,
    SelectionContext,
)
from sidecar.core.steepness import load_factor


def exponent_of(klass: ClassConfig) -> dict[str, float]:
    """Exponent per score name: the class weight (the load score's steepened by
    :func:`sidecar.core.steepness.load_factor`; ``recurrence``, repeat-offender
    memory, always 1). Scores not listed (e.g. the raw
    ``latency_ratio``, ``violation``) are informational only."""
    weights = klass.weights
    return {"latency": weights.latency, "attainment": weights.latency,
            "miss_ratio": weights.latency, "cost": weights.cost,
            "quality": weights.quality, "load": weights.capacity * load_factor(klass),
            "recurrence": 1.0}


# Panic tiers by the soft filter that dropped a candidate: lower is less bad.
_PANIC_TIER: Final = {"capacity": 0, "class_restriction": 1, "live_misses": 2, "failure_run": 3,
                      "quarantine": 4}


def panic_tier(cands: Sequence[Candidate]) -> list[Candidate]:
    """Panic: never leave a class without a route. Serve the least-bad tier of
    the soft-dropped candidates (healthy but full, then restricted, then missing its
    budget now, then held by an open failure run, then circuit open) and let
    scoring spread the load across it: sending the whole class to one route herds."""
    soft = [c for c in cands if c.soft_drop]
    best = min((_PANIC_TIER.get(c.dropped or "", 9) for c in soft), default=9)
    return [c for c in soft if _PANIC_TIER.get(c.dropped or "", 9) == best]


def _filter(
    ctx: SelectionContext, cand: Candidate, filters: tuple[Filter, ...], record_pass: bool
) -> bool:
    """Runs ``filters`` on ``cand`` until one drops it; True when none did."""
    for f in filters:
        verdict = f(ctx, cand)
        if verdict is None:
            if record_pass:
                cand.note(f.name, "pass")
            continue
        cand.note(f.name, verdict)
        cand.dropped = f.name
        cand.soft_drop = f.soft
        return False
    return True


def build_plan(
    ctx: SelectionContext, filters: tuple[Filter, ...], scorers: tuple[Scorer, ...]
) -> Plan:
    """The static stage: static filters on every candidate, static scorers on
    every candidate no hard filter dropped, and their product as ``base``."""
    static_filters = tuple(f for f in filters if not f.per_request)
    cands = [
        Candidate(ctx.config.cluster(n), ctx.view.health(n, ctx.request.slice))
        for n in ctx.model.candidates
        if ctx.config.has_cluster(n)
    ]
    for cand in cands:
        _filter(ctx, cand, static_filters, True)
    eligible = [c for c in cands if c.dropped is None or c.soft_drop]
    exps = exponent_of(ctx.klass)
    if eligible:
        for s in scorers:
            if not s.per_request:
                s(ctx, eligible)
        for cand in eligible:
            base = 1.0
            for name, score in cand.scores.items():
                k = exps.get(name)
                if k:
                    base *= max(score, 1e-6) ** k
            cand.base = base
        # Among the routes a static filter left (not the soft-dropped ones panic may serve).
        # Only with live counts: pooling concentrates, and the queue score is what
        # spills a burst off the best route; weights Envoy applies for a whole window
        # (native mode) have no such correction and piled bursts onto it.
        if ctx.klass.pool_worse and ctx.live_counts:
            pool_worse([c for c in eligible if c.dropped is None])
        if ctx.queue_weight:
            _hold_times(ctx, eligible)
    request_scorers = tuple((s, exps.get(s.name, 0.0)) for s in scorers if s.per_request)
    request_filters = tuple(f for f in filters if f.per_request)
    return Plan(tuple(cands), tuple(eligible), request_filters, request_scorers,
                tuple(f.name for f in request_filters))


def _hold_times(ctx: SelectionContext, cands: Sequence[Candidate]) -> None:
    """``scores["hold_s"]``: how long a request holds a slot on the route, the median of
    its end-to-end time in this slice (the queue score's expected in-flight weight); a
    route without that evidence gets the mean of those with it (1 s when none has)."""
    slice, now = ctx.request.slice, ctx.now
    known: list[float] = []
    for c in cands:
        ev = ctx.view.evidence(c.name, slice, "e2e", now)
        hold = ev.quantile(0.5) if ev is not None else None
        if hold is not None and hold > 0:
            c.scores["hold_s"] = hold
            known.append(hold)
    typical = sum(known) / len(known) if known else 1.0
    for c in cands:
        c.scores.setdefault("hold_s", typical)


def run_request(
    plan: Plan,
    ctx: SelectionContext,
    picker: Picker,
    rng: random.Random,
) -> PipelineResult | None:
    """The per-request stage on a copy of ``plan``; None only when hard filters
    left nothing (the caller uses the default route)."""
    if not plan.eligible:
        return None
    request_filters = plan.request_filters
    cands = [c.for_request() for c in plan.candidates]
    survivors: list[Candidate] = []
    for cand in cands:
        # The filter's answer, not a second look at cand.dropped: a type checker
        # (and the compiled build) take that attribute as still None here.
        if cand.dropped is None and _filter(ctx, cand, request_filters, False):
            survivors.append(cand)
    notes: tuple[str, ...] = ()
    panic = False
    if not survivors:
        survivors = panic_tier(cands)
        panic = True
        names = ", ".join(c.name for c in survivors)
        notes = (f"panic: every candidate was excluded; serving least-bad tier {names}",)
    for s, _ in plan.request_scorers:
        s(ctx, survivors)
    top = 0.0
    for cand in survivors:
        weight = cand.base
        for s, k in plan.request_scorers:
            if k:
                weight *= max(cand.scores[s.name], 1e-6) ** k
        # The view already resolved the health weight for this class (tolerant
        # classes ignore latency states, never an open circuit).
        cand.weight = w = max(weight * cand.health.weight, 1e-9)
        if w > top:
            top = w
    beta = ctx.queue_weight
    if beta:
        top = _apply_queue(ctx, survivors, beta)
    # Exploration floor: every survivor keeps at least health.explore_share x the best weight.
    # Without it a route that was slow once would get almost no traffic, its
    # statistics would never refresh, and neither the health machine nor the
    # latency score could see it recover. Routes the health machine excluded
    # never get here (they are filtered; probes reach them instead).
    # A route keeps only its share of it (scores["floor"], sidecar.core.light_load)
    # when it violates more than the best under light load: that excess is its own.
    floor = ctx.config.health.explore_share * top
    for cand in survivors:
        own = floor * cand.scores.get(FLOOR_SHARE, 1.0)
        if cand.weight < own:
            cand.weight = own
    chosen = picker(ctx, survivors, rng)
    return PipelineResult(chosen, tuple(cands), panic, notes, plan.request_filter_names)


def _apply_queue(ctx: SelectionContext, survivors: list[Candidate], beta: float) -> float:
    """Multiply each survivor's weight by its live latency score (the ``queue``
    score, :mod:`sidecar.core.live_latency`); returns the new top weight."""
    counts = [ctx.view.inflight(c.name) for c in survivors]
    expected = [c.base * c.health.weight * c.scores["hold_s"] for c in survivors]
    top = 0.0
    for cand, q in zip(survivors, queue_scores(counts, expected, beta), strict=True):
        cand.scores["queue"] = q
        cand.weight = w = max(cand.weight * q, 1e-9)
        if w > top:
            top = w
    return top


def run_pipeline(
    ctx: SelectionContext,
    filters: tuple[Filter, ...],
    scorers: tuple[Scorer, ...],
    picker: Picker,
    rng: random.Random,
) -> PipelineResult | None:
    """Both stages at once; None only when hard filters leave nothing."""
    return run_request(build_plan(ctx, filters, scorers), ctx, picker, rng)
