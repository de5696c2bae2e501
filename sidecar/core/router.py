"""The decision core's facade: decide, observe, tick.

Sans-I/O in the h11/aioquic manner: the server shell and the simulator feed
events with ``now`` and get decisions back; :meth:`Router.next_deadline` tells
them when to call :meth:`Router.tick` next. One Router object is the whole
state: statistics, health, in-flight counts and the recent-decision ring.
Outcomes come in through :class:`~sidecar.core.intake.Intake` (its observation
half); windows are judged by :mod:`sidecar.core.window_evaluation`.

**Hot path.** Nothing per request that can be done per refresh: the static
stage of the selection pipeline is cached per (model, slice, step budget,
fan-out) as a plan (:mod:`sidecar.core.plan_cache` says when one is rebuilt).
A decision then runs only the per-request stage (capacity, herding guard, load,
the picker) plus probes and admission -- for most requests as a few lines of
arithmetic over the in-flight counts (:mod:`sidecar.core.request_lane`, exact).
Hard failures do not wait for a refresh: the fast path changes health, which
invalidates plans at once.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from dataclasses import replace

from sidecar.core import compat_sr
from sidecar.core.admission import AdmissionControl
from sidecar.core.config import SEMANTIC_ROUTER, ClassConfig, Config, ModelConfig
from sidecar.core.evidence import RouteEvidence
from sidecar.core.explain import RecentDecision, decision_for, decision_reason, fallback_kind
from sidecar.core.filters import DEFAULT_FILTERS
from sidecar.core.health_board import HealthBoard
from sidecar.core.intake import Intake
from sidecar.core.light_load import LightOutcomes, route_price
from sidecar.core.live_misses import LiveMisses
from sidecar.core.pickers import PICKERS
from sidecar.core.pipeline import build_plan, run_request
from sidecar.core.plan_cache import (
    CachedPlan,
    LowVariants,
    PlanCache,
    probes,
    step_budget_s,
    step_key,
    trial_route,
)
from sidecar.core.pushback import PushBack
from sidecar.core.queue_signs import QueueSigns
from sidecar.core.request_lane import LanePick, RequestLane, chosen_latency, full_result
from sidecar.core.scorers import DEFAULT_SCORERS
from sidecar.core.selection import HealthView, LatencyValue, PipelineResult, SelectionContext
from sidecar.core.stats import StatsStore
from sidecar.core.subwindow import as_metric
from sidecar.core.trial_hold import TrialHold
from sidecar.core.types import Decision, RequestInfo, SliceKey, TransitionEvent
from sidecar.core.viability import health_view
from sidecar.core.window_evaluation import evaluate_windows


class Router(Intake):
    """All routing state for one sidecar (or one simulated policy run)."""

    def __init__(self, config: Config, recent: int = 64) -> None:
        self.config = config
        self.stats = StatsStore(config.stats)
        self.board = HealthBoard(config.health, config.stats)
        self._inflight: Counter[str] = Counter()
        self._low: Counter[str] = Counter()  # of those, requests of a Decision.low
        # Fleet mode: other replicas' in-flight counts (sidecar.fleet), so capacity and
        # load see the provider's whole load; empty when standalone.
        self.peer_inflight: dict[str, int] = {}
        self.peer_low: dict[str, int] = {}  # of those, Decision.low (admission holds it)
        self.counters: Counter[tuple[str, str]] = Counter()  # (kind, label) -> count
        self.decisions: Counter[tuple[str, str, str]] = Counter()  # (cluster, class, reason)
        self.recent: deque[RecentDecision] = deque(maxlen=recent)
        self._as_low = LowVariants()  # decisions marked low, kept per decision
        self.transitions: deque[TransitionEvent] = deque(maxlen=256)
        self._next_eval: float | None = None
        self._picker = PICKERS[config.picker]
        self.admission = AdmissionControl(config, self._low, self.peer_low)
        self.plans = PlanCache(config.stats)
        self._models_of: dict[str, tuple[ModelConfig, ...]] = {}
        self.compat_sr = compat_sr.SrLatencyBook()  # models under compat: semantic-router
        self.trials = TrialHold()  # hard failures whose run is still on trial
        self.light = LightOutcomes()  # outcomes under light load (the floor's share)
        self.pushback = PushBack()  # limits learned from 429s (sidecar.core.pushback)
        self._refused, self._caps = self.pushback.refused_slots, self.pushback.caps
        self.queue_signs = QueueSigns()  # capacity lost without a 429 (sidecar.core.queue_signs)
        self.live = LiveMisses(config)  # routes missing their budget now
        self._configure(config)

    # ------------------------------------------------------------ config

    def _configure(self, config: Config) -> None:
        self.plans.configure(config.stats)
        # Light-load floor shares: standalone only (sidecar.core.light_load, "Fleet mode").
        self._light = self.light if config.fleet is None else None
        self.light.keep_records(any(k.miss_ratio_exponent for k in config.classes))
        self.light.size_for(len(config.clusters) * (config.stats.max_slices + 2))  # + overflows
        self._limits = {c.name: c.max_concurrency for c in config.clusters}
        self.queue_signs.forget(set(self._limits))
        self.pushback.configure(
            self._limits, {m.candidates[0] for m in config.models if len(m.candidates) == 1})
        self._fresh = False  # building a plan: read evidence fresh
        self._models_of = {c.name: tuple(m for m in config.models if c.name in m.candidates)
                           for c in config.clusters}

    def reload(self, config: Config) -> None:
        """Swap in a new config, keeping statistics and health where still meaningful.

        Statistics are kept through any ``stats`` change but a new sub-window length
        (:data:`~sidecar.core.stats.LAYOUT_FIELDS`: the old windows are incomparable);
        they start fresh then (health states are kept)."""
        self._release_trials(None)  # recorded under the old layout, as observed
        if not self.stats.reconfigure(config.stats):
            self.stats = StatsStore(config.stats)
        self.board.reconfigure(config.health, config.stats)
        self.config = config
        self._picker = PICKERS[config.picker]
        self.admission.reconfigure(config)
        self.live.reconfigure(config)
        self._configure(config)
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
        self.trials = TrialHold()  # the snapshot does not carry held trial failures
        self.transitions.extend(transitions)
        self._next_eval = self._boundary_after(now)
        self.plans.clear()

    # ------------------------------------------------------------ RouteView

    def evidence(
        self, cluster: str, slice: SliceKey, metric: str, now: float, fresh: bool = False
    ) -> RouteEvidence | None:
        """The blended evidence of ``slice`` on ``cluster`` (see :mod:`sidecar.core.evidence`).

        ``fresh``: fold in every observation so far (as while building a plan); else a
        blend up to half a sub-window old may be reused."""
        return self.stats.evidence(cluster, slice, as_metric(metric), now,
                                   0.0 if fresh or self._fresh else None)

    def latency(
        self, cluster: str, slice: SliceKey, metric: str, percentile: float, now: float,
        fresh: bool = False,
    ) -> LatencyValue:
        ev = self.evidence(cluster, slice, metric, now, fresh)
        if ev is None:
            return LatencyValue(None, None, False, 0)
        return LatencyValue(ev.quantile(percentile / 100.0), ev.used, ev.fell_back, ev.samples)

    def health(self, cluster: str, slice: SliceKey) -> HealthView:
        """What selection sees: the worse of the slice's and the cluster-wide entry."""
        return health_view(self.board, self.config, cluster, slice)

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
        cfg = self.config
        klass = cfg.workload_class(req.klass) or cfg.workload_class(cfg.default_class)
        self.pushback.release(now)  # a declared wait that is over (cheap when none is)
        decision, result = self._decide(req, klass, now, rng)
        decision, new_event = self._admit(req, klass, decision, result, now,
                                          ticket or req.request_id, rng)
        if decision.admission == "admit" and not cfg.admission.high(req.priority):
            decision = self._as_low.of(decision)
        if not new_event:
            return decision
        if self.board.runs and decision.admission == "admit":
            self.board.note_sent(decision.cluster, req.slice, now)
        counters = self.counters
        counters[("decision", decision.reason)] += 1
        counters[("admission", decision.admission)] += 1
        if not req.class_known:
            counters[("unknown", "class")] += 1  # default class used (documented)
        # Bounded labels: clusters and classes come from config, reasons from a closed set.
        self.decisions[(decision.cluster, req.klass, decision.reason)] += 1
        fallback = fallback_kind(decision, chosen_latency(result))
        if fallback:
            counters[("fallback", fallback)] += 1
        self.recent.append(RecentDecision(now, req, decision, result, self._picker.name))
        return decision

    def _admit(self, req: RequestInfo, klass: ClassConfig | None, decision: Decision,
               result: PipelineResult | LanePick | None, now: float, ticket: str | None,
               rng: random.Random | None = None) -> tuple[Decision, bool]:
        """Run admission control (sidecar.core.admission) on a selection result;
        ``klass``: the request's class (or the default one)."""
        if decision.reason in ("unknown_model", "no_candidate", "not_llm"):
            self.admission.queue.leave(ticket)  # a waiter whose model a reload removed
            return decision, True
        assert klass is not None
        v = self.admission.assess(req, klass, decision, result, self, now, ticket, rng)
        if v.outcome == "admit" and v.reason == "ok" and v.cluster == decision.cluster:
            # The common case: nothing to change but the timeout (the class's).
            if v.timeout_ms == decision.timeout_ms and v.is_retry == decision.is_retry:
                return decision, True
            return replace(decision, timeout_ms=v.timeout_ms, is_retry=v.is_retry), True
        if not v.requeued and v.reason not in ("ok", "disabled"):
            self.counters[("admission_reason", v.reason)] += 1
        if v.outcome == "admit" and v.cluster != decision.cluster:
            rescue = v.reason == "rescue"  # a probe, not a refusal (sidecar.core.rescue_probe)
            decision = self._finish(req, v.cluster, "probe" if rescue else decision.reason,
                                    klass, full_result(result), decision.is_probe or rescue)
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
            is_rescue=v.reason == "rescue",  # its answer alone may end the cooldown
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
        self, req: RequestInfo, klass: ClassConfig | None, now: float, rng: random.Random
    ) -> tuple[Decision, PipelineResult | LanePick | None]:
        cfg = self.config
        if req.api == "other":
            # Not an LLM API (embeddings, model listing...): the default route by design.
            return Decision(cfg.default_cluster, "not_llm"), None
        model = cfg.model(req.model) if req.model else None
        if model is None:
            return Decision(cfg.default_cluster, "unknown_model", detail=str(req.model)), None
        assert klass is not None
        if model.compat == SEMANTIC_ROUTER:
            return compat_sr.decide(req, model, klass, self.config, self.compat_sr), None
        cached = self._plan(req, model, klass, now)
        if cached.probes and not req.retry_attempt:
            # Never probe with a retry: it already had bad luck once.
            for p in cached.probes:
                if self.has_room(p.cluster) and rng.random() < p.share:
                    if not self._carries(req, klass, p.cluster, now):
                        break
                    return self._decision(cached, req, p.cluster, "probe", klass, None), None
        if self.board.runs and not (req.retry_attempt or req.explain):
            # Nor an explained request: it shows the pipeline's choice.
            trial = trial_route(cached, self.board, req.slice, now, self.has_room)
            if trial is not None and self._carries(req, klass, trial, now):
                return self._decision(cached, req, trial, "trial", klass, None), None
        # The per-request stage reads the plan's context (same model, slice and step;
        # what changes per request -- in-flight counts -- comes from the view); as
        # plain arithmetic when that is exact (sidecar.core.request_lane). An open run
        # of hard failures may hold routes back: the full stage then decides.
        ctx = cached.ctx
        if self.board.runs:
            held = frozenset(c for c in model.candidates
                             if self.board.run_held(c, req.slice, now))
            if held:
                ctx = replace(ctx, held=held)
        missing = self.live.missing_among(model.candidates, req.slice, now)
        if missing:
            ctx = replace(ctx, missing=missing)
        if cached.lane is not None and not req.explain and not ctx.held and not ctx.missing:
            # Standalone, the in-flight counts are the Counter's own (missing: 0).
            lane = cached.lane
            pick = lane.pick(self.inflight if self.peer_inflight or self._refused or self._caps
                             else self._inflight.__getitem__, rng)
            if pick is not None:
                row = lane.rows[pick.chosen]
                return self._decision(cached, req, row.name, row.reason, klass, None), pick
        result = run_request(cached.plan, ctx, self._picker, rng)
        if result is None:
            decision = Decision(
                cfg.default_cluster, "no_candidate", detail="hard filters left none"
            )
            return decision, None
        if ctx.missing:  # count the routes it kept out (not those the guard kept in)
            for cand in result.candidates:
                if cand.dropped == "live_misses" and cand.name != result.chosen.name:
                    self.counters[("live_missing", cand.name)] += 1
        reason = decision_reason(result, model)
        return self._decision(cached, req, result.chosen.name, reason, klass, result), result

    def _carries(self, req: RequestInfo, klass: ClassConfig, cluster: str, now: float) -> bool:
        """May ``req`` carry a probe or trial there? plan_cache, "Evidence and admission"."""
        adm, a = self.config.admission, self.admission
        if a.memory.lookup(req.request_id, now) is not None:
            return False  # a retry known only by its request id: never evidence, as above
        if not adm.enabled:
            return True
        if req.deadline_ms is not None and not a.fits(cluster, req, klass, self, now):
            return False
        return adm.high(req.priority) or not a.over(cluster, req, klass, self, now)

    def _decision(
        self, cached: CachedPlan, req: RequestInfo, cluster: str, reason: str,
        klass: ClassConfig, result: PipelineResult | None,
    ) -> Decision:
        probe = reason == "probe"
        if req.explain:
            return self._finish(req, cluster, reason, klass, result, is_probe=probe)
        hit = cached.decisions.get((cluster, reason))
        if hit is None:
            hit = cached.decisions[(cluster, reason)] = self._finish(
                req, cluster, reason, klass, None, is_probe=probe)
        return hit

    def _plan(
        self, req: RequestInfo, model: ModelConfig, klass: ClassConfig, now: float
    ) -> CachedPlan:
        """The current plan of this request's step (:mod:`sidecar.core.plan_cache`)."""
        budget_key, fanout = step_key(req, klass)
        key = (model.name, req.slice, budget_key, fanout)
        hit = self.plans.current(key, self.board.version, self.stats.layout, now)
        if hit is not None:
            return hit
        # The workflow meets the worst of its k calls: each may miss 1/k of the share.
        allowed = max(1.0 - klass.slo.percentile / 100.0, 1e-4) / fanout
        ctx = SelectionContext(self.config, model, klass, req, self, now,
                               step_budget_s(budget_key), allowed, light=self._light,
                               recurrence=self.live.recurrence(model.candidates, req.slice, now),
                               refusing=any(self.pushback.refusing(c, now)
                                            for c in model.candidates))
        self._fresh = True
        try:
            plan = build_plan(ctx, DEFAULT_FILTERS, DEFAULT_SCORERS)
        finally:
            self._fresh = False
        deps = tuple(rs for c in model.candidates for s in (req.slice, *req.slice.broader())
                     if (rs := self.stats.series(c, s)) is not None)  # fmt: skip
        ctx = replace(ctx, healths={c.name: c.health for c in plan.candidates})
        light, names = self._light, model.candidates
        price = None if light is None else (
            lambda c: route_price(light, names, c, req.slice, allowed, now))
        cached = CachedPlan(plan, ctx, probes(self.board, self.config, req.slice, klass, model,
                                              price),
                            now, 0, self.board.version, self.stats.layout, deps,
                            tuple(rs.version for rs in deps),
                            RequestLane.of(plan, ctx, self._picker))
        self.plans.store(key, cached)
        return cached

    def _finish(self, req: RequestInfo, cluster: str, reason: str, klass: ClassConfig,
                result: PipelineResult | None, is_probe: bool = False) -> Decision:
        return decision_for(self.config, self._picker.name, req, cluster, reason, klass,
                            result, is_probe)

    # ------------------------------------------------------------ time

    def next_deadline(self) -> float | None:
        """The next time :meth:`tick` has work to do (window end, cooldown end, or the
        end of a provider's declared wait)."""
        best = self._next_eval
        for t in (self.board.next_deadline(), self.pushback.next_release):
            if t is not None and (best is None or t < best):
                best = t
        return best

    def tick(self, now: float) -> list[TransitionEvent]:
        """Evaluate finished windows and expire cooldowns. Cheap when nothing is due."""
        events = self.board.tick(now)
        self.pushback.release(now)
        if self.trials:
            for _, held in self.trials.due(now, self.config.stats.subwindow_s, self._judged):
                for obs in held:
                    self.stats.observe(obs, now)
        if self._next_eval is not None and now >= self._next_eval:
            self._next_eval = self._boundary_after(now)
            self._learn_caps(now)
            self.pushback.grow(now)
            events.extend(evaluate_windows(self.config, self.stats, self.board,
                                           self._models_of, now))
            self.stats.prune(now)
            self.board.prune(set(self.stats.narrow_keys()))
        self._log(events)
        return events
