"""Queue signs: capacity a provider lost without saying so (pure).

A provider that loses capacity does not always answer 429. A self-hosted server
that lost replicas, or a deployment whose batch got smaller, keeps accepting
requests and queues them: the requests beyond its real capacity wait for a
slot, and their first token comes late. ``max_concurrency`` still says there is
room, so every rule that reads load against it -- light load, the load score,
the capacity filter -- sees a route far from full at shares that break it. The
health machine restricts the route on its misses and restores it once its
samples at a small share are clean; its share grows, and it breaks again (lab
case ``capacity_cliff-s7-009``: a provider left with 39 of its 205 slots was
restored at 4 % of the traffic, took 17 % a minute later, and missed its budget
on about 120 requests in one window).

What tells lost capacity from a slow route is *where* the misses fall: on a
route that queues, the requests sent while it held few others meet their budget
and the ones sent while it held many miss it; on a slow route both miss. This
book keeps, per (cluster, class), the latest outcomes with the number of
requests the route really held when each was sent, and at each window boundary
looks for the count at which the outcomes turn::

    ring      (t_i, k_i, y_i, tpot_i): sent at t_i, within the last SPAN_S seconds
              (at most RING per cluster and class); k_i the requests in flight there
              when it was sent (ours, and the peers' in fleet mode); y_i = 1 if it
              missed its class budget or failed; tpot_i its TPOT, if measured
    episode   the outcomes sent at or after the first miss of the ring
    split k   B = {i: k_i < k}, A = {i: k_i >= k} over the episode
              p_A = x_A / n_A, p_B = x_B / n_B, p = (x_A + x_B) / (n_A + n_B)
              G(k) = n_A H(p_A || p) + n_B H(p_B || p)     H: binary KL divergence
    sign      the split of largest G among those with
              n_A >= MIN_ABOVE, n_B >= MIN_BELOW, p_A >= HIGH, p_B <= LOW, G >= G_MIN,
              and whose misses decoded at the usual pace ("The decode pace");
              the route serves up to k* = max_{i in B} k_i + 1

``G`` is the log-likelihood ratio of "the miss rate changes at k" against "it
is the same everywhere" (a likelihood-ratio test of two binomials): under one
rate, ``2G`` is about chi-square with one degree of freedom, so ``G_MIN`` = 9
nats is a chance of about 2e-5 per split, and stays small over the few hundred
(strongly correlated) splits tried per ring. ``HIGH`` and ``LOW`` keep the test
to what a queue looks like: most of the requests above the count miss, almost
none below it. ``k*`` is the count just above the highest one served below the
split, not the lowest one that missed: where the counts have a gap (a share
cut from half the traffic to a trickle), the capacity somewhere in it is
unknown, and the count that was served is what is known. Each class is judged
on its own: a batch class's generous budget is met at any count and would
otherwise fill ``B`` with successes that say nothing about the interactive
misses.

**Why from the first miss on.** When a route turns slow for every request (a
spike, a drift), it holds each one longer, so by Little's law its in-flight
count rises with the slowdown: the requests sent during the event see higher
counts and miss, and the ones sent before it saw lower counts and met their
budget. Compared with those, a slow spell reads as a queue. A first version
that compared every outcome of the span did so in the lab: in ``spike-s7-002`` a
10x spike on the route with three quarters of the traffic taught it a limit of 67
where it normally held 64-80; counted as refused slots, that limit kept the
route at 2 % of the traffic for three minutes, and 401 -> 787 violations.
From the first miss on, a slow spell misses at every count, and no split has
``p_B <= LOW``. A queue shows there too: the misses at high counts, and the
requests served once the route held fewer -- its share cut by the health
machine or the scores -- while the capacity was still short.

**The decode pace.** A slow spell that ends within the span still has that shape:
misses while the route held many, then successes at the smaller share it was
left with (``spike-s97-013``: a 13 s spike on the route with 70 % of the traffic
capped it at 59 where it had held ~200, and when the other route spiked a minute
later it could not take the traffic: 372 -> 771 violations). What differs is how
the misses decoded. A request that waited for a slot decodes at the usual pace
once it has one (a server's queue delays prefill, not the tokens after it); a
route that turned slow decodes slowly too. So a sign also needs::

    median TPOT of the misses at or above k*  <=  TPOT_RATIO x  median TPOT of
    the successes below k*,   each side with at least MIN_TPOT TPOTs

In the lab the two kinds fall far apart: 0.83-1.12 for the capacity cliffs that
gave a sign, 2.4-3.6 for the spikes. ``TPOT_RATIO`` = 1.5 leaves room for a
full batch decoding somewhat slower than a light one. Misses without a TPOT --
errors, timeouts before the first token, and every response not streamed (its
tokens come at once, so no pace is measured) -- cannot be told apart, and give
no sign.

A sign hands ``k*`` to :meth:`sidecar.core.pushback.PushBack.queued`, which
keeps it as the cluster's *cap*: the capacity rules see the cluster full once
it holds ``k*`` requests, and as loaded as it is below that (unlike a 429's
limit, whose refused slots count as occupied: a limit the provider never stated
must not push traffic off a route that is short of it). It grows back by
``GROW_QUEUED`` per window (a slot at least) once no sign has lowered it for
``HOLD_S`` while traffic presses on it, up to ``max_concurrency``; the next
queue cuts it again.

Pure: times and counts come from the caller; nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from statistics import median
from typing import Final

SPAN_S: Final = 60.0  # outcomes sent within this long before the judgement count
RING: Final = 1024  # outcomes kept per (cluster, class) (the oldest drop first)
MIN_ABOVE: Final = 8  # outcomes at or above the count, at least
MIN_BELOW: Final = 16  # outcomes below the count, at least
HIGH: Final = 0.3  # miss rate at or above the count, at least
LOW: Final = 0.05  # miss rate below the count, at most
G_MIN: Final = 9.0  # log-likelihood ratio of the split, nats
TPOT_RATIO: Final = 1.5  # the misses' median TPOT over the successes', at most
MIN_TPOT: Final = 3  # TPOTs on each side before the decode pace is compared


def _kl(p: float, q: float) -> float:
    """Binary Kullback-Leibler divergence ``H(p || q)`` in nats (``0 < q < 1``)."""
    d = 0.0
    if p > 0.0:
        d += p * math.log(p / q)
    if p < 1.0:
        d += (1.0 - p) * math.log((1.0 - p) / (1.0 - q))
    return d


def split_gain(x_a: int, n_a: int, x_b: int, n_b: int) -> float:
    """``G``: the log-likelihood ratio of two miss rates (above and below) against one."""
    n = n_a + n_b
    x = x_a + x_b
    if n == 0 or x == 0 or x == n:
        return 0.0
    p = x / n
    return n_a * _kl(x_a / n_a, p) + n_b * _kl(x_b / n_b, p)


def find_split(outcomes: list[tuple[int, bool]]) -> int | None:
    """The in-flight count ``k*`` where the outcomes turn (module docstring), or None.

    ``outcomes``: ``(k, missed)`` pairs, in any order (the episode's: see
    :func:`episode`)."""
    n = len(outcomes)
    if n < MIN_ABOVE + MIN_BELOW:
        return None
    ordered = sorted(outcomes)
    total = sum(1 for _, y in ordered if y)
    if total < math.ceil(HIGH * MIN_ABOVE):
        return None
    best: int | None = None
    best_g = G_MIN
    x_b = 0
    for i in range(1, n):
        if ordered[i - 1][1]:
            x_b += 1
        k = ordered[i][0]
        if k == ordered[i - 1][0]:
            continue  # split only between distinct counts
        n_b, n_a = i, n - i
        if n_a < MIN_ABOVE:
            break
        if n_b < MIN_BELOW:
            continue
        x_a = total - x_b
        if x_a < HIGH * n_a or x_b > LOW * n_b:
            continue
        g = split_gain(x_a, n_a, x_b, n_b)
        if g >= best_g:
            # the count above the highest one served below it: where a gap in the
            # counts leaves the capacity unknown, the count known to be served
            best, best_g = ordered[i - 1][0] + 1, g
    return best


Row = tuple[float, int, bool, float | None]  # (sent_at, k, missed, tpot_s)


def episode(ring: Sequence[Row]) -> list[Row]:
    """The outcomes among ``ring`` sent at or after the first miss: the requests sent
    since the trouble began (module docstring, "Why from the first miss on")."""
    first = min((r[0] for r in ring if r[2]), default=None)
    if first is None:
        return []
    return [r for r in ring if r[0] >= first]


def decode_ratio(rows: Sequence[Row], k: int) -> float | None:
    """Median TPOT of the misses at ``k`` or above over that of the requests served
    below it; None while either side has fewer than ``MIN_TPOT`` TPOTs (misses that
    failed or timed out before a token have none)."""
    above = [r[3] for r in rows if r[1] >= k and r[2] and r[3] is not None]
    below = [r[3] for r in rows if r[1] < k and not r[2] and r[3] is not None]
    if len(above) < MIN_TPOT or len(below) < MIN_TPOT:
        return None
    base = median(below)
    return median(above) / base if base > 0.0 else None


def queue_sign(ring: Sequence[Row]) -> int | None:
    """``k*`` if ``ring``'s episode turns at an in-flight count and its misses decoded
    as fast as its successes (module docstring), else None."""
    rows = episode(ring)
    k = find_split([(r[1], r[2]) for r in rows])
    if k is None:
        return None
    ratio = decode_ratio(rows, k)
    return k if ratio is not None and ratio <= TPOT_RATIO else None


class QueueSigns:
    """Per cluster, the latest outcomes by in-flight count at send (module docstring)."""

    def __init__(self) -> None:
        # (cluster, class) -> its latest (sent_at, k, missed, tpot_s)
        self._ring: dict[tuple[str, str], deque[Row]] = {}
        self._fresh: set[tuple[str, str]] = set()  # with outcomes since the last judgement
        self._missed_at: dict[tuple[str, str], float] = {}  # latest send time of a miss

    def note(self, cluster: str, klass: str, sent_at: float, held: int, missed: bool,
             tpot_s: float | None = None) -> None:
        """A request of ``klass`` sent at ``sent_at`` while ``cluster`` held ``held``
        others ended (``missed``: its class budget; ``tpot_s``: its decode pace, if
        measured)."""
        key = (cluster, klass)
        ring = self._ring.get(key)
        if ring is None:
            ring = self._ring[key] = deque(maxlen=RING)
        ring.append((sent_at, max(held, 0), missed, tpot_s))
        self._fresh.add(key)
        if missed and sent_at > self._missed_at.get(key, -math.inf):
            self._missed_at[key] = sent_at

    def judge(self, now: float) -> dict[str, int]:
        """Window boundary: ``cluster -> k*`` of every cluster where some class's outcomes
        of the last ``SPAN_S`` seconds turn at an in-flight count (the lowest such count).
        Older outcomes are dropped."""
        signs: dict[str, int] = {}
        start = now - SPAN_S
        for key in sorted(self._fresh):
            if self._missed_at.get(key, -math.inf) < start:
                continue  # no miss sent within the span: no episode (the common case)
            ring = self._ring[key]
            # by send time: the ring is in order of completion, and a long request
            # sent before the span may end after newer ones
            recent = [e for e in ring if e[0] >= start]
            if len(recent) < len(ring):
                ring.clear()
                ring.extend(recent)
            k = queue_sign(recent)
            if k is not None:
                cluster = key[0]
                signs[cluster] = min(k, signs.get(cluster, k))
        self._fresh.clear()
        return signs

    def forget(self, keep: set[str]) -> None:
        """Drop the clusters not in ``keep`` (a reload removed them)."""
        for key in [key for key in self._ring if key[0] not in keep]:
            del self._ring[key]
            self._missed_at.pop(key, None)
        self._fresh = {key for key in self._fresh if key[0] in keep}
