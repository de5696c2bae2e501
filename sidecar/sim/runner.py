"""Run scenarios x policies and summarise them (the JSON document, schema_version 2).

The document is a pure function of the scenario files, seeds and policy list
(no wall-clock values), so the same inputs give byte-identical JSON. Its
schema is documented in docs/policy-lab.md.

Summary figures (per scenario and for the suite), on *violation rates*
(violations / scored calls, all classes together):

* ``relative_violations`` = tailroute / best baseline, where the best
  baseline is the non-oracle, non-tailroute policy with the lowest rate
  (per scenario: the best one *for that scenario*, a hindsight choice that
  flatters the baselines; for the suite also against the single baseline that
  is best over the whole suite). Below 1: tailroute violates less.
* ``gap_closed`` = (best - tailroute) / (best - oracle): the share of the
  distance from the best baseline to the oracle that tailroute covers (1 =
  as good as the oracle, 0 = no better than the best baseline, negative =
  worse). Undefined (null) when the oracle is not better than the baseline.

Suite figures use the sum of per-scenario rates, so every scenario weighs the
same whatever its traffic volume.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from sidecar.sim.loader import load_scenario
from sidecar.sim.noise_draws import pooled_counts, run_draws
from sidecar.sim.policies import BASELINES, DEFAULT_POLICIES
from sidecar.sim.scenario import EventSpec, Scenario, Trace
from sidecar.sim.validate import ScenarioError

SCHEMA_VERSION: Final = 2
SHIPPED: Final = Path(__file__).parent / "scenarios"


class Progress:
    """Where long runs report progress: ``step`` per policy run, ``fraction`` within one."""

    def step(self, label: str) -> None:
        return None

    def fraction(self, label: str, frac: float) -> None:
        return None


class StderrProgress(Progress):
    """Progress on stderr: a line per run; live percentages only on a terminal."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()

    def step(self, label: str) -> None:
        sys.stderr.write(f"\r\x1b[K{label}" if self.tty else f"{label}\n")
        sys.stderr.flush()

    def fraction(self, label: str, frac: float) -> None:
        if self.tty:
            sys.stderr.write(f"\r\x1b[K{label} {frac * 100:5.1f}%")
            sys.stderr.flush()

    def done(self) -> None:
        if self.tty:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


def scenario_files(suite: str | Path | None) -> list[Path]:
    """The ``*.yaml`` files of a suite directory (default: the shipped scenarios), sorted."""
    d = Path(suite) if suite is not None else SHIPPED
    if d.is_file():
        return [d]
    files = sorted(d.glob("*.yaml")) + sorted(d.glob("*.yml"))
    if not files:
        raise FileNotFoundError(f"{d}: no scenario files (*.yaml)")
    return files


def policies_for(sc: Scenario, requested: Sequence[str] | None) -> list[str]:
    if requested:
        return list(dict.fromkeys(requested))
    return list(sc.policies or DEFAULT_POLICIES)


def run_scenario(sc: Scenario, policies: Sequence[str],
                 progress: Progress | None = None, noise_seeds: int = 1) -> dict[str, Any]:
    """Every policy on one scenario, plus the scenario's summary figures; with
    ``noise_seeds`` above 1 each policy's figures pool that many noise draws
    (:mod:`sidecar.sim.noise_draws`)."""
    results: dict[str, Any] = {}
    for i, pol in enumerate(policies):
        tick = None
        if progress is not None:
            label = f"{sc.name} [{i + 1}/{len(policies)}] {pol}"
            progress.step(label)
            tick = _fraction(progress, label)
        results[pol] = run_draws(sc, pol, noise_seeds, tick)
    return {
        "name": sc.name,
        "file": sc.source,
        "description": sc.description,
        "seed": sc.seed,
        "duration_s": sc.duration,
        "warmup_s": sc.warmup,
        "bucket_s": sc.bucket,
        "tags": list(sc.tags),
        "events": [_event_json(e, sc.duration) for e in sc.events],
        "policies": results,
        "summary": summarize(results),
    }


def _event_json(e: EventSpec, horizon: float) -> dict[str, Any]:
    m = e.match
    return {
        "provider": e.provider,
        "label": e.label,
        "windows": [[lo, hi] for lo, hi in e.windows(horizon)],
        "match": None if m is None else {
            "class": m.klass, "model": m.model, "stream": m.stream, "profile": m.profile,
            "min_input_tokens": m.min_input_tokens, "min_output_tokens": m.min_output_tokens},
    }


def _fraction(progress: Progress, label: str) -> Callable[[float], None]:
    def tick(frac: float) -> None:
        progress.fraction(label, frac)
    return tick


