"""The routing oracle (``oracle_routing``): the lab's first oracle, kept for comparison.

It knows what each candidate would realise for *this* request and never sheds;
the hindsight oracle (:mod:`sidecar.sim.policies.oracle`) replaced it as the
bound because admission control can beat a policy that never sheds.

For every candidate it pre-draws the provider's service randomness (error,
stall, TTFT and TPOT noise) and computes the outcome the request would have
there now -- degradation events, contention and outages included -- then sends
it where the class's SLO metric comes out lowest among candidates that
succeed within the attempt's deadline (ties: fewer in flight). The chosen
candidate's draws are attached to the attempt, so the provider realises exactly
what the oracle saw.

What it does *not* know: the future. Queue wait on a full provider is
estimated by replaying the FIFO queue on the current slot release times with
median service times (otherwise the prediction is the hindsight oracle's
:func:`~sidecar.sim.policies.oracle.predict`), the SLO is judged from the
attempt's start (not the call's), and its choices may still take capacity a later request
would have needed. So it is the limit of per-request routing with perfect
knowledge of the present, which no real policy can beat on average -- not a
global optimum over the whole run.
"""

from __future__ import annotations

import heapq
import random

from sidecar.core.types import Decision
from sidecar.sim.policies import BasePolicy, PolicyContext
from sidecar.sim.policies.oracle import attempt_limits, predict
from sidecar.sim.provider import Draws, Provider
from sidecar.sim.records import QUEUED, Attempt


class RoutingOracle(BasePolicy):
    name = "oracle_routing"

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self.providers = ctx.providers

    def choose(self, att: Attempt, now: float, rng: random.Random) -> str | Decision:
        call = att.call
        # The attempt's deadlines are set by the engine after choose: apply the same
        # rules (but the user's cancellation, which this oracle does not foresee).
        limit, first_limit = attempt_limits(call, now, user=False)
        budget = call.cls.slo.budget_ms / 1000.0
        meets: list[tuple[float, str, Draws]] = []  # (-spare capacity, cluster, draws)
        fastest: tuple[float, str, Draws] | None = None
        idlest: tuple[float, str, Draws] | None = None
        for c in call.candidates:
            prov = self.providers[c]
            draws = prov.draw_for(att)
            load = prov.inflight / prov.spec.capacity
            pred = predict(prov, att, draws, now, limit, first_limit, _queue_wait)
            value = None if pred is None else pred[0]
            if value is not None:
                if value <= budget:
                    meets.append((load, c, draws))
                if fastest is None or value < fastest[0]:
                    fastest = (value, c, draws)
            if idlest is None or load < idlest[0]:
                idlest = (load, c, draws)
        # Meets the SLO: the least loaded such route (keeps headroom for later requests);
        # else the fastest that succeeds; else the least loaded.
        pick = min(meets) if meets else (fastest or idlest)
        assert pick is not None
        att.draws = pick[2]
        return pick[1]


def _queue_wait(prov: Provider, now: float, cap: int) -> float:
    """When a request joining the queue now would start (FIFO replay, median services)."""
    free = prov.release_times(now)[:cap] or [now]
    heapq.heapify(free)
    spec = prov.spec
    median = spec.ttft.median + spec.tpot.median * 100.0  # a typical short generation
    ahead = sum(1 for a in prov.queue if a.state == QUEUED)
    for _ in range(ahead):
        t = heapq.heappop(free)
        heapq.heappush(free, t + median)
    return free[0]
