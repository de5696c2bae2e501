"""The estimators of sidecar.core.evidence: blended slices, P(success within budget),
the binomial test -- properties (monotone in evidence, bounded) and the trap case."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core.config import StatsConfig
from sidecar.core.evidence import binom_sf, blend, significant, with_prior
from sidecar.core.frozen import fast_init
from sidecar.core.stats import StatsStore
from sidecar.core.types import ANY, Observation, SliceKey

FAST = settings(max_examples=60, deadline=None)
CFG = StatsConfig(subwindow_s=10.0, subwindows=30, min_samples=20, prior_samples=10.0)
LONG = SliceKey("m", "interactive", "long", True)
SHORT = SliceKey("m", "interactive", "short", True)
BUDGET = 1.0

# outcome stream items: ("ok", seconds) | ("error", None) | ("timeout", None)
outcomes = st.lists(
    st.one_of(st.tuples(st.just("ok"), st.floats(0.01, 5.0)),
              st.tuples(st.sampled_from(["error", "timeout"]), st.none())),
    max_size=60)


def _store(stream: list[tuple[str, float | None]], slice: SliceKey = SHORT) -> StatsStore:
    store = StatsStore(CFG)
    for i, (outcome, v) in enumerate(stream):
        store.observe(Observation("a", slice, outcome, ttft_s=v), 1.0 + i * 0.01)  # type: ignore[arg-type]
    return store


def _p(store: StatsStore, slice: SliceKey = SHORT) -> float:
    ev = store.evidence("a", slice, "ttft", 2.0, 0.0)
    p = None if ev is None else ev.p_within(BUDGET)
    w = 0.0 if ev is None else ev.evidence_weight
    return with_prior(p, w, CFG.prior_samples, 0.95)


@FAST
@given(outcomes, st.floats(0.01, 0.99))
def test_p_within_budget_is_bounded_and_monotone_in_evidence(
    stream: list[tuple[str, float | None]], fast: float
) -> None:
    base = _p(_store(stream))
    assert 0.0 <= base <= 1.0
    better = _p(_store([*stream, ("ok", fast * BUDGET)]))
    worse = _p(_store([*stream, ("error", None)]))
    slow = _p(_store([*stream, ("ok", BUDGET * 3)]))
    assert better >= base - 1e-9 >= worse - 1e-9
    assert slow <= base + 1e-9


# ... with cancels mixed in: ("first", seconds) a cancel whose first token was measured,
# judged within budget (sidecar.core.judging); ("cancel", None) one that says nothing.
mixed = st.lists(
    st.one_of(st.tuples(st.sampled_from(["ok", "first"]), st.floats(0.01, 5.0)),
              st.tuples(st.sampled_from(["error", "timeout", "cancel"]), st.none())),
    max_size=60)


def _obs(outcome: str, v: float | None, slice: SliceKey = SHORT) -> Observation:
    if outcome == "first":
        return Observation("a", slice, "cancel", ttft_s=v, ttft_measured=True)
    return Observation("a", slice, outcome, ttft_s=v, e2e_s=v)  # type: ignore[arg-type]


def _mixed(stream: list[tuple[str, float | None]], spread: float = 0.01) -> StatsStore:
    store = StatsStore(CFG)
    for i, (outcome, v) in enumerate(stream):
        store.observe(_obs(outcome, v), 1.0 + i * spread)
    return store


@FAST
@given(mixed, st.floats(0.01, 0.99))
def test_p_within_budget_stays_bounded_and_monotone_with_cancels(
    stream: list[tuple[str, float | None]], fast: float
) -> None:
    base = _p(_mixed(stream))
    assert 0.0 <= base <= 1.0
    met = _p(_mixed([*stream, ("first", fast * BUDGET)]))
    said_nothing = _p(_mixed([*stream, ("cancel", None)]))
    worse = _p(_mixed([*stream, ("timeout", None)]))
    assert met >= base - 1e-9 >= worse - 1e-9
    assert said_nothing == pytest.approx(base)


@FAST
@given(mixed, st.sampled_from([0.01, 3.0]))
def test_a_measured_first_token_is_the_ttft_evidence_of_an_answer(
    stream: list[tuple[str, float | None]], spread: float
) -> None:
    """For TTFT, a cancel whose first token was measured weighs exactly as an ok answer
    with that TTFT and no end: same samples, same outcome weights, same aging
    (``spread`` 3 s puts the stream over several sub-windows). For e2e it is no
    outcome at all, as a cancel that says nothing (its end is unknown)."""
    now = 2.0 + len(stream) * spread
    mixed_store = _mixed(stream, spread)
    for metric, stand_in in (("ttft", "ok_ttft"), ("e2e", "cancel")):
        store = StatsStore(CFG)
        for i, (outcome, v) in enumerate(stream):
            obs = (_obs(outcome, v) if outcome != "first"
                   else Observation("a", SHORT, "ok", ttft_s=v) if stand_in == "ok_ttft"
                   else _obs("cancel", None))
            store.observe(obs, 1.0 + i * spread)
        if metric == "e2e" and spread > CFG.subwindow_s / 60:
            continue  # a plain cancel ages nothing: compared within one sub-window only
        a = mixed_store.evidence("a", SHORT, metric, now, 0.0)
        b = store.evidence("a", SHORT, metric, now, 0.0)
        assert (a is None or a.requests == 0) == (b is None or b.requests == 0)
        if a is not None and b is not None:
            assert (a.samples, a.ok, a.requests) == pytest.approx((b.samples, b.ok, b.requests))
            assert a.p_within(BUDGET) == pytest.approx(b.p_within(BUDGET))


@FAST
@given(st.integers(0, 60), st.integers(0, 60), st.floats(0.0, 1.0))
def test_with_prior_stays_between_data_and_neutral(n_ok: int, n_bad: int, neutral: float) -> None:
    w = n_ok + n_bad
    p = n_ok / w if w else None
    got = with_prior(p, float(w), 10.0, neutral)
    lo, hi = sorted((neutral, neutral if p is None else p))
    assert lo - 1e-12 <= got <= hi + 1e-12
    if w >= 10:
        assert got == p


def test_thin_slice_is_shrunk_toward_its_broad_slice_not_replaced_by_it() -> None:
    """The fallback trap: short prompts are fast, the few long ones are all slow. The
    long slice's estimate must move with its own samples, not read as the broad one."""
    store = StatsStore(CFG)
    for i in range(400):
        store.observe(Observation("a", SHORT, "ok", ttft_s=0.2), 1.0 + i * 0.001)
    broad = SliceKey("m", "interactive", ANY, None)
    assert store.evidence("a", broad, "ttft", 2.0, 0.0).p_within(BUDGET) > 0.95  # type: ignore[union-attr]
    got = []
    for n in (0, 1, 3, 10, 40):
        s = StatsStore(CFG)
        for i in range(400):
            s.observe(Observation("a", SHORT, "ok", ttft_s=0.2), 1.0 + i * 0.001)
        for i in range(n):
            s.observe(Observation("a", LONG, "ok", ttft_s=5.0), 1.5 + i * 0.001)
        ev = s.evidence("a", LONG, "ttft", 2.0, 0.0)
        assert ev is not None
        got.append(ev.p_within(BUDGET))
    assert got[0] > 0.95  # no narrow data: the broad value
    assert all(b < a for a, b in itertools.pairwise(got))  # every sample counts
    assert got[2] < 0.8 and got[-1] < 0.25  # 3 samples already matter; 40 dominate


