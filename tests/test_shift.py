"""Shift detection (sidecar.core.shift) and the shifted reading of a series' window."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core.config import StatsConfig
from sidecar.core.histogram import LogHistogram
from sidecar.core.series import RouteStats
from sidecar.core.shift import ShiftState, shift_factor
from sidecar.core.types import Observation, SliceKey

SLICE = SliceKey("m", "interactive", "short", True)
CFG = StatsConfig(subwindow_s=10.0, subwindows=30, min_samples=20, decay=0.85,
                  stale_after_s=600.0)


def hist(values: list[float]) -> LogHistogram:
    h = LogHistogram()
    for v in values:
        h.add(v)
    return h


def reference() -> LogHistogram:
    return hist([0.1 * (1 + i) for i in range(100)])  # 0.1 .. 10 s: p10 ~1, p90 ~9


@pytest.mark.parametrize(("value", "hits_to_shift"), [
    (20.0, 3),  # every sample beyond the reference's p90: three decide it
    (0.05, 3),  # below its p10, the same downward
])
def test_a_run_of_tail_samples_is_a_shift(value: float, hits_to_shift: int) -> None:
    st = ShiftState()
    ref = reference().cumulative()
    found = [st.update(i, ref, hist([value]).cumulative(), 1) for i in range(hits_to_shift)]
    assert found == [False] * (hits_to_shift - 1) + [True]
    assert st.since == 0  # the run began with the first of them


def test_samples_inside_the_reference_never_shift_and_reset_a_run() -> None:
    st = ShiftState()
    ref = reference().cumulative()
    inside = hist([5.0, 2.0, 7.0]).cumulative()
    tail = hist([20.0]).cumulative()
    for i in range(50):
        assert not st.update(2 * i, ref, inside, 3)
        assert not st.update(2 * i + 1, ref, tail, 1)  # one tail sample now and then
    assert st.since is None


def test_samples_at_the_references_p10_or_p90_are_not_beyond_it() -> None:
    """A steady route: its p10 and p90 are one bucket, so new samples in that bucket
    are at the quantiles, not below or above them (they used to count as below the
    p10: two such samples read as a downward shift)."""
    st = ShiftState()
    ref = hist([1.0] * 9 + [2.0]).cumulative()
    same = hist([1.0]).cumulative()
    assert not any(st.update(i, ref, same, 1, alpha=0.05) for i in range(20))
    assert st.since is None and st.up == st.down == 0.0


def test_a_stationary_heavy_tail_rarely_looks_shifted() -> None:
    """p99/p50 ~ 8 (lognormal sigma 0.9): sub-windows of 3 samples tested against a
    window of the same distribution; the CUSUM's false alarms stay rare (5 in this
    draw: about one per 1000 samples, at sparse rates where a sub-window holds a few;
    a busy sub-window's many samples inside the tail pull the statistic back to 0)."""
    rng = random.Random(5)
    ref = hist([math.exp(rng.gauss(0.0, 0.9)) for _ in range(400)]).cumulative()
    st = ShiftState()
    alarms = sum(
        st.update(i, ref, hist([math.exp(rng.gauss(0.0, 0.9)) for _ in range(3)]).cumulative(), 3)
        for i in range(2000))
    assert alarms <= 10  # of 2000 tests (6000 samples)


def test_a_busy_subwindow_with_its_share_of_tail_samples_is_no_shift() -> None:
    st = ShiftState()
    ref = reference().cumulative()
    busy = hist([20.0] * 12 + [5.0] * 88).cumulative()  # 12 % beyond p90
    assert not any(st.update(i, ref, busy, 100) for i in range(20))


def test_shift_factor_is_the_ratio_of_medians() -> None:
    assert shift_factor(hist([1.0, 2.0, 3.0]), hist([6.0])) == pytest.approx(3.0, rel=0.05)
    assert shift_factor(LogHistogram(), hist([6.0])) == 1.0


@pytest.mark.parametrize("factor", [0.3, 1.0, 3.0, 17.0])
def test_shifted_histogram_moves_every_quantile(factor: float) -> None:
    h = hist([0.2, 0.35, 0.5, 0.9, 1.4])
    s = h.shifted(factor)
    assert s.count == h.count
    for q in (0.0, 0.5, 0.95):
        assert s.quantile(q) == pytest.approx(h.quantile(q) * factor, rel=0.03)
    assert h.quantile(0.5) == pytest.approx(0.5, rel=0.03)  # the original is untouched


@pytest.mark.parametrize("factor", [0.05, 0.3, 3.0, 40.0])
def test_a_shifted_histogram_merges_and_grows_like_one_built_from_moved_values(
        factor: float) -> None:
    values = [0.2, 0.35, 0.5, 0.9, 1.4]
    moved = hist(values).shifted(factor)
    into = hist([0.4])
    into.merge(moved)
    moved.add(0.4)  # the moved span must still be the array's: adds land in place
    direct = hist([v * factor for v in values] + [0.4])
    for got in (into, moved, LogHistogram.weighted_sum(moved.relative_accuracy, [(moved, 1.0)])):
        assert got.count == direct.count
        for q in (0.0, 0.25, 0.5, 0.75, 1.0):
            assert got.quantile(q) == pytest.approx(direct.quantile(q), rel=0.05)


