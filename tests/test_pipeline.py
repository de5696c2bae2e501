"""The selection pipeline with a fake route view (fakes over mocks)."""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.config import Config, parse_config
from sidecar.core.evidence import RouteEvidence
from sidecar.core.filters import DEFAULT_FILTERS
from sidecar.core.histogram import LogHistogram
from sidecar.core.pickers import PICKERS
from sidecar.core.pipeline import run_pipeline
from sidecar.core.scorers import DEFAULT_SCORERS
from sidecar.core.selection import HealthView, LatencyValue, PipelineResult, SelectionContext
from sidecar.core.types import RequestInfo, SliceKey
from tests.conftest import base_config_dict

HEALTHY = HealthView("healthy", 1.0, False, False)
RESTRICTED = HealthView("restricted", 0.0, True, False)
QUARANTINED = HealthView("quarantined", 0.0, True, True)


@dataclass
class FakeView:
    """Latency (seconds) per cluster and metric, health and in-flight, all fixed."""

    ttft: dict[str, float] = field(default_factory=dict)
    health_of: dict[str, HealthView] = field(default_factory=dict)
    busy: dict[str, int] = field(default_factory=dict)
    attain: dict[str, float] = field(default_factory=dict)  # success share, all within budget
    outcomes: dict[str, float] = field(default_factory=dict)  # behind attain (default 100)
    no_tpot: set[str] = field(default_factory=set)
    hold: dict[str, float] = field(default_factory=dict)  # e2e median (s), every sample ok

    def latency(self, cluster: str, slice: SliceKey, metric: str, percentile: float,
                now: float) -> LatencyValue:
        v = self.ttft.get(cluster)
        if v is not None and metric == "tpot" and cluster not in self.no_tpot:
            v = v / 10.0  # a route's decode speed follows its TTFT here
        elif metric != "ttft":
            v = None
        return LatencyValue(v, slice if v is not None else None, False, 50 if v else 0)

    def evidence(self, cluster: str, slice: SliceKey, metric: str,
                 now: float) -> RouteEvidence | None:
        if metric == "e2e" and cluster in self.hold:
            e2e = LogHistogram()
            e2e.add(self.hold[cluster])
            return RouteEvidence(e2e.cumulative(), 100, 100.0, 0.0, 100.0, 100.0, True, slice,
                                 False)
        p = self.attain.get(cluster)
        if p is None:
            return None
        h = LogHistogram()
        h.add(0.01)  # every sample well within any budget: P = p_ok
        n = self.outcomes.get(cluster, 100.0)
        return RouteEvidence(h.cumulative(), int(n), n, 0.0, n * p, n, True, slice, False)

    def health(self, cluster: str, slice: SliceKey) -> HealthView:
        return self.health_of.get(cluster, HEALTHY)

    def inflight(self, cluster: str) -> int:
        return self.busy.get(cluster, 0)

    def limit_note(self, cluster: str) -> str | None:
        return None


def _req(klass: str = "interactive") -> RequestInfo:
    s = SliceKey("m", klass, "short", True)
    return RequestInfo("chat", "m", True, 10, 10, klass, 5, None, s)


def _run(view: FakeView, klass: str = "interactive", cfg: Config | None = None,
         picker: str = "weighted_random", seed: int = 1, live: bool = True) -> PipelineResult:
    cfg = cfg or parse_config(base_config_dict(), "t.yaml")
    model = cfg.model("m")
    k = cfg.workload_class(klass)
    assert model is not None and k is not None
    ctx = SelectionContext(cfg, model, k, _req(klass), view, 0.0, live_counts=live)
    result = run_pipeline(ctx, DEFAULT_FILTERS, DEFAULT_SCORERS, PICKERS[picker],
                          random.Random(seed))
    assert result is not None
    return result


def _shares(view: FakeView, klass: str = "interactive", n: int = 400,
            cfg: Config | None = None) -> Counter[str]:
    return Counter(_run(view, klass, cfg, seed=i).chosen.name for i in range(n))


