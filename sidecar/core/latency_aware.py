"""The semantic-router ``latency_aware`` score, as a pure function.

For each enabled metric m (TTFT at ``ttft_percentile``, TPOT at
``tpot_percentile``), among candidates that have a value for *every* enabled
metric ("complete data"):

    ratio_m(c) = value_m(c) / min_{c' complete} value_m(c')
    score(c)   = mean_m ratio_m(c)

Lower is better; the best candidate scores 1.0. Candidates without complete
data get no score (``None``). With no metric enabled, or no candidate with
complete data, there is nothing to rank and callers fall back to the first
candidate (``reason`` tells which).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from sidecar.core.config import LatencyAwareConfig

_EPS: Final = 1e-9  # a zero best value (sub-resolution) must not divide by zero


@dataclass(frozen=True, slots=True)
class LatencyScores:
    scores: dict[str, float]  # only candidates with complete data
    reason: str  # "scored", "no_percentile" or "no_data"


def enabled_metrics(cfg: LatencyAwareConfig) -> tuple[tuple[str, int], ...]:
    """(metric, percentile) pairs that are switched on, TTFT first."""
    out: list[tuple[str, int]] = []
    if cfg.ttft_percentile is not None:
        out.append(("ttft", cfg.ttft_percentile))
    if cfg.tpot_percentile is not None:
        out.append(("tpot", cfg.tpot_percentile))
    return tuple(out)


def latency_aware_scores(
    candidates: Sequence[str],
    values: Mapping[str, Mapping[str, float | None]],
    metrics: Sequence[str],
) -> LatencyScores:
    """Score ``candidates`` from ``values[cluster][metric]`` (None = no data)."""
    if not metrics:
        return LatencyScores({}, "no_percentile")
    complete = [
        c for c in candidates if all(values.get(c, {}).get(m) is not None for m in metrics)
    ]
    if not complete:
        return LatencyScores({}, "no_data")
    best = {m: max(min(float(values[c][m] or 0.0) for c in complete), _EPS) for m in metrics}
    scores = {
        c: sum(max(float(values[c][m] or 0.0), _EPS) / best[m] for m in metrics) / len(metrics)
        for c in complete
    }
    return LatencyScores(scores, "scored")


def pick_lowest(candidates: Sequence[str], scores: Mapping[str, float]) -> str:
    """Lowest score wins; ties go to the earlier candidate (config order)."""
    best = candidates[0]
    best_score = float("inf")
    for c in candidates:
        s = scores.get(c)
        if s is not None and s < best_score:
            best, best_score = c, s
    return best if best_score != float("inf") else candidates[0]
