"""Native-mode weights: the selection pipeline's probabilities as integers per slice."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core.config import Config, parse_config
from sidecar.core.evidence import RouteEvidence
from sidecar.core.histogram import LogHistogram
from sidecar.core.plan_cache import probes
from sidecar.core.router import Router
from sidecar.core.selection import HealthView, LatencyValue
from sidecar.core.types import Observation, SliceKey
from sidecar.core.weights import (
    PLAN_ROUNDS,
    STEP_SLICES,
    TRIAL_SHARE,
    WEIGHT_SCALE,
    compute_weights,
    compute_weights_steps,
    integer_weights,
    native_slices,
    route_candidates,
    slice_weights,
    trial_floor,
)
from sidecar.core.window_load import LoadedView, WindowLoad, WindowView

STATES = ("healthy", "watching", "degraded", "restricted", "quarantined", "probing",
          "restoring")
SLICE = SliceKey("m", "interactive", "short", True)


def native_config(**extra: Any) -> Config:
    data: dict[str, Any] = {
        "clusters": [
            {"name": n, "address": f"127.0.0.1:{9000 + i}", "models": ["m"], "region": r}
            for i, (n, r) in enumerate([("a", "eu"), ("b", "eu"), ("c", "us")])
        ],
        "models": [{"name": "m", "candidates": ["a", "b", "c"]}],
        "routing": {"mode": "native"},
        "stats": {"subwindow_s": 1.0, "min_samples": 5},
    }
    data.update(extra)
    return parse_config(data, "native.yaml")


@dataclass
class FakeView:
    """A RouteView with chosen states, tails and loads."""

    states: dict[str, str] = field(default_factory=dict)
    tails: dict[str, float | None] = field(default_factory=dict)
    loads: dict[str, int] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    probe_share: float = 0.05  # health.probe_share's default

    def latency(self, cluster: str, slice: SliceKey, metric: str, percentile: float,
                now: float) -> LatencyValue:
        v = self.tails.get(cluster)
        return LatencyValue(v, slice if v is not None else None, False, 50 if v else 0)

    def evidence(self, cluster: str, slice: SliceKey, metric: str,
                 now: float) -> RouteEvidence | None:
        """50 successes, all at the route's tail: ``P(B)`` is 1 within budget, else 0."""
        v = self.tails.get(cluster)
        if v is None:
            return None
        h = LogHistogram()
        for _ in range(50):
            h.add(v)
        return RouteEvidence(h.cumulative(), 50, 50.0, 0.0, 50.0, 50.0, True, slice, False)

    def health(self, cluster: str, slice: SliceKey) -> HealthView:
        state = self.states.get(cluster, "healthy")
        default = {"healthy": 1.0, "watching": 1.0, "degraded": 0.3, "restoring": 0.5}
        # Probed as the router says: probing, or restricted for a sensitive class.
        probed = state == "probing" or (state == "restricted" and slice.klass != "batch")
        return HealthView(state, self.weights.get(cluster, default.get(state, 0.0)),
                          state in ("restricted", "quarantined", "probing"),
                          state in ("quarantined", "probing"),
                          self.probe_share if probed else 0.0)

    def inflight(self, cluster: str) -> int:
        return self.loads.get(cluster, 0)

    def limit_note(self, cluster: str) -> str | None:
        return None


views = st.builds(
    FakeView,
    states=st.dictionaries(st.sampled_from("abc"), st.sampled_from(STATES)),
    tails=st.dictionaries(st.sampled_from("abc"),
                          st.none() | st.floats(0.001, 30.0, allow_nan=False)),
    loads=st.dictionaries(st.sampled_from("abc"), st.integers(0, 200)),
)


@settings(max_examples=300, deadline=None)
@given(view=views, klass=st.sampled_from(["interactive", "agentic", "batch"]),
       picker=st.sampled_from(["weighted_random", "lowest_score"]),
       scale=st.sampled_from([1, 3, 100, WEIGHT_SCALE]))
