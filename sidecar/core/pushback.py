"""Provider push-back: the concurrency a provider has shown it accepts (pure).

A 429 (Too Many Requests) from a provider is backpressure, not sickness. A
provider behind a quota, or a smaller deployment than configured, refuses work
while ``max_concurrency`` still says there is room (lab case ``rate_limited``:
half of the requests refused). This module keeps, per cluster, the concurrency
the provider has shown it accepts, and the router counts the capacity it refused
as occupied (:attr:`PushBack.refused_slots`, added by ``Router.inflight``). So
every rule that compares in-flight work with ``max_concurrency`` -- the capacity
filter, the load score, the herding guard, admission, a probe's or a trial's
room, native weights -- sees the provider's real limit without a change of its
own, and a cached plan stays exact (it reads in-flight counts live).

Per cluster (``max`` its ``max_concurrency``; ``k`` the requests still in flight
there when the 429 is observed, peers' included in fleet mode: what the
provider was holding when it refused)::

    on a 429, k >= 1: L <- min(L, k)                  last_refusal <- now
    at a window boundary, if HOLD_S have passed since the last refusal and
    the cluster held floor(L) requests at some point since the last boundary:
                      L <- min(max, L + max(1, GROW * L))
    refused slots     max - floor(L)   (a cluster is tracked only while L < max)

The decrease is anchored at what the provider held, not a factor per refusal:
requests sent before the limit fell come back refused together (a factor per
refusal compounded them); a refusal while we hold ``L`` or more says nothing new. The increase
comes after a quiet spell, and only while traffic presses on the limit (TCP
grows its window only while the window is what holds it back, RFC 7661): a
limit nobody reaches says nothing about the provider, and raising it blindly
would bring the next burst of refusals. A lifted quota is found again within
about a minute of demand, without probing for it request by request (each such
probe would be a 429 a client sees). A 429 still counts as an error in the
route's outcome evidence (``sidecar.core.evidence``): while the limit is being
learned the refusals are real failures for the callers.

A limit learned elsewhere is adopted (:meth:`PushBack.adopt`): from a warm-restart
snapshot (``sidecar.ops.snapshot``: a restart does not send the provider into
the refusals again) and, in fleet mode, from a peer (``sidecar.fleet.limits_sync``:
``k`` counts the whole fleet's requests, so the limit is the provider's, and
each replica need not meet its own refusals to learn it). Adopting keeps the
lower limit and the later refusal: it never raises a limit, and growth stays
each replica's own (pressure it saw itself). A quota (below) is the provider's
too: a replica that reads a cluster's 429s as a quota's publishes it, and its
peers read theirs so as well (:meth:`PushBack.adopt_quota`). In fleet mode ``k``
counts the peers' requests, so a replica seldom sees a 429 come back to an empty
cluster itself; without that, the replicas that never did kept ratcheting ``L``
as the quota's refusals drained (docs/policy-lab.md, "A quota that does not say so").

**A declared wait is a hold, not a limit.** A 429 that says when to come back
(``Retry-After`` / ``retry-after-ms``, parsed into
:attr:`~sidecar.core.types.Observation.retry_after_s`) is a time-based quota: the
provider refuses whatever the route holds, so anchoring ``L`` at ``k`` would
ratchet it down as traffic drains (lab hunt ``burst_429``). Such a 429 instead
holds the cluster::

    on a 429 with wait w:   held_until <- max(held_until, now + min(w, MAX_HOLD_S))
    refused slots           max while now < held_until (the route counts as full)

``L`` is left as it was, and the hold ends by itself (:meth:`PushBack.release`,
due at :attr:`PushBack.next_release`; the router's ``next_deadline`` includes
it): the route then has every slot it had before. A wait of 0 holds nothing.
The router counts a 429 that set a hold as an outcome but keeps it out of the
route's statistics and health (``Intake.observe``): a quota is not sickness, and
counted as errors the refusals took a bursting route to ``restricted`` for minutes.

**A refusal of nothing is a quota.** A 429 that comes back while nothing else of ours is
in flight there (``k = 0``) cannot be a concurrency limit -- none is below 1 -- so the
provider refuses whatever it gets: a quota by time that did not say how long (read as a
limit, lab hunt ``burst_429``'s quota ratcheted ``L`` from 40 to 1 and kept it there).
Such a refusal, and every 429 of the cluster until ``QUOTA_MEMORY_S`` pass without one,
is read as that quota's::

    on a quota's 429:   forget L (back to max)
                        if not held: hold for min(BACKOFF_S * 2^(n-1), MAX_BACKOFF_S),
                        n counting such holds, each starting within BACKOFF_RESET_S
                        of the last one's end

A concurrency limit never shows ``k = 0``: refusals stop once the route holds fewer
than the provider takes. Unlike a declared quota's, such a 429 stays evidence against
the route: nothing says how long the quota lasts, and a route that refuses a share of
its requests at random serves its callers worse than one that does not (figures in
docs/policy-lab.md, "A quota that does not say so").

A hold steers traffic to a model's other routes. A cluster that is some model's only
candidate is therefore never held for an undeclared quota: that model would get
tailroute's own 429 for the whole hold, more than the provider refuses (a provider
refusing a few requests at random would, held, refuse all of them). Its quota's 429s
still learn no limit. (A declared wait holds it: the provider asked for it.)

A cluster held lately (a declared wait or a quota's backoff, whose hold ended less
than ``QUOTA_MEMORY_S`` ago) or whose 429s read as a quota's is *refusing by time*
(:meth:`PushBack.refusing`): the selection's attainment score then judges its
model's routes on its gentle scale only (:class:`~sidecar.core.scorers.Attainment`).

Native routing has no per-request in-flight count (``k`` is 0 there, the peers'
requests in fleet mode), so there every 429 without a wait is a quota's (read as a
limit, one set ``L = 1`` for good: the route looked full and got nothing to grow on).

A ``503`` with a ``Retry-After`` (RFC 9110: how long the service is expected to be
unavailable) holds the cluster as a 429's declared wait does, but stays evidence:
unavailability is the route's own trouble, so a route that keeps declaring it is
restricted and ejected as any other.

**A queue is a limit too** (:mod:`sidecar.core.queue_signs` says why and how): its
count arrives through :meth:`PushBack.queued` and is kept as a *cap*
(:attr:`PushBack.caps`: full at it, nothing refused below it), grows by ``GROW_QUEUED``,
becomes a limit on a 429, and stays this process's own (not in :meth:`learned`).

Invariants: ``1 <= L <= max`` for every tracked cluster; a cluster is tracked
only while ``L < max``; a 429 never raises a limit, except a quota's, which drops it;
time alone never lowers one; a hold never outlasts ``MAX_HOLD_S`` past the 429 that
set it; a cluster whose 429s read as a quota's learns no limit, not even a peer's, and
is never held for it while it is some model's only candidate; a tracked cluster is in
``caps`` (and then not in ``refused_slots`` unless held) iff a queue set its limit last.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

GROW: Final = 0.5  # share of the limit regained per window once quiet (at least one slot)
GROW_QUEUED: Final = 0.1  # the same for a queue's cap (overshooting one queues requests)
HOLD_S: Final = 30.0  # quiet time after the last refusal before the limit may grow again
# A declared wait longer than this is cut to it: a hostile or mistaken header must
# not take a route away for an hour; the provider can refuse again after a minute.
MAX_HOLD_S: Final = 60.0
# The answers whose Retry-After is read as a wait: a 429's quota, and a 503's "unavailable
# until" (RFC 9110 section 10.2.3 names 503 for it; a 3xx's says when to follow it).
WAIT_STATUSES: Final = frozenset((429, 503))


# A 429 that came back while nothing else of ours was in flight there is not a
# concurrency limit (none is below 1): the provider refuses whatever it gets, a quota
# that did not say how long. From then on, until QUOTA_MEMORY_S pass without a 429,
# the cluster's 429s are read as that quota's: no limit is learned from them,
# and each one that comes while the cluster is not held holds it for BACKOFF_S,
# doubled for each such hold that starts within BACKOFF_RESET_S of the last one's end
# (the quota still there as soon as traffic came back), up to MAX_BACKOFF_S.
BACKOFF_S: Final = 1.0
MAX_BACKOFF_S: Final = 32.0
BACKOFF_RESET_S: Final = 10.0
QUOTA_MEMORY_S: Final = 300.0


@dataclass(slots=True)
class _Quota:
    last: float  # the last 429 read as the quota's
    hold_end: float  # when its last backoff hold ended (or ends)
    streak: int  # backoff holds, each within BACKOFF_RESET_S of the last one's end

    def live(self, now: float) -> bool:
        """Still remembered: its last 429 came within QUOTA_MEMORY_S."""
        return now - self.last < QUOTA_MEMORY_S


@dataclass(slots=True)
class _Limit:
    limit: float
    last_refusal: float
    pressed: bool = False  # held floor(limit) requests since the last window boundary
    queued: bool = False  # learned from queueing, not from a 429 (grows by GROW_QUEUED)


class PushBack:
    """Learned concurrency limits of the clusters that answered 429."""

    def __init__(self) -> None:
        self._max: dict[str, int] = {}
        self._tracked: dict[str, _Limit] = {}
        # cluster -> max - floor(limit), tracked clusters only. Router.inflight reads
        # it per candidate and request, so it is a plain dict kept in step (and the
        # same object for the router's lifetime).
        self.refused_slots: dict[str, int] = {}
        self.caps: dict[str, int] = {}  # cluster -> floor(limit) of a queue's cap (in step)
        self._held: dict[str, float] = {}  # cluster -> end of its declared wait
        self.next_release: float | None = None  # earliest end of a hold
        self.holds_version = 0  # moves when a hold starts or ends (native weights republish)
        self._sole: frozenset[str] = frozenset()  # some model's only candidate
        self._quota: dict[str, _Quota] = {}  # clusters whose 429s read as a quota's
        self._last_hold: dict[str, float] = {}  # cluster -> end of its latest hold

    def configure(self, limits: dict[str, int], sole: Iterable[str] = ()) -> None:
        """Set each cluster's configured ``max_concurrency``; learned limits of clusters
        still present are kept (clamped to the new maximum), others dropped. ``sole``:
        the clusters that are some model's only candidate (no quota holds them)."""
        self._max = dict(limits)
        self._sole = frozenset(sole)
        for c in [c for c in self._quota if c not in self._max]:
            del self._quota[c]
        for c in [c for c in self._last_hold if c not in self._max]:
            del self._last_hold[c]
        for c in list(self._held):
            if c not in self._max:
                del self._held[c]
                self.refused_slots.pop(c, None)
        self.next_release = min(self._held.values()) if self._held else None
        for c in list(self._tracked):
            cap = self._max.get(c)
            if cap is None:
                del self._tracked[c]
                self.refused_slots.pop(c, None)
                self.caps.pop(c, None)
            else:
                self._tracked[c].limit = min(self._tracked[c].limit, float(cap))
        self._sync([*self._tracked, *self._held])

    def refused(self, cluster: str, holding: int, now: float) -> None:
        """``cluster`` answered 429 while ``holding`` of our requests were in flight there."""
        cap = self._max.get(cluster)
        if cap is None:
            return
        if holding <= 0 or self.quota(cluster, now):
            self._refused_by_quota(cluster, now)
            return
        cur = self._tracked.get(cluster)
        limit = float(cap) if cur is None else cur.limit
        new = min(limit, float(holding))  # >= 1: holding nothing is a quota's (above)
        if cur is None:
            self._tracked[cluster] = _Limit(new, now)
        else:
            cur.limit, cur.last_refusal, cur.queued = new, now, False
        self._sync((cluster,))

    def queued(self, cluster: str, holding: int, now: float) -> None:
        """``cluster`` queued requests sent while it held ``holding`` or more: its cap
        becomes ``holding`` if lower (a sign at or above the limit says nothing new);
        a cluster whose 429s read as a quota's is left alone."""
        cap = self._max.get(cluster)
        if cap is None or self.quota(cluster, now):
            return
        cur = self._tracked.get(cluster)
        limit = float(cap) if cur is None else cur.limit
        if holding >= math.floor(limit):
            return
        new = max(1.0, float(holding))
        if cur is None:
            self._tracked[cluster] = _Limit(new, now, queued=True)
        else:
            cur.limit, cur.last_refusal, cur.queued = new, now, True
        self._sync((cluster,))

    def quota(self, cluster: str, now: float) -> bool:
        """Are ``cluster``'s 429s read as a quota's now (one came back alone, and the
        last of them within ``QUOTA_MEMORY_S``)?"""
        q = self._quota.get(cluster)
        return q is not None and q.live(now)

    def quotas(self, now: float) -> dict[str, float]:
        """``cluster -> its last 429 read as a quota's``, of every cluster whose 429s read
        as a quota's now (fleet mode publishes them: the quota is the provider's)."""
        return {c: q.last for c, q in self._quota.items() if q.live(now)}

    def adopt_quota(self, cluster: str, last: float) -> None:
        """A peer reads ``cluster``'s 429s as a quota's, the last at ``last``: so does this
        replica until ``QUOTA_MEMORY_S`` after it, and the limit it learned from them is
        dropped. No hold starts here (the peer's holds travel as holds); this replica's
        own 429s back off as a quota's do. Unknown clusters and non-finite times are
        ignored."""
        if cluster in self._max and math.isfinite(last):
            self._note_quota(cluster, last)

    def _note_quota(self, cluster: str, last: float) -> _Quota:
        """``cluster``'s 429s are a quota's, the last at ``last``: its entry (made or
        moved on) and no learned limit."""
        q = self._quota.get(cluster)
        if q is None:
            q = self._quota[cluster] = _Quota(last, -math.inf, 0)
        elif last > q.last:
            q.last = last
        if self._tracked.pop(cluster, None) is not None:
            self._sync((cluster,))
        return q

    def _refused_by_quota(self, cluster: str, now: float) -> None:
        """A quota's 429: drop the learned limit (it was never one), back off a while."""
        q = self._note_quota(cluster, now)
        if cluster in self._sole or now < self._held.get(cluster, -math.inf):
            # some model's only route (held, it would get tailroute's own 429s instead of
            # the share the provider answers); or requests sent before the hold
            return
        q.streak = q.streak + 1 if now - q.hold_end < BACKOFF_RESET_S else 1
        wait = min(BACKOFF_S * 2.0 ** (q.streak - 1), MAX_BACKOFF_S)
        q.hold_end = now + wait
        self.hold(cluster, wait, now)

    def hold(self, cluster: str, wait_s: float, now: float) -> None:
        """``cluster`` answered 429 or 503 asking for ``wait_s`` seconds: it counts as full
        until then (module docstring); its learned limit is left alone."""
        if cluster not in self._max or not wait_s > 0.0:  # also rejects NaN
            return
        until = now + min(wait_s, MAX_HOLD_S)
        if until <= self._held.get(cluster, -math.inf):
            return
        if cluster not in self._held:
            self.holds_version += 1
        self._held[cluster] = until
        self._last_hold[cluster] = until
        self.next_release = min(self._held.values())
        self._sync((cluster,))

    def refusing(self, cluster: str, now: float) -> bool:
        """Has ``cluster`` refused work by time lately: a hold (a declared wait or a
        quota's backoff) ended less than ``QUOTA_MEMORY_S`` ago, or its 429s read as a
        quota's? Its window's refusals are then a schedule's, not a share at random
        (the attainment score does not sharpen on them)."""
        end = self._last_hold.get(cluster)
        return (end is not None and now - end < QUOTA_MEMORY_S) or self.quota(cluster, now)

    def release(self, now: float) -> None:
        """End the holds whose wait is over (call when ``now >= next_release``)."""
        if self.next_release is None or now < self.next_release:
            return
        over = [c for c, until in self._held.items() if until <= now]
        for c in over:
            del self._held[c]
        self.holds_version += len(over)
        self.next_release = min(self._held.values()) if self._held else None
        self._sync(over)

    def held(self) -> dict[str, float]:
        """``cluster -> end of its hold`` of every cluster held by a declared wait."""
        return dict(self._held)

    def pressed(self, cluster: str, holding: int) -> None:
        """A request was released to ``cluster``, which now holds ``holding``."""
        t = self._tracked.get(cluster)
        if t is not None and holding >= math.floor(t.limit):
            t.pressed = True

    def grow(self, now: float) -> None:
        """Window boundary: clusters quiet for ``HOLD_S`` and pressed since the last
        boundary regain some of their limit."""
        if not self._tracked:
            return
        changed = []
        for c, t in self._tracked.items():
            pressed, t.pressed = t.pressed, False
            if pressed and now - t.last_refusal >= HOLD_S:
                share = GROW_QUEUED if t.queued else GROW
                t.limit = min(float(self._max[c]), t.limit + max(1.0, share * t.limit))
                changed.append(c)
        if changed:
            self._sync(changed)

    def adopt(self, cluster: str, limit: float, refused_at: float) -> None:
        """A limit learned elsewhere (a snapshot, a fleet peer), its last refusal at
        ``refused_at``: ours becomes the lower of the two, its refusal the later.
        Unknown clusters and non-finite values are ignored; the limit is clamped to
        ``1..max``."""
        cap = self._max.get(cluster)
        if cap is None or not (math.isfinite(limit) and math.isfinite(refused_at)):
            return
        if self.quota(cluster, refused_at):
            return  # its 429s are a quota's here: the peer's limit is no limit either
        limit = max(1.0, min(float(cap), limit))
        cur = self._tracked.get(cluster)
        if cur is None:
            self._tracked[cluster] = _Limit(limit, refused_at)
        else:
            if limit < cur.limit:
                cur.queued = False  # the lower limit is the peer's 429s', and so its kind
            cur.limit = min(cur.limit, limit)
            cur.last_refusal = max(cur.last_refusal, refused_at)
        self._sync((cluster,))

    def learned(self) -> dict[str, tuple[float, float]]:
        """``cluster -> (limit, last refusal)`` of every cluster below its maximum by its
        429s (what peers and snapshots adopt; a queue's cap is read, not stated)."""
        return {c: (t.limit, t.last_refusal) for c, t in self._tracked.items() if not t.queued}

    def source(self, cluster: str) -> str | None:
        """What lowered ``cluster``'s limit: ``"429"``, ``"queueing"``, or None (untracked)."""
        t = self._tracked.get(cluster)
        return None if t is None else "queueing" if t.queued else "429"

    def limit(self, cluster: str) -> int:
        """The concurrency ``cluster`` is trusted with now (``max_concurrency`` if untracked)."""
        t = self._tracked.get(cluster)
        return self._max.get(cluster, 0) if t is None else math.floor(t.limit)

    def _sync(self, clusters: Iterable[str]) -> None:
        for c in clusters:
            t = self._tracked.get(c)
            cap = self._max.get(c, 0)
            if t is not None and t.limit >= cap:
                del self._tracked[c]
                t = None
            if t is not None and t.queued:
                self.caps[c] = math.floor(t.limit)
            else:
                self.caps.pop(c, None)
            if c in self._held:
                self.refused_slots[c] = cap
            elif t is None or t.queued:
                self.refused_slots.pop(c, None)
            else:
                self.refused_slots[c] = cap - math.floor(t.limit)
