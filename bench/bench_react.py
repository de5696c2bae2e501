"""Time-to-react figures of the named lab cases (not a test; docs/policy-lab.md quotes them).

Usage::

    python bench/bench_react.py [--seeds N]

Runs tailroute on the named cases of ``sidecar/sim/cases`` at several traffic
rates and seeds, from the router's own decision trace:

* ``outage`` (one of three providers answers every request with a fast 503):
  the share of the next 10 s of requests that still reached it, how many
  requests it took, when its circuit opened after the first failure, and
  whether it came back (share in the last 40 s);
* ``ttft_triples`` (one provider's TTFT x3 for 5 minutes): seconds until its
  latency-sensitive share is and stays below 20 % (windows of ~30 requests at
  0.5 req/s, ~50 at 5, ~250 at 50), and its share after the 2-minute /
  20-second mark;
* ``fast_errors``, ``slice_long_inputs``, ``heavy_tail``, ``relapse``: the
  figure each case's test asserts.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sidecar.sim.cases import load_case, share, time_to_react, trace_of, traced_run  # noqa: E402

ESCALATED = {"degraded", "restricted", "quarantined", "probing", "restoring"}


def _fmt(xs: list[float], unit: str = "") -> str:
    return f"median {statistics.median(xs):g}{unit} [{min(xs):g}..{max(xs):g}]" if xs else "-"


def outage(seeds: list[int]) -> None:
    print("outage (provider-b: fast 503s from t=120 s for 120 s; 3 providers)")
    for rate in (5, 20, 50):
        reached, sent, open_after, back = [], [], [], []
        for seed in seeds:
            _, sim = traced_run(load_case("outage", rate=rate, seed=seed))
            tr = trace_of(sim)
            s, _ = share(tr, "provider-b", 120, 130)
            reached.append(round(100 * s, 2))
            sent.append(sum(1 for r in tr if 120 <= r.t < 130 and r.cluster == "provider-b"))
            router = sim.policy.router  # type: ignore[attr-defined]
            ej = next(
                e.at
                for e in router.transitions
                if e.cluster == "provider-b" and e.new == "quarantined"
            )
            first = next(r.t for r in tr if r.t >= 120 and r.cluster == "provider-b")
            open_after.append(round(ej - first, 2))
            back.append(round(100 * share(tr, "provider-b", 380, 420)[0], 1))
        print(
            f"  {rate:>4g} req/s: next 10 s reaching b {_fmt(reached, ' %')}; "
            f"requests {_fmt(sent)}; circuit open {_fmt(open_after, ' s')} after the "
            f"first request sent into the outage; share at 380-420 s {_fmt(back, ' %')}"
        )


def ttft(seeds: list[int]) -> None:
    print("ttft_triples (provider-a TTFT x3 from t=600 s for 300 s)")
    for rate, mark, step in ((0.5, 120, 60.0), (5, 60, 10.0), (50, 20, 5.0)):
        react, after = [], []
        for seed in seeds:
            _, sim = traced_run(load_case("ttft_triples", rate=rate, seed=seed))
            tr = trace_of(sim)
            t = time_to_react(tr, "provider-a", 600, 900, 0.2, step)
            react.append(300.0 if t is None else t)
            after.append(round(100 * share(tr, "provider-a", 600 + mark, 900)[0], 1))
        print(
            f"  {rate:>4g} req/s: below 20 % within {_fmt(react, ' s')}; "
            f"share after {mark} s {_fmt(after, ' %')}"
        )


def others(seeds: list[int]) -> None:
    errs = [
        round(
            100
            * share(
                trace_of(traced_run(load_case("fast_errors", seed=s))[1]), "provider-c", 60, 600
            )[0],
            1,
        )
        for s in seeds
    ]
    print(f"fast_errors: share of the 30 %-failing provider {_fmt(errs, ' %')}")
    moved, stayed = [], []
    for s in seeds:
        tr = trace_of(traced_run(load_case("slice_long_inputs", seed=s))[1])
        moved.append(
            round(
                100 * share(tr, "provider-a", 480, 720, lambda r: r.slice.profile != "short")[0], 1
            )
        )
        b = share(tr, "provider-a", 60, 300, lambda r: r.slice.profile == "short")[0]
        a = share(tr, "provider-a", 300, 720, lambda r: r.slice.profile == "short")[0]
        stayed.append(round(100 * (a - b), 1))
    print(
        f"slice_long_inputs: long-input share on provider-a 3+ min after {_fmt(moved, ' %')}; "
        f"short share change {_fmt(stayed, ' pp')}"
    )
    bad = 0
    for s in seeds:
        out, _ = traced_run(load_case("heavy_tail", seed=s))
        bad += len(ESCALATED & set(out["policy_stats"]["transitions"]))
    print(f"heavy_tail: seeds with a transition beyond watching: {bad} of {len(seeds)}")
    for s in seeds[:3]:
        _, sim = traced_run(load_case("relapse", seed=s))
        tr = trace_of(sim)
        router = sim.policy.router  # type: ignore[attr-defined]
        ws = [
            round(next(r.weights["provider-b"] for r in reversed(tr) if r.t < e.at), 3)
            for e in router.transitions
            if e.cluster == "provider-b" and "relapse" in e.reason
        ]
        print(f"relapse (seed {s}): weight regained before each relapse {ws}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=5)
    ns = p.parse_args(argv)
    seeds = list(range(1, ns.seeds + 1))
    outage(seeds)
    ttft(seeds)
    others(seeds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
