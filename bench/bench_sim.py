"""Benchmark of the policy lab: simulated requests per wall-clock second (not a test).

Usage::

    python bench/bench_sim.py [--scenario FILE] [--duration S] [--repeat N] [--policy NAME ...]

Runs each policy on one scenario (default: the shipped ``sustained_tail``, stretched
to 3000 simulated seconds, ~40k requests) and prints the best of ``--repeat`` runs
as simulated requests (calls) per wall second and per CPU second, on one core, and
the CPU microseconds per request. ``round_robin`` decides in well under a
microsecond, so its time per request is the engine's own overhead (arrivals,
providers' sampling, clients, records, metrics and the summary). tailroute runs the
real decision core per request: its time minus that overhead is the core's. Every
policy runs ``--repeat`` times on the same scenario (tailroute takes a few
seconds per run at the default length); compare figures within one run, or
count instructions (callgrind) for a figure that a shared machine does not move.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sidecar.sim.engine import Simulation  # noqa: E402
from sidecar.sim.loader import load_scenario  # noqa: E402
from sidecar.sim.policies import BASELINES  # noqa: E402

DEFAULT = ROOT / "sidecar" / "sim" / "scenarios" / "sustained_tail.yaml"


def bench(path: Path, policy: str, duration: float, repeat: int) -> tuple[int, float, float]:
    """``(calls, best calls per wall second, best calls per CPU second)`` over the runs.

    CPU seconds (``time.process_time``) tell the single-core speed even when the
    machine is shared; wall seconds are what a user waits.
    """
    sc = load_scenario(path, duration=duration)
    best_wall = best_cpu = 0.0
    calls = 0
    for _ in range(repeat):
        sim = Simulation(sc, policy)
        w0, c0 = time.perf_counter(), time.process_time()
        out = sim.run()
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        calls = int(out["calls"])
        best_wall = max(best_wall, calls / wall)
        best_cpu = max(best_cpu, calls / max(cpu, 1e-9))
    return calls, best_wall, best_cpu


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", type=Path, default=DEFAULT)
    p.add_argument("--duration", type=float, default=3000.0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--policy", nargs="+", default=[*BASELINES, "oracle", "tailroute"])
    ns = p.parse_args(argv)
    print(f"scenario {ns.scenario.name}, {ns.duration:g} simulated s, best of {ns.repeat}")
    print(f"{'policy':<16} {'calls':>8} {'req/wall-s':>11} {'req/cpu-s':>10} {'us/req':>7}")
    overhead = None
    for pol in ns.policy:
        calls, wall, cpu = bench(ns.scenario, pol, ns.duration, ns.repeat)
        us = 1e6 / cpu
        if pol == "round_robin":
            overhead = us
        print(f"{pol:<16} {calls:>8} {wall:>11,.0f} {cpu:>10,.0f} {us:>7.1f}", flush=True)
    if overhead is not None:
        print(f"engine overhead per request (round_robin): {overhead:.1f} CPU-us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
