"""Selection scorers. Each writes ``cand.scores[name]``, a goodness in (0, 1].

The pipeline combines them as ``w = health * prod_i s_i ** k_i`` with the
class's weights (latency weight for ``latency``, ``attainment`` and
``miss_ratio``; 1 for ``recurrence``). Only
:class:`Load` runs per request; the others once per plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from sidecar.core.evidence import with_prior
from sidecar.core.latency_aware import enabled_metrics, latency_aware_scores, partial_ratios
from sidecar.core.light_load import LIGHT, RECORD_MIN, floor_share, violation_share
from sidecar.core.selection import FLOOR_SHARE, Candidate, LatencyValue, Scorer, SelectionContext
from sidecar.core.steepness import latency_score

_NEUTRAL: Final = 1.0
# Health states that have not moved a route: the floor share applies only there (a
# moved route's traffic is the health machine's, which must see evidence to judge it).
UNMOVED: Final = frozenset({"healthy", "watching"})
SLO_TAIL: Final = "slo_tail"  # Candidate.latency key: the class metric at the SLO percentile
_NO_TAIL: Final = LatencyValue(None, None, False, 0)
# Attainment: the excess over the best route beyond SURE_Z standard errors (one-sided
# 95 %) counts 1 + the class's attainment_sharpen times (3: judged on a / 4).
SURE_Z: Final = 1.645
# MissRatio: shares below this fraction of the allowed share are not told apart by ratio.
MISS_RATIO_FLOOR: Final = 0.1


@dataclass(frozen=True, slots=True)
class LatencyRatio:
    """semantic-router ``latency_aware`` ratio score r >= 1, turned into goodness.

        s = r ** -E        E = 2 + (E_max - 2) n / (n + 50),  E_max = the class's
                           ``latency_exponent`` (default 2), n = the route's samples

    With the default a route 10 % slower than the best keeps 0.83 of its weight,
    twice as slow 1/4; with ``latency_exponent: 6`` and plenty of samples 0.56
    and 1/64 (:mod:`sidecar.core.steepness` says when that helps and what it
    costs). The class's ``weights.latency`` is this score's exponent in the
    product of scores, so a steep default would also reinterpret every class's
    weights: at 6, a tolerant class with latency weight 0.2 and cost weight 1.0
    left a cheap route ten times slower but far inside its budget (r ** -1.2),
    against the operator's stated preference. ``r`` judges a route on every metric
    it has data for, a metric it lacks counting as the worst route's
    (:func:`~sidecar.core.latency_aware.partial_ratios`; ``latency_ratio``, the
    informational score, keeps semantic-router's complete-data ratio). A route
    without any data scores like the worst route that has data (1.0 when none has):
    no evidence must not look like the best evidence (a route whose requests all
    fail or get cancelled has no samples). The pipeline's exploration floor still
    gives it traffic to earn data.
    """

    name: str = "latency"
    per_request: bool = False

    def __call__(self, ctx: SelectionContext, cands: list[Candidate]) -> None:
        metrics = enabled_metrics(ctx.model.latency_aware)
        values: dict[str, dict[str, float | None]] = {}
        samples: dict[str, int] = {}
        complete = True  # every candidate has a value for every metric
        for c in cands:
            values[c.name] = {}
            n = -1
            for metric, pct in metrics:
                lv = ctx.view.latency(c.name, ctx.request.slice, metric, pct, ctx.now)
                c.latency[f"{metric}_p{pct}"] = lv
                values[c.name][metric] = lv.value
                if lv.value is not None:
                    n = lv.samples if n < 0 else min(n, lv.samples)
                else:
                    complete = False
            samples[c.name] = max(n, 0)
        names, metric_names = [c.name for c in cands], [m for m, _ in metrics]
        # latency_ratio stays semantic-router's complete-data ratio (the lowest_score
        # picker's); the weight judges each route on every metric it has data for.
        ratios = partial_ratios(names, values, metric_names)
        # With complete data the two are one computation: the same sums in the same
        # order, so the same floats and keys (tests/test_latency_aware.py), and the
        # complete-data ratio is not worked out a second time.
        ratio_scores = ratios if complete else latency_aware_scores(
            names, values, metric_names).scores
        klass = ctx.klass
        scores: dict[str, float] = {}
        for name, ratio in ratios.items():
            scores[name] = latency_score(klass, ratio, samples[name])
        unknown = min(scores.values()) if scores else _NEUTRAL
        for c in cands:
            r = ratio_scores.get(c.name)
            c.scores["latency_ratio"] = r if r is not None else 0.0
            c.scores[self.name] = scores.get(c.name, unknown)


@dataclass(frozen=True, slots=True)
class Attainment:
    """Outcomes as evidence: how likely the route serves this request within budget.

    Per candidate, from its blended evidence (:mod:`sidecar.core.evidence`),
    for the class's SLO metric (e2e for a TTFT class served without streaming)::

        P   = p_ok * F(budget)                 errors, 429s and timeouts in p_ok
        P*  = with_prior(P, W, prior_samples, 1 - (1 - q/100))   thin evidence -> "just meets SLO"
        v   = 1 - P*                           the route's violation share
        n   = max(W, prior_samples)            the outcomes behind v (prior included)
        e   = v - v*                           the excess over the best route (v*, n*)
        se  = sqrt(v (1 - v) / n + v* (1 - v*) / n*)
        e+  = max(0, e - SURE_Z se)            the part of the excess chance cannot explain
        s   = exp(-(e + K e+) / a)             a = SelectionContext.step_allowed,
                                               K = the class's attainment_sharpen (3)

    so a route that misses one more allowed share ``a`` than the best one gets
    1/e of its weight while that could be chance, and down to 1/e^4 once the
    evidence is sure of it: for a p95 class a route failing fast on 30 % of its
    requests gets ~exp(-6) of a clean one's or less, two healthy routes 1 %
    apart ~0.8 of each other. The uniformly sharper scale (``a / 4`` for all of
    ``e``) concentrated more on generated scenarios, but it also moved traffic
    on noise: in the shipped ``burst_queueing`` routes 1-4 % apart in ``v``
    (about one standard error) got 5-20x different weights, the bursts piled
    onto the routes that looked best and admission turned more of them away
    (docs/policy-lab.md, "Sharper where the evidence is sure"). While a
    candidate refuses work by time (``SelectionContext.refusing``: a quota's or
    a declared wait's holds, :mod:`sidecar.core.pushback`) nothing counts
    sharper (``e+ = 0``): its refusals are a schedule, sure on average though
    the route serves well between them, and the others' evidence carries the
    load its holds moved (sharper, the lab hunt ``burst_429`` kept its fastest
    route cut between bursts). Native weights do not see holds and always
    sharpen.
    For a step of a k-way fan-out ``a`` is k times smaller
    (the workflow meets the worst of its k calls), and ``budget`` shrinks to
    the caller's remaining deadline. ``violation`` (v) and ``violation_n`` (n)
    are kept as informational scores, the class metric's tail at the SLO
    percentile as ``latency[SLO_TAIL]`` (admission reads them). The prior's
    pseudo-outcomes violate at exactly the allowed share, so ``v n`` counts the
    observed violations plus the prior's, and a confidence test on ``(v n, n)``
    is as conservative with thin evidence as with none.
    """

    name: str = "attainment"
    per_request: bool = False

    def __call__(self, ctx: SelectionContext, cands: list[Candidate]) -> None:
        slo = ctx.klass.slo
        metric = slo.metric
        if metric == "ttft" and ctx.request.slice.streaming is False:
            metric = "e2e"  # no first token to time: the whole answer is the first byte
        budget, a = ctx.step_budget_s, ctx.step_allowed
        neutral = slo.percentile / 100.0  # "just meets its SLO"
        m = ctx.config.stats.prior_samples
        slice, now = ctx.request.slice, ctx.now
        best, best_n = 1.0, float(m)
        for c in cands:
            ev = ctx.view.evidence(c.name, slice, metric, now)
            if ev is None:
                p = with_prior(None, 0.0, m, neutral)
                tail = _NO_TAIL
                n = float(m)
            else:
                p = with_prior(ev.p_within(budget), ev.evidence_weight, m, neutral)
                n = max(ev.evidence_weight, float(m))
                tail = LatencyValue(ev.quantile(slo.percentile / 100.0), ev.used, ev.fell_back,
                                    ev.samples)
            if metric == slo.metric:
                c.latency[SLO_TAIL] = tail
            v = min(max(1.0 - p, 0.0), 1.0)
            c.scores["violation"] = v
            c.scores["violation_n"] = n
            if v < best:
                best, best_n = v, n
        spread = best * (1.0 - best) / best_n  # the best route's own standard error, squared
        sharpen = 0.0 if ctx.refusing else ctx.klass.attainment_sharpen
        for c in cands:
            v, n = c.scores["violation"], c.scores["violation_n"]
            e = v - best
            sure = max(0.0, e - SURE_Z * math.sqrt(v * (1.0 - v) / n + spread)) if sharpen else 0.0
            c.scores[self.name] = max(math.exp(-(e + sharpen * sure) / a), 1e-6)
        if ctx.light is not None:
            floor_shares(ctx, cands, a)


def floor_shares(ctx: SelectionContext, cands: list[Candidate], a: float) -> None:
    """Each candidate's share of the exploration floor (``scores["floor"]``, only
    where below 1), from its outcomes under light load: ``f`` of
    :mod:`sidecar.core.light_load`, ``a`` the step's allowed violation share. A route
    never seen under light load keeps the whole floor (a new route must be explored),
    though its prior still counts as the best when no route has done better."""
    assert ctx.light is not None
    slice, now = ctx.request.slice, ctx.now
    counts = [ctx.light.counts(c.name, slice, now) for c in cands]
    vs = [violation_share(x, n, a) for x, n in counts]
    best = min(vs)
    for c, v, (_, n) in zip(cands, vs, counts, strict=True):
        if n <= 0.0:
            continue
        f = floor_share(v, best, a)
        if f < 1.0 and c.health.state in UNMOVED:
            c.scores[FLOOR_SHARE] = f


@dataclass(frozen=True, slots=True)
class MissRatio:
    """How many times as often the route misses its budget as the best route does::

        s = ((v* + f a) / (v + f a)) ** g     v: the route's violation share under light load
                                              (:mod:`sidecar.core.light_load`, "The record"),
                                              v* the best candidate's, a the step's allowed
                                              share, f = MISS_RATIO_FLOOR, g = the class's
                                              miss_ratio_exponent (1; 0 turns it off)

        applied only while  inflight(best) < LIGHT x max_concurrency(best)

    The attainment score judges an excess on the scale of the allowed share, so
    routes that all meet their SLO stay close: one missing on 1 % of its requests
    keeps 0.82 of a clean route's weight. Yet every request over budget counts, and
    per request that route costs ten times what one missing on 0.1 % does; herding
    baselines won the generated scenarios of that kind (a clean route with room
    beside slower ones whose tails now and then cross the budget) by sending it
    everything. At ``g = 1`` the route above keeps a third of the clean one's weight
    (0.5 / 1.5 for a p95 class), one missing on 3 % of its requests 14 %. ``f a``
    (0.5 % for a p95 class) keeps shares far below the allowed one from counting as
    ratios of a handful of misses (0.1 % against none: 0.83).

    **Only while the best route is light.** The record holds light outcomes only:
    what a route does with more traffic once it queues is not in it. So the score
    moves traffic to the route with the fewest misses only while that route has more
    than half its slots free (``LIGHT``, as the record's own test; its in-flight
    count when the plan is built). Without that, in the shipped ``flapping`` it moved
    traffic from provider-c, which missed now and then, onto provider-b, which did not
    but was loaded, and the scenario rose 7 % (docs/policy-lab.md, "The miss-ratio
    score on by default").

    Only routes whose record holds ``RECORD_MIN`` light outcomes or more are compared
    (an empty record is no evidence: the prior's share ``a`` would cut a route that
    is seldom light to a tenth), and only routes the health machine has not moved are
    scored (a moved route's weight is its ladder's). Written only where below 1, so
    a plan whose routes miss alike looks as it did. Exponent: the class's latency
    weight, as the attainment score's. Standalone only: fleet mode has no light-load
    book (as for the floor), and native mode has no send-time load, so no record."""

    name: str = "miss_ratio"
    per_request: bool = False

    def __call__(self, ctx: SelectionContext, cands: list[Candidate]) -> None:
        g, light = ctx.klass.miss_ratio_exponent, ctx.light
        if not g or light is None or not cands:
            return
        a, slice, now = ctx.step_allowed, ctx.request.slice, ctx.now
        floor = MISS_RATIO_FLOOR * a
        known: list[tuple[Candidate, float]] = []
        for c in cands:
            x, n = light.record(c.name, slice, now)
            if n >= RECORD_MIN:
                known.append((c, violation_share(x, n, a) + floor))
        if len(known) < 2:
            return
        top, best = min(known, key=lambda cv: cv[1])  # the first of equals, as before
        if ctx.view.inflight(top.name) >= LIGHT * max(top.cluster.max_concurrency, 1):
            return  # the best route is no longer light: its record says nothing of more
        for c, v in known:
            if v > best and c.health.state in UNMOVED:
                c.scores[self.name] = (best / v) ** g


@dataclass(frozen=True, slots=True)
class Recurrence:
    """Repeat-offender memory of live misses (:mod:`sidecar.core.live_misses`)::

        s = relapse_factor ** (n - 1)     n = episodes of missing its budget begun
                                          in the last forgive_after_s (1 for n <= 1)

    Exponent 1 whatever the class weights (it is health, not a preference). Written
    only where below 1, so a plan without relapses looks as it did."""

    name: str = "recurrence"
    per_request: bool = False

    def __call__(self, ctx: SelectionContext, cands: list[Candidate]) -> None:
        recurrence = ctx.recurrence
        if recurrence:
            for c in cands:
                s = recurrence.get(c.name)
                if s is not None:
                    c.scores[self.name] = s


@dataclass(frozen=True, slots=True)
class Cost:
    """Cheaper is better: ``s = min_cost / cost`` over the candidates (free = 1)."""

    name: str = "cost"
    per_request: bool = False

    def __call__(self, ctx: SelectionContext, cands: list[Candidate]) -> None:
        cheapest = min(c.cluster.cost_per_1k_tokens for c in cands)
        for c in cands:
            cost = c.cluster.cost_per_1k_tokens
            c.scores[self.name] = 1.0 if cost <= 0 else max(cheapest, 1e-9) / cost


@dataclass(frozen=True, slots=True)
class Quality:
    """Configured quality relative to the best candidate: ``s = q / max_q``."""

    name: str = "quality"
    per_request: bool = False

    def __call__(self, ctx: SelectionContext, cands: list[Candidate]) -> None:
        best = max(c.cluster.quality for c in cands)
        for c in cands:
            c.scores[self.name] = 1.0 if best <= 0 else max(c.cluster.quality / best, 1e-3)


@dataclass(frozen=True, slots=True)
class Load:
    """Spare capacity: ``s = max(1 - inflight / max_concurrency, 0.02)``; its exponent in
    the product is the class's capacity weight times
    :func:`sidecar.core.steepness.load_factor` (1 by default)."""

    name: str = "load"
    per_request: bool = True

    def __call__(self, ctx: SelectionContext, cands: list[Candidate]) -> None:
        for c in cands:
            used = ctx.view.inflight(c.name) / c.cluster.max_concurrency
            c.scores[self.name] = max(1.0 - used, 0.02)


DEFAULT_SCORERS: Final[tuple[Scorer, ...]] = (
    LatencyRatio(), Attainment(), MissRatio(), Recurrence(), Cost(), Quality(), Load())