def test_weights_sum_to_scale_never_all_zero_and_respect_quarantine(
    view: FakeView, klass: str, picker: str, scale: int
) -> None:
    cfg = native_config(picker=picker)
    s = SliceKey("m", klass, "short", True)
    w = slice_weights(cfg, view, s, now=10.0, scale=scale)
    assert [c for c, _ in w.weights] == ["a", "b", "c"]
    assert all(x >= 0 for _, x in w.weights)
    assert w.total == scale
    open_circuit = [c for c in "abc" if view.states.get(c) == "quarantined"]
    probing = [c for c in "abc" if view.states.get(c) == "probing"]
    if len(open_circuit) + len(probing) < 3:  # else panic serves the open circuits
        assert all(w.weight(c) == 0 for c in open_circuit), w
    # Deterministic for a state: the same inputs give the same weights.
    assert slice_weights(cfg, view, s, now=10.0, scale=scale) == w


def test_probing_route_gets_the_probe_share_and_is_marked() -> None:
    cfg = native_config()
    view = FakeView(states={"b": "probing"})
    w = slice_weights(cfg, view, SLICE, now=0.0)
    assert w.probes == ("b",)
    assert w.weight("b") == round(cfg.health.probe_share * WEIGHT_SCALE)
    assert w.weight("a") == w.weight("c") or abs(w.weight("a") - w.weight("c")) <= 1


def test_restricted_route_is_probed_for_sensitive_class_but_kept_for_batch() -> None:
    cfg = native_config()
    view = FakeView(states={"a": "restricted"})
    sensitive = slice_weights(cfg, view, SLICE, now=0.0)
    assert sensitive.probes == ("a",)
    assert sensitive.weight("a") == round(cfg.health.probe_share * WEIGHT_SCALE)
    batch = slice_weights(cfg, view, SliceKey("m", "batch", "short", True), now=0.0)
    assert batch.probes == () and batch.weight("a") > 0


def test_slow_route_loses_share_by_latency_score() -> None:
    cfg = native_config()
    w = slice_weights(cfg, FakeView(tails={"a": 0.2, "b": 0.2, "c": 0.8}), SLICE, now=0.0)
    assert w.weight("c") < w.weight("a") / 4
    assert w.weight("c") > 0  # exploration floor keeps its statistics fresh


def test_all_quarantined_serves_the_least_bad_tier_never_zero() -> None:
    cfg = native_config()
    w = slice_weights(cfg, FakeView(states=dict.fromkeys("abc", "quarantined")), SLICE, 0.0)
    assert w.panic and w.total == WEIGHT_SCALE and all(x > 0 for _, x in w.weights)


def test_full_cluster_is_avoided_by_window_load() -> None:
    cfg = native_config()
    w = slice_weights(cfg, FakeView(loads={"a": 64}), SLICE, now=0.0)
    assert w.weight("a") == 0 and w.weight("b") > 0


def test_region_policy_is_static_so_routes_list_only_allowed_clusters() -> None:
    cfg = native_config(models=[{"name": "m", "candidates": ["a", "b", "c"],
                                 "regions": ["eu"]}])
    model = cfg.model("m")
    assert model is not None
    assert route_candidates(cfg, model) == ("a", "b")
    w = compute_weights(cfg, FakeView(), 0.0)
    assert all(tuple(c for c, _ in sw.weights) == ("a", "b") for sw in w.values())


def test_native_slices_cover_model_class_profile_stream() -> None:
    slices = native_slices(native_config())
    assert len(slices) == 1 * 3 * 3 * 2
    assert SliceKey("m", "batch", "long", False) in slices


@pytest.mark.parametrize(
    ("shares", "scale", "expect"),
    [
        ({"a": 1, "b": 1, "c": 1}, 100, (34, 33, 33)),
        ({"a": 0, "b": 0, "c": 0}, 10, (4, 3, 3)),  # never all zero
        ({"a": 1e-9, "b": 1, "c": 0}, 100, (1, 99, 0)),  # positive share keeps one unit
        ({"a": 2, "b": 1}, 3, (2, 1, 0)),
    ],
)
def test_integer_weights(shares: dict[str, float], scale: int,
                         expect: tuple[int, ...]) -> None:
    out = integer_weights(shares, ("a", "b", "c"), scale)
    assert tuple(x for _, x in out) == expect


@given(shares=st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=6),
       scale=st.integers(1, 100_000))
