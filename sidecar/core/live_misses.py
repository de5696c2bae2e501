"""Live misses: is a route missing its class budget *now*, from requests as they resolve.

The statistics learn from finished requests and are read through a window of
minutes, and plans are rebuilt every few dozen decisions: a route that turns
slow for twenty seconds keeps much of its traffic while the evidence against it
is still on its way (the generated ``spike`` family: a provider five times
slower kept its share for most of its spike). A request's miss of its budget,
though, is known as soon as the budget has passed without its answer. So each
request sent on a route resolves as a **hit** or a **miss** of its class's
budget at the first moment the sidecar can tell:

====================================  =============================================
request                               resolves
====================================  =============================================
*watched*, budget passed and its      a miss, at the budget (whatever it does next,
first token (TTFT classes) or its     it is late: a censored observation)
answer (others) not in by then
a timed stream (TTFT class) whose     a hit, at the budget (whatever its stream does
first token came by its budget        next: the budget is met)
any other, finished ``ok``            a hit or a miss by its measured latency, when
                                      its outcome comes in
a timeout or cancel                   a miss if it had waited past the budget; a
                                      cancel's measured first token (TTFT classes) in
                                      time a hit; else nothing (a user pressed stop)
an error                              nothing: errors have their own rules (the fast
                                      path, outcomes as evidence)
no outcome will come (its entry       a watched request answered in time: a hit (its
reached another process, or never     miss would have counted at the budget, so its
came)                                 hit must too); any other: nothing
====================================  =============================================

Only observed requests are tracked (``stats.observe_share``): one whose outcome
never comes could show its misses but never its hits.

*Watched* are requests whose answer time the sidecar sees as it happens: every
request of an end-to-end class (the routing stream closes when the response is
over) and, of a TTFT class, the streams the observing filter times
(``timing.token_sample_share``). An unwatched stream's first token is known only
from its access-log entry, so its miss counts only then. A class whose SLO is on
TPOT has no budget a request can pass in flight; it is not tracked. A TTFT class
served without streaming is judged on the whole answer (its first byte).

Per (cluster, slice) a book (:class:`~sidecar.core.live_book.Book`) keeps the
outcomes resolved in the last ``H`` seconds (``health.live_horizon_s``, 10 s; 0
turns this off): ``k`` misses of ``m``, ``k_w`` of ``m_w`` among them of watched
requests. The route is
**missing** for the slice while::

    k >= MIN_MISSES  and  P(X >= k | X ~ Binomial(m, a)) < ALPHA

with ``a`` the class's allowed share ``1 - percentile / 100``: too many misses to
be the route's allowed share by chance (with ``m = 20``, ``a = 0.05``: 5 misses)
-- or while the same test holds for its *watched* requests' outcomes alone
(``k_w`` of ``m_w``). Of a streaming TTFT class only a sample is watched, and the
rest resolve when their streams end, seconds after their first token: when a
route turns slow, the hits of streams sent before keep coming in for a while
and dilute the first misses (a 10 s spike was over before ``k`` of ``m`` grew
beyond chance). The watched requests resolve within the budget of being sent,
so their own test reads the route as it is now (two at ``ALPHA`` each: a
route at its allowed share is kept out by chance at most twice as often). Then
it takes no new request of the slice while the other usable routes have a
quarter of their slots free (the ``live_misses`` filter in
:mod:`sidecar.core.filters`, with the class restriction's herding guard: when a
peak slows every route, sitting one out would only pile its traffic onto the
next; soft: alone, it serves). It is a steering signal, not a health state:
nothing is escalated, and as the misses age out of ``H`` the route is back in the
plan's share (the health machine judges the same requests through the statistics
as before). Each replica of a fleet keeps its own books.

**Repeat-offender memory.** A route that keeps relapsing is back at full share
just in time for its next episode, and an episode's first seconds, before enough
misses resolve, are paid on that share. So the books remember episodes: a
*missing* verdict more than ``EPISODE_GAP x H`` after the route's previous one
starts an episode (within an episode the verdict comes and goes as misses age out
and fresh requests miss again, seconds apart). With ``n`` episodes begun in the
last ``health.forgive_after_s`` (600 s)::

    recurrence = relapse_factor ** (n - 1)        (1 for n <= 1; relapse_factor 0.5)

multiplies the route's static weight for the slice (the ``recurrence`` score,
:mod:`sidecar.core.scorers`): a lone spike costs nothing, a second episode within
ten minutes halves the route's share, a third quarters it, and each episode older
than ``forgive_after_s`` is forgiven. The exploration floor still gives the route
traffic, so its statistics stay fresh. The health machine's own memory
(:mod:`sidecar.core.health`) shrinks restore steps after escalations; episodes the
live misses handle alone rarely escalate, so they had none.

**Native mode.** Envoy routes native requests from the published weights, and the
sidecar learns of each only from its access-log entry: such a request is never
sent through :meth:`LiveMisses.sent`, and resolves by its outcome alone
(:meth:`LiveMisses.outcome`; a batch of successes, :meth:`LiveMisses.outcomes_ok`)
-- unwatched, as an untimed stream is per request. The weights
(:mod:`sidecar.core.weights`) run the same filter, so a missing route is published
at weight 0 while the others have room. Hybrid mode's two kinds of traffic feed the
same books, each request once.

Cost: one heap entry per watched request in flight, popped when its budget
passes; per decision a look at the earliest budget and, only while some book
holds ``MIN_MISSES`` misses, the test on the candidates' books (thresholds
cached per ``(a, m)``).

Pure: times are the caller's ``now``. A lab that knows an answer's time in
advance subclasses :class:`~sidecar.core.live_book.LiveEntry` (its ``answer_at``
is read only once the budget has passed, so it reads the past). The binomial
test is :mod:`sidecar.core.binomial`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final

from sidecar.core.binomial import binomial_threshold
from sidecar.core.config import Config
from sidecar.core.live_book import MIN_MISSES, Book, LiveEntry, budget_of
from sidecar.core.subwindow import OkSample
from sidecar.core.types import Observation, SliceKey

ALPHA: Final = 0.01  # the chance of so many misses from a route at its allowed share
EPISODE_GAP: Final = 2.0  # horizons without a missing verdict that separate two episodes
_THRESHOLDS_MAX: Final = 65536  # cached (allowed share, m) thresholds before starting over

_NONE: Final[frozenset[str]] = frozenset()


class LiveMisses:
    """Every route's :class:`~sidecar.core.live_book.Book` (module docstring). Per
    decision the work is a look at the earliest watched budget and, while some book
    holds ``MIN_MISSES`` misses, the test on the candidates' books."""

    __slots__ = ("_seq", "_thresholds", "books", "config", "suspects", "watch")

    def __init__(self, config: Config) -> None:
        self.config = config
        self.books: dict[tuple[str, SliceKey], Book] = {}
        self.watch: list[tuple[float, int, LiveEntry]] = []  # watched requests, by deadline
        self.suspects: set[Book] = set()
        self._seq = 0  # ties in the heap
        self._thresholds: dict[tuple[float, int], int] = {}

    def reconfigure(self, config: Config) -> None:
        """A reload may change budgets: start the books' outcomes afresh (entries of the
        old ones still resolve there, harmlessly), but keep each route's episodes. They
        are the repeat-offender memory of ``forgive_after_s``: wiped by a reload of any
        field, a route that had missed its budget three times in ten minutes got its
        full share back, and an episode under way at the reload began again (a second
        one: its share halved)."""
        old = self.books
        self.config = config
        self.books = {}
        self.watch = []
        # A new set: the old books (their requests still resolve) keep the old one.
        self.suspects = set()
        known = set(config.cluster_names)
        for (cluster, slice), book in old.items():
            if book.last_missing is not None and cluster in known:
                self.adopt(cluster, slice, book.episodes, book.last_missing)

    def adopt(self, cluster: str, slice: SliceKey, episodes: Iterable[float],
              last_missing: float) -> None:
        """Take over a route's episodes and its latest missing verdict (a reload, a
        warm restart); nothing when the slice is not tracked under this config."""
        book = self._book(cluster, slice)
        if book is not None:
            book.episodes.extend(episodes)
            book.last_missing = last_missing

    def sent(self, cluster: str, slice: SliceKey, now: float, timed: bool,
             make: Callable[[Book, float, bool], LiveEntry] = LiveEntry) -> LiveEntry | None:
        """An observed request of ``slice`` went to ``cluster`` at ``now``. ``timed``: its
        first token will be reported as it comes (:meth:`first_token`; the observing
        stream); every request's close is (:meth:`closed`). ``make`` builds the entry
        (a lab's subclass). None: not tracked (TPOT class, unknown class, turned off)."""
        book = self._book(cluster, slice)
        if book is None:
            return None
        watched = timed or not book.budget.first_token
        entry = make(book, now + book.budget.seconds, watched)
        if watched:
            self._seq += 1
            heapq.heappush(self.watch, (entry.deadline, self._seq, entry))
        return entry

    def _book(self, cluster: str, slice: SliceKey) -> Book | None:
        """The route's book, made on first use; None: not tracked (TPOT class, unknown
        class, turned off)."""
        key = (cluster, slice)
        book = self.books.get(key)
        if book is None:
            horizon = self.config.health.live_horizon_s
            budget = budget_of(self.config, slice)
            if budget is None or horizon <= 0:
                return None
            book = self.books[key] = Book(budget, horizon, self.suspects)
        return book

    def advance(self, now: float) -> None:
        """Resolve the watched requests whose budget passed unanswered: misses, now."""
        watch = self.watch
        while watch and watch[0][0] <= now:
            deadline, _, e = heapq.heappop(watch)
            if e.resolved or not e.watched:
                continue
            t = e.answer_at()
            if t is None or t > deadline:
                e.resolved = True
                e.book.note(now, True, True)  # at ``now``, not the deadline: in order
            elif e.book.budget.first_token:
                # A timed stream's first token came in time: a hit, dated like a miss
                # (not at its stream's end, seconds later: docs/policy-lab.md, stop 63).
                e.resolved = True
                e.book.note(now, False, True)
            # else: an answer in time; its outcome resolves it at the close (an error
            # resolves nothing)

    @staticmethod
    def first_token(entry: LiveEntry, at: float) -> None:
        """A timed request's first token came at ``at`` (TTFT classes' answer)."""
        if entry.book.budget.first_token and entry._answered is None:
            entry._answered = at

    @staticmethod
    def closed(entry: LiveEntry, at: float) -> None:
        """The request's response is over (the routing stream closed) at ``at``: the
        answer, for every class but a TTFT class's stream."""
        if not entry.book.budget.first_token and entry._answered is None:
            entry._answered = at

    @staticmethod
    def unwatch(entry: LiveEntry) -> None:
        """Its first token will not be reported after all (the observer read none):
        only its outcome resolves it."""
        entry.watched = False

    def observed(self, entry: LiveEntry, obs: Observation, now: float) -> None:
        """The request's outcome (module docstring's table): ``ok`` is a hit or a miss by
        the class metric; a timeout or cancel that already waited past the budget a
        miss; anything else resolves nothing."""
        if entry.resolved:
            return
        entry.resolved = True
        self._resolve(entry.book, obs, now, entry.watched)

    def outcome(self, obs: Observation, now: float) -> None:
        """The outcome of a request routed without a decision (native mode: Envoy drew
        its cluster from the published weights, and the sidecar learns of it only from
        its access-log entry): unwatched, it resolves by its outcome, as
        :meth:`observed` resolves any other request."""
        book = self._book(obs.cluster, obs.slice)
        if book is not None:
            self._resolve(book, obs, now)

    def outcomes_ok(self, cluster: str, slice: SliceKey, samples: Sequence[OkSample],
                    now: float) -> None:
        """:meth:`outcome` of many ``ok`` requests of ``slice`` on ``cluster`` at ``now``
        (a batch of native log entries), in one note."""
        book = self._book(cluster, slice)
        if book is None:
            return
        budget = book.budget
        i = 0 if budget.first_token else 2  # OkSample: (ttft, tpot, e2e, tokens)
        m = k = 0
        for sample in samples:
            value = sample[i]
            if value is not None:
                m += 1
                k += value > budget.seconds
        if m:
            watch = self.watch
            if watch and watch[0][0] <= now:
                self.advance(now)  # earlier budgets first: ``recent`` stays in order
            book.note_many(now, m, k)

    def _resolve(self, book: Book, obs: Observation, now: float,
                 watched: bool = False) -> None:
        value = obs.ttft_s if book.budget.first_token else obs.e2e_s
        if value is None or obs.outcome == "error":
            return
        late = value > book.budget.seconds
        if obs.outcome == "ok" or late or (obs.ttft_measured and obs.outcome == "cancel"
                                           and book.budget.first_token):
            watch = self.watch
            if watch and watch[0][0] <= now:
                self.advance(now)  # earlier budgets first: ``recent`` stays in order
            book.note(now, late, watched)

    @staticmethod
    def dropped(entry: LiveEntry) -> None:
        """The request says nothing about its route (Envoy sent it elsewhere)."""
        entry.resolved = True

    def unobserved(self, entry: LiveEntry, now: float) -> None:
        """No outcome will come for the request (its entry reached another process, or
        never came). A watched one answered in time is a hit: its miss would have
        counted at the budget, so without its hit the book would lean to misses. Any
        other resolves nothing."""
        if entry.resolved:
            return
        entry.resolved = True
        t = entry.answer_at() if entry.watched else None
        if t is not None and t <= entry.deadline:
            watch = self.watch
            if watch and watch[0][0] <= now:
                self.advance(now)
            entry.book.note(now, False, True)

    def missing_among(self, clusters: tuple[str, ...], slice: SliceKey,
                      now: float) -> frozenset[str]:
        """Which of ``clusters`` miss the slice's budget now (:meth:`missing`)."""
        watch = self.watch
        if watch and watch[0][0] <= now:
            self.advance(now)
        if not self.suspects:
            return _NONE
        return frozenset(c for c in clusters if self._judge(c, slice, now))

    def missing(self, cluster: str, slice: SliceKey, now: float) -> bool:
        """Is the route missing the slice's budget now (module docstring)?"""
        self.advance(now)
        return self._judge(cluster, slice, now)

    def _judge(self, cluster: str, slice: SliceKey, now: float) -> bool:
        """:meth:`missing` once the watched budgets up to ``now`` are resolved."""
        book = self.books.get((cluster, slice))
        if book is None or book not in self.suspects:
            return False
        book.forget(now)
        if book.k < MIN_MISSES:
            self.suspects.discard(book)
            return False
        if not self._over(book):
            return False
        last = book.last_missing
        if last is None or now - last > EPISODE_GAP * book.horizon:
            book.episodes.append(now)
        book.last_missing = now
        return True

    def _over(self, book: Book) -> bool:
        """Too many misses to be the allowed share by chance: among all the horizon's
        outcomes, or among its watched requests' alone (module docstring)."""
        allowed = book.budget.allowed
        if book.k >= MIN_MISSES and book.k >= self.threshold(allowed, book.m):
            return True
        return book.wk >= MIN_MISSES and book.wk >= self.threshold(allowed, book.wm)

    def recurrence(self, clusters: tuple[str, ...], slice: SliceKey,
                   now: float) -> Mapping[str, float]:
        """Each of ``clusters``' repeat-offender factor for the slice, where below 1
        (module docstring): ``relapse_factor ** (n - 1)``, ``n`` its episodes begun
        in the last ``forgive_after_s``."""
        out: dict[str, float] = {}
        for c in clusters:
            book = self.books.get((c, slice))
            if book is not None and book.episodes:
                factor = self._factor(self._remembered(book, now))
                if factor < 1.0:
                    out[c] = factor
        return out

    def _remembered(self, book: Book, now: float) -> int:
        """The book's episodes begun in the last ``forgive_after_s`` (older ones forgiven)."""
        episodes, memory = book.episodes, now - self.config.health.forgive_after_s
        while episodes and episodes[0] < memory:
            episodes.popleft()
        return len(episodes)

    def _factor(self, n: int) -> float:
        """``relapse_factor ** (n - 1)`` for ``n`` remembered episodes (1 for n <= 1)."""
        return self.config.health.relapse_factor ** min(n - 1, 30) if n > 1 else 1.0

    def summary(self, cluster: str, slice: SliceKey, now: float) -> dict[str, object] | None:
        """What ``/state`` shows of the route's book (None: not tracked, or nothing yet):
        misses and outcomes within the horizon, whether they make it missing, its
        remembered episodes and its repeat-offender factor. Resolves the budgets that
        passed and forgets what aged out (as any decision would), but judges nothing:
        beginning an episode is the decisions'."""
        self.advance(now)
        book = self.books.get((cluster, slice))
        if book is None:
            return None
        book.forget(now)
        n = self._remembered(book, now)
        return {"misses": book.k, "outcomes": book.m,
                "watched_misses": book.wk, "watched_outcomes": book.wm,
                "missing": self._over(book), "episodes": n, "recurrence": self._factor(n)}

    def threshold(self, allowed: float, m: int) -> int:
        """The fewest misses of ``m`` whose chance at share ``allowed`` is below ALPHA."""
        key = (allowed, m)
        t = self._thresholds.get(key)
        if t is None:
            if len(self._thresholds) >= _THRESHOLDS_MAX:
                self._thresholds.clear()
            t = self._thresholds[key] = binomial_threshold(m, allowed, ALPHA)
        return t
