"""Keep the statistics' long-lived objects out of the cyclic collector's full passes.

Every route's statistics hold a ring of sub-windows built once and reused: about 260
objects the cyclic garbage collector tracks per series (docs/memory.md). A full
collection walks every tracked object with the event loop stopped: 600-730 ms at
4,800 routes (1.57 million objects), past Envoy's 500 ms message timeout, so each
one failed the requests in flight open. CPython runs one whenever the objects
promoted since the last exceed a quarter of the long-lived ones, and a native
publication over 1,200 slices promoted enough for a full pass at two publications
of three.

``serve`` freezes what exists at start (``gc.freeze()``: out of every future pass).
Routes created later join the long-lived generation, so :class:`LongLivedFreezer`
checks it now and then and freezes it again once it holds :data:`FREEZE_AT`
objects, about 770 series' worth, where a full pass takes about 90 ms:

1. a full collection first -- it walks only what is not frozen yet, so it frees the
   cycles among those before the survivors are frozen;
2. ``gc.freeze()`` then, if what survived is still at least half of the trigger
   (live state, not garbage).

Objects frozen are still freed by reference counting when dropped (a pruned route's
ring), but a *cycle* among them never is: a frozen object that later becomes part
of cyclic garbage stays. The rings hold no cycles. What else is frozen with them --
requests in flight at that moment -- is bounded by the number of freezes, which
need a quarter of a million new long-lived objects each: bounded by the routes the
config allows (``stats.max_slices`` per cluster). ``tailroute_gc_freezes_total``
and ``tailroute_gc_frozen_objects`` show them.
"""

from __future__ import annotations

import gc
import logging
from typing import Final

log = logging.getLogger("tailroute.gc")

FREEZE_AT: Final = 200_000  # long-lived, unfrozen tracked objects that trigger a freeze
CHECK_EVERY_S: Final = 10.0  # how often serve asks (below the trigger: a count, ~5 ms at most)


class LongLivedFreezer:
    """Freezes the collector's long-lived generation once it has grown big (module
    docstring). ``check`` is cheap below the trigger: one count of that generation."""

    def __init__(self, threshold: int = FREEZE_AT) -> None:
        self.threshold = threshold
        self.freezes = 0

    def check(self) -> bool:
        """Collect and freeze if the long-lived generation holds ``threshold`` objects;
        True if it froze."""
        if len(gc.get_objects(generation=2)) < self.threshold:
            return False
        gc.collect()  # over the unfrozen only: their cycles go before the rest is frozen
        survivors = len(gc.get_objects(generation=2))
        if survivors < self.threshold // 2:
            return False  # mostly garbage, now freed: nothing worth freezing
        gc.freeze()
        self.freezes += 1
        log.info("froze %d long-lived objects out of the garbage collector's passes "
                 "(%d frozen in all)", survivors, gc.get_freeze_count())
        return True

    def counters(self) -> dict[str, int]:
        """For the metrics: freezes so far and the objects frozen (the start-up's too)."""
        return {"gc:freezes": self.freezes, "gc:frozen": gc.get_freeze_count()}