def test_faster_route_gets_more_traffic_but_others_keep_the_floor() -> None:
    shares = _shares(FakeView(ttft={"a": 0.1, "b": 0.2, "c": 0.4}))
    assert shares["a"] > shares["b"] > shares["c"] > 0


def test_steep_class_concentrates_on_the_faster_route_and_keeps_the_floor() -> None:
    """latency_exponent 6: with 50 samples E = 4, so b (twice as slow) weighs 1/16 of a
    (1/4 with the default curve); the exploration floor still keeps c in use."""
    view = FakeView(ttft={"a": 0.1, "b": 0.2, "c": 0.4})
    steep = parse_config(base_config_dict(classes={"interactive": {"latency_exponent": 6}}),
                         "t.yaml")
    gentle = _shares(view)
    shares = _shares(view, cfg=steep)
    assert shares["a"] > gentle["a"] and shares["b"] < gentle["b"]
    assert shares["c"] > 0


@pytest.mark.parametrize(("pool", "live"), [(None, True), (True, True), (False, True),
                                            (None, False)])
def test_clearly_worse_routes_pool_their_weight_unless_the_class_says_not(
    pool: bool | None, live: bool
) -> None:
    """a is fast, b..e each twice as slow: pooled (the default), the four slow routes
    together weigh what one of them did; ``pool_worse: false`` leaves each its own, and
    so do native mode's window weights (no live in-flight counts)."""
    names = ["a", "b", "c", "d", "e"]
    overrides: dict[str, object] = {
        "clusters": [{"name": n, "address": f"127.0.0.1:{9001 + i}", "models": ["m"]}
                     for i, n in enumerate(names)],
        "models": [{"name": "m", "candidates": names}],
    }
    if pool is not None:
        overrides["classes"] = {"interactive": {"pool_worse": pool}}
    cfg = parse_config(base_config_dict(**overrides), "t.yaml")
    view = FakeView(ttft={"a": 0.1, "b": 0.2, "c": 0.2, "d": 0.2, "e": 0.2})
    plan = {c.name: c.base for c in _run(view, cfg=cfg, live=live).candidates}
    slow = plan["b"] + plan["c"] + plan["d"] + plan["e"]
    if pool is False or not live:
        assert slow == pytest.approx(4 * plan["b"]) and slow > 0.5 * plan["a"]
    else:
        assert plan["b"] == pytest.approx(plan["c"]) and slow < 0.5 * plan["a"]


@pytest.mark.parametrize(("queue", "a_loses"), [(None, True), (2.0, True), (0.0, False)])
def test_a_route_holding_more_than_its_share_loses_weight_at_once(
    queue: float | None, a_loses: bool
) -> None:
    """Equal statistics, but a holds 12 requests and b 2: by Little's law a is slower
    now. The queue score (default weight 2) moves weight to b before any response
    reaches the statistics; ``weights.queue: 0`` leaves the weights as they were."""
    overrides = {} if queue is None else {
        "classes": {"interactive": {"weights": {"queue": queue}}}}
    cfg = parse_config(base_config_dict(**overrides), "t.yaml")
    view = FakeView(ttft={"a": 0.1, "b": 0.1, "c": 0.1}, busy={"a": 12, "b": 2, "c": 2})
    cands = {c.name: c for c in _run(view, cfg=cfg).candidates}
    weights = {n: c.weight for n, c in cands.items()}
    if a_loses:
        assert weights["a"] < 0.5 * weights["b"] and weights["b"] == weights["c"]
    else:  # only the load score (capacity weight 0.5) tells them apart
        load = {n: c.scores["load"] for n, c in cands.items()}
        assert weights["a"] / weights["b"] == pytest.approx((load["a"] / load["b"]) ** 0.5)


