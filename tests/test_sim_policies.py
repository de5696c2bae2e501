"""The anchors' policies reproduce their documented behaviour on tiny tables."""

from __future__ import annotations

import random
from typing import Any

import pytest
from test_sim_fixtures import finished, make_attempt, tiny_scenario

from sidecar.core.types import Decision
from sidecar.sim.policies import BASELINES, POLICY_NAMES, PolicyContext, make_policy
from sidecar.sim.policies.anchors import LiteLLM, SemanticRouter, _SrSeries
from sidecar.sim.policies.envoy import EnvoyOutlier
from sidecar.sim.records import CLIENT, ROUTE

RNG = random.Random(0)


def _ctx() -> tuple[Any, PolicyContext]:
    sc = tiny_scenario()
    return sc, PolicyContext(sc.config, {})


# ---------------------------------------------------------------- semantic-router


@pytest.mark.parametrize(
    ("samples", "percentile", "expected"),
    [
        ([], 95, None),  # no data
        ([2.0], 95, 2.0),  # one sample: the EMA is the sample
        ([1.0, 2.0], 95, 0.3 * 2.0 + 0.7 * 1.0),  # < 3 samples: EMA, alpha 0.3
        ([1.0, 2.0, 3.0, 4.0], 95, 3.85),  # index 0.95 * 3 = 2.85: 3 + 0.85 * (4 - 3)
        ([4.0, 1.0, 3.0, 2.0], 50, 2.5),  # order of arrival does not matter
        ([5.0, 1.0, 1.0], 100, 5.0),
    ],
)
def test_semantic_router_value_table(samples: list[float], percentile: int,
                                     expected: float | None) -> None:
    s = _SrSeries()
    for v in samples:
        s.add(v)
    got = s.value(percentile)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)


def test_semantic_router_keeps_only_the_last_1000_samples() -> None:
    s = _SrSeries()
    for _ in range(1000):
        s.add(100.0)
    for _ in range(1000):
        s.add(1.0)
    assert s.value(100) == 1.0  # every old sample is gone, none decayed: simply dropped


def _sr_feed(sr: SemanticRouter, sc: Any, rows: list[tuple[str, float, float]]) -> None:
    for cluster, ttft, tpot in rows:
        sr.on_result(finished(sc, cluster, ttft=ttft, tpot=tpot, tokens=20), 0.0)


@pytest.mark.parametrize(
    ("rows", "expected", "why"),
    [
        ([], "a", "no data anywhere: first candidate"),
        ([("c", 0.5, 0.02)], "c", "only c has data: candidates without data are skipped"),
        ([("b", 0.5, 0.02), ("c", 0.4, 0.02)], "c", "lowest mean ratio wins"),
        ([("a", 0.3, 0.05), ("b", 0.4, 0.02)], "b",
         "mean of TTFT and TPOT ratios: a = (1 + 2.5)/2 > b = (1.33 + 1)/2"),
        ([("a", 0.4, 0.02), ("b", 0.4, 0.02)], "a", "tie: earlier candidate"),
    ],
)
def test_semantic_router_choice_table(rows: list[tuple[str, float, float]], expected: str,
                                      why: str) -> None:
    sc, ctx = _ctx()
    sr = SemanticRouter(ctx)
    _sr_feed(sr, sc, rows)
    assert sr.choose(make_attempt(sc), 0.0, RNG) == expected, why


def test_semantic_router_has_no_health_and_no_decay() -> None:
    sc, ctx = _ctx()
    sr = SemanticRouter(ctx)
    _sr_feed(sr, sc, [("a", 0.2, 0.01)] * 5 + [("b", 0.5, 0.02)] * 5)
    for _ in range(50):  # a fails every request now: not evidence for semantic-router
        sr.on_result(finished(sc, "a", ttft=0.01, outcome="error", status=503), 0.0)
    assert sr.choose(make_attempt(sc), 1e6, RNG) == "a"  # a week later: same verdict


# ---------------------------------------------------------------- LiteLLM


def test_litellm_tries_unused_deployments_first_then_lowest_mean() -> None:
    sc, ctx = _ctx()
    lt = LiteLLM(ctx)
    lt.on_result(finished(sc, "a", ttft=0.2, tokens=10), 0.0)
    assert lt.choose(make_attempt(sc), 1.0, RNG) in ("b", "c")  # unused: latency 0
    lt.on_result(finished(sc, "b", ttft=0.9, tokens=10), 0.0)
    lt.on_result(finished(sc, "c", ttft=0.9, tokens=10), 0.0)
    assert lt.choose(make_attempt(sc), 1.0, RNG) == "a"


def test_litellm_window_is_the_last_ten_samples() -> None:
    sc, ctx = _ctx()
    lt = LiteLLM(ctx)
    for _ in range(10):
        lt.on_result(finished(sc, "a", ttft=5.0, tokens=10), 0.0)
    for c in ("b", "c"):
        lt.on_result(finished(sc, c, ttft=1.0, tokens=10), 0.0)
    assert lt.choose(make_attempt(sc), 1.0, RNG) in ("b", "c")
    for _ in range(10):
        lt.on_result(finished(sc, "a", ttft=0.1, tokens=10), 0.0)
    assert lt.choose(make_attempt(sc), 1.0, RNG) == "a"  # the slow samples slid out


