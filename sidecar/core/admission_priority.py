"""Strict priority under overload: which classes are *pressed*, and what others yield (pure).

``admission.shed_below_priority`` splits classes in two: below it, work is
deferred or shed as soon as its routes are contended; at or above it, work
queues briefly and is then admitted best effort. On its own that protects the
lowest tier only: a middle class (above the threshold) keeps taking the slots
the top class needs, and both miss their SLOs together.

This module adds an ordering among the classes that share routes:

    episode(H)       = requests of class H finding every usable route near its capacity
                       and full or over H's budget, no more than admission.yield_hold_s
                       apart (near: free(r) <= reserve(r), as below)
    pressed(H)       = an episode of H that began at least admission.yield_after_s ago
                       and whose last such request is less than yield_hold_s old
                       (hysteresis both ways: a brief spike presses nobody, and a
                       pressed class stays pressed through short lulls)
    routes(H)        = H's usable routes at that moment
    reserve(r)       = ceil(admission.yield_reserve x max_concurrency(r))
    held(L, r)       = priority(L) >= admission.shed_below_priority and some pressed H
                       with priority(H) > priority(L) has r in routes(H)
    reserved(L, r)   = held(L, r) and free(r) <= reserve(r)

A request of class L treats a ``reserved`` route like a full one when
admission judges contention, so L is contended while every route it could use
is full, over budget or reserved for a more important class; then L queues
behind more important waiters and, its wait over, yields (defer, else shed:
reason ``yield``) instead of being admitted best effort. This is trunk
reservation across the shared routes: once they are all down to their
reserve, lower classes stop and the top class may use the rest; every class
yields in priority order (it is held back by each pressed class above it).
While some route has room beyond its reserve, the route selection chose is
kept (moving L to the route with room measured no better in the lab).
Classes below ``shed_below_priority`` keep no reserve: the overload rows
already defer or shed them whenever their routes are full or over budget, and
holding them to the reserve too cost them more than the pressed class gained
(docs/admission.md). Without a pressed class above it nothing changes for L, and a route that is
not near its capacity is never reserved: latency overload alone (routes slow
but not busy) does not make anybody yield.

The pressed state is kept per (class, priority), since ``x-tailroute-priority`` may
raise a request's priority above its class's, expires by time and only moves when a
saturated request is decided (``mark``). It is capped at :data:`PRESSED_MAX` entries:
under saturation, requests claiming distinct priorities (0..1000, a client's choice)
made one entry each -- 984 of them from 4,000 requests with random priorities, a
125 KB ``/state`` ``admission.pressed`` list, and each decision 2.6 times slower, since
every decision scans the table. At the cap, the least important entry (lowest priority,
then the one expiring first) gives way to a more important mark, and a mark no more
important than every entry is dropped; either is counted (:attr:`PriorityPressure.overflow`,
``/state`` ``admission.pressed_overflow``). What is lost is the least important
pressure: a class yields whenever any live entry above its priority remains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

# Pressed entries kept at once (module docstring): a deployment has a handful of classes
# and priority tiers; past this many, a client is choosing priorities freely.
PRESSED_MAX: Final = 64


@dataclass(frozen=True, slots=True)
class Pressed:
    """One class's pressed state: since when, until when, on which routes."""

    klass: str
    priority: int
    routes: frozenset[str]
    since: float
    until: float


class PriorityPressure:
    """The pressed classes of one router."""

    def __init__(self, hold_s: float, reserve: float, after_s: float = 0.0) -> None:
        self.hold_s = hold_s
        self.reserve = reserve
        self.after_s = after_s
        # keyed by (class, priority): x-tailroute-priority may override a class's priority
        self._pressed: dict[tuple[str, int], Pressed] = {}
        self._top = -1  # highest priority among entries (stale ones included): a cheap test
        self.overflow = 0  # marks dropped or entries evicted at PRESSED_MAX

    @property
    def enabled(self) -> bool:
        return self.hold_s > 0.0

    def mark(self, klass: str, priority: int, routes: frozenset[str], now: float) -> None:
        """A request of ``klass`` found its usable ``routes`` saturated at ``now``."""
        if not self.enabled or not routes:
            return
        key = (klass, priority)
        old = self._pressed.get(key)
        if old is None and len(self._pressed) >= PRESSED_MAX and not self._make_room(priority):
            return
        since = old.since if old is not None and now <= old.until else now
        self._pressed[key] = Pressed(klass, priority, routes, since, now + self.hold_s)
        self._top = max(self._top, priority)

    def _make_room(self, priority: int) -> bool:
        """At :data:`PRESSED_MAX`: evict the least important entry if a mark of
        ``priority`` is more important (True), else refuse the mark (False); counted."""
        self.overflow += 1
        key, least = min(self._pressed.items(), key=lambda kv: (kv[1].priority, kv[1].until))
        if least.priority >= priority:
            return False
        del self._pressed[key]
        return True

    def above(self, priority: int, now: float) -> bool:
        """Is some class more important than ``priority`` pressed now?"""
        if self._top <= priority:
            return False  # the common case: nothing above was ever pressed
        return any(p.priority > priority and self._live(p, now) for p in self._pressed.values())

    def _live(self, p: Pressed, now: float) -> bool:
        return p.since + self.after_s <= now < p.until

    def held_routes(self, priority: int, now: float) -> dict[str, str]:
        """Routes a class of ``priority`` must leave a reserve on -> the pressed class
        (the most important one) it yields to there."""
        out: dict[str, tuple[int, str]] = {}
        for p in self._pressed.values():
            if p.priority <= priority or not self._live(p, now):
                continue
            for r in p.routes:
                if r not in out or out[r][0] < p.priority:
                    out[r] = (p.priority, p.klass)
        return {r: k for r, (_, k) in out.items()}

    def reserve_slots(self, max_concurrency: int) -> int:
        """Slots kept free for a pressed class on a route of ``max_concurrency``."""
        return math.ceil(self.reserve * max_concurrency - 1e-9)

    def snapshot(self, now: float) -> list[dict[str, object]]:
        """The classes pressed now, most important first (for /state)."""
        live = sorted((p for p in self._pressed.values() if self._live(p, now)),
                      key=lambda p: (-p.priority, p.klass))
        return [{"class": p.klass, "priority": p.priority, "routes": sorted(p.routes),
                 "since": p.since, "until": p.until} for p in live]

    def prune(self, now: float) -> None:
        """Forget expired entries (keeps :meth:`above`'s cheap test cheap)."""
        if not self._pressed:
            return  # the common case, once per decision
        dead = [k for k, p in self._pressed.items() if now >= p.until]
        for k in dead:
            del self._pressed[k]
        self._top = max((p.priority for p in self._pressed.values()), default=-1)
