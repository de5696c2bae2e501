"""A simulation run pauses the cyclic garbage collector, which is safe only
because a run makes no reference cycles: what it allocates is freed by
reference counting as it goes (``Simulation.run``'s docstring)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.sim.engine import Simulation
from sidecar.sim.loader import load_scenario

SCENARIOS = Path(__file__).resolve().parents[1] / "sidecar" / "sim" / "scenarios"


@pytest.fixture
def collector_restored() -> Iterator[None]:
    was = gc.isenabled()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


def _cycles_after_run(name: str, policy: str, duration: float) -> tuple[int, int]:
    """(calls, objects the collector finds in cycles right after the run)."""
    sim = Simulation(load_scenario(SCENARIOS / f"{name}.yaml", duration=duration), policy)
    gc.collect()  # what building the simulation left (lazy imports, caches)
    out = sim.run()
    found = gc.collect()  # the simulation is still alive: only cycles the run made
    return int(out["calls"]), found


@pytest.mark.parametrize("enabled", [True, False])
def test_the_run_restores_the_collector_as_it_found_it(
    enabled: bool, collector_restored: None
) -> None:
    sc = load_scenario(SCENARIOS / "sustained_tail.yaml", duration=120)
    collections: list[int] = []

    def count(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    if enabled:
        gc.enable()
    else:
        gc.disable()
    sim = Simulation(sc, "tailroute")
    gc.callbacks.append(count)
    try:
        out = sim.run()
    finally:
        gc.callbacks.remove(count)
    assert out["calls"] > 1000  # enough allocations for gen-0 collections, had it run
    assert collections == []  # paused for the run
    assert gc.isenabled() is enabled


@pytest.mark.parametrize(("scenario", "policy"), [
    *((p.stem, "tailroute") for p in sorted(SCENARIOS.glob("*.yaml"))),
    ("trace_replay", "tailroute_native"),
    ("trace_replay", "tailroute_hybrid"),
    ("outage_recovery", "envoy_outlier"),
    ("agentic_fanout", "litellm"),
    ("overload", "oracle"),
])
def test_a_run_makes_no_reference_cycles(
    scenario: str, policy: str, collector_restored: None
) -> None:
    """Three times the simulated time leaves no more in cycles than the short
    run: nothing per request waits for the (paused) collector."""
    short_calls, short = _cycles_after_run(scenario, policy, 120)
    long_calls, long = _cycles_after_run(scenario, policy, 360)
    assert long_calls > 2 * short_calls
    assert long <= short + 50, (short, long)
