"""One route's live-miss book: the outcomes of one (cluster, slice) resolved within the
horizon, and what its requests are judged against.

:class:`Book` keeps ``k`` misses of ``m`` outcomes (``k_w`` of ``m_w`` of watched
requests) resolved in the last ``H`` seconds, in resolution order, and tells the
owner (:class:`~sidecar.core.live_misses.LiveMisses`, which judges them) when it
holds ``MIN_MISSES`` misses or more by adding itself to the shared ``suspects``
set; :class:`LiveEntry` is one request in a book, kept by the caller until the
request is done (a lab that knows the answer's time in advance subclasses it).
Pure: times are the caller's ``now``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Final

from sidecar.core.config import Config
from sidecar.core.types import SliceKey

MIN_MISSES: Final = 2  # fewer misses never make a route missing, however few requests


@dataclass(frozen=True, slots=True)
class Budget:
    """What a slice's requests are judged against: the budget in seconds, the
    allowed share of misses, and whether the first token is what must arrive."""

    seconds: float
    allowed: float
    first_token: bool


def budget_of(config: Config, slice: SliceKey) -> Budget | None:
    """The slice's budget; None when its class is unknown or its SLO is on TPOT."""
    klass = config.workload_class(slice.klass)
    if klass is None or klass.slo.metric == "tpot":
        return None
    return Budget(klass.slo.budget_ms / 1000.0, max(1.0 - klass.slo.percentile / 100.0, 1e-4),
                  klass.slo.metric == "ttft" and slice.streaming is True)


class LiveEntry:
    """One request in a :class:`Book` (the caller keeps it until the request is done)."""

    __slots__ = ("_answered", "book", "deadline", "resolved", "watched")

    def __init__(self, book: Book, deadline: float, watched: bool) -> None:
        self.book = book
        self.deadline = deadline
        self.watched = watched
        self.resolved = False
        self._answered: float | None = None

    def answer_at(self) -> float | None:
        """When its first token (TTFT classes) or its whole answer came; None: not yet."""
        return self._answered


class Book:
    """The outcomes of one (cluster, slice), resolved within the horizon."""

    __slots__ = ("budget", "episodes", "horizon", "k", "last_missing", "m", "recent",
                 "suspects", "wk", "wm")

    def __init__(self, budget: Budget, horizon: float, suspects: set[Book]) -> None:
        self.budget = budget
        self.horizon = horizon
        # (resolved at, outcomes, misses among them, 1 if a watched request's), in order;
        # a batch of log entries resolves many at one time.
        self.recent: deque[tuple[float, int, int, int]] = deque()
        self.k = 0  # misses in recent
        self.m = 0  # outcomes in recent
        self.wk = 0  # ... of watched requests
        self.wm = 0
        self.suspects = suspects  # the books with MIN_MISSES or more (LiveMisses')
        self.last_missing: float | None = None  # the latest missing verdict
        self.episodes: deque[float] = deque()  # when each remembered episode began

    def note(self, now: float, miss: bool, watched: bool = False) -> None:
        self.note_many(now, 1, 1 if miss else 0, watched)

    def note_many(self, now: float, m: int, k: int, watched: bool = False) -> None:
        """``m`` outcomes resolved at ``now``, ``k`` of them misses."""
        recent = self.recent
        if recent and recent[0][0] < now - self.horizon:
            self.forget(now)
        recent.append((now, m, k, 1 if watched else 0))
        self.m += m
        if watched:
            self.wm += m
            self.wk += k
        if k:
            self.k += k
            if self.k >= MIN_MISSES:
                self.suspects.add(self)

    def forget(self, now: float) -> None:
        """Drop the outcomes resolved more than ``H`` before ``now``."""
        recent, horizon = self.recent, now - self.horizon
        while recent and recent[0][0] < horizon:
            _, m, k, w = recent.popleft()
            self.m -= m
            self.k -= k
            if w:
                self.wm -= m
                self.wk -= k