def test_integer_weights_sum_exactly(shares: list[float], scale: int) -> None:
    order = tuple(f"c{i}" for i in range(len(shares)))
    out = integer_weights(dict(zip(order, shares, strict=True)), order, scale)
    assert sum(x for _, x in out) == scale
    assert all(x >= 0 for _, x in out)


def _observe(router: Router, cluster: str, ttft_s: float, now: float, n: int) -> None:
    for _ in range(n):
        router.observe(Observation(cluster, SLICE, "ok", 200, ttft_s, 0.01, ttft_s + 0.1), now)


def _warmed(c_ttft: float) -> tuple[Config, Router, WindowView]:
    """A native router after 3 s of a and b at 100 ms TTFT and c at ``c_ttft``."""
    cfg = native_config()
    router = Router(cfg)
    for t in range(3):
        for c, ttft in (("a", 0.1), ("b", 0.1), ("c", c_ttft)):
            _observe(router, c, ttft, t + 0.5, 10)
        router.tick(t + 1.0)
    return cfg, router, WindowView(router, {})


def test_router_tail_moves_share_and_quarantine_is_zero() -> None:
    cfg, router, view = _warmed(0.9)
    w = slice_weights(cfg, view, SLICE, now=3.0)
    assert w.weight("c") < w.weight("a") / 4
    for _ in range(10):
        router.observe(Observation("b", SLICE, "error", 500), 3.5)
    router.tick(4.0)
    assert router.health("b", SLICE).state == "quarantined"
    assert slice_weights(cfg, view, SLICE, now=4.0).weight("b") == 0


def _drain(steps: Any) -> tuple[int, Any]:
    """(pause points, result) of a computation in steps."""
    pauses = 0
    while True:
        try:
            next(steps)
            pauses += 1
        except StopIteration as done:
            return pauses, done.value


def test_a_cold_slice_is_split_once_when_the_load_is_planned() -> None:
    """Planning the load splits each slice ``PLAN_ROUNDS`` times; a cold slice (no load
    for a while) adds nothing to the plan, so it is split once, in the last round.
    Before, a full refresh of a config of many unused slices cost ``PLAN_ROUNDS``
    splits of each. A computation pauses every ``STEP_SLICES`` splits: its pauses
    count them. Slices idle only this window keep every round (the mean of the
    rounds: a slice about to carry load again is planned as before)."""
    cfg = native_config()
    view = FakeView(tails={"a": 0.2, "b": 0.3, "c": 0.25})
    every = native_slices(cfg)
    demand = {SLICE: {"a": 20.0}}
    one_pass = (len(every) - 1) // STEP_SLICES
    assert one_pass >= 2
    warm, _ = _drain(compute_weights_steps(cfg, view, 1.0, every, demand=demand))
    assert warm == PLAN_ROUNDS * one_pass  # nothing cold: every slice every round
    cold = frozenset(every) - {SLICE}
    pauses, out = _drain(compute_weights_steps(cfg, view, 1.0, every, demand=demand,
                                               cold=cold))
    assert pauses == one_pass  # the last round over all; the others over 1 slice
    # The busy slice is planned as before; a cold one is its last round's split.
    assert out[SLICE] == compute_weights(cfg, view, 1.0, [SLICE], demand=demand)[SLICE]
    idle = next(s for s in every if s != SLICE and s.klass == SLICE.klass)
    _, pair = _drain(compute_weights_steps(cfg, view, 1.0, [SLICE, idle], demand=demand,
                                           cold={idle}))
    assert out[idle] == pair[idle] and out[idle].total == WEIGHT_SCALE


def test_window_load_names_the_slices_cold_for_a_horizon() -> None:
    load = WindowLoad()
    other = SliceKey("m", "batch", "long", False)
    load.roll(0.0)
    load.add(SLICE, "a", 0.5)
    load.roll(1.0)
    assert load.cold([SLICE, other], 1.0, 10.0) == {other}  # never carried load
    load.roll(2.0)  # an idle window: SLICE is still warm
    assert load.cold([SLICE, other], 10.9, 10.0) == {other}
    assert load.cold([SLICE, other], 11.1, 10.0) == {SLICE, other}  # 10.1 s since its load