def run_suite(
    files: Sequence[Path],
    policies: Sequence[str] | None = None,
    *,
    seed: int | None = None,
    trace: str | Path | None = None,
    duration: float | None = None,
    progress: Progress | None = None,
    keep_going: bool = False,
    noise_seeds: int = 1,
) -> dict[str, Any]:
    """Load and run every scenario file; returns the whole JSON document.

    With ``keep_going`` a scenario that fails to load or run (say, its trace
    file is missing) is recorded under ``errors`` and the others still run;
    otherwise the :class:`ScenarioError` propagates.
    """
    scenarios = []
    errors = []
    for f in files:
        try:
            sc = load_scenario(f, seed=seed, trace=trace, duration=duration)
            check_inputs(sc)
            scenarios.append(run_scenario(sc, policies_for(sc, policies), progress,
                                          noise_seeds))
        except ScenarioError as exc:
            if not keep_going:
                raise
            errors.append({"file": str(f), "error": str(exc)})
    doc: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "scenarios": scenarios,
                           "summary": suite_summary(scenarios)}
    if errors:
        doc["errors"] = errors
    return doc


def check_inputs(sc: Scenario) -> None:
    """Fail early (before any policy runs) when a trace file is missing."""
    for i, wl in enumerate(sc.workloads):
        if isinstance(wl.arrival, Trace) and not wl.arrival.path.is_file():
            raise ScenarioError(
                f"{sc.source}: workloads[{i}].arrival.path: trace file not found: "
                f"{wl.arrival.path} (pass --trace PATH)")


# ---------------------------------------------------------------- summaries


def violation_rate(result: dict[str, Any]) -> float:
    """All classes together: violations / scored calls (pooled over the noise draws
    when there were several)."""
    scored, bad = pooled_counts(result)
    return bad / scored if scored else 0.0


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    rates = {p: round(violation_rate(r), 6) for p, r in results.items()}
    base = {p: v for p, v in rates.items() if p in BASELINES}
    out: dict[str, Any] = {"violation_rate": rates, "best_baseline": None,
                           "relative_violations": None, "gap_closed": None}
    if not base:
        return out
    best = min(base, key=lambda p: (base[p], p))
    out["best_baseline"] = best
    tail, oracle = rates.get("tailroute"), rates.get("oracle")
    out["relative_violations"] = _ratio(tail, base[best])
    out["gap_closed"] = _gap(base[best], tail, oracle)
    return out


def suite_summary(scenarios: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Suite figures over all scenarios, and again over the routing-only ones.

    Scenarios tagged ``admission`` measure admission control: there tailroute
    may shed low-priority work, which the (routing) oracle never does, so the
    oracle is no bound and "gap closed" is not meaningful; the ``routing_only``
    figures leave them out.
    """
    out = _suite_figures(scenarios)
    routing = [sc for sc in scenarios if "admission" not in sc.get("tags", [])]
    if len(routing) != len(scenarios):
        out["routing_only"] = _suite_figures(routing)
    return out


def _suite_figures(scenarios: Sequence[dict[str, Any]]) -> dict[str, Any]:
    totals: dict[str, float] = {}
    counts: dict[str, int] = {}
    best_sum = 0.0
    n_best = 0
    wins = 0
    for sc in scenarios:
        s = sc["summary"]
        for p, v in s["violation_rate"].items():
            totals[p] = totals.get(p, 0.0) + v
            counts[p] = counts.get(p, 0) + 1
        if s["best_baseline"] is not None and "tailroute" in s["violation_rate"]:
            best_sum += s["violation_rate"][s["best_baseline"]]
            n_best += 1
            wins += s["violation_rate"]["tailroute"] <= s["violation_rate"][s["best_baseline"]]
    n = len(scenarios)
    complete = {p: v for p, v in totals.items() if counts[p] == n}
    base = {p: v for p, v in complete.items() if p in BASELINES}
    tail, oracle = complete.get("tailroute"), complete.get("oracle")
    single = min(base, key=lambda p: (base[p], p)) if base else None
    return {
        "scenarios": n,
        "sum_violation_rate": {p: round(v, 6) for p, v in complete.items()},
        "relative_violations_vs_best_per_scenario": _ratio(tail, best_sum) if n_best == n
        else None,
        "gap_closed_vs_best_per_scenario": _gap(best_sum, tail, oracle) if n_best == n
        else None,
        "best_single_baseline": single,
        "relative_violations_vs_best_single": _ratio(tail, base[single]) if single else None,
        "gap_closed_vs_best_single": _gap(base[single], tail, oracle) if single else None,
        "scenarios_tailroute_at_least_as_good": wins if n_best == n else None,
    }


def _ratio(a: float | None, b: float) -> float | None:
    if a is None:
        return None
    if b <= 0:
        return None if a > 0 else 1.0
    return round(a / b, 4)


def _gap(best: float, tail: float | None, oracle: float | None) -> float | None:
    if tail is None or oracle is None or best - oracle <= 1e-9:
        return None
    return round((best - tail) / (best - oracle), 4)
