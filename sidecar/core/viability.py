"""What selection sees of a route's health, and which routes may still serve.

Read from the health board only (pure, no clock). :func:`health_view` is the
worse of a route's slice entry and its cluster-wide entry (by weight), with the
probe share the route gets while probing or restricted (:func:`probe_share`).

A route is **viable** for a
slice when its cluster's circuit is closed and its own entry is neither
quarantined, probing nor restricted for latency-sensitive traffic; it
**serves** the slice when its circuit is closed and its entry is neither
quarantined nor probing (restricted counts: the herding guard keeps such a route
in service when nothing better has room). The health policy asks before it
escalates:

    may quarantine (cluster, slice) for latency   iff  another candidate is viable
    may quarantine (cluster, slice) for failures  iff  another candidate serves
    may eject the whole cluster      iff  every model it serves keeps another candidate
                                          whose circuit is closed, and every slice of those
                                          models that is quarantined or restricted somewhere
                                          keeps another route that serves it

*For failures* means a run of hard failures (the fast path) or a window whose
errors and timeouts reach the burst share: a route that fails most of what it
is sent is worse than one restricted for its latency, which still answers.
Holding it as "the last viable route" beside such a one kept it in service for
the whole outage (a generated outage scenario: the fast route of a slice had
been restricted for two slow answers, the other went down, and the held route's
paced trials, :mod:`sidecar.core.failure_run`, took 180 of the slice's 193
requests in the next 130 s: 24 -> 212 violations).

Without the second clause, ejecting a cluster could leave a slice whose other
routes are all out with none: the last route that serves is restricted instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from sidecar.core.config import Config, ModelConfig
from sidecar.core.health import HealthState
from sidecar.core.health_board import CLUSTER_SLICE, HealthBoard
from sidecar.core.selection import HealthView
from sidecar.core.types import SliceKey

#: States in which a route takes probes only.
QUARANTINED: Final = frozenset({HealthState.QUARANTINED, HealthState.PROBING})
_HEALTHY: Final = HealthView("healthy", 1.0, False, False)
_HEALTHY_ON_TRIAL: Final = HealthView("healthy", 1.0, False, False, on_trial=True)


def health_view(board: HealthBoard, config: Config, cluster: str, slice: SliceKey) -> HealthView:
    """What selection sees: the worse of the slice's and the cluster-wide entry."""
    h = board.peek(cluster, slice)
    hc = board.peek(cluster, CLUSTER_SLICE)
    if hc is not None and hc.state is not HealthState.HEALTHY and (
            h is None or hc.weight <= h.weight):
        h = hc
    on_trial = bool(board.runs) and board.on_trial(cluster, slice)
    if h is None or h.state is HealthState.HEALTHY:
        return _HEALTHY_ON_TRIAL if on_trial else _HEALTHY
    klass = config.workload_class(slice.klass)
    sensitive = klass.latency_sensitive if klass else True
    return HealthView(
        state=h.state.value,
        weight=h.weight_for(sensitive),
        excluded_for_sensitive=h.excluded_for_sensitive,
        quarantined=h.state in QUARANTINED,
        probe_share=probe_share(board, config, cluster, slice, sensitive) or 0.0,
        on_trial=on_trial,
    )


def probe_share(board: HealthBoard, config: Config, cluster: str, slice: SliceKey,
                sensitive: bool, price: Callable[[str], float] | None = None) -> float | None:
    """The share of ``slice``'s traffic :func:`probes` sends ``cluster`` (None: none);
    ``price`` scales a restricted route's (:func:`~sidecar.core.plan_cache.probes`)."""
    hc = board.peek(cluster, CLUSTER_SLICE)
    if hc is not None and hc.state is HealthState.PROBING:
        return hc.probe_share
    if hc is not None and hc.state is HealthState.QUARANTINED:
        # The circuit is open and cooling down: a restricted or probing slice entry
        # must not send it requests (in native mode that was a steady probe share
        # to an ejected, dead cluster until its cooldown ended).
        return None
    h = board.peek(cluster, slice)
    if h is not None and h.state is HealthState.PROBING:
        return h.probe_share
    if not sensitive or (h is not None and h.state is HealthState.QUARANTINED):
        return None
    # A cluster restricted as a whole (a run of failures likely by chance on a
    # partly failing route, or the last viable route) needs its probes as much
    # as a restricted slice: without them a latency-sensitive-only model never
    # sends it a request, and it would wait out the stale-verdict timeout.
    for e in (h, hc):
        if e is not None and e.state is HealthState.RESTRICTED:
            share = config.health.probe_share * e.memory
            return share if price is None else share * price(cluster)
    return None


def viable(board: HealthBoard, cluster: str, slice: SliceKey | None) -> bool:
    """Is ``cluster`` open for ``slice`` (None: as a whole, its circuit only)?"""
    hc = board.peek(cluster, CLUSTER_SLICE)
    if hc is not None and hc.circuit_open:
        return False
    if slice is None:
        return True
    h = board.peek(cluster, slice)
    return h is None or (h.state not in QUARANTINED and not h.excluded_for_sensitive)


def serves(board: HealthBoard, cluster: str, slice: SliceKey) -> bool:
    """Does ``cluster`` still answer ``slice`` (circuit closed, not quarantined or
    probing; restricted counts)?"""
    hc = board.peek(cluster, CLUSTER_SLICE)
    if hc is not None and hc.circuit_open:
        return False
    h = board.peek(cluster, slice)
    return h is None or h.state not in QUARANTINED


def others_viable(board: HealthBoard, config: Config, cluster: str, slice: SliceKey) -> bool:
    """Is there another candidate for this slice that is neither quarantined nor restricted?"""
    model = config.model(slice.model)
    if model is None:
        return True
    return any(viable(board, c, slice) for c in model.candidates if c != cluster)


def others_serve(board: HealthBoard, config: Config, cluster: str, slice: SliceKey) -> bool:
    """Is there another candidate for this slice that :func:`serves` it (what a route
    that fails most requests may be quarantined beside)?"""
    model = config.model(slice.model)
    if model is None:
        return True
    return any(serves(board, c, slice) for c in model.candidates if c != cluster)


def cluster_ejectable(board: HealthBoard, models_of: Mapping[str, tuple[ModelConfig, ...]],
                      cluster: str) -> bool:
    """May the whole cluster be ejected (module docstring)? ``models_of``: the models
    each cluster serves."""
    models = models_of.get(cluster, ())
    if not all(any(viable(board, c, None) for c in m.candidates if c != cluster)
               for m in models):
        return False
    served = {m.name: m for m in models}
    troubled = {s for (_, s), h in board.items()
                if s != CLUSTER_SLICE and s.model in served
                and (h.state in QUARANTINED or h.excluded_for_sensitive)}
    return all(any(serves(board, c, s) for c in served[s.model].candidates if c != cluster)
               for s in troubled)
