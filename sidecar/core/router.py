"""The decision core's facade: decide, observe, tick.

Sans-I/O in the h11/aioquic manner: the server shell and the simulator feed
events with ``now`` and get decisions back; :meth:`Router.next_deadline` tells
them when to call :meth:`Router.tick` next. One Router object is the whole
state: statistics, health, in-flight counts and the recent-decision ring.

**Hot path.** Nothing per request that can be done per refresh: the static
stage of the selection pipeline (:func:`~sidecar.core.pipeline.build_plan`:
health views, blended evidence, latency, attainment, cost and quality scores)
is cached per (model, slice, step budget, fan-out) as a plan. A plan is
rebuilt when the health board changes, a series is created or dropped, or --
once one of its series saw new observations -- after :data:`PLAN_REUSE`
decisions or :data:`PLAN_SUBWINDOWS` sub-windows (20 s by default), whichever
comes first: its evidence is at most two sub-windows old at low rates (where
that is a handful of requests) and a few dozen decisions old at high ones. A
decision then runs only the per-request stage (capacity, herding guard, load,
the picker) plus probes and admission -- for most requests as a few lines of
arithmetic over the in-flight counts (:mod:`sidecar.core.request_lane`, exact).
Hard failures do not wait for a refresh: the fast path changes health, which
invalidates plans at once.
"""

from __future__ import annotations

import math
import random
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from sidecar.core import compat_sr
from sidecar.core.admission import AdmissionControl
from sidecar.core.config import SEMANTIC_ROUTER, ClassConfig, Config, ModelConfig
from sidecar.core.evidence import RouteEvidence
from sidecar.core.explain import RecentDecision, build_explain, decision_reason, fallback_kind
from sidecar.core.filters import DEFAULT_FILTERS
from sidecar.core.health import HealthState, RouteHealth
from sidecar.core.health_board import CLUSTER_SLICE, HealthBoard
from sidecar.core.pickers import PICKERS
from sidecar.core.pipeline import (
    HealthView,
    LatencyValue,
    PipelineResult,
    Plan,
    SelectionContext,
    build_plan,
    run_request,
)
from sidecar.core.request_lane import LanePick, RequestLane, chosen_latency, full_result
from sidecar.core.scorers import DEFAULT_SCORERS
from sidecar.core.series import RouteStats
from sidecar.core.stats import StatsStore
from sidecar.core.subwindow import OkSample, as_metric
from sidecar.core.trial_hold import TrialHold
from sidecar.core.types import (
    ANY,
    Decision,
    Observation,
    RequestInfo,
    SliceKey,
    TransitionEvent,
)

_QUARANTINED = {HealthState.QUARANTINED, HealthState.PROBING}


def _is_hard(obs: Observation) -> bool:
    """A hard failure for the fast path: a timeout, or an error with a 5xx or no status."""
    return obs.outcome == "timeout" or (
        obs.outcome == "error" and (obs.status is None or obs.status >= 500))

_HEALTHY = HealthView("healthy", 1.0, False, False)
_HEALTHY_ON_TRIAL = HealthView("healthy", 1.0, False, False, on_trial=True)
_BUDGET_STEPS_PER_E = 20  # step budgets are cached in ~5 % steps (log scale)
_PLAN_CACHE_MAX = 4096
PLAN_REUSE = 48  # decisions a plan serves before new evidence is folded in
PLAN_SUBWINDOWS = 2  # sub-windows a plan may serve before new evidence is folded in


@dataclass(slots=True)
class _Probe:
    cluster: str
    share: float


@dataclass(slots=True)
class _CachedPlan:
    """A plan and what it was built from (see the module docstring)."""

    plan: Plan
    ctx: SelectionContext
    probes: tuple[_Probe, ...]
    built: float
    uses: int
    board: int
    layout: int
    deps: tuple[RouteStats, ...]
    versions: tuple[int, ...]
    lane: RequestLane | None  # the per-request stage as arithmetic, when exact
    # Decisions without explain are a function of (cluster, reason) for a plan: reused.
    decisions: dict[tuple[str, str], Decision] = field(default_factory=dict)


