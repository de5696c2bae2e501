"""Which slices and clusters native mode renders routes for: config alone decides.

In native mode Envoy's route table has one ``weighted_clusters`` route per slice
(model x class x token profile x stream) of every model with a route candidate,
listing exactly that model's route candidates (:mod:`sidecar.core.weights`
publishes their weights). Those are the model's candidates that pass the hard,
never relaxed filters (model served, region policy), which read the config only:
the rendered routes, :func:`~sidecar.core.weights.compute_weights` and the cold
slices it plans once (:func:`cold_slices`) all come from here. Both answers are
kept for the last config asked about (a config never changes: a reload makes a
new one).
"""

from __future__ import annotations

from typing import Final

from sidecar.core.classify import LONG_PROFILE, TOKEN_PROFILES
from sidecar.core.config import Config, ModelConfig
from sidecar.core.evidence import RouteEvidence
from sidecar.core.filters import DEFAULT_FILTERS
from sidecar.core.selection import Candidate, HealthView, LatencyValue, SelectionContext
from sidecar.core.types import RequestInfo, SliceKey
from sidecar.core.window_load import WindowLoad

PROFILES: Final[tuple[str, ...]] = (*(p[0] for p in TOKEN_PROFILES), LONG_PROFILE)


class _NoView:
    """Hard filters read config only; a view that says so if that ever changes."""

    def latency(
        self, cluster: str, slice: SliceKey, metric: str, percentile: float, now: float
    ) -> LatencyValue:
        raise AssertionError("hard filters must not read statistics")

    def evidence(
        self, cluster: str, slice: SliceKey, metric: str, now: float
    ) -> RouteEvidence | None:
        raise AssertionError("hard filters must not read statistics")

    def health(self, cluster: str, slice: SliceKey) -> HealthView:
        raise AssertionError("hard filters must not read health")

    def inflight(self, cluster: str) -> int:
        raise AssertionError("hard filters must not read load")

    def limit_note(self, cluster: str) -> str | None:
        raise AssertionError("hard filters must not read load")


def representative(config: Config, slice: SliceKey) -> RequestInfo:
    """A first-attempt request of ``slice`` without deadline, step or explain (selection
    reads a request's model, class and slice, and flags the native path never has)."""
    klass = config.workload_class(slice.klass)
    return RequestInfo(
        api="chat", model=slice.model, stream=bool(slice.streaming), max_tokens=None,
        input_tokens=0, klass=slice.klass, priority=klass.priority if klass else 0,
        tenant=None, slice=slice,
    )


def route_candidates(config: Config, model: ModelConfig) -> tuple[str, ...]:
    """The model's candidates that pass every hard (never relaxed) filter, in order."""
    klass = config.workload_class(config.default_class)
    assert klass is not None
    some_slice = SliceKey(model.name, klass.name, PROFILES[0], False)
    ctx = SelectionContext(config, model, klass, representative(config, some_slice),
                           _NoView(), 0.0)
    hard = [f for f in DEFAULT_FILTERS if not f.soft]
    out = []
    for name in model.candidates:
        if not config.has_cluster(name):
            continue
        cand = Candidate(config.cluster(name), HealthView("healthy", 1.0, False, False))
        if all(f(ctx, cand) is None for f in hard):
            out.append(name)
    return tuple(out)


def model_candidates(config: Config) -> dict[str, tuple[str, ...]]:
    """:func:`route_candidates` of every model, by name (a new dict each call)."""
    return {m.name: cands for m, cands in _derived(config).candidates}


def native_slices(config: Config) -> tuple[SliceKey, ...]:
    """Every slice native mode renders a route for: model x class x profile x stream,
    for models with at least one route candidate."""
    return _derived(config).slices


class _Derived:
    """What :func:`model_candidates` and :func:`native_slices` answer for one config."""

    __slots__ = ("candidates", "config", "slices")

    def __init__(self, config: Config) -> None:
        self.config = config  # held: `is` cannot meet a new config at a freed one's address
        self.candidates = tuple((m, route_candidates(config, m)) for m in config.models)
        out = []
        for model, cands in self.candidates:
            if not cands:
                continue
            for klass in config.classes:
                for profile in PROFILES:
                    for streaming in (True, False):
                        out.append(SliceKey(model.name, klass.name, profile, streaming))
        self.slices = tuple(out)


# The last config's answers. A Config is immutable and both depend on it alone (the hard
# filters read config only: _NoView), while every weights computation worked them out
# three times (cold_slices, refresh_weights, compute_weights): with 1,800 slices, 20 of
# them busy, a publication between windows took 11-13 ms of CPU, 7-9 ms with them kept.
_last: list[_Derived] = []


def _derived(config: Config) -> _Derived:
    for d in _last:
        if d.config is config:
            return d
    d = _Derived(config)
    _last[:] = [d]
    return d


def cold_slices(config: Config, load: WindowLoad, now: float) -> frozenset[SliceKey]:
    """Native slices that carried no load for a stats window (``compute_weights``)."""
    return load.cold(native_slices(config), now,
                     config.stats.subwindows * config.stats.subwindow_s)
