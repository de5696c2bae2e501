"""The hindsight oracle: clairvoyant routing plus admission, the lab's reference bound.

**What it knows** (what no real router can):

* this request's realised service on every candidate: it pre-draws each
  provider's randomness for the request (error, stall and slow-path draws, the
  TTFT/TPOT deviates, the part of a heavy-tailed distribution) and computes the
  outcome with the provider's *true* current distributions, active events and
  ramps, error mixes, contention and capacity; the chosen candidate then
  realises exactly those draws;
* each provider's true queue: the exact release time of every busy slot, and
  for every queued request its own draws (the oracle routed it), so the start
  time of a request joining the FIFO now is replayed, not guessed;
* the class SLOs, deadlines and the time the call has already spent (retries,
  holds), so it judges the SLO metric as the client will see it.

**What it does** for each attempt, in order:

1. **Route**: among the candidates where the call would meet its SLO, the least
   loaded one (in flight / capacity: headroom for later requests), preferring
   one with a free slot.
2. **Hold** (answer ``queue``) a call whose meeting candidates are all full, when
   its class is not the most urgent one and its slack lets it wait: it re-asks
   when a slot frees (most urgent held call first) and at the latest start that
   still meets its SLO. This is priority scheduling: urgent calls take the
   freed slots first.
3. **Shed or skip** a call that cannot meet its SLO anywhere: it is a violation
   whatever happens to it, and serving it only takes capacity from calls that
   can still make it. Exceptions: a critical workflow step that can still
   *succeed* before the workflow deadline is routed to its fastest successful
   candidate (the workflow may still complete); an optional step is skipped
   (what a caller short of budget does).

**Why it bounds the policies** -- and how far. For a single request, given the
state it finds, no causal policy can do better: it sees the realised outcome
on every route, which a real router can only estimate. Shedding and skipping
touch only calls that violate anyway, so they never lower attainment; holding
only delays calls whose slack covers the wait. What it cannot see is the
future: a greedy per-request choice may take capacity a later call needed,
and it does not keep idle capacity in reserve. An exact bound (the offline
optimum of a stochastic scheduling problem with queues, contention, retries
and workflows) is not computable at this scale, so the claim is empirical and
tested: on the shipped suite and on generated scenarios of every family, no
shipped policy has a lower violation rate (``tests/test_sim_oracle.py``; the
generated summary reports any exception under ``oracle_beaten``).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from typing import Final

from sidecar.core.admission import stream_cap_s
from sidecar.core.types import Decision
from sidecar.sim.policies import BasePolicy, PolicyContext
from sidecar.sim.provider import Draws, Provider
from sidecar.sim.records import QUEUED, Attempt, Call

_MIN_HOLD_S: Final = 0.05  # holding for less than this is not worth a re-ask
#: When a request joining ``prov``'s full FIFO at ``now`` starts: ``(prov, now, cap) -> t``.
QueueStart = Callable[[Provider, float, int], float]


class Oracle(BasePolicy):
    name = "oracle"

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self.providers = ctx.providers
        self.top_priority = max(c.priority for c in ctx.config.classes)
        self._latest: dict[int, float] = {}  # held call id -> latest useful start

    def choose(self, att: Attempt, now: float, rng: random.Random) -> str | Decision:
        call = att.call
        limit, first_limit = attempt_limits(call, now)
        budget = call.cls.slo.budget_ms / 1000.0
        metric = call.cls.slo.metric
        spent = now - call.start if metric != "tpot" else 0.0
        free: list[tuple[float, str, Draws]] = []  # meets the SLO, starts at once
        full: list[tuple[float, str, Draws, float]] = []  # meets it after a queue wait
        fastest: tuple[float, str, Draws] | None = None  # succeeds (late or not)
        for c in call.candidates:
            prov = self.providers[c]
            draws = prov.draw_for(att)
            pred = predict(prov, att, draws, now, limit, first_limit)
            if pred is None:
                continue
            value, wait = pred
            if fastest is None or value < fastest[0]:
                fastest = (value, c, draws)
            if spent + value <= budget:
                load = prov.inflight / prov.spec.capacity
                if wait > 0.0:
                    full.append((load, c, draws, value - wait))
                else:
                    free.append((load, c, draws))
        if free:
            pick = min(free)
            self._latest.pop(call.id, None)
            att.draws = pick[2]
            return pick[1]
        if full:
            held = self._hold(call, now, budget, min(x[3] for x in full))
            if held is not None:
                return held
            pick4 = min(full)
            self._latest.pop(call.id, None)
            att.draws = pick4[2]
            return pick4[1]
        self._latest.pop(call.id, None)
        return self._hopeless(att, fastest)

    def _hold(self, call: Call, now: float, budget: float, service: float) -> Decision | None:
        """``queue`` when waiting for a free slot still meets the SLO (see module doc)."""
        if call.cls.priority >= self.top_priority or call.cls.slo.metric == "tpot":
            return None
        latest = call.start + budget - service
        if call.deadline is not None:
            latest = min(latest, call.deadline - service)
        if now >= self._latest.get(call.id, latest) - 1e-9 or latest - now < _MIN_HOLD_S:
            return None  # out of slack: admit it to the provider's queue
        self._latest[call.id] = latest
        return Decision(call.candidates[0], "oracle", admission="queue")

    def _hopeless(self, att: Attempt, fastest: tuple[float, str, Draws] | None
                  ) -> str | Decision:
        """The call cannot meet its SLO anywhere: a violation whatever happens."""
        call = att.call
        step = call.step
        if step is not None and step.kind == "optional":
            return Decision(call.candidates[0], "oracle", admission="skip")
        if step is not None and fastest is not None:
            att.draws = fastest[2]  # the workflow may still complete
            return fastest[1]
        return Decision(call.candidates[0], "oracle", admission="shed")

    def queue_until(self, call: Call) -> float | None:
        return self._latest.get(call.id)

    def withdraw(self, call: Call) -> None:
        self._latest.pop(call.id, None)


def attempt_limits(call: Call, now: float, user: bool = True) -> tuple[float, float]:
    """When an attempt sent now ends at the latest, and its first byte must arrive
    (the engine sets the same deadlines after ``choose``: the class timeout caps an
    unstreamed answer and a stream's first byte; a stream's length only its safety
    net, ``stream_cap_s``). ``user``:
    count the user's own cancellation too."""
    idle = now + call.cls.slo.timeout_ms / 1000.0
    limit = now + stream_cap_s(call.cls) if call.stream else idle
    if call.wl.client.timeout is not None:
        limit = min(limit, now + call.wl.client.timeout)
    if call.deadline is not None:
        limit = min(limit, call.deadline)
    if user and call.user_cancel_at is not None:
        limit = min(limit, max(call.user_cancel_at, now))
    first = min(limit, idle)
    ft = call.wl.client.first_token_timeout
    return limit, first if ft is None else min(first, now + ft)


