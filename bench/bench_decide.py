"""Microbenchmark of the decision path: ``Router.decide`` for three candidates (not a test).

Usage::

    python bench/bench_decide.py [--requests N] [--rate R] [--repeat K]

A router with three candidate clusters is warmed with a minute of steady
traffic (interactive streams, R requests/s, every response observed), then
decisions are timed one by one (``time.perf_counter_ns``) while traffic goes
on: between two decisions the simulated clock advances by ``1/R`` and the
previous request's outcome is observed, so plans and evidence are rebuilt as
often as they would be in production. Printed, per variant, the median and
p99 of a decision and the observe/started/finished cost per request, in the
same run:

* ``tailroute``            -- the router as shipped (plans cached);
* ``tailroute, no plans``  -- the same pipeline rebuilt for every request
  (the previous design's per-request work, for comparison);
* ``least_inflight``       -- the simplest strong baseline of the policy lab.

Figures on a shared machine are noisy: compare the ratios within one run.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sidecar.core.config import Config, parse_config  # noqa: E402
from sidecar.core.router import Router  # noqa: E402
from sidecar.core.types import Observation, RequestInfo, SliceKey  # noqa: E402

SLICE = SliceKey("m", "interactive", "short", True)


def config() -> Config:
    return parse_config({
        "default_cluster": "a",
        "clusters": [{"name": n, "address": f"127.0.0.1:{9001 + i}", "models": ["m"]}
                     for i, n in enumerate("abc")],
        "models": [{"name": "m", "candidates": ["a", "b", "c"]}],
    }, "bench.yaml")


def request(i: int) -> RequestInfo:
    return RequestInfo("chat", "m", True, 200, 300, "interactive", 10, None, SLICE,
                       request_id=f"r{i}")


def observation(cluster: str, rng: random.Random) -> Observation:
    base = {"a": 0.3, "b": 0.4, "c": 0.5}[cluster]
    if rng.random() < 0.01:
        return Observation(cluster, SLICE, "error", status=503)
    ttft = base * rng.lognormvariate(0.0, 0.4)
    return Observation(cluster, SLICE, "ok", ttft_s=ttft, tpot_s=0.02 * rng.lognormvariate(0, 0.2),
                       e2e_s=ttft + 3.0, output_tokens=150)


class _NoPlans(Router):
    """The pipeline rebuilt for every request (what every decision cost before plans)."""

    def _plan(self, *args: Any, **kw: Any) -> Any:
        self.plans.clear()
        return super()._plan(*args, **kw)


def _leastinflight() -> tuple[list[float], list[float]]:
    return [], []


def run(router_cls: type[Router], n: int, rate: float, seed: int) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    router = router_cls(config())
    now = 0.0
    step = 1.0 / rate
    i = 0
    while now < 60.0:  # warm: one minute of traffic
        d = router.decide(request(i), now, rng)
        router.started(d.cluster)
        router.finished(d.cluster)
        router.observe(observation(d.cluster, rng), now)
        if (t := router.next_deadline()) is not None and t <= now:
            router.tick(now)
        now += step
        i += 1
    decide_ns: list[int] = []
    after_ns: list[int] = []
    pc = time.perf_counter_ns
    for _ in range(n):
        req = request(i)
        t0 = pc()
        d = router.decide(req, now, rng)
        t1 = pc()
        router.started(d.cluster)
        router.finished(d.cluster)
        router.observe(observation(d.cluster, rng), now)
        t2 = pc()
        if (t := router.next_deadline()) is not None and t <= now:
            router.tick(now)
        decide_ns.append(t1 - t0)
        after_ns.append(t2 - t1)
        now += step
        i += 1
    return decide_ns, after_ns


def run_baseline(n: int, seed: int) -> list[int]:
    """``least_inflight``: fewest in flight, ties at random (sidecar.sim.policies.simple)."""
    rng = random.Random(seed)
    inflight = {"a": 0, "b": 0, "c": 0}
    cands = ("a", "b", "c")
    out: list[int] = []
    pc = time.perf_counter_ns
    for _ in range(n):
        t0 = pc()
        low = min(inflight[c] for c in cands)
        best = [c for c in cands if inflight[c] == low]
        choice = best[0] if len(best) == 1 else rng.choice(best)
        out.append(pc() - t0)
        inflight[choice] += 0
    return out


def _row(name: str, ns: list[int], after: list[int] | None, ref: float) -> str:
    med = statistics.median(ns) / 1000.0
    p99 = sorted(ns)[int(0.99 * (len(ns) - 1))] / 1000.0
    extra = f"{statistics.median(after) / 1000.0:>9.1f}" if after else f"{'-':>9}"
    return f"{name:<22} {med:>9.1f} {p99:>9.1f} {extra} {med / ref:>8.2f}x"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--rate", type=float, default=50.0, help="simulated requests per second")
    p.add_argument("--repeat", type=int, default=3, help="runs per variant (best median kept)")
    ns = p.parse_args(argv)
    results: dict[str, tuple[list[int], list[int] | None]] = {}
    for name, cls in (("tailroute", Router), ("tailroute, no plans", _NoPlans)):
        best: tuple[list[int], list[int]] | None = None
        for r in range(ns.repeat):
            got = run(cls, ns.requests, ns.rate, seed=r)
            if best is None or statistics.median(got[0]) < statistics.median(best[0]):
                best = got
        assert best is not None
        results[name] = best
    base = min((run_baseline(ns.requests, r) for r in range(ns.repeat)),
               key=statistics.median)
    results["least_inflight"] = (base, None)
    ref = statistics.median(results["tailroute"][0]) / 1000.0
    print(f"decide() for 3 candidates, {ns.requests} timed requests at {ns.rate:g} req/s "
          f"(simulated clock), best median of {ns.repeat}")
    print(f"{'variant':<22} {'median µs':>9} {'p99 µs':>9} {'obs µs':>9} {'vs first':>9}")
    for name, (d, a) in results.items():
        print(_row(name, d, a, ref))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
