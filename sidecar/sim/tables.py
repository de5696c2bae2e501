"""Human-readable tables of a results document: plain text (CLI) and markdown (report)."""

from __future__ import annotations

from typing import Any, Final


def _classes(sc: dict[str, Any]) -> list[str]:
    names: list[str] = []
    for r in sc["policies"].values():
        for c in r["classes"]:
            if c not in names:
                names.append(c)
    return names


def _rate(r: dict[str, Any], key: str) -> float:
    tot = sum(c["scored"] for c in r["classes"].values())
    if not tot:
        return 0.0
    return float(sum(c[key] * c["scored"] for c in r["classes"].values()) / tot)


def _wf(r: dict[str, Any]) -> str:
    started = sum(c.get("workflows", {}).get("started", 0) for c in r["classes"].values())
    done = sum(c.get("workflows", {}).get("completed", 0) for c in r["classes"].values())
    return f"{done}/{started}" if started else "-"


def _cost(r: dict[str, Any]) -> str:
    vals = [c["cost_per_completed"] for c in r["classes"].values()
            if c.get("cost_per_completed") is not None]
    return "-" if not vals else "/".join(f"{v:.2f}" for v in vals)


def rows(sc: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of one scenario's table (one row per policy)."""
    classes = _classes(sc)
    header = ["policy", *[f"{c} viol." for c in classes], "timeouts", "errors",
              "flips", "fallback sat.", "on degraded", "workflows", "cost/done"]
    out = []
    for pol, r in sc["policies"].items():
        cells = [pol]
        for c in classes:
            cr = r["classes"].get(c)
            cells.append("-" if cr is None else
                         f"{cr['violations']} ({cr['violation_rate'] * 100:.1f}%)")
        cells += [
            f"{_rate(r, 'timeout_rate') * 100:.1f}%",
            f"{_rate(r, 'error_rate') * 100:.1f}%",
            str(r["route_flips"]),
            f"{r['fallback_saturation']:.2f}",
            f"{r['degraded_share'] * 100:.1f}%",
            _wf(r),
            _cost(r),
        ]
        out.append(cells)
    return header, out


# Printed once under the text tables (docs/policy-lab.md has the full definitions).
LEGEND: Final = """\
columns (per policy; rates are shares of scored calls):
  <class> viol.  calls of that class that missed their SLO, count (rate)
  timeouts, errors  over all classes
  flips          significant re-pointings of a slice's traffic between time buckets
                 (oscillation; docs/policy-lab.md, Metrics)
  fallback sat.  peak (in service + queued) / capacity on clusters never a model's first
                 candidate; above 1 the fallback was overloaded
  on degraded    share of attempts served while a degradation event matched them
  workflows      completed / started;  cost/done  cost per completed call, per class in order
summary: SLO violation rates over all classes of the scenario together; tailroute/best =
  tailroute's rate / the best baseline's (lower is better); gap closed = share of the
  best-baseline -> (hindsight) oracle distance tailroute covers"""


def summary_line(s: dict[str, Any]) -> str:
    if s.get("best_baseline") is None:
        return "summary: no baseline in this run"
    rel, gap = s.get("relative_violations"), s.get("gap_closed")
    rates = s["violation_rate"]
    parts = [f"best baseline {s['best_baseline']} ({rates[s['best_baseline']] * 100:.2f}%)"]
    if "tailroute" in rates:
        parts.append(f"tailroute {rates['tailroute'] * 100:.2f}%")
    if "oracle" in rates:
        parts.append(f"oracle {rates['oracle'] * 100:.2f}%")
    if rel is not None:
        parts.append(f"tailroute/best = {rel:.2f}")
    if gap is not None:
        parts.append(f"gap closed = {gap * 100:.0f}%")
    return "summary (all classes): " + ", ".join(parts)


def suite_lines(s: dict[str, Any]) -> list[str]:
    out = [f"suite: {s['scenarios']} scenario(s)", *_figure_lines(s)]
    if "routing_only" in s:
        r = s["routing_only"]
        out.append(f"routing-only scenarios (without those tagged admission): {r['scenarios']}")
        out += ["  " + x for x in _figure_lines(r)]
    return out


def _figure_lines(s: dict[str, Any]) -> list[str]:
    out: list[str] = []
    if s.get("relative_violations_vs_best_per_scenario") is not None:
        out.append(
            "tailroute SLO violations relative to the best baseline of each scenario: "
            f"{s['relative_violations_vs_best_per_scenario']:.2f}"
            + _gap_text(s.get("gap_closed_vs_best_per_scenario"))
        )
    if s.get("best_single_baseline") and s.get("relative_violations_vs_best_single") is not None:
        out.append(
            f"... relative to the best single baseline ({s['best_single_baseline']}): "
            f"{s['relative_violations_vs_best_single']:.2f}"
            + _gap_text(s.get("gap_closed_vs_best_single"))
        )
    if s.get("scenarios_tailroute_at_least_as_good") is not None:
        out.append(f"scenarios where tailroute is at least as good as the best baseline: "
                   f"{s['scenarios_tailroute_at_least_as_good']}/{s['scenarios']}")
    return out


def _gap_text(gap: float | None) -> str:
    if gap is None:
        return ""
    return f"; share of the best-baseline->oracle gap closed: {gap * 100:.0f}%"


def text_table(sc: dict[str, Any]) -> str:
    header, body = rows(sc)
    widths = [max(len(x[i]) for x in [header, *body]) for i in range(len(header))]
    draws = max((r.get("noise_draws", {}).get("draws", 1) for r in sc["policies"].values()),
                default=1)
    pooled = f"; {draws} noise draws: rows are the first, the summary pools all" \
        if draws > 1 else ""
    lines = [f"== {sc['name']} (seed {sc['seed']}, {sc['duration_s']:g} s, "
             f"warm-up {sc['warmup_s']:g} s{pooled}) =="]
    fmt = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    lines.append(fmt.format(*header))
    lines += [fmt.format(*r) for r in body]
    lines.append(summary_line(sc["summary"]))
    return "\n".join(lines)


def markdown_table(sc: dict[str, Any]) -> str:
    header, body = rows(sc)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def markdown_suite_table(doc: dict[str, Any]) -> str:
    """Scenario x policy: SLO violation rate per class (the closing-note table)."""
    policies: list[str] = []
    for sc in doc["scenarios"]:
        for p in sc["policies"]:
            if p not in policies:
                policies.append(p)
    lines = ["| scenario | class | " + " | ".join(policies) + " |",
             "|---|---|" + "---|" * len(policies)]
    for sc in doc["scenarios"]:
        for c in _classes(sc):
            cells = []
            for p in policies:
                cr = sc["policies"].get(p, {}).get("classes", {}).get(c)
                cells.append("-" if cr is None else f"{cr['violation_rate'] * 100:.1f}%")
            lines.append(f"| {sc['name']} | {c} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