def predict(prov: Provider, att: Attempt, draws: Draws, now: float, limit: float,
            first_limit: float, queue: QueueStart | None = None) -> tuple[float, float] | None:
    """``(SLO metric from now, queue wait)`` this attempt would realise on ``prov``;
    None when it would not succeed (error, stall, 429, or past its deadlines).
    ``queue`` says when a request joining a full provider's FIFO starts (default:
    :func:`start_after_queue`)."""
    call = att.call
    spec = prov.spec
    cap = prov.capacity(now) if prov.cap_events else spec.capacity
    wait, busy = 0.0, prov.busy
    if prov.busy >= cap:
        if prov.queued >= spec.queue_limit or cap <= 0:
            return None
        wait = (queue or start_after_queue)(prov, now, cap) - now
        busy = cap - 1
    start = now + wait
    f1, f2, err, stall, outage, _, mix = prov.effects(att, start, draws[4])
    if outage or draws[0] < err or draws[1] < stall:
        return None
    if mix and prov.error_for(draws[0], err, mix, draws[2], 0.5) is not None:
        return None
    slow = 1.0 + spec.contention * busy / spec.capacity
    service_ttft, tpot = prov.service_times(att, draws, slow * f1, slow * f2)
    ttft = wait + service_ttft
    e2e = ttft + tpot * (call.output_tokens - 1)
    first_byte = ttft if call.stream else e2e
    if now + e2e > limit or now + first_byte > first_limit:
        return None
    metric = call.cls.slo.metric
    if metric == "ttft":
        return first_byte, wait
    if metric == "e2e":
        return e2e, wait
    return (tpot if call.stream and call.output_tokens > 1
            else e2e / max(call.output_tokens, 1)), wait


def start_after_queue(prov: Provider, now: float, cap: int) -> float:
    """When a request joining ``prov``'s FIFO now would start: the queue replayed on the
    busy slots' release times with each queued request's own service (its pre-drawn
    variates; median service for one without) and its give-up time."""
    # with busy >= cap (capacity may have dropped below busy), the k-th start waits for
    # release number busy - cap + k: the last cap release times are the slots it gets
    releases = prov.release_times(now)
    free = releases[max(len(releases) - cap, 0):] or [now]
    heapq.heapify(free)
    spec = prov.spec
    full = 1.0 + spec.contention * (cap - 1) / spec.capacity
    for q in prov.queue:
        if q.state != QUEUED:
            continue
        t = free[0]
        if t >= min(q.deadline, q.ttft_deadline):
            continue  # gives up before a slot frees: never takes one
        heapq.heapreplace(free, t + _service_e2e(prov, q, t, full))
    return free[0]


def _service_e2e(prov: Provider, q: Attempt, t: float, slow: float) -> float:
    """How long queued ``q`` holds a slot once it starts at ``t``."""
    spec = prov.spec
    d = q.draws
    c = q.call
    if d is None:
        return (spec.ttft.median + spec.prefill_per_1k * c.input_tokens / 1000.0
                + spec.tpot.median * (c.output_tokens - 1)) * slow
    f1, f2, err, stall, outage, _, _ = prov.effects(q, t, d[4])
    if outage or d[0] < err:
        return spec.error_after * slow
    if d[1] < stall:
        natural = float("inf")
    else:
        ttft, tpot = prov.service_times(q, d, slow * f1, slow * f2)
        natural = ttft + tpot * (c.output_tokens - 1)
    if spec.keeps_working_on_cancel and natural != float("inf"):
        return natural
    return min(natural, max(q.deadline - t, 0.0))
