"""The decision core's facade: decide, observe, tick.

Sans-I/O in the h11/aioquic manner: the server shell and the simulator feed
events with ``now`` and get decisions back; :meth:`Router.next_deadline` tells
them when to call :meth:`Router.tick` next. One Router object is the whole
state: statistics, health, in-flight counts and the recent-decision ring.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from dataclasses import replace

from sidecar.core import compat_sr
from sidecar.core.admission import AdmissionControl
from sidecar.core.config import SEMANTIC_ROUTER, ClassConfig, Config, ModelConfig
from sidecar.core.explain import RecentDecision, build_explain, decision_reason, fallback_kind
from sidecar.core.filters import DEFAULT_FILTERS
from sidecar.core.health import HealthState
from sidecar.core.health_board import HealthBoard
from sidecar.core.pickers import PICKERS
from sidecar.core.pipeline import (
    HealthView,
    LatencyValue,
    PipelineResult,
    SelectionContext,
    run_pipeline,
)
from sidecar.core.scorers import DEFAULT_SCORERS
from sidecar.core.stats import StatsStore
from sidecar.core.types import (
    Decision,
    Observation,
    RequestInfo,
    SliceKey,
    TransitionEvent,
)

_QUARANTINED = {HealthState.QUARANTINED, HealthState.PROBING}
_HEALTHY = HealthView("healthy", 1.0, False, False)


class Router:
    """All routing state for one sidecar (or one simulated policy run)."""

    def __init__(self, config: Config, recent: int = 64) -> None:
        self.config = config
        self.stats = StatsStore(config.stats)
        self.board = HealthBoard(config.health, config.stats)
        self._inflight: Counter[str] = Counter()
        self.counters: Counter[tuple[str, str]] = Counter()  # (kind, label) -> count
        self.decisions: Counter[tuple[str, str, str]] = Counter()  # (cluster, class, reason)
        self.recent: deque[RecentDecision] = deque(maxlen=recent)
        self.transitions: deque[TransitionEvent] = deque(maxlen=256)
        self._next_eval: float | None = None
        self._picker = PICKERS[config.picker]
        self.admission = AdmissionControl(config)
        self._memo: dict[tuple[str, SliceKey, str, float, float], LatencyValue] = {}
        self.compat_sr = compat_sr.SrLatencyBook()  # models under compat: semantic-router

    # ------------------------------------------------------------ config

    def reload(self, config: Config) -> None:
        """Swap in a new config, keeping statistics and health where still meaningful.

        A changed sub-window length makes the old windows incomparable: statistics
        start fresh then (health states are kept).
        """
        if config.stats != self.config.stats:
            self.stats = StatsStore(config.stats)
        self.board.reconfigure(config.health, config.stats)
        self.config = config
        self._picker = PICKERS[config.picker]
        self.admission.reconfigure(config)
        self.compat_sr.retain(config)

    def restore(
        self, stats: StatsStore, board: HealthBoard, transitions: list[TransitionEvent],
        now: float,
    ) -> None:
        """Adopt state loaded from a warm-restart snapshot (times already rebased to ``now``).

        Evaluation resumes at the next window boundary, so cooldowns and pending
        windows carry on without waiting for the first new observation.
        """
        self.stats = stats
        self.board = board
        self.transitions.extend(transitions)
        self._next_eval = self._boundary_after(now)

    # ------------------------------------------------------------ RouteView

    def latency(
        self, cluster: str, slice: SliceKey, metric: str, percentile: float, now: float
    ) -> LatencyValue:
        # Scorers ask for the same percentile more than once per decision (the
        # latency_aware TTFT and the class SLO are often the same): memoise per decision.
        key = (cluster, slice, metric, percentile, now)
        hit = self._memo.get(key)
        if hit is None:
            lk = self.stats.lookup(cluster, slice, metric, percentile / 100.0, now)
            hit = self._memo[key] = LatencyValue(lk.value, lk.used, lk.fell_back, lk.samples)
        return hit

    def health(self, cluster: str, slice: SliceKey) -> HealthView:
        h = self.board.peek(cluster, slice)
        if h is None:
            return _HEALTHY
        klass = self.config.workload_class(slice.klass)
        return HealthView(
            state=h.state.value,
            weight=h.weight_for(klass.latency_sensitive if klass else True),
            excluded_for_sensitive=h.excluded_for_sensitive,
            quarantined=h.state in _QUARANTINED,
        )

    def inflight(self, cluster: str) -> int:
        return self._inflight[cluster]

    # ------------------------------------------------------------ decisions

    def decide(
        self, req: RequestInfo, now: float, rng: random.Random, ticket: str | None = None
    ) -> Decision:
        """Choose a cluster for ``req`` and decide its admission. Never raises for content.

        ``ticket`` identifies the held request when admission answers ``queue``
        (default: ``req.request_id``); the caller re-asks with the same ticket
        when capacity frees or at :meth:`queue_until`, and calls :meth:`withdraw`
        if it gives up. A re-ask that stays queued is not counted again.
        """
        self._memo.clear()
        decision, result = self._decide(req, now, rng)
        decision, new_event = self._admit(req, decision, result, now, ticket or req.request_id)
        if not new_event:
            return decision
        self.counters[("decision", decision.reason)] += 1
        self.counters[("admission", decision.admission)] += 1
        if not req.class_known:
            self.counters[("unknown", "class")] += 1  # default class used (documented)
        # Bounded labels: clusters and classes come from config, reasons from a closed set.
        self.decisions[(decision.cluster, req.klass, decision.reason)] += 1
        fallback = fallback_kind(decision, result)
        if fallback:
            self.counters[("fallback", fallback)] += 1
        self.recent.append(RecentDecision(now, req, decision, result, self._picker.name))
        return decision

    def _admit(
        self, req: RequestInfo, decision: Decision, result: PipelineResult | None,
        now: float, ticket: str | None,
    ) -> tuple[Decision, bool]:
        """Run admission control (sidecar.core.admission) on a selection result."""
        if decision.reason in ("unknown_model", "no_candidate"):
            return decision, True
        klass = self.config.workload_class(req.klass) or self.config.workload_class(
            self.config.default_class)
        assert klass is not None
        v = self.admission.assess(req, klass, decision, result, self, now, ticket)
        if not v.requeued and v.reason not in ("ok", "disabled"):
            self.counters[("admission_reason", v.reason)] += 1
        if v.outcome == "admit" and v.cluster != decision.cluster:
            decision = self._finish(req, v.cluster, decision.reason, klass, result,
                                    is_probe=decision.is_probe)
        detail = f"{v.reason}: {v.note}" if v.note or v.outcome != "admit" else decision.detail
        decision = replace(
            decision,
            reason=decision.reason if v.outcome == "admit" else "admission",
            admission=v.outcome,
            status=v.status,
            retry_after_s=self.config.admission.defer_retry_after_s
            if v.outcome == "defer" else None,
            timeout_ms=v.timeout_ms,
            is_retry=v.is_retry,
            detail=detail,
        )
        return decision, not v.requeued

    def queue_until(self, ticket: str) -> float | None:
        """The latest time a request held by a ``queue`` answer must re-ask (None: not held)."""
        return self.admission.wait_until(ticket)

    def withdraw(self, ticket: str) -> None:
        """The shell gave up on a held request (client gone, stream closed)."""
        if self.admission.queue.leave(ticket) is not None:
            self.counters[("admission_reason", "queue_abandoned")] += 1

    def _decide(
        self, req: RequestInfo, now: float, rng: random.Random
    ) -> tuple[Decision, PipelineResult | None]:
        cfg = self.config
        model = cfg.model(req.model) if req.model else None
        if model is None:
            return Decision(cfg.default_cluster, "unknown_model", detail=str(req.model)), None
        klass = cfg.workload_class(req.klass) or cfg.workload_class(cfg.default_class)
        assert klass is not None
        if model.compat == SEMANTIC_ROUTER:
            return self._decide_semantic_router(req, model, klass), None
        probe = self._maybe_probe(req, klass, model.candidates, rng)
        if probe is not None:
            return self._finish(req, probe, "probe", klass, None, is_probe=True), None
        ctx = SelectionContext(cfg, model, klass, req, self, now)
        result = run_pipeline(ctx, DEFAULT_FILTERS, DEFAULT_SCORERS, self._picker, rng)
        if result is None:
            decision = Decision(
                cfg.default_cluster, "no_candidate", detail="hard filters left none"
            )
            return decision, None
        reason = decision_reason(result, model)
        return self._finish(req, result.chosen.name, reason, klass, result), result

    def _decide_semantic_router(
        self, req: RequestInfo, model: ModelConfig, klass: ClassConfig
    ) -> Decision:
        """semantic-router's latency_aware pick, exactly (sidecar.core.compat_sr)."""
        candidates = compat_sr.eligible(model, self.config)
        if not candidates:
            return Decision(self.config.default_cluster, "no_candidate",
                            detail="no candidate in the model's regions")
        choice = compat_sr.select(model, candidates, self.compat_sr)
        decision = self._finish(req, choice.cluster, choice.reason, klass, None)
        if req.explain:
            decision = replace(decision, explain=compat_sr.explain(req, choice, candidates))
        return decision

    def _maybe_probe(
        self, req: RequestInfo, klass: ClassConfig, candidates: tuple[str, ...],
        rng: random.Random,
    ) -> str | None:
        """Send a small share of a slice's traffic as probes.

        Probes go to routes whose cooldown has ended (probing) and, for
        latency-sensitive classes, to restricted routes, which otherwise see no
        such traffic and could never show recovery. Capacity still applies.
        """
        if req.retry_attempt:
            return None  # never probe with a retry: it already had bad luck once
        share = self.config.health.probe_share
        for c in candidates:
            h = self.board.peek(c, req.slice)
            if h is None:
                continue
            eligible = h.state is HealthState.PROBING or (
                h.state is HealthState.RESTRICTED and klass.latency_sensitive
            )
            if (
                eligible
                and self._inflight[c] < self.config.cluster(c).max_concurrency
                and rng.random() < share
            ):
                return c
        return None

    def _finish(
        self,
        req: RequestInfo,
        cluster: str,
        reason: str,
        klass: ClassConfig,
        result: PipelineResult | None,
        is_probe: bool = False,
    ) -> Decision:
        upstream = self.config.cluster(cluster).models.get(req.model or "")
        # Building the explain costs ~10% of a decision: only on request (the
        # recent-decision ring builds it lazily for /explain).
        explain = (
            build_explain(req, result, self._picker.name) if result is not None and req.explain
            else None
        )
        return Decision(
            cluster=cluster,
            reason=reason,
            upstream_model=upstream if upstream and upstream != req.model else None,
            timeout_ms=klass.slo.timeout_ms,
            is_probe=is_probe,
            explain=explain,
        )

    # ------------------------------------------------------------ observations

    def wants_observation(
        self, cluster: str, slice: SliceKey, now: float, rng: random.Random
    ) -> bool:
        """Should this response be timed? Always while the route's current sub-window
        lacks ``min_samples`` samples (evidence first), else with ``observe_share``."""
        share = self.config.stats.observe_share
        if share >= 1.0:
            return True
        series = self.stats.series(cluster, slice)
        if series is None or series.current_samples(now) < self.config.stats.min_samples:
            return True
        return rng.random() < share

    def started(self, cluster: str) -> None:
        """A routed request was released to ``cluster``."""
        self._inflight[cluster] += 1

    def finished(self, cluster: str) -> None:
        """A request previously :meth:`started` on ``cluster`` is over (any outcome)."""
        if self._inflight[cluster] > 0:
            self._inflight[cluster] -= 1

    def _judge_censored(self, obs: Observation) -> Observation:
        """A cancel is evidence only if the wait already exceeded the class budget.

        Then it is a client-side timeout (the client gave up on a slow route);
        before that, a user pressing stop says nothing about the route, so its
        lower-bound latencies are dropped.
        """
        if obs.outcome != "cancel" or not obs.censored:
            return obs
        klass = self.config.workload_class(obs.slice.klass)
        value = None
        if klass is not None:
            value = obs.ttft_s if klass.slo.metric == "ttft" else obs.e2e_s
        if klass is not None and value is not None and value * 1000.0 >= klass.slo.budget_ms:
            return replace(obs, outcome="timeout")
        return replace(obs, ttft_s=None, e2e_s=None, censored=False)

    def observe(self, obs: Observation, now: float) -> list[TransitionEvent]:
        """Record one measured outcome; probes also drive the probing state."""
        self.compat_sr.observe(obs, self.config)
        obs = self._judge_censored(obs)
        self.counters[("outcome", obs.outcome)] += 1
        if self._next_eval is None:
            self._next_eval = self._boundary_after(now)
        self.stats.observe(obs, now)
        events: list[TransitionEvent] = []
        if obs.is_probe and obs.outcome != "cancel":
            ok = obs.outcome == "ok" and self._within_budget(obs)
            events = self.board.record_probe(obs.cluster, obs.slice, ok, now)
            self._log(events)
        return events

    def _within_budget(self, obs: Observation) -> bool:
        """Did a probe meet its class SLO budget (the metric it promises)?"""
        klass = self.config.workload_class(obs.slice.klass)
        if klass is None:
            return True
        value = {"ttft": obs.ttft_s, "tpot": obs.tpot_s, "e2e": obs.e2e_s}[klass.slo.metric]
        if value is None:
            value = obs.e2e_s  # e.g. a TTFT class served without streaming
        return value is None or value * 1000.0 <= klass.slo.budget_ms

    # ------------------------------------------------------------ time

    def _boundary_after(self, now: float) -> float:
        step = self.config.stats.subwindow_s
        return (int(now / step) + 1) * step

    def next_deadline(self) -> float | None:
        """The next time :meth:`tick` has work to do (window end or cooldown end)."""
        times = [t for t in (self._next_eval, self.board.next_deadline()) if t is not None]
        return min(times) if times else None

    def tick(self, now: float) -> list[TransitionEvent]:
        """Evaluate finished windows and expire cooldowns. Cheap when nothing is due."""
        events = self.board.tick(now)
        if self._next_eval is not None and now >= self._next_eval:
            self._next_eval = self._boundary_after(now)
            events.extend(self._evaluate(now))
            self.stats.prune(now)
            self.board.prune(set(self.stats.narrow_keys()))
        self._log(events)
        return events

    def _evaluate(self, now: float) -> list[TransitionEvent]:
        events: list[TransitionEvent] = []
        for cluster, slice in self.stats.narrow_keys():
            klass = self.config.workload_class(slice.klass)
            if klass is None:
                continue
            summary = self.stats.window_summary(
                cluster, slice, klass.slo.metric, klass.slo.percentile / 100.0, now
            )
            events.extend(
                self.board.evaluate(
                    cluster,
                    slice,
                    summary,
                    klass.slo,
                    now,
                    may_quarantine=self._others_viable(cluster, slice),
                )
            )
        return events

    def _others_viable(self, cluster: str, slice: SliceKey) -> bool:
        """Is there another candidate for this slice that is neither quarantined nor restricted?"""
        model = self.config.model(slice.model)
        if model is None:
            return True
        for c in model.candidates:
            if c == cluster:
                continue
            h = self.board.peek(c, slice)
            if h is None or (h.state not in _QUARANTINED and not h.excluded_for_sensitive):
                return True
        return False

    def _log(self, events: list[TransitionEvent]) -> None:
        for e in events:
            self.transitions.append(e)
            self.counters[("transition", e.new)] += 1
