"""The lab's side of live misses (:mod:`sidecar.core.live_misses`): what the server
shell reports as it happens, from an attempt's simulated times.

The server tells the router's books when a request is sent, when its first token
comes (the sampled observing stream: ``timing.token_sample_share`` of streams),
when its routing stream closes, and its outcome. The lab has no event at the
first token or at the close, but an attempt knows both once its service starts
(:mod:`sidecar.sim.provider`); an :class:`AttemptEntry` hands them to the book,
which reads an answer time only once the request's budget has passed -- the
past, as the server would have reported it. Which streams are timed is drawn
from the policy's own generator, so the engine's draws stay as they were.
"""

from __future__ import annotations

import random

from sidecar.core.live_book import LiveEntry
from sidecar.core.router import Router
from sidecar.core.types import Observation
from sidecar.sim.records import Attempt


class AttemptEntry(LiveEntry):
    """A lab request's entry: its answer time is the attempt's."""

    __slots__ = ("att",)
    att: Attempt  # set by track() right after the book makes the entry

    def answer_at(self) -> float | None:
        att = self.att
        return att.first_token_at if self.book.budget.first_token else att.end_at


def track(router: Router, att: Attempt, now: float, rng: random.Random) -> None:
    """``att`` was released to its cluster: enter it in the router's books."""
    call = att.call
    timed = call.stream and rng.random() < router.config.timing.token_sample_share
    entry = router.live.sent(att.cluster, call.slice, now, timed, AttemptEntry)
    if entry is not None:
        entry.att = att  # type: ignore[attr-defined]  # an AttemptEntry: make= said so
        att.live = entry


def resolve(router: Router, att: Attempt, obs: Observation | None, now: float) -> None:
    """``att`` is over with observation ``obs``: that resolves its entry, if it has one."""
    entry = att.live
    if entry is not None:
        att.live = None
        if obs is None:
            router.live.unobserved(entry, now)
        else:
            router.live.observed(entry, obs, now)
