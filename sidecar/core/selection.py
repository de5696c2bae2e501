"""What the selection pipeline's stages read and write (:mod:`sidecar.core.pipeline`).

* :class:`RouteView`: the router's read-only view of every route as of ``now``
  (latency lookups, evidence, health, in-flight counts);
* :class:`SelectionContext`: everything a filter, scorer or picker may consult
  for one request or plan (config, model, class, request, view, budgets);
* :class:`Candidate`: one cluster's scratch state through the stages (verdicts,
  scores, weight), with a cheap per-request copy;
* the stage protocols :class:`Filter`, :class:`Scorer`, :class:`Picker`;
* their products: :class:`Plan` (the static stage) and :class:`PipelineResult`
  (one request's choice), and the value types :class:`LatencyValue` and
  :class:`HealthView`.

Types only, no selection logic: the stages live in ``filters``, ``scorers`` and
``pickers``, the orchestration in ``pipeline``.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from sidecar.core.config import ClassConfig, ClusterConfig, Config, ModelConfig
from sidecar.core.frozen import fast_init
from sidecar.core.types import RequestInfo, SliceKey

if TYPE_CHECKING:
    from sidecar.core.evidence import RouteEvidence
    from sidecar.core.light_load import LightOutcomes


FLOOR_SHARE: Final = "floor"  # Candidate.scores key: its share of the exploration floor


@dataclass(frozen=True, slots=True)
class LatencyValue:
    """A percentile looked up through the slice hierarchy."""

    value: float | None  # seconds
    used: SliceKey | None
    fell_back: bool
    samples: int

    # Written out for the compiled lab (sidecar.core.frozen).
    def __init__(self, value: float | None, used: SliceKey | None, fell_back: bool,
                 samples: int) -> None:
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "used", used)
        object.__setattr__(self, "fell_back", fell_back)
        object.__setattr__(self, "samples", samples)


fast_init(LatencyValue)


@fast_init
@dataclass(frozen=True, slots=True)
class HealthView:
    """What selection needs from one route's health state."""

    state: str
    weight: float  # 0..1, already resolved for the slice's class
    excluded_for_sensitive: bool  # restricted: latency-sensitive classes must not use it
    quarantined: bool  # circuit open (includes probing, except chosen probes)
    # Share of the slice's traffic sent to the route as probes (probing, or restricted
    # for a latency-sensitive class; shrunk by relapse memory); 0 when not probed.
    probe_share: float = 0.0
    # An open run of hard failures is on trial (sidecar.core.health, "Trial pace"):
    # native weights give the route at least TRIAL_SHARE (sidecar.core.weight_shares).
    on_trial: bool = False


class RouteView(Protocol):
    """Read-only view of routes as of ``now`` (implemented by the router)."""

    def latency(
        self, cluster: str, slice: SliceKey, metric: str, percentile: float, now: float
    ) -> LatencyValue: ...

    def evidence(
        self, cluster: str, slice: SliceKey, metric: str, now: float
    ) -> RouteEvidence | None: ...

    def health(self, cluster: str, slice: SliceKey) -> HealthView: ...

    def inflight(self, cluster: str) -> int: ...

    def limit_note(self, cluster: str) -> str | None:
        """Why ``cluster`` counts as fuller than its requests in flight, in words (a
        limit the provider's 429s or queueing taught, a declared wait:
        :mod:`sidecar.core.pushback`), or None. ``inflight`` already counts it; this
        is for explanations only."""
        ...


class Candidate:
    """One cluster as it moves through the pipeline (mutable scratch state).

    ``base`` is the product of the static-stage scores (with their exponents);
    a request works on :meth:`for_request`, a copy that shares the read-only
    ``latency`` lookups."""

    __slots__ = ("_own", "base", "cluster", "dropped", "health", "latency", "name", "scores",
                 "soft_drop", "verdicts", "weight")

    def __init__(self, cluster: ClusterConfig, health: HealthView,
                 shared: Candidate | None = None) -> None:
        """A fresh candidate, or (``shared``) a request's copy of a plan's."""
        self.cluster = cluster
        self.name = cluster.name  # read a dozen times per request: a slot, not a property
        self.health = health
        if shared is None:
            self.verdicts: dict[str, str] = {}  # filter -> "pass" or reason (see note())
            self._own = True  # verdicts is this candidate's own dict (not the plan's)
            self.scores: dict[str, float] = {}
            self.latency: dict[str, LatencyValue] = {}
            self.weight = 1.0
            self.base = 1.0
            self.dropped: str | None = None  # the first filter that rejected it, if any
            self.soft_drop = False
        else:
            # A compiled (mypyc) class cannot be made without __init__, so the copy
            # is made through it rather than by Candidate.__new__.
            self.verdicts, self._own = shared.verdicts, False
            self.scores = dict(shared.scores)
            self.latency = shared.latency
            self.weight, self.base = shared.weight, shared.base
            self.dropped, self.soft_drop = shared.dropped, shared.soft_drop

    def note(self, name: str, verdict: str) -> None:
        """Record a filter's verdict (a request copy copies the plan's dict on first write)."""
        if not self._own:
            self.verdicts = dict(self.verdicts)
            self._own = True
        self.verdicts[name] = verdict

    def for_request(self) -> Candidate:
        """A request's copy: scores its own, verdicts and latency shared until written."""
        return Candidate(self.cluster, self.health, self)


