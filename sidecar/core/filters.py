"""Selection filters, in the order they run. Each keeps (None) or drops (reason).

Hard filters (``soft = False``) are mandatory policy and never relaxed;
soft filters may be relaxed by panic mode when they would leave no route.
``per_request`` filters read in-flight counts and run for every request; the
others run once per plan (see :mod:`sidecar.core.pipeline`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Final

from sidecar.core.selection import Candidate, Filter, HealthView, SelectionContext


@dataclass(frozen=True, slots=True)
class ModelServed:
    """Drop clusters that do not serve the requested model."""

    name: str = "model_served"
    soft: bool = False
    per_request: bool = False

    def __call__(self, ctx: SelectionContext, cand: Candidate) -> str | None:
        if ctx.model.name in cand.cluster.models:
            return None
        return f"does not serve {ctx.model.name}"


@dataclass(frozen=True, slots=True)
class RegionPolicy:
    """Data-policy constraint: the model's allowed regions (empty = any)."""

    name: str = "region"
    soft: bool = False
    per_request: bool = False

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
    per_request: bool = False

    def __call__(self, ctx: SelectionContext, cand: Candidate) -> str | None:
        return f"{cand.health.state}: circuit open" if cand.health.quarantined else None


# Herding guard: a restricted route is only excluded while the routes left for
# the class have at least this share of their capacity free.
HERD_HEADROOM: Final = 0.25


@dataclass(frozen=True, slots=True)
class ClassRestriction:
    """Restricted routes are excluded for latency-sensitive classes; tolerant ones use them.

    Herding guard: traffic may leave a restricted route only as fast as the
    alternatives have room. While the other usable routes (not restricted, not
    quarantined) have less than ``HERD_HEADROOM`` of their summed
    ``max_concurrency`` free, the restricted route stays in at the degraded
    weight instead of being excluded, so the class is spread rather than piled
    onto fallbacks that would slow down under the extra load.
    """

    name: str = "class_restriction"
    soft: bool = True
    per_request: bool = True  # the herding guard reads in-flight counts

    def __call__(self, ctx: SelectionContext, cand: Candidate) -> str | None:
        if not (cand.health.excluded_for_sensitive and ctx.klass.latency_sensitive):
            return None
        if cand.health.quarantined:
            return None  # the quarantine filter answers for open circuits
        free, cap = alternatives_room(
            ctx, lambda name, h: name == cand.name or h.excluded_for_sensitive or h.quarantined)
        if cap and free >= HERD_HEADROOM * cap:
            return f"restricted for latency-sensitive class {ctx.klass.name}"
        cand.health = _at_weight(cand.health, ctx.config.health.degraded_weight)
        cand.note("herding_guard", f"kept: alternatives have {free}/{cap} slots free")
        return None


def alternatives_room(ctx: SelectionContext,
                      unusable: Callable[[str, HealthView], bool]) -> tuple[int, int]:
    """``(free, cap)``: free slots and summed ``max_concurrency`` of the model's routes
    that are not ``unusable`` (the herding guard's alternatives)."""
    cap = free = 0
    for name in ctx.model.candidates:
        if not ctx.config.has_cluster(name) or unusable(name, ctx.health_of(name)):
            continue
        limit = ctx.config.cluster(name).max_concurrency
        cap += limit
        free += max(limit - ctx.view.inflight(name), 0)
    return free, cap


@functools.lru_cache(maxsize=256)
def _at_weight(health: HealthView, weight: float) -> HealthView:
    """``health`` at another weight; the views are frozen, so one copy serves every
    request the herding guard keeps on the route (``replace`` costs microseconds)."""
    return replace(health, weight=weight)


@dataclass(frozen=True, slots=True)
class Capacity:
    """Full clusters (in-flight >= max_concurrency) take no new work.

    This is also the herding guard: traffic leaving a degraded route can only
    land where there is spare capacity; when every alternative is full, panic
    mode (or admission control) decides.

    A route the provider holds to a lower limit (429s, queueing) or holds off for a
    declared wait (:mod:`sidecar.core.pushback`) is counted full there, and its
    verdict says so rather than give the count that includes the refused slots.
    """

    name: str = "capacity"
    soft: bool = True
    per_request: bool = True

    def __call__(self, ctx: SelectionContext, cand: Candidate) -> str | None:
        n = ctx.view.inflight(cand.name)
        top = cand.cluster.max_concurrency
        if n < top:
            return None
        note = ctx.view.limit_note(cand.name)
        if note is None:
            return f"full: {n}/{top} in flight"
        return f"full: {note} (of {top})"


@dataclass(frozen=True, slots=True)
class FailureRun:
    """A route in an open run of ``s`` hard failures takes no new work while the
    ``K - s`` requests that would eject it are still unanswered (the trial limit of
    :mod:`sidecar.core.health`): a provider that just went down gets the run that
    ejects it, not the traffic sent while that run fails. Soft: when it is the only
    route left, it serves."""

    name: str = "failure_run"
    soft: bool = True
    per_request: bool = True

    def __call__(self, ctx: SelectionContext, cand: Candidate) -> str | None:
        if ctx.held and cand.name in ctx.held:
            return "open failure run: its ejecting requests are still unanswered"
        return None


@dataclass(frozen=True, slots=True)
class LiveMissing:
    """A route whose recent requests miss the slice's budget far more often than its
    allowed share (:mod:`sidecar.core.live_misses`) takes no new request of the slice
    until those misses age out. With the class restriction's herding guard: only while
    the other usable routes have ``HERD_HEADROOM`` of their slots free (at a peak that
    slows every route, sitting one out would pile its traffic onto the next). Soft:
    when it is the only route left, it serves."""

    name: str = "live_misses"
    soft: bool = True
    per_request: bool = True

    def __call__(self, ctx: SelectionContext, cand: Candidate) -> str | None:
        missing = ctx.missing
        if not missing or cand.name not in missing:
            return None
        sensitive = ctx.klass.latency_sensitive
        free, cap = alternatives_room(ctx, lambda name, h: name in missing or h.quarantined
                                      or (h.excluded_for_sensitive and sensitive))
        if cap and free >= HERD_HEADROOM * cap:
            return "missing its budget now: recent requests late beyond its allowed share"
        cand.note("herding_guard", f"kept: alternatives have {free}/{cap} slots free")
        return None


DEFAULT_FILTERS: Final[tuple[Filter, ...]] = (
    ModelServed(),
    RegionPolicy(),
    Quarantine(),
    ClassRestriction(),
    Capacity(),
    FailureRun(),
    LiveMissing(),
)
