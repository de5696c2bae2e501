"""The observation half of the router: outcomes in, statistics and health out.

:class:`Intake` is a mixin of :class:`~sidecar.core.router.Router` (the state is
the router's; this module holds how an outcome is taken in). Per outcome::

    cancel after the class budget     -> a timeout (the client gave up on a slow route)
    cancel before it                  -> its lower-bound latencies dropped (a user pressed
                                         stop), but a measured first token kept: a TTFT
                                         sample of a cancel, never an ok
                                         (sidecar.core.judging); under light load a
                                         met budget (TTFT classes)
    probe                             -> statistics, then the probing or restricted route's
                                         verdict (a slice's probe must meet its budget); a
                                         quarantined one's only for a rescue sent since
    anything else                     -> the fast path (runs of hard failures), then the
                                         statistics -- unless it is a hard error of a run
                                         still on trial, held until the run is judged

A hard failure is a timeout or an error with a 5xx or no status
(:func:`is_hard`). The fast path ejects the whole cluster when its
cluster-wide run trips and every model it serves keeps another route
(:func:`~sidecar.core.viability.cluster_ejectable`), else the slice (restricted
instead of quarantined when no other route still serves the slice,
:func:`~sidecar.core.viability.others_serve`).
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Sequence

from sidecar.core import compat_sr
from sidecar.core.config import Config, ModelConfig
from sidecar.core.health_board import CLUSTER_SLICE, HealthBoard
from sidecar.core.judging import is_hard, judge_censored, within_budget
from sidecar.core.light_load import LIGHT, LightOutcomes, load_of
from sidecar.core.live_misses import LiveMisses
from sidecar.core.pushback import WAIT_STATUSES, PushBack
from sidecar.core.queue_signs import QueueSigns
from sidecar.core.rescue_probe import counts_as_probe
from sidecar.core.stats import StatsStore
from sidecar.core.subwindow import OkSample
from sidecar.core.trial_hold import TrialHold
from sidecar.core.types import Observation, SliceKey, TransitionEvent
from sidecar.core.viability import cluster_ejectable, others_serve


class Intake:
    """Outcomes into statistics and health (module docstring); a mixin of the Router."""

    config: Config
    stats: StatsStore
    board: HealthBoard
    trials: TrialHold
    compat_sr: compat_sr.SrLatencyBook
    counters: Counter[tuple[str, str]]
    transitions: deque[TransitionEvent]
    _inflight: Counter[str]
    _low: Counter[str]  # in flight with Decision.low (less important than shed_below_priority)
    _models_of: dict[str, tuple[ModelConfig, ...]]
    _next_eval: float | None
    light: LightOutcomes
    _limits: dict[str, int]  # max_concurrency per cluster (the router's _configure)
    peer_inflight: dict[str, int]  # fleet mode: other replicas' in-flight counts
    pushback: PushBack
    queue_signs: QueueSigns
    _refused: dict[str, int]  # pushback.refused_slots
    _caps: dict[str, int]  # pushback.caps
    live: LiveMisses  # routes missing their budget now

    def inflight(self, cluster: str) -> int:
        """Requests in flight on ``cluster`` as capacity rules see them: ours, the peers'
        (fleet mode) and the slots the provider refused (:mod:`sidecar.core.pushback`)."""
        n = self._inflight[cluster]
        if self.peer_inflight:
            n += self.peer_inflight.get(cluster, 0)
        if self._caps:
            cap = self._caps.get(cluster)
            if cap is not None and n >= cap:  # at a limit learned from queueing: full
                n = max(n, self._limits[cluster])
        return n + self._refused.get(cluster, 0) if self._refused else n

    def held(self, cluster: str) -> int:
        """Requests really in flight on ``cluster``: ours and the peers' (fleet mode)."""
        n = self._inflight[cluster]
        return n + self.peer_inflight.get(cluster, 0) if self.peer_inflight else n

    def has_room(self, cluster: str) -> bool:
        """Below the cluster's limit with our own requests (a probe's or trial's room)."""
        own = self._inflight[cluster]
        cap = self._caps.get(cluster)
        return (own + self._refused.get(cluster, 0) < self._limits[cluster]
                and (cap is None or own < cap))

    def limit_note(self, cluster: str) -> str | None:
        """Why ``cluster`` counts as fuller than its requests (RouteView): a hold or a
        lower limit, from :mod:`sidecar.core.pushback`."""
        if cluster not in self._refused and cluster not in self._caps:
            return None
        until = self.pushback.held().get(cluster)
        if until is not None:
            return f"held until {until:.1f} s (a declared wait or a quota's backoff)"
        why = "queueing" if self.pushback.source(cluster) == "queueing" else "429s"
        return f"its limit of {self.pushback.limit(cluster)} in flight, learned from {why}"

    def own_inflight(self, cluster: str) -> int:
        """This process's requests in flight on ``cluster`` (what fleet mode publishes)."""
        return self._inflight[cluster]

    def note_declared_wait(self, cluster: str, wait_s: float, now: float) -> None:
        """``cluster`` answered 429 or 503 declaring a wait of ``wait_s``
        (sidecar.core.pushback holds it). The shells call this for every such answer,
        observed or not: outcomes are sampled (``stats.observe_share``), a provider's
        declared wait must not be."""
        self.pushback.hold(cluster, wait_s, now)

    def own_low(self, cluster: str) -> int:
        """Of :meth:`own_inflight`, those of a :attr:`~sidecar.core.types.Decision.low`
        (fleet mode publishes them too: slots a more important class may take)."""
        return self._low[cluster]

    def _load(self, cluster: str) -> float:
        """The route's load now (:func:`~sidecar.core.light_load.load_of`)."""
        return load_of(self.inflight(cluster), self._limits.get(cluster, 1))

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

    def started(self, cluster: str, low: bool = False) -> float:
        """A routed request was released to ``cluster``; returns the route's load before
        it (:func:`~sidecar.core.light_load.load_of`), for its observation's ``sent_load``.
        ``low``: its decision's :attr:`~sidecar.core.types.Decision.low` (pass it back to
        :meth:`finished`)."""
        load = self._load(cluster)
        self._inflight[cluster] += 1
        if low:
            self._low[cluster] += 1
        if cluster in self._refused or cluster in self._caps:
            self.pushback.pressed(cluster, self.held(cluster))
        return load

    def finished(self, cluster: str, low: bool = False) -> None:
        """A request previously :meth:`started` on ``cluster`` is over (any outcome)."""
        if self._inflight[cluster] > 0:
            self._inflight[cluster] -= 1
        if low and self._low[cluster] > 0:
            self._low[cluster] -= 1

    def observe(self, obs: Observation, now: float) -> list[TransitionEvent]:
        """Record one measured outcome; probes drive the probing state, other
        outcomes the fast path for hard failures."""
        self.compat_sr.observe(obs, self.config)
        declared = False
        wait = obs.retry_after_s if obs.status in WAIT_STATUSES else None
        if wait is not None:  # the provider said when to come back (sidecar.core.pushback)
            self.pushback.hold(obs.cluster, wait, now)
            # A 429's wait is a time-based quota, not sickness; a 503's says the route is
            # unavailable until then, which stays evidence against it.
            declared = obs.status == 429 and wait > 0.0
        elif obs.status == 429:  # a concurrency limit, or a quota that did not say so
            self.pushback.refused(obs.cluster, self.held(obs.cluster), now)
        obs = judge_censored(self.config, obs)
        if not obs.attempt:  # a retried attempt is evidence, not a request's outcome
            self.counters[("outcome", obs.outcome)] += 1
        if declared:
            # The hold keeps requests away for the wait the provider declared; the quota
            # says nothing about the route's health, so it is neither an error in its
            # statistics nor a failure for the health machine (counted as an outcome only).
            return []
        if self._next_eval is None:
            self._next_eval = self._boundary_after(now)
        if obs.outcome == "cancel":
            sent = obs.sent_load
            if (obs.ttft_s is not None and not obs.is_retry and sent is not None
                    and sent < LIGHT and self._load(obs.cluster) < LIGHT
                    and (k := self.config.workload_class(obs.slice.klass)) is not None
                    and k.slo.metric == "ttft"):
                # Its first token came within a TTFT budget (kept by judge_censored): it
                # met it, as an ok does; any other cancel says nothing (its end unknown).
                self.light.note(obs.cluster, obs.slice, False, now)
            self.stats.observe(obs, now)
            return []
        sent = obs.sent_load
        if sent is not None:
            violated = obs.outcome != "ok" or not within_budget(self.config, obs)
            if obs.status != 429:  # a refusal is pushback's, not a queue's
                self._note_queue_sign(obs, sent, violated, now)
            if sent < LIGHT and self._load(obs.cluster) < LIGHT:
                # A 429 is the provider's backpressure (sidecar.core.pushback answers it),
                # not the route's tail: the floor's ring counts it, the miss-ratio record
                # does not.
                self.light.note(obs.cluster, obs.slice, violated, now,
                                record=obs.status != 429)
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

    def _note_queue_sign(self, obs: Observation, sent: float, missed: bool,
                         now: float) -> None:
        """Hand the outcome to the queue-sign book (:mod:`sidecar.core.queue_signs`): when
        it was sent, the requests really held then (its load less the slots a learned
        limit refuses now: a limit seldom moves within one request) and whether it
        missed its class budget."""
        cluster = obs.cluster
        limit = self._limits.get(cluster, 1)
        held = round(sent * limit)
        if self._refused:
            held -= self._refused.get(cluster, 0)
        if self._caps and held >= limit and cluster in self._caps:
            held = self._caps[cluster]  # sent at the cap, which reads as full (inflight)
        took = obs.e2e_s if obs.e2e_s is not None else obs.ttft_s
        self.queue_signs.note(cluster, obs.slice.klass, now - (took or 0.0), held, missed,
                              obs.tpot_s)

    def _learn_caps(self, now: float) -> None:
        """Window boundary: each cluster whose requests began to queue is capped at the
        count where they did (:mod:`sidecar.core.queue_signs`, :meth:`PushBack.queued`)."""
        for cluster, holding in self.queue_signs.judge(now).items():
            self.pushback.queued(cluster, holding, now)

    def observe_logged(self, obs: Observation, now: float) -> list[TransitionEvent]:
        """:meth:`observe` for a request routed without a decision (native mode: Envoy
        drew its cluster from the published weights), learned from its access-log entry
        alone: its outcome also resolves it in the live-miss books, which a decided
        request reaches through its own entry (:mod:`sidecar.core.live_misses`)."""
        self.live.outcome(obs, now)
        return self.observe(obs, now)

    def observe_ok(self, cluster: str, slice: SliceKey, samples: Sequence[OkSample],
                   now: float) -> None:
        """:meth:`observe_logged` of many ``ok`` first attempts of ``slice`` on ``cluster``
        that are not probes, all at ``now`` (a batch of native log entries), in one pass:
        the same statistics, counters, live-miss books and fast-path runs as one call per
        sample in order. A success trips nothing, so there are no events; and on a route
        the health board holds nothing for, it changes nothing there either."""
        n = len(samples)
        if not n:
            return
        self.live.outcomes_ok(cluster, slice, samples, now)
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

    def _record(self, obs: Observation, key: SliceKey, now: float) -> None:
        """Into the statistics after the fast path saw it -- unless it is a failure of
        a run on trial, held until the run is judged (:mod:`sidecar.core.trial_hold`)."""
        route = (obs.cluster, key)
        if not self._judged(route):
            # Only errors wait: a timeout already waited out the class timeout, its run
            # cannot finish quickly anyway, and on a loaded route it is the overload
            # signal the score must see at once (held, they herded traffic onto it).
            if obs.outcome == "error" and is_hard(obs):
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

    def _record_probe(self, obs: Observation, key: SliceKey, now: float) -> list[TransitionEvent]:
        """A cluster-wide probe passes on any answer; a slice's must meet its budget.
        A quarantined entry takes only rescues sent since (sidecar.core.rescue_probe)."""
        events: list[TransitionEvent] = []
        sent = now - (obs.e2e_s or 0.0) if obs.is_rescue else None
        hc = self.board.peek(obs.cluster, CLUSTER_SLICE)
        if hc is not None and counts_as_probe(hc, sent):
            events += self.board.record_probe(obs.cluster, CLUSTER_SLICE, obs.outcome == "ok",
                                              now, sent)
        h = self.board.peek(obs.cluster, key)
        if h is not None and counts_as_probe(h, sent):
            ok = obs.outcome == "ok" and within_budget(self.config, obs)
            events += self.board.record_probe(obs.cluster, key, ok, now, sent)
        return events

    def _fast_path(self, obs: Observation, key: SliceKey, now: float) -> list[TransitionEvent]:
        """Runs of hard failures (5xx, connect failures, resets, timeouts) eject at once
        (module docstring)."""
        hard = is_hard(obs)
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
        if cluster_trip and cluster_ejectable(board, self._models_of, obs.cluster):
            board.reset_run(obs.cluster, key)
            return board.eject(obs.cluster, CLUSTER_SLICE, now)
        if not slice_trip:
            return []
        return board.eject(obs.cluster, key, now,
                           others_serve(board, self.config, obs.cluster, key))

    def _boundary_after(self, now: float) -> float:
        """The next sub-window boundary after ``now`` (when windows are judged)."""
        step = self.config.stats.subwindow_s
        return (int(now / step) + 1) * step

    def _log(self, events: list[TransitionEvent]) -> None:
        for e in events:
            self.transitions.append(e)
            self.counters[("transition", e.new)] += 1
            if e.old == "probing" and e.new == "restoring":
                # The circuit closes again: judge the route on what it does from now on.
                # (Its light record is kept: sidecar.core.light_load, "The record".)
                s = SliceKey.parse(e.slice)
                self.stats.fence(e.cluster, None if s == CLUSTER_SLICE else s, e.at)
