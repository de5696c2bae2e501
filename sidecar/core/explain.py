"""How a routing decision is described: its reason, fallback kind and explain record.

The :class:`~sidecar.core.router.Router` builds each :class:`Decision` with
:func:`decision_for`, labels it with :func:`decision_reason` and
:func:`fallback_kind` (bounded metric labels) and keeps :class:`RecentDecision`
entries whose explain is built only when read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from sidecar.core.config import ClassConfig, Config, ModelConfig
from sidecar.core.latency_aware import enabled_metrics
from sidecar.core.selection import LatencyValue, PipelineResult, verdicts_of
from sidecar.core.types import CandidateExplain, Decision, Explain, RequestInfo

if TYPE_CHECKING:
    from sidecar.core.request_lane import LanePick


class RecentDecision:
    """One entry of the recent-decision ring; explain is built when someone reads it.
    One is made per request: a plain slotted class (the compiled lab makes it a
    native class, without the Python-level ``__new__`` a NamedTuple has)."""

    __slots__ = ("at", "decision", "picker", "request", "result")

    def __init__(self, at: float, request: RequestInfo, decision: Decision,
                 result: PipelineResult | LanePick | None = None, picker: str = "") -> None:
        self.at = at
        self.request = request
        self.decision = decision
        self.result = result  # a lane pick is rebuilt when read
        self.picker = picker

    def explain(self) -> Explain | None:
        result = self.result
        if self.decision.explain is not None or result is None:
            return self.decision.explain
        if not isinstance(result, PipelineResult):
            result = result.result()
        return build_explain(self.request, result, self.picker)


def decision_reason(result: PipelineResult, model: ModelConfig) -> str:
    """The decision reason of a pipeline result for ``model``."""
    if result.panic:
        return "panic"
    if len(model.candidates) == 1:
        return "only_candidate"
    ratio = result.chosen.scores.get("latency_ratio", 0.0)
    if ratio > 0:
        return "scored"
    if any(c.scores.get("latency_ratio", 0.0) > 0 for c in result.candidates):
        return "exploring"  # chosen route has no data yet; others do
    return "no_data" if enabled_metrics(model.latency_aware) else "no_percentile"


def fallback_kind(
    decision: Decision, chosen_latency: Mapping[str, LatencyValue] | None
) -> str | None:
    """Why a decision did not come from full, narrow-slice evidence (None: it did);
    ``chosen_latency``: the latencies the pipeline looked up for its chosen candidate."""
    if decision.reason in ("unknown_model", "no_candidate"):
        return "default_route"
    if decision.reason == "panic":
        return "panic"
    if decision.reason in ("no_data", "no_percentile"):
        return "first_candidate"
    if chosen_latency is not None:
        for lv in chosen_latency.values():  # a loop, not any(genexpr): per decision
            if lv.fell_back:
                return "broader_slice"
    return None


def build_explain(req: RequestInfo, result: PipelineResult, picker: str) -> Explain:
    """The explain record of a pipeline result (``/explain``, the explain header)."""
    cands = []
    for c in result.candidates:
        used = next((lv for lv in c.latency.values() if lv.used is not None), None)
        cands.append(
            CandidateExplain(
                cluster=c.name,
                verdicts=verdicts_of(result, c),
                scores={k: round(v, 4) for k, v in c.scores.items()},
                state=c.health.state,
                weight=round(c.weight, 6),
                stats_slice=used.used.label() if used and used.used else "",
                fell_back=bool(used and used.fell_back),
            )
        )
    return Explain(req.slice.label(), tuple(cands), picker, result.notes)


def decision_for(config: Config, picker: str, req: RequestInfo, cluster: str, reason: str,
                 klass: ClassConfig, result: PipelineResult | None,
                 is_probe: bool = False) -> Decision:
    """The :class:`Decision` sending ``req`` to ``cluster``: the upstream model name when
    the cluster serves the model under another, the class's timeout, and an explain
    record when the request asked for one (``result``: the pipeline's, if it ran)."""
    upstream = config.cluster(cluster).models.get(req.model or "")
    # Building the explain costs ~10% of a decision: only on request (the
    # recent-decision ring builds it lazily for /explain).
    explain = (
        build_explain(req, result, picker) if result is not None and req.explain else None
    )
    return Decision(
        cluster=cluster,
        reason=reason,
        upstream_model=upstream if upstream and upstream != req.model else None,
        timeout_ms=klass.slo.timeout_ms,
        is_probe=is_probe,
        explain=explain,
    )