def test_shifted_histogram_stays_in_range() -> None:
    h = hist([1e-4, 1.0])
    assert h.shifted(1e-12).quantile(0.0) is not None
    assert h.shifted(1e12).count == h.count


def feed(rs: RouteStats, values: list[float], t: float) -> None:
    for v in values:
        rs.observe(Observation("a", SLICE, "ok", ttft_s=v, e2e_s=v * 4), t)


@pytest.mark.parametrize(("factor", "moves"), [(3.0, True), (1.1, False)])
def test_a_sparse_route_reads_a_shift_after_a_few_samples(factor: float, moves: bool) -> None:
    """60 samples from before, then one sample a sub-window: a tripled latency is read
    as roughly tripled quantiles after a few samples, not after minutes of aging; a
    10 % drift is left to the window's ordinary aging."""
    rng = random.Random(1)
    draw = lambda: 0.35 * math.exp(rng.gauss(0.0, 0.4))  # noqa: E731
    rs = RouteStats(CFG)
    for k in range(6):
        feed(rs, [draw() for _ in range(10)], k * 10 + 1.0)
    before = rs.quantile("ttft", 0.95, 65.0)
    assert before is not None
    for k in range(6, 11):
        feed(rs, [draw() * factor], k * 10 + 1.0)
    after = rs.quantile("ttft", 0.95, 115.0)
    assert after is not None
    if moves:
        assert after > 2.0 * before
    else:
        assert after < 1.3 * before


def test_fence_forgets_a_shift() -> None:
    rs = RouteStats(CFG)
    feed(rs, [0.3] * 40, 1.0)
    for k in range(1, 5):
        feed(rs, [3.0], k * 10 + 1.0)
    rs.evidence("ttft", 55.0, 0.0)
    assert any(s.since is not None for s in rs._shift.values())
    rs.fence(60.0)
    assert not rs._shift


def test_a_shift_reads_no_factor_from_the_last_few_samples_before_it() -> None:
    """The evidence from before a shift ages out of the window a sub-window at a time;
    with two samples left (0.12 s and 1.55 s) their "median" read F = 31 from the
    3.78 s and 4.22 s since, moving 1.55 s to ~48 s: a p90 of 12.7 s here (53.5 s in
    the fleet property's example) from samples up to 4.22 s. Fewer than
    SHIFT_MIN_BEFORE samples from before: the shift lapses, the window reads plain."""
    rs = RouteStats(CFG)
    for k in range(4):
        feed(rs, [0.3, 0.4, 0.5, 0.6, 2.0], k * 10 + 1.0)  # 20 % at 2.0 s: p90 2.0 s
    feed(rs, [0.12, 1.55], 41.0)  # inside the window's p10..p90: no run begins
    feed(rs, [3.78], 51.0)
    feed(rs, [4.22], 61.0)  # two beyond the p90 in a row: a shift since sub-window 5

    def read(t: float) -> tuple[int | None, float]:
        ev = rs.evidence("ttft", t, 0.0)
        assert ev is not None
        q = ev.merged(rs.accuracy).quantile(0.9)
        assert q is not None
        return rs._shift["ttft"].since, q

    since, p90 = read(75.0)
    assert since == 5 and p90 > 3 * 4.22  # the old tail (2.0 s) moved by ~8: by design
    since, p90 = read(325.0)  # sub-windows 0..2 gone: 7 samples from before left
    assert since == 5 and p90 > 3 * 4.22
    rs._sync(335.0)  # the shift lapses as the window moves, before anyone reads it
    assert rs._shift["ttft"].since is None
    since, p90 = read(335.0)  # only sub-window 4's two left (failed: p90 12.68 s)
    assert since is None and p90 <= 4.22 * 1.03


def _answers(rs: RouteStats, now: float) -> list[tuple[int, float | None]]:
    out = []
    for metric in ("ttft", "e2e"):
        ev = rs.evidence(metric, now, 0.0)
        merged = None if ev is None else ev.merged(rs.accuracy)
        out.append((0 if ev is None else ev.samples,
                    None if merged is None else merged.quantile(0.9)))
    return out


_STEPS = st.lists(st.tuples(
    st.integers(1, 4),  # sub-windows to the next batch of samples
    st.lists(st.sampled_from([0.3, 0.4, 0.5, 2.0, 3.8, 4.2, 9.0]), max_size=8),
    st.booleans(),  # read the first series after this batch
), min_size=1, max_size=60)


@given(_STEPS)
@settings(max_examples=80, deadline=None)
def test_reading_a_window_never_changes_what_it_says(steps: list[tuple[int, list[float],
                                                                      bool]]) -> None:
    """Two series fed the same samples at the same times give the same answers
    whether one was read after every batch and the other never: a shift begins
    and lapses as the window moves (sidecar.core.series), not when it is read."""
    read_often, never_read = RouteStats(CFG), RouteStats(CFG)
    t = 0.0
    for gap, values, read in steps:
        t += gap * CFG.subwindow_s
        feed(read_often, values, t)
        feed(never_read, values, t)
        if read:
            _answers(read_often, t + 1.0)
    assert _answers(read_often, t + 5.0) == _answers(never_read, t + 5.0)
    assert ({m: s.since for m, s in read_often._shift.items()}
            == {m: s.since for m, s in never_read._shift.items()})
