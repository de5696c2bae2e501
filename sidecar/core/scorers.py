"""Selection scorers. Each writes ``cand.scores[name]``, a goodness in (0, 1].

The pipeline combines them as ``w = health * prod_i s_i ** k_i`` with the
class's weights (latency weight for ``latency`` and ``headroom``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.core.latency_aware import enabled_metrics, latency_aware_scores
from sidecar.core.pipeline import Candidate, Scorer, SelectionContext

_NEUTRAL = 1.0


@dataclass(frozen=True, slots=True)
class LatencyRatio:
    """semantic-router ``latency_aware`` ratio score r >= 1, turned into goodness.

        s = 1 / r ** 2

    so a route twice as slow as the best gets a quarter of the weight. A route
    without data scores like the worst route that has data (1.0 when none has):
    no evidence must not look like the best evidence (a route whose requests
    all fail or get cancelled has no samples). The pipeline's exploration floor
    still gives it traffic to earn data.
    """

    name: str = "latency"

    def __call__(self, ctx: SelectionContext, cands: list[Candidate]) -> None:
        metrics = enabled_metrics(ctx.model.latency_aware)
        values: dict[str, dict[str, float | None]] = {}
        for c in cands:
            values[c.name] = {}
            for metric, pct in metrics:
                lv = ctx.view.latency(c.name, ctx.request.slice, metric, pct, ctx.now)
                c.latency[f"{metric}_p{pct}"] = lv
                values[c.name][metric] = lv.value
        result = latency_aware_scores([c.name for c in cands], values, [m for m, _ in metrics])
        known = [1.0 / (r * r) for r in result.scores.values()]
        unknown = min(known) if known else _NEUTRAL
        for c in cands:
            r = result.scores.get(c.name)
            c.scores["latency_ratio"] = r if r is not None else 0.0
            c.scores[self.name] = unknown if r is None else 1.0 / (r * r)


@dataclass(frozen=True, slots=True)
class SloHeadroom:
    """How much of the class's SLO budget the route's tail leaves free.

        h = clamp((budget - tail) / budget, 0, 1);   s = 0.05 + 0.95 * h

    ``tail`` is the class's SLO metric at the SLO percentile. No data: like the
    worst candidate with data (neutral when none has data).
    """

    name: str = "headroom"

    def __call__(self, ctx: SelectionContext, cands: list[Candidate]) -> None:
        slo = ctx.klass.slo
        budget = slo.budget_ms / 1000.0
        missing: list[Candidate] = []
        for c in cands:
            lv = ctx.view.latency(c.name, ctx.request.slice, slo.metric, slo.percentile, ctx.now)
            c.latency[f"slo_{slo.metric}_p{slo.percentile:g}"] = lv
            if lv.value is None:
                missing.append(c)
                continue
            h = min(max((budget - lv.value) / budget, 0.0), 1.0)
            c.scores[self.name] = 0.05 + 0.95 * h
        known = [c.scores[self.name] for c in cands if c not in missing]
        for c in missing:
            c.scores[self.name] = min(known) if known else _NEUTRAL


@dataclass(frozen=True, slots=True)
class Cost:
    """Cheaper is better: ``s = min_cost / cost`` over the candidates (free = 1)."""

    name: str = "cost"

    def __call__(self, ctx: SelectionContext, cands: list[Candidate]) -> None:
        cheapest = min(c.cluster.cost_per_1k_tokens for c in cands)
        for c in cands:
            cost = c.cluster.cost_per_1k_tokens
            c.scores[self.name] = 1.0 if cost <= 0 else max(cheapest, 1e-9) / cost


@dataclass(frozen=True, slots=True)
class Quality:
    """Configured quality relative to the best candidate: ``s = q / max_q``."""

    name: str = "quality"

    def __call__(self, ctx: SelectionContext, cands: list[Candidate]) -> None:
        best = max(c.cluster.quality for c in cands)
        for c in cands:
            c.scores[self.name] = 1.0 if best <= 0 else max(c.cluster.quality / best, 1e-3)


@dataclass(frozen=True, slots=True)
class Load:
    """Spare capacity: ``s = max(1 - inflight / max_concurrency, 0.02)``."""

    name: str = "load"

    def __call__(self, ctx: SelectionContext, cands: list[Candidate]) -> None:
        for c in cands:
            used = ctx.view.inflight(c.name) / c.cluster.max_concurrency
            c.scores[self.name] = max(1.0 - used, 0.02)


DEFAULT_SCORERS: tuple[Scorer, ...] = (LatencyRatio(), SloHeadroom(), Cost(), Quality(), Load())
