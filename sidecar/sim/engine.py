"""The discrete-event engine: virtual time, one heap of events, one policy.

Events are plain tuples ``(time, seq, handler, arg)`` in a :mod:`heapq`; ``seq``
breaks ties in scheduling order, so a run is a pure function of the scenario,
the seed and the policy. Nothing sleeps: a simulated hour takes as long as its
events take to process.

Randomness is split into independent named streams derived from the seed
(:class:`~sidecar.sim.dists.Stream` ``f"{seed}:{name}"`` for arrivals, token
counts and user cancellations per workload and service per provider;
``random.Random(f"{seed}:{name}")`` for client retry jitter and the policy's
own). Arrivals, token counts and cancellations therefore do not depend on the
policy: every policy faces exactly the same traffic (common random numbers),
which makes differences between policies far less noisy.

Client behaviour (per attempt): the deadline is the earliest of the route
timeout (the decision's ``timeout_ms`` when the policy returns a
:class:`~sidecar.core.types.Decision` with one, else the class's ``timeout_ms``
for an unstreamed answer and only the safety net of
:func:`~sidecar.core.admission.stream_cap_s` for a stream), the client's own
``timeout_ms``, the workflow deadline and a user cancellation. A stream's first
byte must come within the class's ``timeout_ms`` (Envoy's route idle timeout:
tokens then follow every TPOT, far below any class timeout, so only the silence
before the first byte can reach it), a ``first_token_timeout_ms`` may end it
earlier. On ``error`` or ``timeout`` the
client retries per its ``retry_on``/``retries`` with exponential backoff and
jitter, never past the workflow deadline. Non-admit answers of a policy are
handled as documented in docs/policy-lab.md (skip, refuse, hold on ``queue``:
:mod:`sidecar.sim.held_calls`).
"""

from __future__ import annotations

import gc
import heapq
import itertools
import math
import random
from collections.abc import Callable
from typing import Any

from sidecar.core.admission import stream_cap_s
from sidecar.core.classify import token_profile
from sidecar.core.types import Decision, SliceKey
from sidecar.sim.dists import Stream
from sidecar.sim.held_calls import HeldCalls
from sidecar.sim.metrics import Metrics, slo_value
from sidecar.sim.policies import BasePolicy, Policy, PolicyContext, make_policy
from sidecar.sim.provider import Provider
from sidecar.sim.records import (
    CLIENT,
    DONE,
    ROUTE,
    USER,
    Attempt,
    Call,
    finalize_unfinished,
    outcome_kind,
)
from sidecar.sim.scenario import Scenario
from sidecar.sim.traffic import ArrivalItem, Source, arrivals
from sidecar.sim.workflows import WorkflowRunner

Handler = Callable[[Any], None]