class Router:
    """All routing state for one sidecar (or one simulated policy run)."""

    def __init__(self, config: Config, recent: int = 64) -> None:
        self.config = config
        self.stats = StatsStore(config.stats)
        self.board = HealthBoard(config.health, config.stats)
        self._inflight: Counter[str] = Counter()
        # Fleet mode: other replicas' in-flight counts (sidecar.fleet), so capacity and
        # load see the provider's whole load; empty when standalone.
        self.peer_inflight: dict[str, int] = {}
        self.counters: Counter[tuple[str, str]] = Counter()  # (kind, label) -> count
        self.decisions: Counter[tuple[str, str, str]] = Counter()  # (cluster, class, reason)
        self.recent: deque[RecentDecision] = deque(maxlen=recent)
        self.transitions: deque[TransitionEvent] = deque(maxlen=256)
        self._next_eval: float | None = None
        self._picker = PICKERS[config.picker]
        self.admission = AdmissionControl(config)
        self._plans: dict[tuple[str, SliceKey, int | None, int], _CachedPlan] = {}
        self._models_of: dict[str, tuple[ModelConfig, ...]] = {}
        self.compat_sr = compat_sr.SrLatencyBook()  # models under compat: semantic-router
        self.trials = TrialHold()  # hard failures whose run is still on trial
        self._configure(config)

    # ------------------------------------------------------------ config

    def _configure(self, config: Config) -> None:
        self._plans.clear()
        self._refresh_s = config.stats.subwindow_s * PLAN_SUBWINDOWS
        self._max_age_s = config.stats.subwindow_s * config.stats.subwindows
        self._fresh = False  # building a plan: read evidence fresh
        self._models_of = {
            c.name: tuple(m for m in config.models if c.name in m.candidates)
            for c in config.clusters
        }

    def reload(self, config: Config) -> None:
        """Swap in a new config, keeping statistics and health where still meaningful.

        A changed sub-window length or ring makes the old windows incomparable:
        statistics start fresh then (health states are kept).
        """
        self._release_trials(None)  # recorded under the old layout, as observed
        if config.stats != self.config.stats:
            self.stats = StatsStore(config.stats)
        self.board.reconfigure(config.health, config.stats)
        self.config = config
        self._picker = PICKERS[config.picker]
        self.admission.reconfigure(config)
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
        self._plans.clear()

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
        h = self.board.peek(cluster, slice)
        hc = self.board.peek(cluster, CLUSTER_SLICE)
        if hc is not None and hc.state is not HealthState.HEALTHY and (
                h is None or hc.weight <= h.weight):
            h = hc
        on_trial = bool(self.board.runs) and self.board.on_trial(cluster, slice)
        if h is None or h.state is HealthState.HEALTHY:
            return _HEALTHY_ON_TRIAL if on_trial else _HEALTHY
        klass = self.config.workload_class(slice.klass)
        sensitive = klass.latency_sensitive if klass else True
        return HealthView(
            state=h.state.value,
            weight=h.weight_for(sensitive),
            excluded_for_sensitive=h.excluded_for_sensitive,
            quarantined=h.state in _QUARANTINED,
            probe_share=self._probe_share(cluster, slice, sensitive) or 0.0,
            on_trial=on_trial,
        )

    def inflight(self, cluster: str) -> int:
        n = self._inflight[cluster]
        return n + self.peer_inflight.get(cluster, 0) if self.peer_inflight else n

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
        decision, result = self._decide(req, klass, now, rng)
        decision, new_event = self._admit(req, klass, decision, result, now,
                                          ticket or req.request_id)
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

    def _admit(
        self, req: RequestInfo, klass: ClassConfig | None, decision: Decision,
        result: PipelineResult | LanePick | None, now: float, ticket: str | None,
    ) -> tuple[Decision, bool]:
        """Run admission control (sidecar.core.admission) on a selection result;
        ``klass``: the request's class (or the default one)."""
        if decision.reason in ("unknown_model", "no_candidate"):
            return decision, True
        assert klass is not None
        v = self.admission.assess(req, klass, decision, result, self, now, ticket)
        if v.outcome == "admit" and v.reason == "ok" and v.cluster == decision.cluster:
            # The common case: nothing to change but the timeout (the class's).
            if v.timeout_ms == decision.timeout_ms and v.is_retry == decision.is_retry:
                return decision, True
            return replace(decision, timeout_ms=v.timeout_ms, is_retry=v.is_retry), True
        if not v.requeued and v.reason not in ("ok", "disabled"):
            self.counters[("admission_reason", v.reason)] += 1
        if v.outcome == "admit" and v.cluster != decision.cluster:
            decision = self._finish(req, v.cluster, decision.reason, klass,
                                    full_result(result), is_probe=decision.is_probe)
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
        self, req: RequestInfo, klass: ClassConfig | None, now: float, rng: random.Random
    ) -> tuple[Decision, PipelineResult | LanePick | None]:
        cfg = self.config
        model = cfg.model(req.model) if req.model else None
        if model is None:
            return Decision(cfg.default_cluster, "unknown_model", detail=str(req.model)), None
        assert klass is not None
        if model.compat == SEMANTIC_ROUTER:
            return self._decide_semantic_router(req, model, klass), None
        cached = self._plan(req, model, klass, now)
        if cached.probes and not req.retry_attempt:
            # Never probe with a retry: it already had bad luck once.
            for p in cached.probes:
                if (self._inflight[p.cluster] < cfg.cluster(p.cluster).max_concurrency
                        and rng.random() < p.share):
                    return self._decision(cached, req, p.cluster, "probe", klass, None), None
        if self.board.runs and not (req.retry_attempt or req.explain):
            # Nor an explained request: it shows the pipeline's choice.
            trial = self._trial(cached, req.slice, now)
            if trial is not None:
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
        if cached.lane is not None and not req.explain and not ctx.held:
            # Standalone, the in-flight counts are the Counter's own (missing: 0).
            lane = cached.lane
            pick = lane.pick(self.inflight if self.peer_inflight
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
        reason = decision_reason(result, model)
        return self._decision(cached, req, result.chosen.name, reason, klass, result), result

    def _decision(
        self, cached: _CachedPlan, req: RequestInfo, cluster: str, reason: str,
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

    def _step(self, req: RequestInfo, klass: ClassConfig) -> tuple[int | None, int]:
        """Plan key parts of a request's step: budget (None: the class's) and fan-out."""
        fanout = max(1, min(req.fanout, 256))
        budget_ms = klass.slo.budget_ms
        if req.deadline_ms is None or req.deadline_ms >= budget_ms:
            return None, fanout
        return round(math.log(max(req.deadline_ms, 1.0) / 1000.0) * _BUDGET_STEPS_PER_E), fanout

    def _plan(
        self, req: RequestInfo, model: ModelConfig, klass: ClassConfig, now: float
    ) -> _CachedPlan:
        budget_key, fanout = self._step(req, klass)
        key = (model.name, req.slice, budget_key, fanout)
        hit = self._plans.get(key)
        if hit is not None and hit.board == self.board.version and \
                hit.layout == self.stats.layout:
            hit.uses += 1
            age = now - hit.built
            if hit.uses < PLAN_REUSE and age < self._refresh_s:
                return hit
            if age < self._max_age_s and all(
                    rs.version == v for rs, v in zip(hit.deps, hit.versions, strict=True)):
                hit.uses = 0  # nothing observed since: still current
                return hit
        budget_s = None if budget_key is None else math.exp(budget_key / _BUDGET_STEPS_PER_E)
        allowed = max(1.0 - klass.slo.percentile / 100.0, 1e-4) / fanout
        ctx = SelectionContext(self.config, model, klass, req, self, now, budget_s, allowed)
        self._fresh = True
        try:
            plan = build_plan(ctx, DEFAULT_FILTERS, DEFAULT_SCORERS)
        finally:
            self._fresh = False
        deps = tuple(rs for c in model.candidates for s in (req.slice, *req.slice.broader())
                     if (rs := self.stats.series(c, s)) is not None)  # fmt: skip
        ctx = replace(ctx, healths={c.name: c.health for c in plan.candidates})
        cached = _CachedPlan(plan, ctx, self._probes(req.slice, klass, model), now, 0,
                             self.board.version, self.stats.layout, deps,
                             tuple(rs.version for rs in deps),
                             RequestLane.of(plan, ctx, self._picker))
        if len(self._plans) >= _PLAN_CACHE_MAX:
            self._plans.clear()
        self._plans[key] = cached
        return cached

    def _trial(self, cached: _CachedPlan, slice: SliceKey, now: float) -> str | None:
        """The route, if any, whose open run is on trial with no trial pending
        (trial pace, :mod:`sidecar.core.health`): it takes this request, so a dead
        route is judged within its ``K`` requests whatever share the scores left
        it. Only a route no static filter dropped, and with room."""
        for cand in cached.plan.candidates:
            c = cand.name
            if (cand.dropped is None and self.board.trial_due(c, slice, now)
                    and self._inflight[c] < self.config.cluster(c).max_concurrency):
                return c
        return None

    def _probes(
        self, slice: SliceKey, klass: ClassConfig, model: ModelConfig
    ) -> tuple[_Probe, ...]:
        """Where a small share of a slice's traffic goes as probes.

        Probes go to routes whose cooldown has ended (probing; the cluster-wide
        entry or the slice's) and, for latency-sensitive classes, to restricted
        routes (the slice's entry or the cluster-wide one), which otherwise see
        no such traffic and could never show recovery. Shares shrink with the
        route's relapses; capacity still applies.
        """
        out: list[_Probe] = []
        for c in model.candidates:
            share = self._probe_share(c, slice, klass.latency_sensitive)
            if share is not None:
                out.append(_Probe(c, share))
        return tuple(out)

    def _probe_share(self, cluster: str, slice: SliceKey, sensitive: bool) -> float | None:
        """The share of ``slice``'s traffic :meth:`_probes` sends ``cluster`` (None: none)."""
        hc = self.board.peek(cluster, CLUSTER_SLICE)
        if hc is not None and hc.state is HealthState.PROBING:
            return hc.probe_share
        h = self.board.peek(cluster, slice)
        if h is not None and h.state is HealthState.PROBING:
            return h.probe_share
        if not sensitive:
            return None
        # A cluster restricted as a whole (a run of failures likely by chance on a
        # partly failing route, or the last viable route) needs its probes as much
        # as a restricted slice: without them a latency-sensitive-only model never
        # sends it a request, and it would wait out the stale-verdict timeout.
        for e in (h, hc):
            if e is not None and e.state is HealthState.RESTRICTED:
                return self.config.health.probe_share * e.memory
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
        """Record one measured outcome; probes drive the probing state, other
        outcomes the fast path for hard failures."""
        self.compat_sr.observe(obs, self.config)
        obs = self._judge_censored(obs)
        self.counters[("outcome", obs.outcome)] += 1
        if self._next_eval is None:
            self._next_eval = self._boundary_after(now)
        if obs.outcome == "cancel":
            self.stats.observe(obs, now)
            return []
        if obs.is_probe:
            key = self.stats.observe(obs, now)
            events = self._record_probe(obs, key, now)
        else:
            key = self.stats.key_of(obs.cluster, obs.slice)
            events = self._fast_path(obs, key, now)
            self._record(obs, key, now)
        if events:
            self._log(events)
        return events

    def _record(self, obs: Observation, key: SliceKey, now: float) -> None:
        """Into the statistics after the fast path saw it -- unless it is a failure of
        a run on trial, held until the run is judged (:mod:`sidecar.core.trial_hold`)."""
        route = (obs.cluster, key)
        if not self._judged(route):
            # Only errors wait: a timeout already waited out the class timeout, its run
            # cannot finish quickly anyway, and on a loaded route it is the overload
            # signal the score must see at once (held, they herded traffic onto it).
            if obs.outcome == "error" and _is_hard(obs):
                self.trials.hold(route, obs, now)
                return
        elif self.trials:
            hc = self.board.peek(obs.cluster, CLUSTER_SLICE)
            for r in self.trials.clusters(obs.cluster) if hc and hc.circuit_open else [route]:
                self._release_trials(r, now)
        self.stats.observe(obs, now)

    def _judged(self, route: tuple[str, SliceKey]) -> bool:
        """Is the route's run of hard failures no longer on trial (or not open)?"""
        h = self.board.peek(*route)
        if h is None or not h.trial_failures:
            return True
        hc = self.board.peek(route[0], CLUSTER_SLICE)
        return hc is not None and hc.circuit_open

    def _release_trials(self, route: tuple[str, SliceKey] | None, now: float = 0.0) -> None:
        """Record held trial failures: one route's at ``now``, or (None) all of them,
        each at the time it was held."""
        if route is None:
            for obs, held_at in self.trials.release_all():
                self.stats.observe(obs, held_at)
            return
        for obs in self.trials.release(route):
            self.stats.observe(obs, now)

    def observe_ok(self, cluster: str, slice: SliceKey, samples: Sequence[OkSample],
                   now: float) -> None:
        """:meth:`observe` of many ``ok`` first attempts of ``slice`` on ``cluster`` that
        are not probes, all at ``now`` (a batch of log entries), in one pass: the same
        statistics, counters and fast-path runs as one call per sample in order. A
        success trips nothing, so there are no events; and on a route the health board
        holds nothing for, it changes nothing there either."""
        n = len(samples)
        if not n:
            return
        config = self.config
        if self.compat_sr.covers(slice.model, config):
            for ttft, tpot, e2e, tokens in samples:
                self.compat_sr.observe(
                    Observation(cluster, slice, "ok", None, ttft, tpot, e2e, tokens), config)
        self.counters[("outcome", "ok")] += n
        if self._next_eval is None:
            self._next_eval = self._boundary_after(now)
        key = self.stats.observe_ok(cluster, slice, samples, now)
        board = self.board
        hc = board.peek(cluster, CLUSTER_SLICE)
        if hc is not None and hc.circuit_open:
            return  # stragglers of an ejected cluster (_fast_path)
        if hc is None and board.peek(cluster, key) is None:
            return
        label = key.label()
        for _, _, e2e, _ in samples:
            sent_at = None if e2e is None else now - e2e
            board.note_outcome(cluster, CLUSTER_SLICE, False, now, sent_at, label)
            board.note_outcome(cluster, key, False, now, sent_at)
        if self.trials and (cluster, key) in self.trials and self._judged((cluster, key)):
            self._release_trials((cluster, key), now)

    def _record_probe(self, obs: Observation, key: SliceKey, now: float) -> list[TransitionEvent]:
        """A cluster-wide probe passes on any answer; a slice's must meet its budget."""
        events: list[TransitionEvent] = []
        hc = self.board.peek(obs.cluster, CLUSTER_SLICE)
        if hc is not None and hc.state in (HealthState.PROBING, HealthState.RESTRICTED):
            events += self.board.record_probe(obs.cluster, CLUSTER_SLICE, obs.outcome == "ok",
                                              now)
        h = self.board.peek(obs.cluster, key)
        if h is not None and h.state in (HealthState.PROBING, HealthState.RESTRICTED):
            ok = obs.outcome == "ok" and self._within_budget(obs)
            events += self.board.record_probe(obs.cluster, key, ok, now)
        return events

    def _fast_path(self, obs: Observation, key: SliceKey, now: float) -> list[TransitionEvent]:
        """Runs of hard failures (5xx, connect failures, resets, timeouts) eject at once:
        the whole cluster when its run trips and another route serves its models,
        else the slice (restricted instead when it is the last viable route)."""
        hard = _is_hard(obs)
        board = self.board
        sent_at = None if obs.e2e_s is None else now - obs.e2e_s
        hc = board.peek(obs.cluster, CLUSTER_SLICE)
        if hc is not None and hc.circuit_open:
            return []  # stragglers of an ejected cluster: its incident, not its slices'
        timeout = obs.outcome == "timeout"
        cluster_trip = board.note_outcome(obs.cluster, CLUSTER_SLICE, hard, now, sent_at,
                                          key.label(), timeout)
        slice_trip = board.note_outcome(obs.cluster, key, hard, now, sent_at, timeout=timeout)
        if not (cluster_trip or slice_trip):
            return []
        if cluster_trip and self._cluster_ejectable(obs.cluster):
            board.reset_run(obs.cluster, key)
            return board.eject(obs.cluster, CLUSTER_SLICE, now)
        if not slice_trip:
            return []
        return board.eject(obs.cluster, key, now, self._others_viable(obs.cluster, key))

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
        a, b = self._next_eval, self.board.next_deadline()
        if a is None or b is None:
            return a if b is None else b
        return a if a < b else b

    def tick(self, now: float) -> list[TransitionEvent]:
        """Evaluate finished windows and expire cooldowns. Cheap when nothing is due."""
        events = self.board.tick(now)
        if self.trials:
            for _, held in self.trials.due(now, self.config.stats.subwindow_s, self._judged):
                for obs in held:
                    self.stats.observe(obs, now)
        if self._next_eval is not None and now >= self._next_eval:
            self._next_eval = self._boundary_after(now)
            events.extend(self._evaluate(now))
            self.stats.prune(now)
            self.board.prune(set(self.stats.narrow_keys()))
        self._log(events)
        return events

    def _evaluate(self, now: float) -> list[TransitionEvent]:
        events: list[TransitionEvent] = []
        open_clusters = {c for (c, s), h in self.board.items()
                         if s == CLUSTER_SLICE and h.circuit_open}  # fmt: skip
        for cluster, slice in self.stats.narrow_keys():
            klass = self.config.workload_class(slice.klass)
            if klass is None or cluster in open_clusters:
                # A cluster whose circuit is open is judged as a whole (its slices'
                # windows hold the outage and the probes); they start afresh on restore.
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
        k = math.floor(now / self.config.stats.subwindow_s) - 1
        for (cluster, slice), h in self.board.items():
            if slice == CLUSTER_SLICE and h.state is not HealthState.HEALTHY:
                req, fail = self._cluster_outcomes(cluster, k, now)
                events.extend(self.board.evaluate_outcomes(cluster, slice, k, req, fail, now))
        return events

    def _cluster_outcomes(self, cluster: str, index: int, now: float) -> tuple[int, int]:
        """Requests and failures of every model on ``cluster`` in sub-window ``index``."""
        req = fail = 0
        for m in self._models_of.get(cluster, ()):
            rs = self.stats.series(cluster, SliceKey(m.name, ANY, ANY, None))
            if rs is not None:
                r, f = rs.outcomes_in(index, index, now)
                req, fail = req + r, fail + f
        return req, fail

    def _viable(self, cluster: str, slice: SliceKey | None) -> bool:
        hc = self.board.peek(cluster, CLUSTER_SLICE)
        if hc is not None and hc.circuit_open:
            return False
        if slice is None:
            return True
        h = self.board.peek(cluster, slice)
        return h is None or (h.state not in _QUARANTINED and not h.excluded_for_sensitive)

    def _others_viable(self, cluster: str, slice: SliceKey) -> bool:
        """Is there another candidate for this slice that is neither quarantined nor restricted?"""
        model = self.config.model(slice.model)
        if model is None:
            return True
        return any(self._viable(c, slice) for c in model.candidates if c != cluster)

    def _cluster_ejectable(self, cluster: str) -> bool:
        """May the whole cluster be ejected: does every model it serves keep another
        candidate whose cluster-wide circuit is closed, and does every slice of those
        models that is quarantined or restricted somewhere keep another viable route?
        (Without the second part, ejecting the cluster could leave a slice whose other
        routes are all open with none.)"""
        models = self._models_of.get(cluster, ())
        if not all(any(self._viable(c, None) for c in m.candidates if c != cluster)
                   for m in models):
            return False
        served = {m.name: m for m in models}
        troubled = {s for (_, s), h in self.board.items()
                    if s != CLUSTER_SLICE and s.model in served
                    and (h.state in _QUARANTINED or h.excluded_for_sensitive)}
        return all(any(self._viable(c, s) for c in served[s.model].candidates if c != cluster)
                   for s in troubled)

    def _log(self, events: list[TransitionEvent]) -> None:
        for e in events:
            self.transitions.append(e)
            self.counters[("transition", e.new)] += 1
            if e.old == "probing" and e.new == "restoring":
                # The circuit closes again: judge the route on what it does from now on.
                s = SliceKey.parse(e.slice)
                self.stats.fence(e.cluster, None if s == CLUSTER_SLICE else s, e.at)


def route_health(router: Router, cluster: str, slice: SliceKey) -> RouteHealth | None:
    """The stored health entry of a route (None: fresh and healthy)."""
    return router.board.peek(cluster, slice)