def test_a_route_with_longer_answers_may_hold_more_requests() -> None:
    """b's requests hold a slot four times as long (its e2e median): holding four times
    as many as a is what Little's law expects, so the queue score leaves a and b alike;
    a third route holding as many as b at a's hold time is slower now."""
    def queue(busy: dict[str, int]) -> dict[str, float]:
        view = FakeView(ttft={"a": 0.1, "b": 0.1, "c": 0.1},
                        hold={"a": 1.0, "b": 4.0, "c": 1.0}, busy=busy)
        return {c.name: c.scores["queue"] for c in _run(view).candidates}

    # (the histogram holds each median within its 2 % bucket error)
    as_expected = queue({"a": 3, "b": 12, "c": 3})
    assert as_expected == pytest.approx({"a": 1.0, "b": 1.0, "c": 1.0}, rel=0.05)
    q = queue({"a": 3, "b": 12, "c": 12})
    assert q["c"] < 0.5 * min(q["a"], q["b"])


def test_lowest_score_picker_is_semantic_router_deterministic() -> None:
    ttft_only = parse_config(base_config_dict(algorithm={
        "type": "latency_aware", "latency_aware": {"ttft_percentile": 95}}), "t.yaml")
    view = FakeView(ttft={"a": 0.3, "b": 0.1, "c": 0.2})
    picks = {_run(view, cfg=ttft_only, picker="lowest_score", seed=i).chosen.name
             for i in range(20)}
    assert picks == {"b"}
    # With TPOT also enabled and missing for b, only a and c have complete data.
    partial = FakeView(ttft={"a": 0.3, "b": 0.1, "c": 0.2}, no_tpot={"b"})
    assert _run(partial, picker="lowest_score").chosen.name == "c"
    # Nobody has complete data: the first candidate (documented).
    assert _run(FakeView(ttft={"b": 0.1}, no_tpot={"b"}), picker="lowest_score").chosen.name \
        == "a"


def test_a_route_slow_to_the_first_token_without_tpot_samples_yet_stays_down() -> None:
    """c's first token is 15x slower; its TPOT has too few samples to say (TPOT needs
    usage, which native mode reads on a sample of requests): it is judged on its TTFT.
    Before, it had no complete data and scored as the best routes' peer (a third)."""
    for no_tpot in ({"c"}, {"a", "b", "c"}):  # all: streams without usage
        view = FakeView(ttft={"a": 0.03, "b": 0.03, "c": 0.45}, no_tpot=no_tpot)
        cands = {c.name: c for c in _run(view).candidates}
        assert cands["c"].scores["latency"] < 0.05 * cands["a"].scores["latency"]
        assert cands["c"].weight <= 0.05 * cands["a"].weight  # the exploration floor


def test_route_without_data_does_not_outrank_routes_with_data() -> None:
    view = FakeView(ttft={"a": 0.1, "b": 0.5})  # c: no data
    r = _run(view)
    weights = {c.name: c.weight for c in r.candidates}
    assert weights["c"] <= weights["b"] < weights["a"]
    assert weights["c"] > 0


def test_fast_errors_are_evidence() -> None:
    """Same latency everywhere; c fails fast on 30 % of its requests: it keeps
    only the exploration floor, the others split the rest."""
    view = FakeView(ttft={"a": 0.2, "b": 0.2, "c": 0.2}, attain={"a": 0.99, "b": 0.99,
                                                                  "c": 0.7})
    shares = _shares(view, n=600)
    assert shares["c"] / 600 < 0.05 and shares["c"] > 0
    assert abs(shares["a"] - shares["b"]) < 90


def _attainment(view: FakeView) -> dict[str, float]:
    scores = {c.name: c.scores for c in _run(view).candidates}
    return {name: sc["attainment"] for name, sc in scores.items()}


