"""Calls held by an admission ``queue`` answer, as a client behind tailroute's shell
waits for them (docs/policy-lab.md): a held call re-asks the policy when a slot frees
(highest class priority first, then the longest waiting) or at the policy's
``queue_until``, and its client gives up at its own limit -- the policy is then told to
``withdraw`` it and the call ends as a timeout (or a cancellation, when the user's
cancel came first)."""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from sidecar.sim.records import Call

if TYPE_CHECKING:
    from sidecar.sim.engine import Simulation


def _no_queue(call: Call) -> None:
    """Policies without an admission queue: nothing to ask or withdraw."""
    return None


class HeldCalls:
    """The held calls of one simulation run."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self._heap: list[tuple[int, int, int]] = []  # (-priority, seq, call id)
        self.calls: dict[int, tuple[Call, float]] = {}  # id -> (call, give-up time)

    def hold(self, call: Call) -> None:
        """Hold a call the policy answered ``queue`` (module docstring)."""
        sim = self.sim
        now = sim.now
        give_up = call.hold_limit
        if give_up is None:  # first time held: the client's patience starts now
            cl, cls = call.wl.client, call.cls
            give_up = now + (cl.first_token_timeout or cl.timeout or cls.slo.timeout_ms / 1000.0)
            for t in (call.deadline, call.user_cancel_at):
                if t is not None and t < give_up:
                    give_up = t
            call.hold_limit = give_up
        self.calls[call.id] = (call, give_up)
        heapq.heappush(self._heap, (-call.cls.priority, sim.next_seq(), call.id))
        until = getattr(sim.policy, "queue_until", _no_queue)(call)
        if until is None:
            until = now + sim.config.admission.queue_wait_ms / 1000.0
        sim.push(max(min(until, give_up), now), self._timer, call)

    def _timer(self, call: Call) -> None:
        held = self.calls.pop(call.id, None)
        if held is None:
            return  # already re-asked (a slot freed first)
        self._reask(call, held[1])

    def _reask(self, call: Call, give_up: float) -> None:
        sim = self.sim
        if sim.now >= give_up:
            getattr(sim.policy, "withdraw", _no_queue)(call)
            sim.finish_call(call, "cancelled" if call.user_cancel_at is not None
                            and sim.now >= call.user_cancel_at else "timeout", None)
            return
        sim.send(call)

    def release_one(self) -> None:
        """A slot freed: the highest-priority, longest-waiting held call re-asks."""
        while self._heap:
            _, _, cid = heapq.heappop(self._heap)
            held = self.calls.pop(cid, None)
            if held is not None:
                self._reask(*held)
                return