class Simulation:
    """One run: ``Simulation(scenario, "tailroute").run()`` returns the metrics summary."""

    def __init__(
        self,
        scenario: Scenario,
        policy: str,
        progress: Callable[[float], None] | None = None,
        *,
        noise_seed: int | None = None,
    ) -> None:
        """``noise_seed`` (default: the scenario's seed) seeds only the providers' service
        draws and the policy's own randomness: the same traffic with independent noise."""
        sc = scenario
        self.sc = sc
        self.config = sc.config
        self.now = 0.0
        self.horizon = sc.duration + sc.drain
        self._heap: list[tuple[float, int, Handler, Any]] = []
        self._seq = itertools.count()
        self._progress = progress
        seed = sc.seed
        noise = seed if noise_seed is None else noise_seed
        self.rng_policy = random.Random(f"{noise}:policy:{policy}")
        self.rng_client = random.Random(f"{seed}:client")
        self.providers = {
            name: Provider(spec, [e for e in sc.events if e.provider == name],
                           Stream(f"{noise}:provider:{name}"), self.push, self._attempt_end,
                           keyed=f"{noise}:service:{name}", horizon=self.horizon)
            for name, spec in sc.providers.items()
        }
        ctx = PolicyContext(sc.config, self.providers)
        replicated = None
        if sc.replicas is not None:  # tailroute as k replicas splitting the traffic
            from sidecar.sim.replicas import replicated as make_replicated

            replicated = make_replicated(policy, ctx, sc.replicas, seed)
        self.policy: Policy = replicated or make_policy(policy, ctx)
        self.policy_name = policy
        # Skip hooks a policy does not override (most baselines): calls cost time per request.
        cls_ = type(self.policy)
        self._on_start = None if getattr(cls_, "on_start", None) is BasePolicy.on_start \
            else self.policy.on_start
        self._on_result = None if getattr(cls_, "on_result", None) is BasePolicy.on_result \
            else self.policy.on_result
        self._needs_tick = self.policy.needs_tick
        self._prices = {n: p.cost_per_1k_tokens for n, p in sc.providers.items()}
        self.metrics = Metrics(sc.config, sc.warmup, sc.duration, sc.bucket, self.horizon,
                               [wl.name for wl in sc.workloads])
        self._slices: dict[tuple[str, str, str, bool], SliceKey] = {}
        self._candidates = {m.name: m.candidates for m in sc.config.models}
        self._ids = itertools.count()
        self.active = 0  # calls and workflows not yet finished
        self.sources_left = 0
        self._armed = math.inf
        self._sources: dict[str, Source] = {}
        self.workflows = WorkflowRunner(self)
        self.held = HeldCalls(self)  # calls held by an admission "queue" answer
        for wl in sc.workloads:
            end = min(wl.end if wl.end is not None else sc.duration, sc.duration)
            rng = Stream(f"{seed}:arrivals:{wl.name}")
            src = Source(wl, arrivals(wl.arrival, rng, wl.start, end, sc.source), seed)
            self._sources[wl.name] = src
            self._next_arrival(src)
        if callable(getattr(self.policy, "route_state", None)):
            # the policy's view of each route at the end of every bucket (state series)
            for b in range(math.ceil(sc.duration / sc.bucket)):
                self.push(min((b + 1) * sc.bucket, sc.duration) - 1e-9, self._sample, None)
        for prov in self.providers.values():
            for ev in prov.cap_events:
                for lo, hi in ev.windows(self.horizon):
                    self.push(lo, self._pump, prov)
                    self.push(hi, self._pump, prov)

    # ------------------------------------------------------------ loop

    def push(self, t: float, fn: Handler, arg: Any) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), fn, arg))

    def next_seq(self) -> int:
        """The next tie-break number (events and held calls share one order)."""
        return next(self._seq)

    def run(self) -> dict[str, Any]:
        """Runs the scenario to its end and returns the summary.

        The cyclic garbage collector is paused for the run (and left as it was
        found, after): a run makes no reference cycles (``tests/test_sim_gc.py``
        holds every shipped scenario and several policies to that), so a
        collection finds nothing and only walks the in-flight calls, attempts and
        heap entries -- about 3 % of a compiled run's time. Everything a run
        allocates is still freed by reference counting as it goes.
        """
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return self._run()
        finally:
            if was_enabled:
                gc.enable()

    def _run(self) -> dict[str, Any]:
        heap, pop = self._heap, heapq.heappop
        horizon, progress = self.horizon, self._progress
        if self._needs_tick:
            self._arm()
        n = 0
        while heap:
            t, _, fn, arg = pop(heap)
            if t > horizon:
                break
            self.now = t
            fn(arg)
            if self.active == 0 and self.sources_left == 0:
                break
            n += 1
            if progress is not None and not n & 0xFFFF:
                progress(min(t / self.sc.duration, 1.0))
        peaks = {c: p.peak_inflight / p.spec.capacity for c, p in self.providers.items()}
        out = self.metrics.summary(peaks)
        out["unfinished"] = self.active
        stats = getattr(self.policy, "stats", None)
        if callable(stats):
            out["policy_stats"] = stats()
        return out

    def _sample(self, _: Any) -> None:
        self.metrics.sample_states(self.now, self.policy)  # type: ignore[arg-type]

    def _pump(self, prov: Provider) -> None:
        prov.pump(self.now)

    def _arm(self) -> None:
        d = self.policy.next_deadline()
        if d is not None and d < self._armed:
            self._armed = max(d, self.now)
            self.push(self._armed, self._tick, None)

    def _tick(self, _: Any) -> None:
        self._armed = math.inf
        self.policy.tick(self.now)
        self._arm()

    # ------------------------------------------------------------ arrivals

    def _next_arrival(self, src: Source) -> None:
        item = next(src.gen, None)
        if item is None:
            return
        self.sources_left += 1
        self.push(item[0], self._arrive, (src, item))

    def _arrive(self, arg: tuple[Source, ArrivalItem]) -> None:
        src, (now, inp, out) = arg
        self.sources_left -= 1
        self._next_arrival(src)
        wl = src.wl
        scored = self.sc.warmup <= now < self.sc.duration
        key = src.arrived
        src.arrived = key + 1
        if wl.workflow is not None:
            self.workflows.start(src, inp, out, scored, key)
            return
        if inp is None or out is None:
            inp, out = src.tokens()
        call = self.new_call(src, wl.klass, wl.stream, inp, out, wl.max_tokens, scored, key)
        self.send(call)

    def new_call(self, src: Source, klass: str, stream: bool, inp: int, out: int,
                  max_spec: Any, scored: bool, key: int = -1) -> Call:
        """A new call of ``src``; ``key`` identifies it independently of the policy (its
        arrival ordinal, or its place in its workflow) for the keyed service draws."""
        wl = src.wl
        declared: int | None
        if max_spec == "output":
            declared = out
        elif max_spec is None:
            declared = None
        else:
            declared = int(max_spec)
            out = min(out, declared)
        profile = token_profile(inp, declared)
        skey = (wl.model, klass, profile, stream)
        sk = self._slices.get(skey)
        if sk is None:
            sk = self._slices[skey] = SliceKey(wl.model, klass, profile, stream)
        cls = self.config.workload_class(klass)
        assert cls is not None
        call = Call(next(self._ids), wl, cls, wl.model, stream, inp, out, declared, sk,
                    self._candidates[wl.model], self.now, scored, key)
        cr = wl.client.cancel_rate
        if cr > 0.0:
            r = src.cancel_rng
            if r.random() < cr:
                limit = wl.client.timeout or cls.slo.timeout_ms / 1000.0
                call.user_cancel_at = self.now + r.random() * limit
        self.active += 1
        return call

    # ------------------------------------------------------------ attempts

    def send(self, call: Call) -> None:
        now = self.now
        if call.deadline is not None and now >= call.deadline:
            self.finish_call(call, "timeout", None)
            return
        att = Attempt(call, call.attempts, now)
        choice = self.policy.choose(att, now, self.rng_policy)
        idle = call.cls.slo.timeout_ms / 1000.0
        route_timeout = stream_cap_s(call.cls) if call.stream else idle
        if choice.__class__ is str:
            cluster: str = choice
        else:
            d: Decision = choice  # type: ignore[assignment]
            if d.admission != "admit":
                self._not_admitted(call, d)
                return
            cluster = d.cluster
            att.is_probe = d.is_probe
            att.is_rescue = d.is_rescue
            att.low = d.low
            if d.timeout_ms is not None:
                route_timeout = d.timeout_ms / 1000.0
        call.attempts += 1
        att.cluster = cluster
        dl, kind = now + route_timeout, ROUTE
        ct = call.wl.client.timeout
        if ct is not None and now + ct < dl:
            dl, kind = now + ct, CLIENT
        if call.deadline is not None and call.deadline < dl:
            dl, kind = call.deadline, CLIENT
        if call.user_cancel_at is not None and call.user_cancel_at < dl:
            dl, kind = max(call.user_cancel_at, now), USER
        att.deadline, att.deadline_kind = dl, kind
        if call.stream and now + idle < dl:
            att.ttft_deadline, att.ttft_kind = now + idle, ROUTE
        ft = call.wl.client.first_token_timeout
        if ft is not None and now + ft < min(dl, att.ttft_deadline):
            att.ttft_deadline, att.ttft_kind = now + ft, CLIENT
        if self._on_start is not None:
            self._on_start(att, now)
        self.metrics.sent(att, now)
        self.providers[cluster].submit(att, now)

    def _not_admitted(self, call: Call, d: Decision) -> None:
        """The policy answered queue, defer, shed, reject or skip instead of a route."""
        if d.admission == "skip":
            self.finish_call(call, "skipped", None)
            return
        if d.admission == "queue":
            self.held.hold(call)
            return
        call.attempts += 1
        extra = float(d.retry_after_s or 0)
        if not self._retry(call, "error", extra):
            self.finish_call(call, "rejected", None)

    # ------------------------------------------------------------ attempts

    def _attempt_end(self, att: Attempt) -> None:
        now = self.now
        if att.outcome is None:
            finalize_unfinished(att)
        att.state = DONE
        self.providers[att.cluster].finish(att, now)
        call = att.call
        if att.tokens_done:
            call.cost += self._prices[att.cluster] * (call.input_tokens + att.tokens_done) / 1000.0
        if att.degraded:
            self.metrics.attempt_done(att)
        if self._on_result is not None:
            self._on_result(att, now)
        if self._needs_tick:
            self._arm()
        if self.held.calls:
            self.held.release_one()
        if att.outcome == "ok":
            call.end_at = att.end_at
            call.first_token_at = att.first_token_at if call.stream else att.end_at
            call.tpot_s = att.tpot_s
            self.finish_call(call, "ok", slo_value(call))
            return
        kind = outcome_kind(att)
        if kind == "cancelled":
            self.finish_call(call, "cancelled", None)
        elif not self._retry(call, kind, 0.0):
            self.finish_call(call, kind, None)

    def _retry(self, call: Call, kind: str, at_least: float) -> bool:
        cl = call.wl.client
        if call.retries_left <= 0 or kind not in cl.retry_on:
            return False
        wait = cl.backoff * cl.backoff_factor ** max(call.attempts - 1, 0)
        if cl.jitter:
            wait *= 1.0 + cl.jitter * (2.0 * self.rng_client.random() - 1.0)
        t = self.now + max(wait, at_least)
        if call.deadline is not None and t >= call.deadline:
            return False
        if call.user_cancel_at is not None and t >= call.user_cancel_at:
            return False
        call.retries_left -= 1
        self.push(t, self.send, call)
        return True

    def finish_call(self, call: Call, kind: str, metric: float | None) -> None:
        self.active -= 1
        self.metrics.call_done(call, kind, metric, self.now)
        wf = call.workflow
        if wf is not None and not wf.done:
            self.workflows.call_done(wf, call, kind)


def run_once(scenario: Scenario, policy: str,
             progress: Callable[[float], None] | None = None) -> dict[str, Any]:
    """Run ``policy`` on ``scenario`` and return the metrics summary."""
    return Simulation(scenario, policy, progress).run()

