from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sidecar.core.config import StatsConfig
from sidecar.core.stats import (
    GLOBAL_OVERFLOW,
    OVERFLOW_CLASS,
    Lookup,
    RouteStats,
    SeriesWindow,
    StatsStore,
)
from sidecar.core.types import ANY, Observation, Outcome, SliceKey

# min_aging 0: evidence ages with requests only (time aging has its own tests below);
# shift_alpha 0: the aging arithmetic alone (shifts: tests/test_shift.py);
# enough_samples 0: no busy-route bound (its own test below)
CFG = StatsConfig(subwindow_s=10.0, subwindows=6, min_samples=5, decay=0.5, stale_after_s=300,
                  min_aging=0.0, shift_alpha=0.0, enough_samples=0.0)
NARROW = SliceKey("m", "interactive", "short", True)
MID = SliceKey("m", "interactive", ANY, None)
WIDE = SliceKey("m", ANY, ANY, None)


def obs(
    ttft: float | None = 0.5,
    outcome: Outcome = "ok",
    cluster: str = "a",
    slice: SliceKey = NARROW,
    retry: bool = False,
) -> Observation:
    e2e = None if ttft is None else ttft * 4
    return Observation(cluster, slice, outcome, ttft_s=ttft, e2e_s=e2e, is_retry=retry)


def feed(rs: RouteStats | StatsStore, values: list[float], t: float, **kw: object) -> None:
    for v in values:
        rs.observe(obs(v, **kw), t)  # type: ignore[arg-type]


def within(got: float | None, want: float, a: float = 0.02) -> bool:
    return got is not None and abs(got - want) / want <= a * (1 + 1e-9)


# ---------------------------------------------------------------- SeriesWindow


def test_series_window_rotation_and_expiry() -> None:
    w = SeriesWindow(StatsConfig(subwindow_s=10.0, subwindows=3))
    assert w.current(5.0).index == 0
    w.current(5.0).ok += 1
    assert w.current(25.0).index == 2
    assert [age for age, _ in w.live(25.0)] == [0, 2]  # sub-window 1 never written
    assert w.get(0) is not None
    w.advance(30.0)  # sub-window 0 is now 3 back: expired
    assert w.get(0) is None and w.get(3) is None  # 3 is current but not yet written
    assert w.advance(12.0) == 3  # time never goes backwards
    assert w.current(12.0).index == 3


# ---------------------------------------------------------------- RouteStats


def test_outcomes_counted_but_only_ok_first_attempts_are_latency_samples() -> None:
    rs = RouteStats(CFG)
    feed(rs, [0.1] * 4, 1.0)
    rs.observe(obs(9.0, "error"), 1.0)
    rs.observe(obs(9.0, "timeout"), 1.0)
    rs.observe(obs(9.0, "cancel"), 1.0)
    rs.observe(obs(9.0, retry=True), 1.0)  # retry: counted, not latency evidence
    rs.observe(obs(None), 1.0)  # ok without a measured ttft
    assert rs.count("ttft", 1.0) == 4
    assert rs.count("tpot", 1.0) == 0
    # 6 ok (incl. the retry and the unmeasured one) + error + timeout; cancels excluded
    assert rs.error_rate(1.0) == pytest.approx(1 / 8)
    assert rs.timeout_rate(1.0) == pytest.approx(1 / 8)
    assert rs.quantile("ttft", 1.0, 1.0) is None  # 4 < min_samples
    feed(rs, [0.1], 1.0)
    assert within(rs.quantile("ttft", 1.0, 1.0), 0.1)  # the 9 s values never entered


