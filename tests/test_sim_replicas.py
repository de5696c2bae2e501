"""The policy lab's replicas model: k replicas splitting the traffic, isolated or sharing
state through the production fleet sync; the scenario field ``replicas:``."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from test_sim_fixtures import tiny

from sidecar.sim.engine import Simulation
from sidecar.sim.loader import load_scenario, parse_scenario
from sidecar.sim.replica_spec import ReplicaSpec
from sidecar.sim.replicas import compare
from sidecar.sim.validate import ScenarioError

SCENARIOS = Path(__file__).resolve().parents[1] / "sidecar" / "sim" / "scenarios"


def test_shared_replicas_detect_like_one_and_isolated_ones_lag() -> None:
    """The acceptance of fleet mode in the lab, on the shipped sustained tail (shortened
    to 150 s of tail): 4 replicas with a quarter of the traffic each."""
    sc = load_scenario(SCENARIOS / "sustained_tail.yaml", duration=330)
    modes = compare(sc, count=4, push_interval_s=1.0)["modes"]
    single = modes["single"]["detect_s"]
    assert single is not None
    assert modes["shared"]["detect_s"] is not None
    assert modes["shared"]["detect_s"] <= 1.25 * single
    # Every isolated replica needs at least twice as long, or never detects in the run.
    per = modes["isolated"]["events"][0]["per_replica_s"]
    assert all(d is None or d >= 2 * single for d in per)
    assert modes["shared"]["violations"] <= modes["isolated"]["violations"]


def test_replicas_field_parses_and_runs_deterministically() -> None:
    data = tiny()
    data["replicas"] = {"count": 3, "state": "shared", "push_interval_s": 0.5}
    sc = parse_scenario(data, "t.yaml")
    assert sc.replicas == ReplicaSpec(3, "shared", 0.5)
    a = Simulation(sc, "tailroute").run()
    b = Simulation(sc, "tailroute").run()
    assert a == b and a["policy_stats"]["replicas"]["count"] == 3
    assert Simulation(dataclasses.replace(sc, replicas=ReplicaSpec(2)), "round_robin").run()


@pytest.mark.parametrize(("value", "message"), [
    (0, "replicas.count: must be an integer in 1..64"),
    ({"count": 2, "state": "both"}, "replicas.state: must be shared or isolated"),
    ({"count": 2, "push": 1}, "replicas: unknown field(s): push"),
    ("four", "replicas: must be a replica count"),
])
def test_bad_replicas_field_names_file_and_field(value: object, message: str) -> None:
    data = tiny()
    data["replicas"] = value
    with pytest.raises(ScenarioError, match=re.escape(f"t.yaml: {message}")):
        parse_scenario(data, "t.yaml")
