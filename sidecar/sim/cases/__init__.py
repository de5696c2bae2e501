"""Named lab cases: small scenarios that pin one behaviour each (issues 11 and 15).

Each YAML file here is a scenario in the usual format (docs/scenarios.md); they
are not part of the shipped suite (``sidecar/sim/scenarios``) but are run by
``tests/test_lab_cases.py`` and ``bench/bench_react.py``. The helpers load a
case with its traffic rate or seed changed, run tailroute with a decision
trace, and measure shares and reaction times from that trace.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sidecar.ops.config_file import read_yaml
from sidecar.sim.engine import Simulation
from sidecar.sim.loader import parse_scenario
from sidecar.sim.policies.tailroute import Tailroute, TraceRow
from sidecar.sim.scenario import Scenario
from sidecar.sim.validate import ScenarioError

CASES = Path(__file__).resolve().parent
Pred = Callable[[TraceRow], bool]


def load_case(name: str, *, rate: float | None = None, seed: int | None = None,
              **overrides: Any) -> Scenario:
    """``CASES/<name>.yaml`` with every workload's Poisson rate scaled so the first
    one runs at ``rate`` (others keep their proportion), and top-level overrides."""
    data = copy.deepcopy(read_yaml(CASES / f"{name}.yaml", "scenario", ScenarioError))
    if rate is not None:
        base = float(data["workloads"][0]["arrival"]["rate_per_s"])
        for wl in data["workloads"]:
            wl["arrival"]["rate_per_s"] = float(wl["arrival"]["rate_per_s"]) * rate / base
    data.update(overrides)
    return parse_scenario(data, str(CASES / f"{name}.yaml"), base=CASES, seed=seed)


def traced_run(sc: Scenario, policy: str = "tailroute") -> tuple[dict[str, Any], Simulation]:
    """Run ``sc``; tailroute records every routing answer in ``sim.policy.trace``."""
    sim = Simulation(sc, policy)
    if isinstance(sim.policy, Tailroute):
        sim.policy.trace = []
    return sim.run(), sim


def trace_of(sim: Simulation) -> list[TraceRow]:
    assert isinstance(sim.policy, Tailroute) and sim.policy.trace is not None
    return sim.policy.trace


def share(trace: Sequence[TraceRow], cluster: str, lo: float, hi: float,
          pred: Pred | None = None) -> tuple[float, int]:
    """Share of answers in ``[lo, hi)`` (matching ``pred``) that went to ``cluster``."""
    rows = [r for r in trace if lo <= r.t < hi and (pred is None or pred(r))]
    return sum(r.cluster == cluster for r in rows) / max(len(rows), 1), len(rows)


def time_to_react(trace: Sequence[TraceRow], cluster: str, start: float, end: float,
                  below: float, step: float, pred: Pred | None = None) -> float | None:
    """Seconds after ``start`` by which ``cluster``'s share, in windows of ``step``
    seconds, is and stays below ``below`` until ``end`` (the end of the first such
    window: an upper bound; None: it never settles)."""
    t = start
    settled: float | None = None
    while t < end:
        s, n = share(trace, cluster, t, min(t + step, end), pred)
        if n and s >= below:
            settled = None
        elif settled is None:
            settled = min(t + step, end)
        t += step
    return None if settled is None else settled - start