def test_blend_reports_trust_from_the_narrowest_level_with_enough_samples() -> None:
    store = StatsStore(CFG)
    for _ in range(30):
        store.observe(Observation("a", SHORT, "ok", ttft_s=0.2), 1.0)
    for _ in range(3):
        store.observe(Observation("a", LONG, "ok", ttft_s=2.0), 1.0)
    ev = store.evidence("a", LONG, "ttft", 2.0, 0.0)
    assert ev is not None and ev.trusted and ev.fell_back and ev.samples == 3
    assert ev.used == SliceKey("m", "interactive", ANY, None)
    assert blend([(LONG, None)], 10.0, 20, 0.02) is None


@FAST
@given(st.integers(0, 300), st.integers(1, 300), st.floats(0.001, 0.999))
def test_binomial_tail_matches_the_exact_sum(x: int, n: int, p: float) -> None:
    x = min(x, n + 1)
    exact = sum(math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(min(x, n + 1), n + 1))
    got = binom_sf(x, n, p)
    assert 0.0 <= got <= 1.0
    if x <= n * p:
        assert got == 1.0  # never significant there: answered without summing
    elif n * p * (1 - p) <= 30:
        assert got == pytest.approx(exact, rel=1e-6, abs=1e-12)
    else:
        assert got == pytest.approx(exact, abs=0.02)  # normal approximation


def test_significance_needs_more_evidence_for_smaller_shares() -> None:
    # 2 slow samples of 20 are a heavy tail's everyday noise, 5 of 20 are a breach
    assert not significant(2, 20, 0.05, 0.05)
    assert significant(5, 20, 0.05, 0.05)
    assert not significant(0, 0, 0.05, 0.05)


def test_fast_init_keeps_dataclass_semantics() -> None:
    import dataclasses

    @fast_init
    @dataclasses.dataclass(frozen=True, slots=True)
    class V:
        a: int
        b: str = "x"
        c: tuple[int, ...] = dataclasses.field(default_factory=tuple)
        d: list[int] = dataclasses.field(default_factory=list, hash=False, compare=False)

    v = V(1)
    assert (v.a, v.b, v.c, v.d) == (1, "x", (), []) and V(1).d is not v.d
    assert dataclasses.replace(v, b="y") == V(1, "y") and hash(V(2)) == hash(V(2))
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.a = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        fast_init(dataclasses.dataclass(int))  # type: ignore[arg-type]
