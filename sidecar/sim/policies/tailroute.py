"""tailroute itself: the core :class:`~sidecar.core.router.Router`, driven like the server.

The calls mirror the server shell (``sidecar.shell.app`` / ``sidecar.shell.extproc``):

* ``decide(request_info, now, rng)`` when the request is classified -- the
  :class:`~sidecar.core.types.RequestInfo` is what ``classify`` would build
  from the request's headers and body (class, priority, token profile, stream,
  retry attempt, remaining deadline, workflow step);
* ``started(cluster)`` when the routed request is released;
* ``finished(cluster)`` then ``observe(observation, now)`` when it is over,
  with the :class:`~sidecar.core.types.Observation` a
  :class:`~sidecar.core.timing.ResponseTimer` would produce (TTFT/TPOT for
  streams only; a route timeout is ``timeout``, a client going away ``cancel``);
* ``tick(now)`` at ``next_deadline()``.

The decision's admission answer, per-request timeout and probe flag are
honoured by the engine. A ``queue`` answer holds the request: it re-asks
``decide`` with the same ticket when a slot frees -- highest priority, longest
waiting first; the server wakes every held request instead, which comes to the
same since the core serves its queue FIFO per priority -- or at
``queue_until(ticket)``, and ``withdraw(ticket)`` is called if its client
gives up first. ``tailroute_no_admission`` is the same with
``admission.enabled: false`` (to measure what admission control buys).
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from typing import Final, NamedTuple

from sidecar.core.config import Config
from sidecar.core.router import Router
from sidecar.core.types import Decision, SliceKey
from sidecar.sim.policies import BasePolicy, PolicyContext, live_entries
from sidecar.sim.records import Attempt, Call

SAMPLE_SEED: Final = 0x7A11  # the timed-stream draw: any fixed seed (the run stays reproducible)


class TraceRow(NamedTuple):
    """One routing answer, recorded when :attr:`Tailroute.trace` is a list."""

    t: float
    slice: SliceKey
    cluster: str
    admission: str
    is_probe: bool
    weights: dict[str, float]  # health weight of every candidate of the model


class Tailroute(BasePolicy):
    name = "tailroute"
    needs_tick = True

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self.router = Router(self.effective_config(ctx.config))
        self.transitions: Counter[str] = Counter()
        # Set to a list to record every answer (named lab cases, time-to-react figures).
        self.trace: list[TraceRow] | None = None
        # Which streams the observing filter times (live_entries), apart from the engine's.
        self.sample_rng = random.Random(SAMPLE_SEED)

    @staticmethod
    def effective_config(config: Config) -> Config:
        return config

    def choose(self, att: Attempt, now: float, rng: random.Random) -> str | Decision:
        d = self.router.decide(att.request_info(now), now, rng, ticket=_ticket(att.call))
        if self.trace is not None:
            s = att.call.slice
            weights = {c: self.router.health(c, s).weight for c in att.call.candidates}
            self.trace.append(TraceRow(now, s, d.cluster, d.admission, d.is_probe, weights))
        return d

    def queue_until(self, call: Call) -> float | None:
        """A call held by a ``queue`` answer must re-ask by then (the router's bound)."""
        return self.router.queue_until(_ticket(call))

    def withdraw(self, call: Call) -> None:
        """The held call's client gave up."""
        self.router.withdraw(_ticket(call))

    def on_start(self, att: Attempt, now: float) -> None:
        att.sent_load = self.router.started(att.cluster, att.low)
        live_entries.track(self.router, att, now, self.sample_rng)

    def on_result(self, att: Attempt, now: float) -> None:
        self.router.finished(att.cluster, att.low)
        obs = att.observation()
        live_entries.resolve(self.router, att, obs, now)
        if obs is not None:
            for e in self.router.observe(obs, now):
                self.transitions[e.new] += 1

    def tick(self, now: float) -> None:
        for e in self.router.tick(now):
            self.transitions[e.new] += 1

    def next_deadline(self) -> float | None:
        return self.router.next_deadline()

    def route_state(self, cluster: str, slice: SliceKey) -> tuple[str, float]:
        """How the router sees the route now: health state and weight (the lab's series)."""
        h = self.router.health(cluster, slice)
        return h.state, h.weight

    def stats(self) -> dict[str, dict[str, int]]:
        decisions = {label: n for (kind, label), n in sorted(self.router.counters.items())
                     if kind == "decision"}
        return {"decisions": decisions, "transitions": dict(sorted(self.transitions.items()))}


def _ticket(call: Call) -> str:
    """The admission-queue ticket: one per HTTP request, like the server's request id
    (a held request keeps it across re-asks; a client retry is a new request)."""
    return f"c{call.id}.{call.attempts}"


class TailrouteNoAdmission(Tailroute):
    name = "tailroute_no_admission"

    @staticmethod
    def effective_config(config: Config) -> Config:
        return dataclasses.replace(
            config, admission=dataclasses.replace(config.admission, enabled=False)
        )
