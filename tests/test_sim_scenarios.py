"""Scenario files: validation errors, the shipped suite, determinism, the oracle bound."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_sim_fixtures import CONV_TRACE, SCENARIOS, tiny

from sidecar.sim.engine import run_once
from sidecar.sim.loader import load_scenario, parse_scenario
from sidecar.sim.runner import run_suite, violation_rate
from sidecar.sim.validate import ScenarioError

SHIPPED = sorted(SCENARIOS.glob("*.yaml"))
EXPECTED = {
    "isolated_spike", "sparse_spike", "sustained_tail", "slice_confined", "burst_queueing",
    "flapping", "outage_recovery", "capacity_fallback", "retry_storm", "agentic_fanout",
    "trace_replay", "overload",
}


def _error(data: Any) -> str:
    with pytest.raises(ScenarioError) as exc:
        parse_scenario(data, "bad.yaml")
    return str(exc.value)


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d.update(colour="red"), "bad.yaml: <root>: unknown field(s): colour"),
        (lambda d: d.update(duration_s="long"), "bad.yaml: duration_s: must be a number"),
        (lambda d: d["providers"]["a"].update(ttft_msx=3),
         "bad.yaml: providers.a: unknown field(s): ttft_msx"),
        (lambda d: d["providers"]["a"]["ttft_ms"].update(p99=1),
         "bad.yaml: providers.a.ttft_ms.p99: must be >= median"),
        (lambda d: d["workloads"][0]["arrival"].update(rate_per_s=0),
         "bad.yaml: workloads[0].arrival.rate_per_s: must be > 0"),
        (lambda d: d["workloads"][0]["arrival"].update(process="zipf"),
         "bad.yaml: workloads[0].arrival.process: must be one of"),
        (lambda d: d["workloads"][0].update(stream="yes"),
         "bad.yaml: workloads[0].stream: must be true or false"),
        (lambda d: d["workloads"][0].update({"class": "gold"}),
         "bad.yaml: workloads[0].class: unknown class 'gold'"),
        (lambda d: d["config"]["clusters"][1].update(max_concurrency=0),
         "bad.yaml: config.clusters[1].max_concurrency: must be >= 1"),
        (lambda d: d["providers"].pop("c"),
         "bad.yaml: providers: missing provider for cluster 'c'"),
        (lambda d: d.update(events=[{"provider": "a", "at_s": 5}]),
         "bad.yaml: events[0]: event changes nothing"),
        (lambda d: d.update(events=[{"provider": "z", "at_s": 5, "outage": True}]),
         "bad.yaml: events[0].provider: unknown provider 'z'"),
        (lambda d: d.update(events=[{"provider": "a", "at_s": 5, "ttft_factor": 2,
                                     "match": {"profile": "huge"}}]),
         "bad.yaml: events[0].match.profile: must be one of"),
        (lambda d: d["workloads"][0].update(client={"retries": 1, "retry_on": ["oops"]}),
         "bad.yaml: workloads[0].client.retry_on[0]: must be 'error' or 'timeout'"),
        (lambda d: d["workloads"][0].update(workflow={"deadline_ms": 1000, "steps": [
            {"name": "x", "step": "maybe"}]}),
         "bad.yaml: workloads[0].workflow.steps[0].step: must be one of"),
        (lambda d: d.update(policies=["nope"]), "bad.yaml: policies[0]: unknown policy 'nope'"),
        (lambda d: d.pop("config"), "bad.yaml: <root>: give exactly one of 'config'"),
        (lambda d: d.update(duration_s=10**400),
         "bad.yaml: duration_s: must be a finite number, got an integer too large"),
    ],
)
def test_validation_errors_name_file_and_field(mutate: Any, expected: str) -> None:
    data = tiny()
    mutate(data)
    assert expected in _error(data)


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    f = tmp_path / "broken.yaml"
    f.write_text("name: x\nproviders: [\n", encoding="utf-8")
    with pytest.raises(ScenarioError, match=r"broken.yaml: line \d+, column \d+: invalid YAML"):
        load_scenario(f)


def test_trace_arrivals_refuse_token_fields() -> None:
    data = tiny()
    data["workloads"][0]["arrival"] = {"process": "trace", "path": "x.csv"}
    assert "workloads[0].input_tokens: tokens come from the trace" in _error(data)


# ---------------------------------------------------------------- shipped suite


def test_the_suite_ships_every_required_scenario() -> None:
    assert {p.stem for p in SHIPPED} >= EXPECTED


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_each_shipped_scenario_loads_and_runs_briefly(path: Path) -> None:
    trace = None
    if path.stem == "trace_replay":
        if not CONV_TRACE.exists():
            pytest.skip(f"trace not available at {CONV_TRACE}")
        trace = CONV_TRACE
    sc = load_scenario(path, duration=40, trace=trace)
    assert sc.description.strip(), "every shipped scenario explains itself"
    for policy in ("round_robin", "tailroute", "oracle"):
        out = run_once(sc, policy)
        assert out["calls"] > 0
        assert out["unfinished"] == 0
        for cls in out["classes"].values():
            assert cls["violations"] >= 0
            assert sum(cls["outcomes"].values()) == cls["calls"]


def test_missing_trace_is_a_clear_error(tmp_path: Path) -> None:
    sc = load_scenario(SCENARIOS / "trace_replay.yaml", duration=20,
                       trace=tmp_path / "nope.csv")
    with pytest.raises(ScenarioError, match=r"workloads\[0\]\.arrival\.path: cannot read trace"):
        run_once(sc, "round_robin")


# ---------------------------------------------------------------- determinism


def test_same_seed_same_json_different_seed_different() -> None:
    files = [SCENARIOS / "outage_recovery.yaml"]
    pols = ["round_robin", "litellm", "tailroute"]
    a = json.dumps(run_suite(files, pols, duration=90), sort_keys=True)
    b = json.dumps(run_suite(files, pols, duration=90), sort_keys=True)
    c = json.dumps(run_suite(files, pols, duration=90, seed=99), sort_keys=True)
    assert a == b
    assert a != c
    doc = json.loads(a)
    assert doc["schema_version"] == 2
    assert set(doc["scenarios"][0]["policies"]) == set(pols)


def test_arrivals_do_not_depend_on_the_policy() -> None:
    """Common random numbers: every policy faces the same calls."""
    sc = load_scenario(SCENARIOS / "isolated_spike.yaml", duration=60)
    counts = {p: run_once(sc, p)["calls"] for p in ("round_robin", "random", "oracle")}
    assert len(set(counts.values())) == 1


# ---------------------------------------------------------------- the oracle bound


@pytest.mark.parametrize("name", ["sustained_tail", "outage_recovery", "flapping"])
def test_oracle_is_never_worse_on_slo_violations(name: str) -> None:
    """By construction the oracle sees each request's realised latency on every route,
    so on fault scenarios (not capacity-bound ones, where greedy per-request choices
    can hurt later requests) no policy should violate the SLO less often."""
    sc = load_scenario(SCENARIOS / f"{name}.yaml")
    rates = {p: violation_rate(run_once(sc, p))
             for p in ("oracle", "round_robin", "least_inflight", "litellm", "tailroute")}
    for p, v in rates.items():
        assert rates["oracle"] <= v, (p, rates)
