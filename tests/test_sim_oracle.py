"""The hindsight oracle: what it knows, when it sheds or holds, and that it bounds the policies."""

from __future__ import annotations

import random
from typing import Any

import pytest
from test_sim_engine import Driver
from test_sim_fixtures import CONV_TRACE, SCENARIOS, make_attempt, tiny

from sidecar.core.types import Decision
from sidecar.sim.dists import Stream
from sidecar.sim.engine import Simulation, run_once
from sidecar.sim.gen_families import FAMILIES
from sidecar.sim.gen_run import generate_one
from sidecar.sim.loader import load_scenario, parse_scenario
from sidecar.sim.policies import BASELINES, PolicyContext
from sidecar.sim.policies.oracle import Oracle, start_after_queue
from sidecar.sim.provider import Provider
from sidecar.sim.runner import violation_rate
from sidecar.sim.scenario import EventSpec, Scenario

# ---------------------------------------------------------------- queue replay


def test_the_queue_is_replayed_with_each_requests_own_service() -> None:
    d = Driver(capacity=1, contention=0.0)
    first = d.send(tokens=11)  # 100 ms + 10 x 10 ms: ends at 0.2 s
    queued = d.send(tokens=51)  # starts at 0.2, takes 100 + 50 x 10 ms: ends at 0.8 s
    for a in (first, queued):
        a.draws = [0.9, 0.9, 0.0, 0.0, 0.9]  # no error, no stall, median service
    d.heap.sort()
    while d.heap and d.heap[0][0] <= 0.0:  # both arrive at 0
        _, _, fn, arg = d.heap.pop(0)
        fn(arg)
    assert (d.prov.busy, d.prov.queued) == (1, 1)
    assert start_after_queue(d.prov, 0.0, 1) == pytest.approx(0.8)


def test_after_a_capacity_drop_a_new_request_waits_for_the_extra_releases() -> None:
    d = Driver(capacity=2, contention=0.0)
    ev = EventSpec("a", at=0.5, duration=None, capacity=1)
    d.prov = Provider(d.sc.providers["a"], [ev], Stream("c"), d.push, d.end)
    short, long_ = d.send(tokens=11), d.send(tokens=51)  # end at 0.2 s and 0.6 s
    for a in (short, long_):
        a.draws = [0.9, 0.9, 0.0, 0.0, 0.9]
        d.prov.submit(a, 0.0)
    d.heap.clear()
    # at 0.1 s both still run but only one slot remains: a newcomer needs both to end
    assert start_after_queue(d.prov, 0.1, d.prov.capacity(0.6)) == pytest.approx(0.6)


# ---------------------------------------------------------------- decisions


def _oracle(data: dict[str, Any]) -> tuple[Scenario, Oracle, dict[str, Any]]:
    sc = parse_scenario(data, "t.yaml")
    sim = Simulation(sc, "oracle")
    assert isinstance(sim.policy, Oracle)
    return sc, sim.policy, sim.providers


def test_a_call_that_cannot_meet_its_slo_anywhere_is_shed() -> None:
    data = tiny()
    data["config"]["classes"]["interactive"]["slo"]["budget_ms"] = 50  # below any TTFT
    sc, oracle, _ = _oracle(data)
    att = make_attempt(sc)
    d = oracle.choose(att, 0.0, random.Random(1))
    assert isinstance(d, Decision) and d.admission == "shed"


def test_it_routes_where_the_realised_outcome_meets_the_slo() -> None:
    data = tiny()
    data["providers"]["a"]["error_rate"] = 1.0
    data["providers"]["b"]["ttft_ms"] = 5000  # over the 1 s budget
    sc, oracle, _ = _oracle(data)
    for _ in range(20):
        att = make_attempt(sc)
        assert oracle.choose(att, 0.0, random.Random(1)) == "c"
        assert att.draws is not None  # the provider realises what the oracle saw


