"""Comparing a real run with the simulator's runs: the compared figures and their
tolerances.

Part of :mod:`sidecar.sim.realtime` (split for size).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

from sidecar.sim.realtime_scenario import plan_traffic
from sidecar.sim.scenario import Scenario
from sidecar.sim.validate import ScenarioError

# ---------------------------------------------------------------- comparison


@dataclass(frozen=True, slots=True)
class Tolerances:
    """How far the real run may be from the simulator's mean over its noise seeds.

    Chosen from measured spreads (docs/policy-lab.md, "Validation against the
    real Envoy"): about 3.5 standard deviations of the run-to-run spread of each
    figure, so that a faithful real run fails with well under 1 % probability
    while a policy that does not move traffic off the degraded provider fails.
    The per-bucket share is the coarse shape check (5 s buckets of ~60 attempts
    swing by 10-15 pp from run to run, and the bucket holding the event start
    runs ~12 pp higher in real runs); the before/after windows are the fine one.
    """

    violation_pp: float = 4.0  # SLO violation rate of every class, percentage points
    ttft_p50_rel: float = 0.15  # TTFT p50 of every streaming class, relative
    # TTFT p95 of every streaming class, relative: 3.5 sd of the real spread was 35 %,
    # but since pooling the simulator reads this tail ~22 % lower than real runs do
    # (docs/policy-lab.md, "Validation against the real Envoy": not traced).
    ttft_p95_rel: float = 0.50
    share_before_pp: float = 25.0  # share of the degraded provider before the event
    share_after_pp: float = 7.0  # ... after the event (from one bucket after its start)
    bucket_share_pp: float = 40.0  # ... in each time bucket of the all-class series (coarse)


#: A class's share of traffic is compared over a window only when the plan sends
#: at least this many of its calls there (fewer: binomial noise alone is > +-5 pp).
MIN_WINDOW_CALLS: Final = 100


@dataclass(frozen=True, slots=True)
class Figure:
    """One compared metric: the simulator's mean and range over its runs, the real value."""

    name: str
    sim: float
    sim_lo: float
    sim_hi: float
    real: float
    tolerance: float  # absolute (rates, shares) or relative to ``sim`` (latencies)
    relative: bool = False

    @property
    def diff(self) -> float:
        if self.relative:
            return abs(self.real - self.sim) / self.sim if self.sim else math.inf
        return abs(self.real - self.sim)

    @property
    def ok(self) -> bool:
        return self.diff <= self.tolerance

    def line(self) -> str:
        """``name  sim MEAN [LO..HI]  real X  diff D (tol T)  ok|FAIL``, in ms, % or pp."""
        if self.relative:
            vals = [f"{v:.0f}" for v in (self.sim, self.sim_lo, self.sim_hi, self.real)]
            d, t, unit = self.diff * 100, self.tolerance * 100, "%"
        else:
            vals = [f"{v * 100:.1f}%" for v in (self.sim, self.sim_lo, self.sim_hi, self.real)]
            d, t, unit = self.diff * 100, self.tolerance * 100, "pp"
        return (f"{self.name:<38} sim {vals[0]:>6} [{vals[1]}..{vals[2]}]  real {vals[3]:>6}  "
                f"diff {d:4.1f}{unit} (tol {t:g}{unit})  {'ok' if self.ok else 'FAIL'}")

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "sim": round(self.sim, 4), "sim_lo": round(self.sim_lo, 4),
                "sim_hi": round(self.sim_hi, 4), "real": round(self.real, 4),
                "diff": round(self.diff, 4), "tolerance": self.tolerance,
                "relative": self.relative, "ok": self.ok}


def degraded_provider(sc: Scenario) -> tuple[str, float, float]:
    """The first event's provider and its first window (clipped to the run)."""
    if not sc.events:
        raise ScenarioError(f"{sc.source}: validation needs a degradation event")
    e = sc.events[0]
    lo, hi = e.windows(sc.duration)[0]
    return e.provider, lo, hi


def window_share(run: Mapping[str, Any], cluster: str, lo: float, hi: float,
                 klass: str | None = None) -> float:
    """Share of ``cluster`` among the attempts (of ``klass``, or all) sent in ``[lo, hi)``."""
    sel = [c for t, k, c in run["attempt_log"] if lo <= t < hi and (klass is None or k == klass)]
    return sum(1 for c in sel if c == cluster) / len(sel) if sel else 0.0


def _class_metric(klass: str, key: str, sub: str | None, run: Mapping[str, Any]) -> float:
    v = run["classes"][klass][key]
    return float(v if sub is None else v[sub])


def _bucket_share(cluster: str, i: int, run: Mapping[str, Any]) -> float:
    return float(run["series"]["share"][cluster][i])


def figures(sc: Scenario, sims: Sequence[Mapping[str, Any]], real: Mapping[str, Any],
            tol: Tolerances | None = None) -> list[Figure]:
    """The compared metrics of ``real`` against the simulator runs ``sims``.

    * SLO violation rate of every class;
    * TTFT p50 and p95 of every streaming class (a non-streaming call's TTFT is
      its whole duration: a token-count statistic more than a latency one);
    * share of the degraded provider (first event) among all attempts and among
      each class's, before the event (from the warm-up) and after it (from one
      bucket after its start), for classes with >= ``MIN_WINDOW_CALLS`` planned
      calls in the window;
    * share of the degraded provider in each time bucket (``series.share``).
    """
    tol = tol or Tolerances()
    out: list[Figure] = []

    def fig(name: str, get: Callable[[Mapping[str, Any]], float], tolerance: float,
            relative: bool = False) -> None:
        vals = [get(s) for s in sims]
        out.append(Figure(name, statistics.fmean(vals), min(vals), max(vals), get(real),
                          tolerance, relative))

    streaming = {w.klass for w in sc.workloads if w.stream}
    for klass in [c.name for c in sc.config.classes]:
        if klass not in real["classes"] or any(klass not in s["classes"] for s in sims):
            continue
        fig(f"violation_rate[{klass}]",
            partial(_class_metric, klass, "violation_rate", None), tol.violation_pp / 100)
        if klass in streaming:
            fig(f"ttft_p50_ms[{klass}]",
                partial(_class_metric, klass, "ttft_ms", "p50"), tol.ttft_p50_rel, True)
            fig(f"ttft_p95_ms[{klass}]",
                partial(_class_metric, klass, "ttft_ms", "p95"), tol.ttft_p95_rel, True)
    prov, lo, hi = degraded_provider(sc)
    windows = (("before event", sc.warmup, lo, tol.share_before_pp),
               ("after event", lo + sc.bucket, min(hi, sc.duration), tol.share_after_pp))
    plan = plan_traffic(sc)
    for label, w_lo, w_hi, t in windows:
        if w_hi <= w_lo:
            continue
        fig(f"share[{prov},all] {label}",
            partial(window_share, cluster=prov, lo=w_lo, hi=w_hi), t / 100)
        for klass in dict.fromkeys(w.klass for w in sc.workloads):
            n = sum(1 for p in plan if p.wl.klass == klass and w_lo <= p.t < w_hi)
            if n >= MIN_WINDOW_CALLS:
                fig(f"share[{prov},{klass}] {label}",
                    partial(window_share, cluster=prov, lo=w_lo, hi=w_hi, klass=klass),
                    t / 100)
    for i, ts in enumerate(real["series"]["t"]):
        fig(f"share[{prov},all] bucket {ts:g}s", partial(_bucket_share, prov, i),
            tol.bucket_share_pp / 100)
    return out