@dataclass(frozen=True, slots=True)
class SelectionContext:
    """Everything a filter, scorer or picker may consult.

    ``budget_s`` is what this request has for the class's SLO metric (the class
    budget, or less when the caller's remaining deadline is shorter) and
    ``allowed`` the share of such requests that may miss it: ``1 - percentile /
    100`` for a single call, divided by ``k`` for a step of a ``k``-way fan-out
    (its workflow meets the worst of ``k`` draws: judge at ``1 - (1 - q) / k``)."""

    config: Config
    model: ModelConfig
    klass: ClassConfig
    request: RequestInfo
    view: RouteView
    now: float
    budget_s: float | None = None  # None: the class budget
    allowed: float | None = None  # None: 1 - percentile / 100
    # Health views as the plan saw them (per-request filters read these, not the view).
    healths: Mapping[str, HealthView] | None = None
    # Routes an open run of hard failures holds back for this request (the trial
    # limit of sidecar.core.health; the router sets it only while such a run is open).
    held: frozenset[str] = frozenset()
    # Routes missing this slice's budget now (sidecar.core.live_misses; the router
    # sets it only while one is).
    missing: frozenset[str] = frozenset()
    # Repeat-offender factors below 1 by cluster (sidecar.core.live_misses, the
    # ``recurrence`` score); None or empty while no route relapsed.
    recurrence: Mapping[str, float] | None = None
    # Some candidate refuses work by time lately (sidecar.core.pushback.PushBack.refusing):
    # the attainment score then judges every route on its gentle scale.
    refusing: bool = False
    # The view's in-flight counts are each request's own (False: a window's average,
    # as native mode's weights read them; the queue score is then left out).
    live_counts: bool = True
    # Outcomes under light load (sidecar.core.light_load): the attainment scorer
    # turns them into each candidate's share of the exploration floor. None (native
    # weights, tests): every survivor keeps the whole floor.
    light: LightOutcomes | None = None

    def health_of(self, cluster: str) -> HealthView:
        if self.healths is not None and (h := self.healths.get(cluster)) is not None:
            return h
        return self.view.health(cluster, self.request.slice)

    @property
    def step_budget_s(self) -> float:
        return self.klass.slo.budget_ms / 1000.0 if self.budget_s is None else self.budget_s

    @property
    def queue_weight(self) -> float:
        """The queue score's exponent (:mod:`sidecar.core.live_latency`): the class's
        ``weights.queue``, 0 unless the counts are live (it exists to act within one
        request's duration)."""
        return self.klass.weights.queue if self.live_counts else 0.0

    @property
    def step_allowed(self) -> float:
        if self.allowed is not None:
            return self.allowed
        return max(1.0 - self.klass.slo.percentile / 100.0, 1e-4)


class Filter(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def soft(self) -> bool: ...

    @property
    def per_request(self) -> bool: ...

    def __call__(self, ctx: SelectionContext, cand: Candidate) -> str | None: ...


class Scorer(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def per_request(self) -> bool: ...

    def __call__(self, ctx: SelectionContext, cands: list[Candidate]) -> None: ...


class Picker(Protocol):
    @property
    def name(self) -> str: ...

    def __call__(
        self, ctx: SelectionContext, cands: list[Candidate], rng: random.Random
    ) -> Candidate: ...


@fast_init
@dataclass(frozen=True, slots=True)
class PipelineResult:
    """``request_filters``: the per-request filters that ran; a candidate they kept
    has no verdict entry from them (read it as "pass", as :func:`verdicts_of` does)."""

    chosen: Candidate
    candidates: tuple[Candidate, ...]
    panic: bool
    notes: tuple[str, ...]
    request_filters: tuple[str, ...] = ()


def verdicts_of(result: PipelineResult, cand: Candidate) -> dict[str, str]:
    """Every filter's verdict on ``cand`` in ``result``, in filter order."""
    out = dict(cand.verdicts)
    if cand.dropped is None or cand.dropped in result.request_filters:
        for name in result.request_filters:
            if name == cand.dropped:
                break
            out.setdefault(name, "pass")
    return out


@dataclass(frozen=True, slots=True)
class Plan:
    """The static stage for one selection context (see module docstring)."""

    candidates: tuple[Candidate, ...]  # every configured candidate, static verdicts applied
    eligible: tuple[Candidate, ...]  # not dropped by a hard filter
    request_filters: tuple[Filter, ...] = ()
    request_scorers: tuple[tuple[Scorer, float], ...] = ()  # with their class exponents
    request_filter_names: tuple[str, ...] = ()
