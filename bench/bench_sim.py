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

``--compiled`` also runs every policy on the mypyc-compiled build of the same
sources (:mod:`sidecar.devtools.compiled`; built on first use, about two minutes)
in a child process, alternating with the interpreted runs, and prints the
compiled rows and the ratio compiled / interpreted per policy: the interpreted
run is the baseline measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if os.environ.get("TAILROUTE_COMPILED") != "1":  # the compiled child has its copy first
    sys.path.insert(0, str(ROOT))

from sidecar.devtools import compiled  # noqa: E402
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
    p.add_argument("--compiled", action="store_true",
                   help="also run on the mypyc-compiled build and print the ratio")
    p.add_argument("--one-json", action="store_true", help=argparse.SUPPRESS)  # the child
    ns = p.parse_args(argv)
    if ns.one_json:  # one policy, one run, as JSON (the compiled child)
        compiled.require()
        calls, wall, cpu = bench(ns.scenario, ns.policy[0], ns.duration, 1)
        print(json.dumps([calls, wall, cpu]))
        return 0
    src = compiled.ensure() if ns.compiled else None
    print(f"scenario {ns.scenario.name}, {ns.duration:g} simulated s, best of {ns.repeat}"
          + (", interpreted and compiled (mypyc) alternating" if src else ""))
    print(f"{'policy':<16} {'build':<11} {'calls':>8} {'req/wall-s':>11} {'req/cpu-s':>10} "
          f"{'us/req':>7}")
    overhead: dict[str, float] = {}
    for pol in ns.policy:
        rows: dict[str, tuple[int, float, float]] = {}
        for _ in range(ns.repeat):  # alternating, so drift on a shared machine hits both
            got = [("interpreted", bench(ns.scenario, pol, ns.duration, 1))]
            if src is not None:
                got.append(("compiled", _compiled_run(src, ns.scenario, pol, ns.duration)))
            for build, (calls, wall, cpu) in got:
                old = rows.get(build, (calls, 0.0, 0.0))
                rows[build] = (calls, max(old[1], wall), max(old[2], cpu))
        for build, (calls, wall, cpu) in rows.items():
            us = 1e6 / cpu
            if pol == "round_robin":
                overhead[build] = us
            print(f"{pol:<16} {build:<11} {calls:>8} {wall:>11,.0f} {cpu:>10,.0f} {us:>7.1f}",
                  flush=True)
        if "compiled" in rows:
            print(f"{pol:<16} compiled / interpreted: "
                  f"{rows['compiled'][2] / rows['interpreted'][2]:.2f}x req/cpu-s", flush=True)
    for build, us in overhead.items():
        print(f"engine overhead per request (round_robin, {build}): {us:.1f} CPU-us")
    return 0


def _compiled_run(src: Path, scenario: Path, policy: str, duration: float
                  ) -> tuple[int, float, float]:
    """One run of ``policy`` in a child process on the compiled build."""
    argv, env = compiled.child_command(src, [
        str(Path(__file__).resolve()), "--one-json", "--scenario", str(scenario),
        "--duration", str(duration), "--policy", policy])
    out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True).stdout
    calls, wall, cpu = json.loads(out)
    return int(calls), float(wall), float(cpu)


if __name__ == "__main__":
    raise SystemExit(main())
