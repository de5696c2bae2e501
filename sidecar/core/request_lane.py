"""The per-request stage of a cached plan over flat tuples: the common case, exactly.

:func:`~sidecar.core.pipeline.run_request` copies every candidate of the plan,
runs the per-request filters (capacity, the herding guard) and the load
scorer on the copies, combines the weights and lets the picker choose; the
result object then feeds admission, the decision's labels and the
recent-decision ring. For most requests almost none of that varies: only the
in-flight counts do. A :class:`RequestLane` is built with the plan when the
plan's per-request stage reduces to arithmetic over those counts:

* the picker is ``weighted_random``, the only per-request scorer is ``load``
  and the per-request filters are the class restriction and capacity;
* the class restriction passes every candidate the static stage kept without
  acting (none is restricted for this latency-sensitive class, so the herding
  guard never runs).

Per request the lane reads the in-flight count of each survivor and, when
every one is below its ``max_concurrency`` (capacity would drop none),
computes exactly what the pipeline would -- same operations in the same
order, so the weights and the pick are bit-identical::

    load_i = max(1 - inflight_i / max_concurrency_i, 0.02)
    w_i    = max(base_i * max(load_i, 1e-6) ** k_load * health_i, 1e-9)
    w_i    = max(w_i, probe_share * max_j w_j)           (exploration floor)
    pick     the first i with  u * sum_j w_j - sum_{j <= i} w_j < 0,  u = rng.random()

Otherwise (a full candidate: capacity, panic) it returns None and the caller
runs the full stage, which has consumed no random number yet. A
:class:`LanePick` records the counts and the choice; :meth:`LanePick.result`
rebuilds the :class:`~sidecar.core.pipeline.PipelineResult` the pipeline would
have produced, for whoever needs it (explain, admission beyond its fast path),
and only then. What depends on the chosen candidate alone -- the decision
reason, the fallback label, admission's "some route within budget" -- is
static for the plan and computed once.

Pure like the rest of the core: the in-flight counts come from the caller.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import NamedTuple

from sidecar.core.config import ClassConfig
from sidecar.core.explain import decision_reason
from sidecar.core.filters import Capacity, ClassRestriction
from sidecar.core.pickers import WeightedRandom
from sidecar.core.pipeline import (
    Candidate,
    LatencyValue,
    Picker,
    PipelineResult,
    Plan,
    SelectionContext,
)
from sidecar.core.scorers import Load

_LANE_FILTERS = (ClassRestriction, Capacity)


class RequestLane:
    """The per-request stage of one plan (module docstring); build with :meth:`of`."""

    __slots__ = ("admission_ok", "k_load", "limits", "names", "plan", "probe_share", "reasons",
                 "rows", "survivors")

    def __init__(self, plan: Plan, survivors: tuple[Candidate, ...], k_load: float,
                 probe_share: float, reasons: tuple[str, ...]) -> None:
        self.plan = plan
        self.survivors = survivors  # the plan's candidates the static stage kept, in order
        self.names = tuple(c.name for c in survivors)
        self.limits = tuple(c.cluster.max_concurrency for c in survivors)
        # (name, max_concurrency, static weight, health weight) per survivor
        self.rows = tuple((c.name, c.cluster.max_concurrency, c.base, c.health.weight)
                          for c in survivors)
        self.k_load = k_load
        self.probe_share = probe_share
        self.reasons = reasons  # decision reason when survivor i is chosen
        # Admission's "some usable route below capacity and within budget" for this
        # plan and class (every survivor is below capacity when the lane applies);
        # admission fills it in on first use (sidecar.core.admission).
        self.admission_ok: tuple[ClassConfig, bool] | None = None

    @classmethod
    def of(cls, plan: Plan, ctx: SelectionContext, picker: Picker) -> RequestLane | None:
        """The lane of ``plan``, or None when its per-request stage is not plain arithmetic."""
        if type(picker) is not WeightedRandom or not plan.eligible:
            return None
        if any(type(f) not in _LANE_FILTERS for f in plan.request_filters):
            return None
        if len(plan.request_scorers) != 1 or type(plan.request_scorers[0][0]) is not Load:
            return None
        survivors = tuple(c for c in plan.candidates if c.dropped is None)
        if not survivors:
            return None  # panic: the full stage picks the tier
        sensitive = ctx.klass.latency_sensitive
        for c in survivors:
            if c.health.excluded_for_sensitive and sensitive and not c.health.quarantined:
                return None  # the class restriction (or its herding guard) acts
        reasons = tuple(decision_reason(PipelineResult(c, plan.candidates, False, ()), ctx.model)
                        for c in survivors)
        return cls(plan, survivors, plan.request_scorers[0][1], ctx.config.health.probe_share,
                   reasons)

    def pick(self, inflight: Callable[[str], int], rng: random.Random) -> LanePick | None:
        """Choose for one request (module docstring); None: some survivor is full."""
        k = self.k_load
        counts: list[int] = []
        weights: list[float] = []
        top = 0.0
        for name, limit, base, health in self.rows:
            n = inflight(name)
            if n >= limit:
                return None  # capacity drops it: the full stage decides (no draw made)
            counts.append(n)
            weight = base
            if k:
                load = 1.0 - n / limit
                if load < 0.02:
                    load = 0.02
                weight *= max(load, 1e-6) ** k
            w = weight * health
            if w < 1e-9:
                w = 1e-9
            weights.append(w)
            if w > top:
                top = w
        floor = self.probe_share * top
        for i, w in enumerate(weights):
            if w < floor:
                weights[i] = floor
        x = rng.random() * sum(weights)
        chosen = len(weights) - 1
        for i, w in enumerate(weights):
            x -= w
            if x < 0:
                chosen = i
                break
        return LanePick(self, tuple(counts), tuple(weights), chosen)


class LanePick(NamedTuple):
    """One request's choice through a :class:`RequestLane`."""

    lane: RequestLane
    counts: tuple[int, ...]  # in-flight count of each survivor when it was chosen
    weights: tuple[float, ...]  # final weight of each survivor
    chosen: int  # index into the lane's survivors

    @property
    def name(self) -> str:
        return self.lane.names[self.chosen]

    @property
    def reason(self) -> str:
        return self.lane.reasons[self.chosen]

    @property
    def chosen_latency(self) -> dict[str, LatencyValue]:
        """The chosen candidate's looked-up latencies (shared with the plan, read-only)."""
        return self.lane.survivors[self.chosen].latency

    def result(self) -> PipelineResult:
        """The :class:`PipelineResult` :func:`~sidecar.core.pipeline.run_request` would
        have returned for this request (a new object each call)."""
        lane = self.lane
        cands = [c.for_request() for c in lane.plan.candidates]
        survivors = [c for c in cands if c.dropped is None]
        for c, n, limit, w in zip(survivors, self.counts, lane.limits, self.weights,
                                  strict=True):
            c.scores["load"] = max(1.0 - n / limit, 0.02)
            c.weight = w
        return PipelineResult(survivors[self.chosen], tuple(cands), False, (),
                              lane.plan.request_filter_names)


def full_result(result: PipelineResult | LanePick | None) -> PipelineResult | None:
    """The pipeline result behind a decision, rebuilt from a lane pick if need be."""
    return result.result() if isinstance(result, LanePick) else result


def chosen_latency(result: PipelineResult | LanePick | None) -> dict[str, LatencyValue] | None:
    """The latencies looked up for the chosen candidate (None without a pipeline result)."""
    if result is None:
        return None
    return result.chosen_latency if isinstance(result, LanePick) else result.chosen.latency
