"""Scenario files: validation errors, the shipped suite, determinism, the oracle bound."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_sim_fixtures import CONV_TRACE, SCENARIOS, tiny

from sidecar.core.config import ConfigError
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


# ---------------------------------------------------------------- bounds (sidecar.sim.bounds)

_WORKFLOW = {"deadline_ms": 30000, "steps": [{"name": "plan"}, {"name": "tools", "fanout": 200}]}


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d.update(duration_s=10**12), "bad.yaml: duration_s: must be <= 259200"),
        (lambda d: d.update(drain_s=1e15), "bad.yaml: drain_s: must be <= 86400"),
        (lambda d: d.update(bucket_s=1e-9),
         "bad.yaml: bucket_s: too small for duration_s + drain_s = 150 s: 150,000,000,000 "
         "time buckets, more than 100,000 (use bucket_s >= 0.0015)"),
        (lambda d: d.update(duration_s=259200, bucket_s=1),
         "bad.yaml: bucket_s: too small for duration_s + drain_s = 259290 s: 259,290 "
         "time buckets"),
        (lambda d: d["workloads"][0]["arrival"].update(rate_per_s=1e9),
         "bad.yaml: workloads[0].arrival.rate_per_s: must be <= 10000, got 1000000000.0"),
        (lambda d: d["workloads"][0]["arrival"].update(rate_changes=[
            {"at_s": 5, "rate_per_s": 1e6}]),
         "bad.yaml: workloads[0].arrival.rate_changes[0].rate_per_s: must be <= 10000"),
        (lambda d: d["workloads"][0].update(arrival={
            "process": "onoff", "rate_on": 50000, "on_s": 1, "off_s": 1}),
         "bad.yaml: workloads[0].arrival.rate_on: must be <= 10000"),
        (lambda d: d["workloads"][0].update(arrival={"process": "mmpp", "states": [
            {"rate_per_s": 1, "mean_s": 5}, {"rate_per_s": 1e7, "mean_s": 5}]}),
         "bad.yaml: workloads[0].arrival.states[1].rate_per_s: must be <= 10000"),
        # the general guard: each number in bounds, their product is not
        (lambda d: d.update(duration_s=200000, bucket_s=60) or d["workloads"][0][
            "arrival"].update(rate_per_s=100),
         "bad.yaml: workloads: about 2e+07 simulated requests expected (arrival rate x "
         "200000 s, workflow fan-out included; most from workloads[0] 'chat'), more than "
         "the cap of 2,000,000"),
        # a workflow's calls count: 100/s for an hour is 360 thousand arrivals, 201 calls each
        (lambda d: d.update(duration_s=3600) or d["workloads"][0].update(
            arrival={"process": "poisson", "rate_per_s": 100}, workflow=_WORKFLOW),
         "bad.yaml: workloads: about 7.24e+07 simulated requests expected"),
        (lambda d: d.update(events=[{"provider": "a", "at_s": 0, "duration_s": 1e-7,
                                     "outage": True,
                                     "repeat": {"every_s": 1e-6, "count": 10**12}}]),
         "bad.yaml: events[0].repeat: 150,000,000 windows within duration_s + drain_s = 150 s, "
         "more than 100,000"),
    ],
)
def test_sizes_beyond_the_bounds_are_refused_naming_the_field(mutate: Any,
                                                             expected: str) -> None:
    data = tiny()
    mutate(data)
    assert expected in _error(data)


@pytest.mark.parametrize("duration", [float("nan"), float("inf"), 0.0, -5.0, 1e12])
def test_a_duration_override_out_of_bounds_is_refused(duration: float) -> None:
    with pytest.raises(ScenarioError, match=r"^bad.yaml: --duration: must be a number of "
                       r"seconds above 0 and at most 259200, got "):
        parse_scenario(tiny(), "bad.yaml", duration=duration)


@pytest.mark.parametrize(
    ("arrival", "calls"),
    [
        ({"process": "poisson", "rate_per_s": 5}, 300.0),
        ({"process": "poisson", "rate_per_s": 2, "rate_changes": [{"at_s": 30,
                                                                     "rate_per_s": 4}]}, 180.0),
        ({"process": "poisson", "rate_per_s": 0.001, "interpolate": "linear",
          "rate_changes": [{"at_s": 20, "rate_per_s": 10}]}, 100.01 + 400.0),
        ({"process": "onoff", "rate_on": 9, "rate_off": 1, "on_s": 1, "off_s": 3}, 180.0),
        ({"process": "mmpp", "states": [{"rate_per_s": 1, "mean_s": 3},
                                        {"rate_per_s": 7, "mean_s": 1}]}, 150.0),
    ],
)
def test_expected_calls_are_rate_times_duration(arrival: dict[str, Any], calls: float) -> None:
    from sidecar.sim.bounds import expected_calls

    sc = parse_scenario(tiny(workloads=[{"name": "w", "arrival": arrival, "input_tokens": 10,
                                         "output_tokens": 10}]), "ok.yaml")
    assert expected_calls(sc.workloads[0], sc.duration) == pytest.approx(calls)


def test_the_longest_duration_with_sparse_traffic_still_loads() -> None:
    data = tiny(duration_s=259200, bucket_s=10)
    data["workloads"][0]["arrival"]["rate_per_s"] = 5  # 1.3 million calls: under the cap
    assert parse_scenario(data, "long.yaml").duration == 259200


@pytest.mark.parametrize("what", ["dev_zero", "sparse_17_mib", "config_file_dev_zero"])
def test_a_huge_scenario_file_is_refused_before_it_is_read(tmp_path: Path, what: str) -> None:
    if what == "dev_zero":
        path, big = Path("/dev/zero"), "/dev/zero"
    elif what == "sparse_17_mib":
        path = big = tmp_path / "big.yaml"
        with path.open("wb") as f:
            f.truncate(17 << 20)
    else:
        path, big = tmp_path / "s.yaml", "/dev/zero"
        path.write_text("name: s\nconfig_file: /dev/zero\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=f"^{big}: .*file is larger than 16 MiB: refused"):
        load_scenario(path)


def test_a_huge_trace_is_refused_before_it_is_read(tmp_path: Path) -> None:
    trace = tmp_path / "huge.csv"
    with trace.open("wb") as f:
        f.truncate(17 << 20)
    sc = load_scenario(SCENARIOS / "trace_replay.yaml", duration=20, trace=trace)
    with pytest.raises(ScenarioError, match=r"workloads\[0\]\.arrival\.path: trace .*huge.csv "
                       r"is larger than 16 MiB: refused"):
        run_once(sc, "round_robin")


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


HUNT = sorted((SCENARIOS.parent / "hunt").glob("*.yaml"))
# A scenario whose traffic is too sparse for 30 s to hold a call runs longer.
BRIEF_S = {"trickle_regression": 900.0}


def test_the_hunt_set_is_the_one_documented() -> None:
    """sidecar/sim/hunt: classes the generator does not draw, tabled in docs/policy-lab.md."""
    doc = (SCENARIOS.parents[2] / "docs" / "policy-lab.md").read_text()
    assert len(HUNT) == 58
    for path in HUNT:
        assert f"`{path.stem}`" in doc, path.stem


@pytest.mark.parametrize("path", HUNT, ids=lambda p: p.stem)
def test_each_hunt_scenario_loads_and_runs_briefly(path: Path) -> None:
    if path.stem == "trace_swings" and not CONV_TRACE.parent.exists():
        pytest.skip(f"traces not available at {CONV_TRACE.parent}")
    sc = load_scenario(path, duration=BRIEF_S.get(path.stem, 30.0))
    assert sc.name == path.stem and sc.description.strip()
    out = run_once(sc, "tailroute")
    assert out["calls"] > 0 and out["unfinished"] == 0


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