def test_litellm_cooldown_needs_five_calls_and_a_failing_majority() -> None:
    sc, ctx = _ctx()
    lt = LiteLLM(ctx)
    for c in ("b", "c"):
        lt.on_result(finished(sc, c, ttft=1.0), 0.0)
    for i in range(4):
        lt.on_result(finished(sc, "a", ttft=0.01, outcome="error", status=503), 1.0 + i)
    assert lt.deps[("m", "a")].cool_until < 0  # 4 calls: below the minimum
    lt.on_result(finished(sc, "a", ttft=0.01, outcome="error", status=503), 5.0)
    assert lt.deps[("m", "a")].cool_until == pytest.approx(10.0)  # 5 s cooldown
    assert lt.choose(make_attempt(sc), 6.0, RNG) != "a"
    # a 429 cools down at once
    lt.on_result(finished(sc, "b", ttft=0.01, outcome="error", status=429), 6.0)
    assert lt.deps[("m", "b")].cool_until == pytest.approx(11.0)


def test_litellm_everything_cooling_answers_429() -> None:
    sc, ctx = _ctx()
    lt = LiteLLM(ctx)
    for c in ("a", "b", "c"):
        lt.on_result(finished(sc, c, ttft=0.01, outcome="error", status=429), 0.0)
    d = lt.choose(make_attempt(sc), 1.0, RNG)
    assert isinstance(d, Decision) and d.admission == "defer" and d.status == 429


def test_litellm_timeout_penalty_goes_to_the_latency_list_only() -> None:
    sc, ctx = _ctx()
    lt = LiteLLM(ctx)
    att = finished(sc, "a", ttft=30.0, outcome="timeout", status=504)
    att.deadline_kind = ROUTE
    lt.on_result(att, 0.0)
    dep = lt.deps[("m", "a")]
    assert list(dep.latency) == [1000.0] and not dep.ttft
    cancel = finished(sc, "a", ttft=3.0, outcome="cancel", status=0)
    cancel.deadline_kind = CLIENT
    lt.on_result(cancel, 0.0)
    assert dep.fails == 1  # the caller going away is not a deployment failure


# ---------------------------------------------------------------- Envoy


def _fail(env: EnvoyOutlier, sc: Any, cluster: str, at: float, n: int = 5) -> None:
    for _ in range(n):
        env.on_result(finished(sc, cluster, ttft=0.01, outcome="error", status=503), at)


def test_envoy_ejects_after_five_consecutive_5xx_and_returns_after_sweep() -> None:
    sc, ctx = _ctx()
    env = EnvoyOutlier(ctx)
    _fail(env, sc, "a", 1.0, n=4)
    env.on_result(finished(sc, "a", ttft=0.1), 1.0)  # a success resets the run
    _fail(env, sc, "a", 1.0, n=4)
    assert "a" not in env.ejected_until
    _fail(env, sc, "a", 2.0, n=1)
    assert env.ejected_until["a"] == pytest.approx(32.0)  # 30 s x 1st ejection
    picks = {env.choose(make_attempt(sc), 3.0, RNG) for _ in range(6)}
    assert picks == {"b", "c"}
    env.tick(30.0)
    assert "a" in env.ejected_until  # not yet
    env.tick(40.0)
    assert "a" not in env.ejected_until  # returned at the first sweep after 32 s
    _fail(env, sc, "a", 41.0)
    assert env.ejected_until["a"] == pytest.approx(41.0 + 60.0)  # 30 s x 2nd ejection


def test_envoy_max_ejection_percent_still_ejects_one() -> None:
    sc, ctx = _ctx()
    env = EnvoyOutlier(ctx)
    _fail(env, sc, "a", 1.0)
    _fail(env, sc, "b", 1.0)
    assert set(env.ejected_until) == {"a"}  # 10 % of 3 hosts: only the first


def test_envoy_counts_route_timeouts_not_cancels_or_429() -> None:
    sc, ctx = _ctx()
    env = EnvoyOutlier(ctx)
    for _ in range(5):
        att = finished(sc, "a", ttft=10.0, outcome="timeout", status=504)
        att.deadline_kind = ROUTE
        env.on_result(att, 1.0)
    assert "a" in env.ejected_until
    for _ in range(5):
        env.on_result(finished(sc, "b", ttft=0.1, outcome="error", status=429), 1.0)
    assert "b" not in env.ejected_until


# ---------------------------------------------------------------- registry


def test_every_policy_builds_and_chooses_a_candidate() -> None:
    sc = tiny_scenario()
    from sidecar.sim.engine import Simulation

    for name in POLICY_NAMES:
        sim = Simulation(sc, name)  # builds providers, so the oracle can look at them
        choice = sim.policy.choose(make_attempt(sc), 0.0, random.Random(1))
        cluster = choice if isinstance(choice, str) else choice.cluster
        assert cluster in ("a", "b", "c"), name
    assert "tailroute" not in BASELINES and "oracle" not in BASELINES
    with pytest.raises(KeyError):
        make_policy("nope", PolicyContext(sc.config, {}))
