"""Lab metrics: groupings per workload, slice and profile; series; route flips."""

from __future__ import annotations

from typing import Any

import pytest
from test_sim_fixtures import tiny, tiny_scenario

from sidecar.core.types import SliceKey
from sidecar.sim.engine import run_once
from sidecar.sim.loader import parse_scenario
from sidecar.sim.metrics import Metrics
from sidecar.sim.metrics_summary import route_flips


def _two_workloads() -> dict[str, Any]:
    data = tiny()
    data["workloads"].append({
        "name": "essays", "class": "interactive",
        "arrival": {"process": "poisson", "rate_per_s": 1},
        "input_tokens": 300, "output_tokens": {"median": 600, "p99": 1500},
        "max_tokens": 2048})
    data["workloads"][0]["max_tokens"] = 256
    return data


def test_calls_are_grouped_by_workload_slice_and_profile() -> None:
    out = run_once(parse_scenario(_two_workloads(), "t.yaml"), "round_robin")
    cls = out["classes"]["interactive"]
    wls = out["workloads"]
    assert set(wls) == {"chat", "essays"}
    assert wls["chat"]["calls"] + wls["essays"]["calls"] == cls["calls"]
    assert wls["chat"]["violations"] + wls["essays"]["violations"] == cls["violations"]
    assert {"short", "long"} <= set(out["profiles"])  # chat is short (a few medium)
    slices = out["slices"]
    assert "m|interactive|long|stream" in slices  # essays declare 2048 tokens
    assert sum(s["calls"] for s in slices.values()) == cls["calls"]
    assert sum(p["scored"] for p in out["profiles"].values()) == cls["scored"]
    shares = out["slice_traffic_share"]["m|interactive|long|stream"]
    assert set(shares) == {"a", "b", "c"} and sum(shares.values()) == pytest.approx(1, abs=1e-3)


def test_series_hold_violation_rates_slice_shares_and_route_states() -> None:
    sc = tiny_scenario(duration_s=120, events=[{"provider": "a", "at_s": 20, "outage": True}])
    out = run_once(sc, "tailroute")
    ser = out["series"]
    n = len(ser["t"])
    assert len(ser["violation_rate"]["interactive"]) == n
    sl = ser["slices"]["m|interactive|short|stream"]
    assert len(sl["attempts"]) == n
    for b in range(n):
        if sl["attempts"][b]:
            assert sum(v[b] for v in sl["share"].values()) == pytest.approx(1.0, abs=1e-3)
    states = ser["route_state"]["m|interactive|short|stream"]
    assert set(states) == {"a", "b", "c"}
    assert states["a"]["state"][0] == "healthy"
    assert "quarantined" in states["a"]["state"]  # the router noticed the outage
    assert states["a"]["weight"][-1] == 0.0
    assert all(0.0 <= w <= 1.0 for w in states["b"]["weight"] if w is not None)
    assert "route_state" not in run_once(sc, "round_robin")["series"]


# ---------------------------------------------------------------- route flips


def _metrics_with(buckets: list[dict[str, int]]) -> Metrics:
    sc = tiny_scenario()
    m = Metrics(sc.config, 0.0, 10.0 * len(buckets), 10.0, 10.0 * len(buckets))
    sk = SliceKey("m", "interactive", "short", True)
    rows: dict[str, list[int]] = {}
    for b, counts in enumerate(buckets):
        for c, n in counts.items():
            rows.setdefault(c, [0] * m.n_buckets)[b] = n
    m.rows[sk] = rows
    return m


@pytest.mark.parametrize(
    ("buckets", "flips"),
    [
        # a steady split: no flip
        ([{"a": 50, "b": 50}] * 4, 0),
        # noise around an even split (what a random picker does): no flip
        ([{"a": 28, "b": 22}, {"a": 21, "b": 29}, {"a": 27, "b": 23}, {"a": 22, "b": 28}], 0),
        # one decisive move away from a: one flip (a reaction counts once)
        ([{"a": 50, "b": 50}, {"a": 50, "b": 50}, {"a": 5, "b": 95}, {"a": 4, "b": 96}], 1),
        # oscillation between a and b, never a strict majority change on 3 routes: flips
        ([{"a": 45, "b": 10, "c": 45}, {"a": 10, "b": 45, "c": 45}] * 2, 3),
        # too few attempts to judge a bucket: skipped
        ([{"a": 10, "b": 0}, {"a": 0, "b": 10}, {"a": 10, "b": 0}], 0),
        # a quiet bucket in between does not hide the move
        ([{"a": 60, "b": 0}, {"a": 3, "b": 2}, {"a": 0, "b": 60}], 1),
    ],
)
def test_route_flips_count_significant_repointings(buckets: list[dict[str, int]],
                                                   flips: int) -> None:
    m = _metrics_with(buckets)
    assert route_flips(m, 0, len(buckets)) == flips