def _held_setup() -> dict[str, Any]:
    data = tiny()
    data["config"]["classes"]["interactive"]["priority"] = 10
    data["config"]["classes"]["batch"]["priority"] = 1
    for c in ("a", "b", "c"):
        data["providers"][c].update(capacity=1, contention=0.0)
    return data


def test_a_low_priority_call_waits_for_a_free_slot_an_urgent_one_does_not() -> None:
    sc, oracle, providers = _oracle(_held_setup())
    for c in ("a", "b", "c"):  # every slot busy for the next 0.3-0.5 s
        busy = make_attempt(sc, c, output_tokens=11)
        busy.draws = [0.9, 0.9, 0.0, 0.0, 0.9]
        providers[c].submit(busy, 0.0)
    rng = random.Random(1)
    batch = make_attempt(sc, klass="batch", output_tokens=10)
    held = oracle.choose(batch, 0.0, rng)
    assert isinstance(held, Decision) and held.admission == "queue"
    until = oracle.queue_until(batch.call)
    assert until is not None and until > 10.0  # a 20 s budget leaves room to wait
    urgent = make_attempt(sc, output_tokens=10)
    assert oracle.choose(urgent, 0.0, rng) == "a"  # queues at a provider: meets after 0.3 s
    late = make_attempt(sc, klass="batch", output_tokens=10)
    late.call.start = -until  # out of slack: admitted or shed, never held again
    assert not (isinstance(d := oracle.choose(late, 0.0, rng), Decision)
                and d.admission == "queue")


def test_optional_steps_that_would_violate_are_skipped() -> None:
    data = tiny()
    data["workloads"][0]["workflow"] = {"deadline_ms": 60000, "steps": [
        {"name": "plan"}, {"name": "extra", "step": "optional"}]}
    data["config"]["classes"]["interactive"]["slo"]["budget_ms"] = 50
    out = run_once(parse_scenario(data, "t.yaml"), "oracle")
    cls = out["classes"]["interactive"]
    assert cls["outcomes"]["skipped"] > 0
    assert cls["workflows"]["completed"] > 0  # critical steps still run (late, but done)


def test_the_routing_oracle_never_sheds() -> None:
    data = tiny()
    data["config"]["classes"]["interactive"]["slo"]["budget_ms"] = 50
    out = run_once(parse_scenario(data, "t.yaml"), "oracle_routing")
    assert out["classes"]["interactive"]["outcomes"]["rejected"] == 0


# ---------------------------------------------------------------- the bound


def _assert_bound(sc: Scenario) -> None:
    competitors = [*BASELINES, "tailroute"]
    if "admission" in sc.tags:
        competitors.append("tailroute_no_admission")
    rates = {p: violation_rate(run_once(sc, p)) for p in [*competitors, "oracle"]}
    beaten = {p: v for p, v in rates.items() if v < rates["oracle"]}
    assert not beaten, (sc.name, rates["oracle"], beaten)


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.yaml")), ids=lambda p: p.stem)
def test_no_policy_beats_the_oracle_on_the_shipped_suite(path: Any) -> None:
    trace = None
    if path.stem == "trace_replay":
        if not CONV_TRACE.exists():
            pytest.skip(f"trace not available at {CONV_TRACE}")
        trace = CONV_TRACE
    _assert_bound(load_scenario(path, duration=180, trace=trace))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_no_policy_beats_the_oracle_on_generated_scenarios(family: str) -> None:
    g = generate_one(family, 2024, 0)
    _assert_bound(parse_scenario(g.data, f"{g.name}.yaml",
                                 duration=min(g.data["duration_s"], 240)))


def test_oracle_draws_do_not_disturb_the_other_providers() -> None:
    """Pre-drawing for every candidate consumes each provider's stream per request,
    so the oracle's runs stay deterministic for a seed."""
    sc = parse_scenario(tiny(), "t.yaml")
    assert run_once(sc, "oracle") == run_once(sc, "oracle")
    assert Stream("x").row() == Stream("x").row()
    assert PolicyContext(sc.config, {}).config is sc.config