@pytest.mark.parametrize(("miss_c", "n", "low", "high"), [
    # 4 % more misses than a and b on 100 outcomes each: within chance of them
    # (z ~ 1.3), judged on the gentle scale a = 5 %: exp(-0.8)
    (0.05, 100.0, 0.40, 0.50),
    # the same excess on 2,000 outcomes is sure: most of it counts four times
    (0.05, 2000.0, 0.01, 0.10),
    # 19 % more on 100 outcomes: sure beyond ~3 points of noise, far below exp(-3.8)
    (0.20, 100.0, 1e-6, 1e-3),
])
def test_an_excess_counts_sharper_once_chance_cannot_explain_it(
        miss_c: float, n: float, low: float, high: float) -> None:
    view = FakeView(ttft={"a": 0.2, "b": 0.2, "c": 0.2},
                    attain={"a": 0.99, "b": 0.99, "c": 1.0 - miss_c},
                    outcomes={"a": n, "b": n, "c": n})
    s = _attainment(view)
    assert s["a"] == s["b"] == 1.0
    assert low <= s["c"] <= high, s


def test_no_excess_counts_sharper_while_a_route_refuses_by_time() -> None:
    """A quota's refusals (8 s of 70 % every 40 s) are a sure excess on average, yet the
    route serves well between them, and the others' evidence carries the load its
    holds moved: while any candidate refuses by time (SelectionContext.refusing), every
    route is judged on the gentle scale."""
    view = FakeView(ttft={"a": 0.2, "b": 0.2, "c": 0.2},
                    attain={"a": 0.99, "b": 0.99, "c": 0.94},
                    outcomes={"a": 2000.0, "b": 2000.0, "c": 2000.0})
    cfg = parse_config(base_config_dict(), "t.yaml")
    model, k = cfg.model("m"), cfg.workload_class("interactive")
    assert model is not None and k is not None
    scores = {}
    for refusing in (False, True):
        ctx = SelectionContext(cfg, model, k, _req(), view, 0.0, refusing=refusing)
        result = run_pipeline(ctx, DEFAULT_FILTERS, DEFAULT_SCORERS,
                              PICKERS["weighted_random"], random.Random(0))
        assert result is not None
        scores[refusing] = {c.name: c.scores["attainment"] for c in result.candidates}
    assert scores[False]["c"] < 0.1  # sure: sharper
    assert scores[True]["c"] == pytest.approx(math.exp(-0.05 / 0.05))


@given(st.floats(0.0, 0.3), st.floats(0.0, 0.3), st.floats(10.0, 5000.0))
def test_attainment_is_bounded_and_never_rises_with_more_evidence(
        miss_best: float, excess: float, n: float) -> None:
    """Bounded in (0, 1], 1 for the best route, never above the gentle scale, and
    the same excess on more outcomes never weighs more (monotone in evidence)."""
    def score(outcomes: float) -> float:
        view = FakeView(ttft={"a": 0.2, "b": 0.2, "c": 0.2},
                        attain={"a": 1.0 - miss_best, "b": 1.0 - miss_best - excess,
                                "c": 1.0 - miss_best},
                        outcomes={"a": outcomes, "b": outcomes, "c": outcomes})
        s = _attainment(view)
        assert s["a"] == 1.0
        return s["b"]

    few, more = score(n), score(2.0 * n)
    gentle = math.exp(-excess / 0.05)
    assert 0.0 < more <= few * (1.0 + 1e-9) and few <= max(gentle, 1e-6) * (1.0 + 1e-9)


@pytest.mark.parametrize("fanout", [1, 8])
def test_fan_out_step_judges_a_deeper_tail(fanout: int) -> None:
    """A 2 % extra miss is little for one call, a lot for the slowest of 8."""
    view = FakeView(ttft={"a": 0.2, "b": 0.2, "c": 0.2}, attain={"a": 0.995, "b": 0.995,
                                                                  "c": 0.975})
    cfg = parse_config(base_config_dict(), "t.yaml")
    model, k = cfg.model("m"), cfg.workload_class("interactive")
    assert model is not None and k is not None
    ctx = SelectionContext(cfg, model, k, _req(), view, 0.0, None, 0.05 / fanout)
    picks = Counter(
        r.chosen.name for i in range(400)
        if (r := run_pipeline(ctx, DEFAULT_FILTERS, DEFAULT_SCORERS,
                              PICKERS["weighted_random"], random.Random(i))) is not None
    )
    share_c = picks["c"] / 400
    assert (share_c > 0.2) if fanout == 1 else (share_c < 0.06)