def test_recency_weighting_ages_per_newer_subwindow_and_requests() -> None:
    rs = RouteStats(CFG)  # min_samples 5, decay 0.5
    feed(rs, [2.0] * 10, 5.0)  # sub-window 0
    feed(rs, [0.2] * 10, 15.0)  # sub-window 1 (current at t=15)
    # the current one (10 >= min_samples requests) ages the older by a full step:
    # 2.0 holds 5 of 15
    assert within(rs.quantile("ttft", 0.6, 15.0), 0.2)
    assert within(rs.quantile("ttft", 0.7, 15.0), 2.0)
    # one window later: the same split (the current sub-window is empty, ages nothing)
    assert within(rs.quantile("ttft", 0.6, 25.0), 0.2)
    assert within(rs.quantile("ttft", 0.7, 25.0), 2.0)
    feed(rs, [0.2] * 30, 25.0)  # the current sub-window counts at once: 2.0 holds 2.5 of 37.5
    assert within(rs.quantile("ttft", 0.9, 25.0), 0.2)
    feed(rs, [0.2] * 2, 35.0)  # two requests: 2 / 5 of a step, 0.5 ** 0.4
    ev = rs.evidence("ttft", 35.0, 0.0)
    assert ev is not None and ev.weight == pytest.approx((30 + 5 + 2.5) * 0.5**0.4 + 2)


def test_sparse_traffic_keeps_a_long_window_busy_traffic_a_short_one() -> None:
    """Forgetting is per sub-window when busy and per min_samples requests when sparse:
    1 request per sub-window reaches back minutes, 200 per sub-window ~a minute."""
    cfg = StatsConfig(subwindow_s=10.0, subwindows=30, min_samples=20, decay=0.7, min_aging=0.0,
                      enough_samples=0.0)
    sparse, busy = RouteStats(cfg), RouteStats(cfg)
    for k in range(29):
        feed(sparse, [1.0], k * 10 + 1.0)
        feed(busy, [1.0] * 200, k * 10 + 1.0)
    ev_sparse = sparse.evidence("ttft", 290.0, 0.0)
    ev_busy = busy.evidence("ttft", 290.0, 0.0)
    assert ev_sparse is not None and ev_busy is not None
    assert ev_sparse.samples == 29 and ev_sparse.weight > 20  # ~ all of them, barely faded
    # busy: weights 1, 0.7, 0.49, ... down to 0.7 ** 8 (0.7 ** 9 < 0.05 is dropped)
    assert ev_busy.samples == 9 * 200
    assert ev_busy.weight == pytest.approx(200 * sum(0.7**i for i in range(9)))


@pytest.mark.parametrize(
    ("per_subwindow", "kept", "weight"),
    [(10, None, None),  # sparse: decay alone binds (0.7 ** 0.5 < 1 - 10/400), as without
     (200, 5, 200 * sum(0.5**i for i in range(5))),  # 1 - 200/400 = 0.5 per sub-window
     (1000, 1, 1000.0)],  # more than enough: the older sub-windows are dropped
)
def test_a_busy_route_keeps_about_enough_samples(
    per_subwindow: int, kept: int | None, weight: float | None,
) -> None:
    """enough_samples: a completed sub-window with r requests keeps at most
    1 - r / enough_samples of the older evidence, so at high rates the window is a
    short time window of about enough_samples samples, not a minute of thousands."""
    cfg = StatsConfig(subwindow_s=10.0, subwindows=30, min_samples=20, decay=0.7, min_aging=0.0,
                      enough_samples=400.0)
    rs, without = RouteStats(cfg), RouteStats(replace(cfg, enough_samples=0.0))
    for k in range(12):
        feed(rs, [1.0] * per_subwindow, k * 10 + 1.0)
        feed(without, [1.0] * per_subwindow, k * 10 + 1.0)
    ev, ev0 = rs.evidence("ttft", 125.0, 0.0), without.evidence("ttft", 125.0, 0.0)
    assert ev is not None and ev0 is not None
    if kept is None:
        assert (ev.samples, ev.weight) == (ev0.samples, pytest.approx(ev0.weight))
        return
    assert ev.samples == kept * per_subwindow < ev0.samples
    assert ev.weight == pytest.approx(weight)


