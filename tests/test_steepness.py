"""The steepness curves (sidecar.core.steepness): bounded, monotone in evidence, the
default curve unchanged."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.config import ClassConfig
from sidecar.core.steepness import GENTLE, latency_exponent, latency_score, load_factor

DEFAULT = ClassConfig("interactive")


@given(st.floats(2.0, 12.0), st.integers(0, 10**6), st.integers(0, 10**6))
def test_exponent_is_bounded_and_grows_with_samples(top: float, n: int, extra: int) -> None:
    k = dataclasses.replace(DEFAULT, latency_exponent=top)
    e, e_more = latency_exponent(k, n), latency_exponent(k, n + extra)
    assert GENTLE <= e <= e_more <= top
    assert latency_exponent(k, 0) == GENTLE  # no samples: no steeper than the default


@given(st.integers(0, 10**6))
def test_default_class_keeps_the_gentle_curve(n: int) -> None:
    assert latency_exponent(DEFAULT, n) == GENTLE
    assert load_factor(DEFAULT) == 1.0


@given(st.floats(2.0, 12.0), st.integers(0, 10**4),
       st.floats(1.0, 100.0), st.floats(0.0, 10.0))
def test_latency_score_never_rewards_a_slower_route(top: float, n: int, r: float,
                                                    dr: float) -> None:
    k = dataclasses.replace(DEFAULT, latency_exponent=top)
    assert 0.0 < latency_score(k, r + dr, n) <= latency_score(k, r, n) <= 1.0