@pytest.mark.parametrize(
    ("klass", "excluded"),
    [("interactive", True), ("batch", False)],
)
def test_restricted_route_excluded_only_for_latency_sensitive(klass: str,
                                                              excluded: bool) -> None:
    view = FakeView(ttft={"a": 0.1, "b": 0.1, "c": 0.1}, health_of={"a": RESTRICTED})
    r = _run(view, klass)
    a = next(c for c in r.candidates if c.name == "a")
    assert (a.dropped == "class_restriction") is excluded


def test_herding_guard_keeps_restricted_route_when_alternatives_are_full() -> None:
    cap = 64  # default max_concurrency
    view = FakeView(ttft={"a": 0.1, "b": 0.1, "c": 0.1}, health_of={"a": RESTRICTED},
                    busy={"b": cap - 2, "c": cap - 2})
    r = _run(view)
    a = next(c for c in r.candidates if c.name == "a")
    assert a.dropped is None and "herding_guard" in a.verdicts
    assert a.health.weight == pytest.approx(0.3)  # degraded weight, not excluded


def test_quarantined_route_is_never_chosen_while_others_are_usable() -> None:
    view = FakeView(ttft={"a": 0.01, "b": 0.2, "c": 0.2}, health_of={"a": QUARANTINED})
    assert "a" not in _shares(view, n=100)


def test_panic_spreads_over_the_least_bad_tier() -> None:
    """Everything full: serve the full-but-healthy routes, spread, and say so."""
    view = FakeView(ttft={"a": 0.1, "b": 0.1, "c": 0.1}, health_of={"c": QUARANTINED},
                    busy={"a": 64, "b": 64})
    results = [_run(view, seed=i) for i in range(100)]
    assert all(r.panic for r in results)
    assert {r.chosen.name for r in results} == {"a", "b"}
    assert "panic" in results[0].notes[0]


def test_panic_with_every_route_restricted_serves_them_all() -> None:
    view = FakeView(ttft={"a": 0.1, "b": 0.2, "c": 0.3},
                    health_of={n: RESTRICTED for n in "abc"})
    assert set(_shares(view, n=200)) == {"a", "b", "c"}


def test_region_policy_is_a_hard_filter() -> None:
    data = base_config_dict()
    data["clusters"][0]["region"] = "eu"
    data["clusters"][1]["region"] = "us"
    data["clusters"][2]["region"] = "us"
    data["models"][0]["regions"] = ["eu"]
    cfg = parse_config(data, "t.yaml")
    view = FakeView(ttft={"a": 5.0, "b": 0.1, "c": 0.1}, health_of={"a": QUARANTINED})
    r = _run(view, cfg=cfg)
    # Only a is allowed; even quarantined, panic may serve it, never b or c.
    assert r.chosen.name == "a" and r.panic


@pytest.mark.parametrize(
    ("latency_aware", "reason"),
    [({}, "no_percentile"), ({"ttft_percentile": 95}, "no_data")],
)
def test_decision_reason_tells_no_percentile_from_no_data(
    latency_aware: dict[str, int], reason: str
) -> None:
    """Both fall back to the first candidate; the reason says which (metrics label)."""
    from sidecar.core.router import Router

    cfg = parse_config(base_config_dict(algorithm={
        "type": "latency_aware", "latency_aware": latency_aware}), "t.yaml")
    d = Router(cfg).decide(_req(), 0.0, random.Random(1))
    assert d.reason == reason