def test_window_load_is_littles_law() -> None:
    load = WindowLoad()
    load.roll(0.0)
    for _ in range(20):
        load.add(SLICE, "a", 0.5)  # 20 requests of 0.5 s in 2 s: 5 in flight on average
    load.add(SLICE, "b", float("nan"))
    assert load.roll(2.0) == {"a": 5.0}
    assert load.demand == {SLICE: {"a": 5.0}}
    assert load.roll(4.0) == {}


@pytest.mark.parametrize(("extra", "expected"), [
    ({}, {"a": 2, "b": 0}),
    ({"a": 1.4, "b": 2.6}, {"a": 3, "b": 3}),
    ({"a": 0.5, "b": 1.5, "z": 7.0}, {"a": 2, "b": 2}),  # half to even; others ignored
])
def test_loaded_views_add_the_load_to_in_flight_counts_only(
    extra: dict[str, float], expected: dict[str, int]
) -> None:
    router = Router(native_config())
    for c in "abc":
        _observe(router, c, 0.1, 1.0, 20)
    router.started("a")
    router.started("a")
    for view, fresh in ((LoadedView(router, extra), False), (WindowView(router, extra), True)):
        assert {c: view.inflight(c) for c in "ab"} == expected
        assert view.health("a", SLICE) == router.health("a", SLICE)
        assert view.latency("a", SLICE, "ttft", 0.95, 1.0) == router.latency(
            "a", SLICE, "ttft", 0.95, 1.0, fresh=fresh)


def test_window_view_reads_evidence_fresh_within_a_sub_window() -> None:
    """Errors (429s: evidence, not a hard-failure run) logged since the last
    computation count at the next one, even inside the same sub-window."""
    cfg = native_config(stats={"subwindow_s": 10.0, "min_samples": 5})
    router = Router(cfg)
    view = WindowView(router, {})
    for c in "abc":
        _observe(router, c, 0.1, 1.0, 20)
    before = slice_weights(cfg, view, SLICE, now=1.0)
    for _ in range(30):
        router.observe(Observation("c", SLICE, "error", 429), 1.5)
    after = slice_weights(cfg, view, SLICE, now=2.0)  # same sub-window, 1 s later
    assert router.health("c", SLICE).state == "healthy"  # no ejection: the score moved it
    assert after.weight("c") < before.weight("c") / 4, (before, after)


def test_probe_share_shrinks_with_relapses_as_per_request() -> None:
    """A route ejected again while restoring (a relapse) is probed with a smaller
    share (relapse memory), in the weights exactly as in Router._probes."""
    cfg = native_config(health={"cooldown_s": 1, "cooldown_max_s": 1, "relapse_factor": 0.5})
    router = Router(cfg)
    view = WindowView(router, {})
    klass, model = cfg.workload_class("interactive"), cfg.model("m")
    assert klass is not None and model is not None
    t = 0.0
    shares = []
    for _ in range(2):  # the second ejection comes while restoring: a relapse
        for _ in range(20):  # a run long enough for the route's failure rate
            router.observe(Observation("b", SLICE, "error", 500), t)
            if router.health("b", SLICE).state == "quarantined":
                break
        t += 1.5
        router.tick(t)  # cooldown over: probing
        assert router.health("b", SLICE).state == "probing"
        w = slice_weights(cfg, view, SLICE, now=t)
        assert w.probes == ("b",)
        planned = probes(router.board, router.config, SLICE, klass, model)
        per_request = {p.cluster: p.share for p in planned}
        assert w.weight("b") == round(per_request["b"] * WEIGHT_SCALE)
        shares.append(w.weight("b"))
        for _ in range(cfg.health.probe_successes):
            router.observe(Observation("b", SLICE, "ok", 200, 0.1, 0.01, 0.2, is_probe=True), t)
        assert router.health("b", SLICE).state == "restoring"
        t += 0.1
    assert shares[1] == shares[0] // 2, shares


