"""Finished requests waiting for their access-log entry: bounded, in close order, honest.

A routed request is over when Envoy closes its routing stream; its outcome comes
later, in an access-log entry (normally within one ``buffer_flush_interval``).
:class:`LogWait` keeps the finished-but-unlogged requests in the order they
closed, so that

* the age of the oldest one is a direct measure of the access log's health
  (:meth:`oldest_wait`): a few hundred ms when entries flow; it climbs to the
  grace period when they stop — whatever the reason (no stream: sidecar
  restarted, bootstrap without the access log; a stream that is open but
  silent: Envoy above its write watermark, dropping entries);
* their number is bounded (``cap``): when the access log is down, requests keep
  finishing at the request rate (70 req/s x 30 s grace = 2,100); past the cap
  the oldest are given up at once;
* a request given up on is counted ``lost`` exactly once — not evidence, no
  outcome — and remembered (a bounded FIFO of ids), so that its entry, should
  it still arrive, is counted ``late`` and not observed a second time.

Pure bookkeeping: times come from the caller, nothing here touches the router.
"""

from __future__ import annotations

from collections.abc import Iterator

# Finished requests waiting for their entry at most. Normal operation holds about
# rate x (flush interval + entry latency): ~200 at 1,000 req/s with the 100 ms flush.
MAX_AWAITING = 4096
# Ids given up on that are remembered, so a late entry is not counted twice.
REMEMBER_LOST = 4096


class LogWait:
    """The close-ordered book of finished requests and the ids recently given up on."""

    def __init__(self, cap: int = MAX_AWAITING, remember: int = REMEMBER_LOST) -> None:
        self.cap = cap
        self.remember = remember
        self._closed: dict[str, float] = {}  # rid -> when its stream closed (close order)
        self._lost: dict[str, None] = {}  # FIFO of ids counted lost

    def __len__(self) -> int:
        return len(self._closed)

    def closed(self, rid: str, now: float) -> list[str]:
        """The request's stream closed; returns the ids pushed out by the cap (oldest
        first), which the caller gives up on."""
        self._closed.setdefault(rid, now)
        over = len(self._closed) - self.cap
        return [self._pop_oldest() for _ in range(over)] if over > 0 else []

    def done(self, rid: str) -> None:
        """The entry arrived (or the request is finished some other way)."""
        self._closed.pop(rid, None)

    def oldest_wait(self, now: float) -> float:
        """Seconds the oldest finished request has waited for its entry (0: none)."""
        first = next(iter(self._closed.values()), None)
        return max(now - first, 0.0) if first is not None else 0.0

    def lost(self, rid: str) -> None:
        """Remember a request counted lost (its entry, if it comes, is late)."""
        self._closed.pop(rid, None)
        self._lost[rid] = None
        if len(self._lost) > self.remember:
            del self._lost[next(iter(self._lost))]

    def take_lost(self, rid: str) -> bool:
        """True (once) if ``rid`` was counted lost: its entry came late."""
        return self._lost.pop(rid, 0) is None

    def _pop_oldest(self) -> str:
        rid = next(iter(self._closed))
        del self._closed[rid]
        return rid

    def __iter__(self) -> Iterator[str]:
        return iter(self._closed)
