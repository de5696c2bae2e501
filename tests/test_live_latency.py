"""The live latency ratio (sidecar.core.live_latency): properties of the queue score."""

from __future__ import annotations

import functools
import operator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.live_latency import queue_scores, sum_in_order

counts_st = st.lists(st.integers(0, 200), min_size=1, max_size=6)
share = st.floats(1e-6, 1e3, allow_nan=False, allow_infinity=False)
beta_st = st.floats(0.0, 12.0, allow_nan=False)


@given(counts=counts_st, data=st.data(), beta=beta_st)
def test_scores_are_bounded_and_the_least_loaded_route_keeps_one(
    counts: list[int], data: st.DataObject, beta: float
) -> None:
    shares = data.draw(st.lists(share, min_size=len(counts), max_size=len(counts)))
    qs = queue_scores(counts, shares, beta)
    assert len(qs) == len(counts)
    assert all(0.0 < q <= 1.0 for q in qs)
    assert max(qs) == 1.0


@given(counts=counts_st, data=st.data())
def test_beta_zero_changes_nothing(counts: list[int], data: st.DataObject) -> None:
    shares = data.draw(st.lists(share, min_size=len(counts), max_size=len(counts)))
    assert queue_scores(counts, shares, 0.0) == [1.0] * len(counts)


@given(counts=st.lists(st.integers(0, 100), min_size=2, max_size=5), data=st.data(),
       beta=st.floats(0.1, 12.0), extra=st.integers(1, 50))
def test_more_requests_in_flight_never_raise_a_routes_score(
    counts: list[int], data: st.DataObject, beta: float, extra: int
) -> None:
    """Monotone in evidence: a route that holds more (the others unchanged) is never
    scored better for it."""
    shares = data.draw(st.lists(share, min_size=len(counts), max_size=len(counts)))
    i = data.draw(st.integers(0, len(counts) - 1))
    more = list(counts)
    more[i] += extra
    before = queue_scores(counts, shares, beta)[i]
    assert queue_scores(more, shares, beta)[i] <= before * (1 + 1e-12)


@given(shares=st.lists(st.integers(1, 20), min_size=1, max_size=6), per=st.integers(0, 20),
       beta=beta_st)
def test_counts_as_expected_are_neutral(
    shares: list[int], per: int, beta: float
) -> None:
    """Routes that hold what their expected weight (share x hold time) implies keep
    their weights: a route meant to get more traffic, or with longer answers, is not
    penalized for holding more."""
    counts = [per * s for s in shares]
    assert queue_scores(counts, [float(s) for s in shares], beta) == pytest.approx(
        [1.0] * len(shares))


@pytest.mark.parametrize(("counts", "shares", "slow_now"), [
    ([12, 3], [1.0, 1.0], 0),  # equal shares: the one holding four times as many
    ([30, 2, 2], [0.6, 0.2, 0.2], 0),  # the favourite holding 30 where ~20 is its share
    ([2, 9, 2], [0.6, 0.2, 0.2], 1),  # a minor route piling up (a spike)
])
def test_the_route_slower_now_scores_lowest(
    counts: list[int], shares: list[float], slow_now: int
) -> None:
    qs = queue_scores(counts, shares, 2.0)
    assert min(qs) == qs[slow_now] < 0.8


def test_a_route_failing_fast_gains_nothing_from_its_empty_slots() -> None:
    """Fast errors free slots; join-shortest-queue would reward them. With its small
    static share the failing route's few in-flight requests are what it should hold."""
    qs = queue_scores([19, 1], [0.95, 0.05], 2.0)
    assert qs[0] > 0.9


@given(st.lists(st.floats(min_value=0.0, max_value=1e12, allow_nan=False), max_size=12))
def test_sum_in_order_adds_left_to_right(values: list[float]) -> None:
    # Bit for bit the sequential sum, whatever the Python's own sum() does (3.12+
    # compensates): the request lane and the full stage must add alike.
    assert sum_in_order(values) == functools.reduce(operator.add, values, 0.0)