def test_a_slow_route_on_trial_gets_the_trial_share_until_its_run_is_judged() -> None:
    """Trial floor (sidecar.core.weights, step 3): a failure on a route whose scores
    left it little puts it on trial at >= TRIAL_SHARE; a success ends the trial."""
    cfg, router, view = _warmed(0.6)
    before = slice_weights(cfg, view, SLICE, now=3.0).weight("c")
    assert before < WEIGHT_SCALE * TRIAL_SHARE / 2
    router.observe(Observation("c", SLICE, "error", 503), 3.1)
    on_trial = slice_weights(cfg, view, SLICE, now=3.1)
    assert on_trial.weight("c") == WEIGHT_SCALE * TRIAL_SHARE
    assert on_trial.weight("a") > 0 and on_trial.weight("b") > 0
    _observe(router, "c", 0.6, 3.9, 1)  # sent at 3.2: after the run began
    assert slice_weights(cfg, view, SLICE, now=3.9).weight("c") < WEIGHT_SCALE * TRIAL_SHARE / 2


@settings(max_examples=300, deadline=None)
@given(shares=st.dictionaries(st.sampled_from("abcde"), st.floats(0.0, 10.0), min_size=1),
       chosen=st.lists(st.sampled_from("abcdef"), max_size=4))
def test_trial_floor_keeps_the_total_and_raises_only_the_routes_on_trial(
    shares: dict[str, float], chosen: list[str]
) -> None:
    out = trial_floor(shares, chosen)
    total = sum(shares.values())
    assert set(out) == set(shares)
    assert sum(out.values()) == pytest.approx(total, abs=1e-9)
    on = [c for c in dict.fromkeys(chosen) if c in shares]
    if total > 0 and on:
        floor = min(TRIAL_SHARE, 1 / len(on)) * total
        for c in on:
            assert out[c] >= floor - 1e-9
        others = [c for c in shares if c not in on]
        for c in others:
            assert out[c] <= shares[c] + 1e-9


def test_a_route_missing_its_budget_now_gets_no_weight_while_others_have_room() -> None:
    """Live misses in native mode: the log entries' outcomes fill the books
    (``LiveMisses.outcome``), and a route missing the slice's budget now is
    published at 0 -- while the others have room (the herding guard) -- and back
    once its misses age out of the horizon."""
    cfg, router, view = _warmed(0.1)
    for _ in range(6):
        router.live.outcome(Observation("c", SLICE, "ok", 200, ttft_s=60.0, e2e_s=61.0), 3.0)
    kept = compute_weights(cfg, view, 3.1, [SLICE], live=router.live)[SLICE]
    assert kept.weight("c") == 0 and kept.missing == ("c",)
    assert kept.weight("a") > 0 and kept.weight("b") > 0
    busy = WindowView(router, {"a": 10_000.0, "b": 10_000.0})  # no room elsewhere
    guarded = compute_weights(cfg, busy, 3.1, [SLICE], live=router.live)[SLICE]
    assert guarded.weight("c") > 0 and guarded.missing == ()
    horizon = cfg.health.live_horizon_s
    back = compute_weights(cfg, view, 3.0 + horizon + 0.1, [SLICE], live=router.live)[SLICE]
    assert back.weight("c") > 0 and back.missing == ()
    assert compute_weights(cfg, view, 3.1, [SLICE])[SLICE].weight("c") > 0  # no live: as before


def test_a_repeat_offender_gets_a_smaller_share_once_back() -> None:
    """Native mode keeps the same repeat-offender memory: a route that missed its
    budget in two episodes within ``forgive_after_s`` comes back from the second with
    its weight scaled by ``relapse_factor`` (not to 0: it still earns evidence)."""
    cfg, router, view = _warmed(0.1)
    late = Observation("c", SLICE, "ok", 200, ttft_s=60.0, e2e_s=61.0)
    for t in (3.0, 40.0):  # two episodes, a quiet gap between them
        for _ in range(6):
            router.live.outcome(late, t)
        assert compute_weights(cfg, view, t + 0.1, [SLICE], live=router.live)[SLICE].missing \
            == ("c",)
    back = 40.0 + cfg.health.live_horizon_s + 0.2
    scaled = compute_weights(cfg, view, back, [SLICE], live=router.live)[SLICE]
    plain = compute_weights(cfg, view, back, [SLICE])[SLICE]
    assert scaled.missing == () and 0 < scaled.weight("c") < 0.75 * plain.weight("c")
    assert scaled.weight("a") > plain.weight("a")
