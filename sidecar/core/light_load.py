"""Outcomes under light load: what a route does when nothing queues on it.

The exploration floor keeps every surviving route at ``explore_share`` of the
best weight so its statistics stay fresh. Each request the floor sends costs
the route's excess violation share over the best route's, and on a route that
is slow *by itself* (a drift, a regression) that cost is paid for as long as
the evidence lasts. On a route whose violations came from *load* (a burst
queued on it) the floor is what refreshes its evidence once the load is gone;
cutting it there piles the next burst onto the others. The window's evidence
cannot tell the two apart, so this book keeps, per (cluster, slice), the
latest outcomes of requests served under light load both when sent and when
finished::

    light   in flight / max_concurrency < LIGHT at send and at finish
            (peers' counts included in fleet mode; the request itself excluded)
    ring    the latest RING such outcomes (violated: not ok, or over the class budget)
    w_i     = 0.5 ** ((now - t_i) / HALF_LIFE_S)
    x, n    = sum_i w_i [violated_i],  sum_i w_i

and :func:`~sidecar.core.scorers.floor_shares` turns them into each candidate's
share of the floor (``a`` the step's allowed violation share)::

    v   = (x + PRIOR a) / (n + PRIOR)              no light evidence: v = a
    c   = FLOOR_PRICE a                             what the floor may cost, per request
    f   = min(1, c / (v - min_c v))                 (1 for the best, or within c of it)

so what the floor costs a route is at most ``explore_share x FLOOR_PRICE x a``
of the best weight in excess violations. For a p95 class (``a`` = 0.05) beside
a route that met its budget on its last ten, a route that missed it on 7 of its
last 10 light-load requests keeps ~2.7 % of the floor, one that missed once
~19 %, and one whose light outcomes have all aged away (``v`` back at the prior
``a``) ~37 %. A route never seen under light load keeps the whole floor: a new
route must be explored. ``FLOOR_PRICE`` was 1 until the generated scenarios
showed the price paid where it bought nothing: on the held-out family seed 41
(pooled over four noise draws) 1/4 gave a 2.5 % lower mean violation rate and
no change on the shipped suite, where a burst's queue, not a slow route, is
what the floor must see (docs/policy-lab.md, "A cheaper exploration floor").

Counting only the load when sent is not enough: requests sent at a burst's
start are served under its load. The ring's cap bounds how long one episode
weighs (a spike's violations age out as ten fresh answers arrive) and the
half-life lets a route nobody sends to earn part of its floor back with time.

Only routes the health machine has not moved (``healthy``, ``watching``) lose
part of the floor. A moved route's traffic is the health machine's: it must
see evidence to escalate or restore it, and a cut floor starved it (a degraded
route sat degraded, judged on a sample a minute).

**Fleet mode** keeps the whole floor. Replicas share one health verdict built
from everyone's evidence, while this book is each replica's own. When a route
is slow only on one replica's path, that replica's ring cuts its floor and its
slow samples leave the shared evidence; the others' fast samples then speak for
the route, and the fleet never judges it (measured in
``tests/test_integration_fleet.py``: the route stayed ``healthy``).

**The record.** The ring answers "has this route been missing lately", ten
outcomes deep; too few to tell a route missing on 1 % of its requests from one
that never misses, which is what the miss-ratio score
(:class:`~sidecar.core.scorers.MissRatio`) compares. So the book also keeps,
per (cluster, slice), every light outcome as a decayed count::

    x, n = sum_i w_i [violated_i], sum_i w_i     w_i = 0.5 ** ((now - t_i) / RECORD_HALF_LIFE_S)
    v    = (x + PRIOR a) / (n + PRIOR)           as for the floor

with a half-life of one minute: some hundreds of outcomes at a few requests a
second, and an incident's misses weigh a quarter two minutes later. Only
light outcomes, because under load a route's misses are its queue's, which the
load and queue scores already answer per request: compared as ratios they
moved whole bursts (the window's shares in their place raised the shipped
suite's violations by 3 %, `burst_queueing` and `capacity_fallback` most). A
two-minute half-life told small shares apart better on generated scenarios but
judged recovered routes on their incidents for longer: the suite's
`capacity_fallback`, `outage_recovery` and `retry_storm` rose 7-9 %
(docs/policy-lab.md, "Misses as ratios"). The score compares only routes with
``RECORD_MIN`` light outcomes or more: an empty record is no evidence, and its
prior (the allowed share) would cut a route that is seldom light -- the fastest
route of a slice, busy with the rest of the traffic -- to a tenth of the best
one's weight. A route's record is kept when the health machine restores it: its
incident's misses then weigh on it for the minutes they take to age out, once
it is back at ``healthy``. Started over, the record let a restored route escape
the comparison until it had ``RECORD_MIN`` light outcomes, and a flapping route
was back at full weight before its next incident (the suite's ``flapping`` +8 %:
docs/policy-lab.md, "Which rule costs the suite"). A 429 is not noted in
the record: it is the provider's backpressure, which :mod:`sidecar.core.pushback`
answers, not the route's tail.
The router keeps records only while some class has a ``miss_ratio_exponent``
(:meth:`LightOutcomes.keep_records`; 1 by default): nothing else reads them.

Outcomes without a send-time load (native mode, where Envoy picks the route;
unit tests) are not counted: a route without light evidence keeps the whole
floor. Pure: times come from the caller.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from typing import Final

from sidecar.core.types import SliceKey

LIGHT: Final = 0.5  # below this share of max_concurrency in flight, a route is not queueing
RING: Final = 10  # light outcomes kept per (cluster, slice)
HALF_LIFE_S: Final = 60.0  # a light outcome's weight halves every minute
PRIOR: Final = 5.0  # pseudo-outcomes violating at exactly the allowed share
# The floor may cost a route this share of the allowed violation share per request
# (module docstring). At 1 every route within ``a`` of the best kept its whole floor:
# three such routes beside a good one held ~13 % of the traffic by the floor alone.
FLOOR_PRICE: Final = 0.25
# (cluster, slice) pairs kept before the book starts over: at least this many, and as many
# as the config allows (LightOutcomes.size_for). At 4,096 alone a config with more routes
# than that emptied the book again and again, and the floor and the miss-ratio score
# lost their evidence (1,200 slices on 4 clusters each: 4,800 routes).
MAX_ROUTES: Final = 4096
# A restricted route's probes are its only way back (its slice sends it nothing else),
# so their price never cuts them below this share of probe_share: unpriced, a route
# missing a quarter of its requests took 5 % of the slice as probes; priced down to
# f (~2 %), one that had recovered waited minutes for its misses to age out.
PROBE_PRICE_MIN: Final = 0.25

# The record's half-life: long enough to tell 1 % of misses from none at a few requests
# a second, short enough that a recovered route is not judged on its incident for long
# (120 s did better on generated scenarios and worse on the shipped suite's recoveries).
RECORD_HALF_LIFE_S: Final = 60.0
RECORD_MIN: Final = 10.0  # light outcomes (decayed) a record needs before the miss ratio reads it

_LN_HALF_PER_S: Final = -0.6931471805599453 / HALF_LIFE_S
_LN_RECORD_PER_S: Final = -0.6931471805599453 / RECORD_HALF_LIFE_S


class LightOutcomes:
    """The latest light-load outcomes per (cluster, slice) (module docstring)."""

    __slots__ = ("_keeps_records", "_records", "_rings", "max_routes")

    def __init__(self) -> None:
        self._rings: dict[tuple[str, SliceKey], deque[tuple[float, bool]]] = {}
        # The record: [x, n, time of the last note] (module docstring, "The record");
        # kept for routes with a ring, and only while someone reads it (keep_records).
        self._records: dict[tuple[str, SliceKey], list[float]] = {}
        self._keeps_records = True
        self.max_routes = MAX_ROUTES

    def size_for(self, routes: int) -> None:
        """Keep up to ``routes`` (cluster, slice) pairs (never fewer than ``MAX_ROUTES``):
        the most the config can route, so the book never starts over while in use."""
        self.max_routes = max(MAX_ROUTES, routes)

    def keep_records(self, on: bool) -> None:
        """Keep the records or not: only the miss-ratio score reads them, so the router
        keeps them while some class has a ``miss_ratio_exponent`` (a record, one
        ``exp`` per light outcome, is then not paid for on every response for nothing).
        Turned off, they are dropped; turned on again, they start empty."""
        self._keeps_records = on
        if not on:
            self._records.clear()

    def note(self, cluster: str, slice: SliceKey, violated: bool, now: float,
             record: bool = True) -> None:
        """One outcome of a request served under light load, finished at ``now``
        (``record``: in the record too; the router keeps 429s out of it)."""
        key = (cluster, slice)
        ring = self._rings.get(key)
        if ring is None:
            if len(self._rings) >= self.max_routes:
                self._rings.clear()
                self._records.clear()
            ring = self._rings[key] = deque(maxlen=RING)
        ring.append((now, violated))
        if not (record and self._keeps_records):
            return
        rec = self._records.get(key)
        if rec is None:
            rec = self._records[key] = [0.0, 0.0, now]
        w = _record_decay(rec, now)
        rec[0] = rec[0] * w + (1.0 if violated else 0.0)
        rec[1] = rec[1] * w + 1.0
        rec[2] = max(rec[2], now)

    def record(self, cluster: str, slice: SliceKey, now: float) -> tuple[float, float]:
        """``(x, n)`` of the record: every light outcome, decayed with a half-life of
        ``RECORD_HALF_LIFE_S`` (module docstring); (0, 0) if none."""
        rec = self._records.get((cluster, slice))
        if rec is None:
            return 0.0, 0.0
        w = _record_decay(rec, now)
        return rec[0] * w, rec[1] * w

    def counts(self, cluster: str, slice: SliceKey, now: float) -> tuple[float, float]:
        """``(x, n)``: decayed violations and outcomes (module docstring); (0, 0) if none."""
        ring = self._rings.get((cluster, slice))
        if not ring:
            return 0.0, 0.0
        x = n = 0.0
        for t, violated in ring:
            w = math.exp((now - t) * _LN_HALF_PER_S) if now > t else 1.0
            n += w
            if violated:
                x += w
        return x, n


def _record_decay(rec: list[float], now: float) -> float:
    """How much of a record last noted at ``rec[2]`` still weighs at ``now``."""
    return math.exp((now - rec[2]) * _LN_RECORD_PER_S) if now > rec[2] else 1.0


def violation_share(x: float, n: float, a: float) -> float:
    """``v``: the decayed light-load violations ``x`` of ``n``, with the prior (docstring)."""
    return (x + PRIOR * a) / (n + PRIOR)


def floor_share(v: float, best: float, a: float) -> float:
    """``f``: the share of the exploration floor a route with ``v`` keeps (docstring)."""
    excess = v - best
    price = FLOOR_PRICE * a
    return price / excess if excess > price else 1.0


def route_price(book: LightOutcomes, clusters: Iterable[str], cluster: str, slice: SliceKey,
                a: float, now: float) -> float:
    """``max(PROBE_PRICE_MIN, f)`` of ``cluster`` against the best of ``clusters`` (1
    without light evidence): what a restricted route's probe share keeps
    (:func:`~sidecar.core.plan_cache.probes`)."""
    x, n = book.counts(cluster, slice, now)
    if n <= 0.0:
        return 1.0
    best = min(violation_share(*book.counts(c, slice, now), a) for c in clusters)
    return max(PROBE_PRICE_MIN, floor_share(violation_share(x, n, a), best, a))


def load_of(inflight: int, max_concurrency: int) -> float:
    """A route's load: requests in flight (besides the one asking) over its limit."""
    return inflight / max(max_concurrency, 1)
