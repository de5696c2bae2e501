"""The worse routes pool their weight (sidecar.core.pooling): properties of the formula."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.config import ClusterConfig
from sidecar.core.pooling import POOL, pool_worse
from sidecar.core.selection import FLOOR_SHARE, Candidate, HealthView


def _cands(weights: list[float], health: list[float] | None = None) -> list[Candidate]:
    out = []
    for i, w in enumerate(weights):
        h = 1.0 if health is None else health[i]
        c = Candidate(ClusterConfig(f"c{i}", f"127.0.0.1:{8001 + i}", {"m": "m"}),
                      HealthView("healthy", h, False, False))
        c.base = w
        out.append(c)
    return out


_G = 0.1 / (0.1 + 0.9 * math.log(1 / 0.9))  # g of [1, 0.9, 0.1]: 0.5133


@pytest.mark.parametrize(
    ("weights", "expected"),
    [
        # two candidates: the pairwise comparison the scores were made for
        ([1.0, 0.1], [1.0, 0.1]),
        # alike routes (all within the best's weight): untouched
        ([1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]),
        # one clearly worse route beside the best only: nothing to pool with
        ([1.0, 1.0, 0.1], [1.0, 1.0, 0.1]),
        # a route a little worse than the best is a small member (m = ln(1 / 0.9))
        ([1.0, 0.9, 0.1], [1.0, 0.9 * (1 - math.log(1 / 0.9) * (1 - _G)), 0.1 * _G]),
        # nine equal clearly worse routes hold what one of them did
        ([1.0] + [0.1] * 9, [1.0] + [0.1 / 9] * 9),
        # two clearly worse: the heavier keeps a share g = 0.2 / 0.3 of its weight
        ([1.0, 0.2, 0.1], [1.0, 0.2 * 2 / 3, 0.1 * 2 / 3]),
    ],
)
def test_pooled_weights(weights: list[float], expected: list[float]) -> None:
    cands = _cands(weights)
    pool_worse(cands)
    assert [c.base for c in cands] == pytest.approx(expected)


def test_partial_membership_between_the_best_and_one_over_e() -> None:
    """A route at top / sqrt(e) is half a member: it keeps half its weight plus half of
    its pooled share."""
    w = [1.0, math.exp(-0.5), 0.1]
    cands = _cands(w)
    pool_worse(cands)
    g = max(0.5 * w[1], 0.1) / (0.5 * w[1] + 0.1)
    assert cands[1].base == pytest.approx(w[1] * (1 - 0.5 * (1 - g)))
    assert cands[2].base == pytest.approx(0.1 * g)
    assert cands[0].base == 1.0 and POOL not in cands[0].scores


def test_health_weight_counts_and_the_floor_share_is_left_alone() -> None:
    cands = _cands([1.0, 1.0, 1.0], health=[1.0, 0.05, 0.05])
    cands[2].scores[FLOOR_SHARE] = 0.5
    pool_worse(cands)
    assert [c.base for c in cands] == pytest.approx([1.0, 0.5, 0.5])
    assert FLOOR_SHARE not in cands[1].scores and cands[2].scores[FLOOR_SHARE] == 0.5


weights_st = st.lists(st.floats(min_value=1e-6, max_value=1.0), min_size=1, max_size=12)


@given(weights_st)
def test_best_keeps_its_weight_and_no_route_gains(weights: list[float]) -> None:
    cands = _cands(weights)
    pool_worse(cands)
    top = max(weights)
    for c, w in zip(cands, weights, strict=True):
        assert 0.0 < c.base <= w
        if w == top:
            assert c.base == w


@given(weights_st)
def test_the_pool_holds_what_its_heaviest_member_held(weights: list[float]) -> None:
    """The members' pooled parts (``m_i s_i`` before, ``m_i s_i g`` after) add up to the
    largest ``m_i s_i``: how many worse routes there are no longer adds up."""
    cands = _cands(weights)
    top = max(weights)
    member = [min(1.0, math.log(top / w)) for w in weights]
    pool_worse(cands)
    pooled = sum(c.base - (1 - m) * w for c, m, w in zip(cands, member, weights, strict=True))
    assert pooled == pytest.approx(max(m * w for m, w in zip(member, weights, strict=True)),
                                   rel=1e-9, abs=1e-12)


@given(weights_st, st.floats(min_value=0.01, max_value=100.0))
def test_scale_free(weights: list[float], k: float) -> None:
    """Only ratios to the best matter (the static stage's scores are relative)."""
    a, b = _cands(weights), _cands([w * k for w in weights])
    pool_worse(a)
    pool_worse(b)
    assert [x.base * k for x in a] == pytest.approx([y.base for y in b], rel=1e-9)