@pytest.mark.parametrize("per_subwindow", [0, 1, 3])
def test_time_ages_evidence_however_few_requests_follow(per_subwindow: int) -> None:
    """min_aging: every completed sub-window ages older evidence by at least
    decay ** min_aging, also one the route got no request in (its share fell)."""
    cfg = StatsConfig(subwindow_s=10.0, subwindows=30, min_samples=20, decay=0.7,
                      stale_after_s=300.0)  # default min_aging 0.5
    rs = RouteStats(cfg)
    feed(rs, [0.3] * 40, 1.0)  # sub-window 0: the route was busy then
    for k in range(1, 7):
        feed(rs, [3.0] * per_subwindow, k * 10 + 1.0)
    ev = rs.evidence("ttft", 65.0, 0.0)  # sub-windows 1..5 completed, 6 current
    assert ev is not None
    # each completed newer sub-window ages by 0.7 ** max(0.5, r / 20); the current one
    # by 0.7 ** (r / 20) alone
    step = 0.7 ** max(0.5, per_subwindow / 20)
    old = 40 * step**5 * 0.7 ** (per_subwindow / 20)
    new = per_subwindow * (1 + sum(step**i * 0.7 ** (per_subwindow / 20) for i in range(5)))
    assert ev.weight == pytest.approx(old + new)
    # without time aging the 40 old samples would keep 40 * 0.7 ** (r / 20) of their weight
    # for the r newer requests: all of it at none, 29 at 3 a sub-window
    assert old < 40 * 0.45


def test_window_summary_is_the_last_completed_subwindow() -> None:
    rs = RouteStats(CFG)
    feed(rs, [0.3] * 6, 12.0)
    rs.observe(obs(1.0, "error"), 13.0)
    feed(rs, [5.0] * 10, 21.0)  # current sub-window 2, not summarised yet
    s = rs.window_summary(21.0, "ttft", 0.95)
    assert (s.index, s.start, s.end, s.samples, s.requests, s.errors) == (1, 10.0, 20.0, 6, 7, 1)
    assert within(s.quantile, 0.3) and s.failure_rate == pytest.approx(1 / 7)


def test_sparse_route_evaluation_window_grows_until_min_samples() -> None:
    """Too few samples: the span is kept and extended (never judged twice)."""
    sparse = RouteStats(CFG)
    feed(sparse, [0.3] * 4, 12.0)
    first = sparse.window_summary(21.0, "ttft", 0.95)
    assert first.quantile is None and first.samples == 4
    feed(sparse, [0.4] * 2, 25.0)
    grown = sparse.window_summary(31.0, "ttft", 0.95)
    assert (grown.start, grown.end, grown.samples) == (10.0, 30.0, 6)
    assert within(grown.quantile, 0.4)
    # Judged: the next evaluation window starts after it.
    nxt = sparse.window_summary(41.0, "ttft", 0.95)
    assert (nxt.start, nxt.samples, nxt.quantile) == (30.0, 0, None)


def test_a_closed_span_is_not_judged_again() -> None:
    """A span judged on its failures is closed: the next window starts after it."""
    sparse = RouteStats(CFG)
    feed(sparse, [0.3] * 4, 12.0)
    rs_open = sparse.window_summary(21.0, "ttft", 0.95)
    assert rs_open.quantile is None and rs_open.start == 10.0
    sparse.close_span(21.0)
    nxt = sparse.window_summary(31.0, "ttft", 0.95)
    assert (nxt.start, nxt.samples) == (20.0, 0)


def test_sparse_span_is_capped_at_the_ring() -> None:
    sparse = RouteStats(CFG)
    feed(sparse, [0.3], 12.0)
    for t in (21.0, 31.0, 41.0, 51.0):
        assert sparse.window_summary(t, "ttft", 0.95).start == 10.0
    # At 61 the span covers every completed sub-window the ring keeps: it is closed
    # (insufficient) and the next evaluation window starts after it.
    last = sparse.window_summary(61.0, "ttft", 0.95)
    assert (last.start, last.quantile) == (10.0, None)
    assert sparse.window_summary(71.0, "ttft", 0.95).start == 60.0


