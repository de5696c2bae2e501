"""The admission queue as plain data: waiters with deadlines, ordered FIFO per priority.

The core never sleeps. When admission answers ``queue``, the request joins
this queue with a wait deadline (``until``); the shell (or the simulator)
holds the request and asks the router again when capacity frees or the
deadline passes. On that re-ask the waiter's position decides:

    order key = (-priority, seq)        higher priority first, FIFO within one
    ahead(w)  = live waiters with a smaller order key than w

A waiter may take a free slot only when ``ahead < free slots``, so a newcomer
cannot overtake older or more important waiters. A waiter whose ``until`` has
passed no longer counts as ahead of anyone; it is kept (marked expired) for a
grace period so its own re-ask is still recognised, then pruned. The queue
holds at most ``queue_max`` live waiters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

EPS_S: Final = 1e-6  # a re-ask at the deadline (float rounding) counts as expired
GRACE_S: Final = 1.0  # keep expired waiters this long (at least) for their final re-ask


@dataclass(frozen=True, slots=True)
class Waiter:
    """One held request: ``ticket`` is the shell's id for it."""

    ticket: str
    priority: int
    seq: int
    since: float
    until: float

    def order(self) -> tuple[int, int]:
        return (-self.priority, self.seq)

    def expired(self, now: float) -> bool:
        return now >= self.until - EPS_S


class AdmissionQueue:
    """Bounded queue of waiters; all methods are O(queue_max) at worst."""

    def __init__(self, max_live: int) -> None:
        self.max_live = max_live
        self._waiters: dict[str, Waiter] = {}
        self._seq = 0

    def get(self, ticket: str | None) -> Waiter | None:
        return None if ticket is None else self._waiters.get(ticket)

    def live(self, now: float) -> list[Waiter]:
        """Waiters still within their wait, in service order."""
        return sorted((w for w in self._waiters.values() if not w.expired(now)),
                      key=Waiter.order)

    def has_room(self, now: float) -> bool:
        return len(self.live(now)) < self.max_live

    def ahead(self, priority: int, waiter: Waiter | None, now: float) -> int:
        """How many live waiters come before ``waiter`` (or before a newcomer of ``priority``)."""
        if waiter is not None:
            key = waiter.order()
            return sum(1 for w in self._waiters.values()
                       if w is not waiter and not w.expired(now) and w.order() < key)
        return sum(1 for w in self._waiters.values()
                   if not w.expired(now) and w.priority >= priority)

    def join(self, ticket: str, priority: int, now: float, until: float) -> Waiter:
        """Add a waiter (the caller checked :meth:`has_room`)."""
        self._seq += 1
        w = Waiter(ticket, priority, self._seq, now, until)
        self._waiters[ticket] = w
        return w

    def leave(self, ticket: str | None) -> Waiter | None:
        """Remove a waiter (admitted, refused, or abandoned by the shell)."""
        return None if ticket is None else self._waiters.pop(ticket, None)

    def prune(self, now: float) -> int:
        """Forget waiters expired for longer than the grace period (they never re-asked)."""
        if not self._waiters:
            return 0  # the common case, once per decision
        dead = [t for t, w in self._waiters.items()
                if now > w.until + max(GRACE_S, w.until - w.since)]
        for t in dead:
            del self._waiters[t]
        return len(dead)

    def next_deadline(self, now: float) -> float | None:
        """The earliest wait deadline among live waiters (when a shell timer should fire)."""
        live = self.live(now)
        return min(w.until for w in live) if live else None

    def __len__(self) -> int:
        return len(self._waiters)
