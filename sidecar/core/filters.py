"""Selection filters, in the order they run. Each keeps (None) or drops (reason).

Hard filters (``soft = False``) are mandatory policy and never relaxed;
soft filters may be relaxed by panic mode when they would leave no route.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.core.pipeline import Candidate, Filter, SelectionContext


@dataclass(frozen=True, slots=True)
class ModelServed:
    """Drop clusters that do not serve the requested model."""

    name: str = "model_served"
    soft: bool = False

    def __call__(self, ctx: SelectionContext, cand: Candidate) -> str | None:
        if ctx.model.name in cand.cluster.models:
            return None
        return f"does not serve {ctx.model.name}"


@dataclass(frozen=True, slots=True)
class RegionPolicy:
    """Data-policy constraint: the model's allowed regions (empty = any)."""

    name: str = "region"
    soft: bool = False

    def __call__(self, ctx: SelectionContext, cand: Candidate) -> str | None:
        allowed = ctx.model.regions
        if not allowed or cand.cluster.region in allowed:
            return None
        return f"region {cand.cluster.region or '-'} not in {','.join(allowed)}"


@dataclass(frozen=True, slots=True)
class Quarantine:
    """Circuit open: quarantined (and probing, outside the probe share) routes take no traffic."""

    name: str = "quarantine"
    soft: bool = True

    def __call__(self, ctx: SelectionContext, cand: Candidate) -> str | None:
        return f"{cand.health.state}: circuit open" if cand.health.quarantined else None


@dataclass(frozen=True, slots=True)
class ClassRestriction:
    """Restricted routes are excluded for latency-sensitive classes; tolerant ones use them."""

    name: str = "class_restriction"
    soft: bool = True

    def __call__(self, ctx: SelectionContext, cand: Candidate) -> str | None:
        if cand.health.excluded_for_sensitive and ctx.klass.latency_sensitive:
            return f"restricted for latency-sensitive class {ctx.klass.name}"
        return None


@dataclass(frozen=True, slots=True)
class Capacity:
    """Full clusters (in-flight >= max_concurrency) take no new work.

    This is also the herding guard: traffic leaving a degraded route can only
    land where there is spare capacity; when every alternative is full, panic
    mode (or admission control) decides.
    """

    name: str = "capacity"
    soft: bool = True

    def __call__(self, ctx: SelectionContext, cand: Candidate) -> str | None:
        n = ctx.view.inflight(cand.name)
        if n < cand.cluster.max_concurrency:
            return None
        return f"full: {n}/{cand.cluster.max_concurrency} in flight"


DEFAULT_FILTERS: tuple[Filter, ...] = (
    ModelServed(),
    RegionPolicy(),
    Quarantine(),
    ClassRestriction(),
    Capacity(),
)