def test_stale_data_reports_nothing() -> None:
    rs = RouteStats(StatsConfig(subwindow_s=10, subwindows=60, min_samples=1, stale_after_s=30))
    feed(rs, [0.4] * 5, 1.0)
    assert rs.quantile("ttft", 0.5, 31.0) is not None
    assert rs.quantile("ttft", 0.5, 31.5) is None
    assert rs.count("ttft", 31.5) == 0 and rs.error_rate(31.5) is None


# ---------------------------------------------------------------- StatsStore


def test_observe_feeds_broader_slices_and_lookup_prefers_narrow() -> None:
    store = StatsStore(CFG)
    other = SliceKey("m", "interactive", "long", True)
    feed(store, [0.1] * 5, 1.0)
    feed(store, [3.0] * 5, 1.0, slice=other)
    assert store.series("a", MID) is not None and store.series("a", WIDE) is not None
    assert store.series("a", MID).count("ttft", 1.0) == 10  # type: ignore[union-attr]
    lk = store.lookup("a", NARROW, "ttft", 0.95, 1.0)
    assert lk.used == NARROW and not lk.fell_back and lk.samples == 5 and within(lk.value, 0.1)
    # a narrow slice with too little data falls back to the narrowest broader one
    third = SliceKey("m", "interactive", "medium", False)
    feed(store, [1.0] * 2, 1.0, slice=third)
    lk = store.lookup("a", third, "ttft", 0.95, 1.0)
    assert lk.used == MID and lk.fell_back and lk.samples == 12
    assert store.lookup("b", NARROW, "ttft", 0.95, 1.0) == Lookup(None, None, False, 0)
    with pytest.raises(ValueError):
        store.lookup("a", NARROW, "latency", 0.95, 1.0)


def test_slice_cardinality_is_capped_per_cluster() -> None:
    cfg = StatsConfig(max_slices=3, min_samples=1)
    store = StatsStore(cfg)
    for i in range(10):  # attacker-chosen classes
        store.observe(obs(slice=SliceKey("m", f"c{i}", "short", True)), 1.0)
    for i in range(10):  # and models
        store.observe(obs(slice=SliceKey(f"x{i}", "c", "short", True)), 1.0)
    keys = store.narrow_keys()
    overflow = [s for _, s in keys if s.klass == OVERFLOW_CLASS]
    assert len(keys) == 3 + 3 + 1 and GLOBAL_OVERFLOW in overflow
    assert len(store) <= 5 * cfg.max_slices + 2
    assert store.series("a", SliceKey("m", OVERFLOW_CLASS, ANY, None)).count("ttft", 1.0) == 7  # type: ignore[union-attr]
    store.observe(obs(cluster="b", slice=SliceKey("m", "c9", "short", True)), 1.0)
    assert ("b", SliceKey("m", "c9", "short", True)) in store.narrow_keys()  # per-cluster cap


def test_prune_frees_stale_series_and_cap_slots() -> None:
    store = StatsStore(StatsConfig(max_slices=1, stale_after_s=20))
    store.observe(obs(), 0.0)
    assert store.admit("a", SliceKey("m", "other", "short", True)).klass == OVERFLOW_CLASS
    dead = store.prune(30.0)
    assert ("a", NARROW) in dead and len(store) == 0
    assert store.admit("a", SliceKey("m", "other", "short", True)).klass == "other"


