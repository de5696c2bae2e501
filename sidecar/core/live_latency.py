"""The live latency ratio: what the in-flight counts say about latency *now*.

Latency statistics learn from completed requests, so a route that turns slow
is seen one request duration late at best, and later still through windows and
plan refreshes: a spike of ten seconds is over before the percentiles move.
The in-flight counts move at once. By Little's law a route taking the share
``s_i`` of the traffic, whose requests hold a slot for ``L_i``, has
``n_i = lambda s_i L_i`` requests in flight. So the count against what the
share and the known hold time imply says how much slower the route is *now*
than its statistics say::

    e_i = w_i L_i / sum_j w_j L_j       the expected share of the in-flight requests
    x_i = (1 + n_i) / (1 + N e_i)       N = sum_j n_j
    q_i = (min_j x_j / x_i) ** beta     beta = the class's ``weights.queue``

``w_i`` is the candidate's static weight (latency, attainment, cost and health
scores: the share the plan means to give it) and ``L_i`` the median end-to-end
time of the slice on the route (:func:`sidecar.core.pipeline.build_plan` looks
it up). In a steady state every ``x`` is about 1 and nothing changes: a route
that holds many requests because it is meant to get many, or because its
answers are long, is not penalized. A spike or a queue raises that route's
``x`` within one request's duration. The ``+ 1`` on both sides keeps one or two
requests from meaning much: at low rates ``N`` is a handful and ``x`` stays
near 1. A route that fails fast holds few requests, but its static share is
small too, so it gains nothing (comparing raw counts, as join-shortest-queue
does, rewards exactly that).

The counts are the route's across every slice, while ``w`` and ``L`` are this
slice's: the slice stands in for the route's mix. That is exact when the
routes carry the same mix and an approximation otherwise (a route that takes
most of the long answers of another slice holds more than this slice's ``L``
implies, and is scored as somewhat slower now).

Why the hold time: without it (``x_i = (1 + n_i) / (1 + N s_i)``) a route that
is faster holds fewer requests than its share, so ``x`` rewards it a second time
for the speed the latency score already rewarded; that concentrated the bursts
of the shipped ``burst_queueing`` onto one queue in some noise seeds (20-24 %
violations where the policy without it gives 12-16 %; docs/policy-lab.md, "The
live latency ratio").

``q`` is in ``(0, 1]``, 1 for the route with the lowest ``x``; ``beta = 0``
turns it off and leaves every weight as it was, bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence


def sum_in_order(values: list[float]) -> float:
    """``((0 + v_0) + v_1) + ...``: plain left-to-right addition, as CPython 3.11's
    ``sum`` does for floats (3.12 and later compensate the rounding). The request
    lane (:mod:`sidecar.core.request_lane`) must add exactly as the full stage it
    replays does, on any Python, so both sum through here. A list: compiled, its
    loop then runs over the list's items directly."""
    total = 0.0
    for v in values:
        total += v
    return total


def queue_scores(counts: Sequence[int], expected: Sequence[float], beta: float) -> list[float]:
    """``q_i`` for candidates with in-flight ``counts`` and ``expected`` in-flight weights
    ``w_i L_i`` (any scale); every 1.0 when ``beta`` is 0 or no weight is positive
    (module docstring)."""
    if not beta:
        return [1.0] * len(counts)
    total_n = sum(counts)  # ints: exact in any order
    total_w = sum_in_order(list(expected))
    if total_w <= 0.0:
        return [1.0] * len(counts)
    scale = total_n / total_w
    xs = [(1.0 + n) / (1.0 + scale * w) for n, w in zip(counts, expected, strict=True)]
    best = min(xs)
    return [(best / x) ** beta for x in xs]