def test_snapshot_roundtrip_rebases_time() -> None:
    store = StatsStore(CFG)
    feed(store, [0.2] * 10, 3.0)
    feed(store, [0.9] * 10, 14.0)
    store.observe(obs(1.0, "timeout"), 14.0)
    data = json.loads(json.dumps(store.to_dict(15.0)))
    back = StatsStore.from_dict(data, CFG, 1015.0)  # new process, new monotonic base
    for q in (0.3, 0.9):
        assert back.lookup("a", NARROW, "ttft", q, 1015.0) == store.lookup(
            "a", NARROW, "ttft", q, 15.0
        )
    before = store.window_summary("a", NARROW, "ttft", 0.5, 15.0)
    after = back.window_summary("a", NARROW, "ttft", 0.5, 1015.0)
    assert (after.samples, after.quantile, after.requests) == (
        before.samples, before.quantile, before.requests,
    )
    assert after.index == before.index + 100  # rebased onto the new clock
    assert back.series("a", NARROW).timeout_rate(1015.0) == pytest.approx(1 / 21)  # type: ignore[union-attr]
    assert back.narrow_keys() == store.narrow_keys()
    with pytest.raises(ValueError):
        StatsStore.from_dict(data, StatsConfig(subwindow_s=5.0), 0.0)
    with pytest.raises(ValueError):
        StatsStore.from_dict({**data, "series": [{"cluster": "a"}]}, CFG, 0.0)


# ---------------------------------------------------------------- properties


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.lists(st.floats(0.001, 100.0), max_size=15), min_size=1, max_size=6
    ),  # samples per sub-window, oldest first
    st.sampled_from([0.1, 0.5, 0.9, 0.95, 0.99]),
    st.sampled_from([0.5, 0.7, 1.0]),
    st.sampled_from([0.0, 0.5, 1.0]),
    st.sampled_from([0.0, 12.0, 400.0]),
)
# The oldest sub-window weighs 0.0625 among the completed ones (kept) and 0.03125
# once the current one's factor applies: the cutoff is the former's.
@example([[0.5], [1.0] * 3, [1.0] * 9, [1.0] * 4 + [0.5], [1.0, 0.5], [1.0] * 4],
         0.1, 0.5, 0.0, 0.0)
def test_window_quantile_is_decay_weighted_nearest_rank(
    windows: list[list[float]], q: float, decay: float, min_aging: float, enough: float
) -> None:
    """Against the definition: sub-window i weighs the product over newer ones j of
    min(decay ** max(min_aging, min(1, r_j / min_samples)), 1 - r_j / enough_samples)
    -- for the current, last one min(decay ** min(1, r_j / min_samples), ...) -- and
    the current weighs 1. The 0.05 cutoff
    applies when a sub-window is folded in, to its weight among the completed ones
    (before the current sub-window's factor)."""
    cfg = StatsConfig(subwindow_s=1.0, subwindows=6, min_samples=2, decay=decay, shift_alpha=0.0,
                      min_aging=min_aging, enough_samples=enough)
    rs = RouteStats(cfg)
    n = len(windows)
    for k, xs in enumerate(windows):
        feed(rs, xs, k + 0.5)
    now = n - 0.5
    weights, w = [1.0] * n, 1.0

    def enough_cap(r: int) -> float:
        return max(1.0 - r / enough, 0.01) if enough and r else 1.0

    current = min(decay ** min(1.0, len(windows[-1]) / cfg.min_samples),
                  enough_cap(len(windows[-1])))
    for k in range(n - 2, -1, -1):
        r = len(windows[k + 1])
        share = min(1.0, r / cfg.min_samples)
        w *= min(decay ** (share if k + 1 == n - 1 else max(min_aging, share)), enough_cap(r))
        weights[k] = w if w / current >= 0.05 * (1 - 1e-12) else 0.0
    data = [(x, weights[k]) for k, xs in enumerate(windows) for x in xs if weights[k] > 0]
    got = rs.quantile("ttft", q, now)
    if sum(len(xs) for k, xs in enumerate(windows) if weights[k] > 0) < cfg.min_samples:
        assert got is None
        return
    values = np.array([x for x, _ in data])
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(np.array([w for _, w in data])[order])
    # nearest rank over the weighted samples; allow the neighbouring rank when
    # the target sits on a boundary within float rounding of a partial sum
    target = q * cum[-1]
    lo = int(np.searchsorted(cum, target * (1 - 1e-9), side="left"))
    hi = int(np.searchsorted(cum, target * (1 + 1e-9), side="left"))
    candidates = {float(values[order][min(i, len(values) - 1)]) for i in range(lo, hi + 1)}
    assert any(within(got, c) for c in candidates), (got, candidates)
