"""The semantic-router ``latency_aware`` score, as a pure function.

For each enabled metric m (TTFT at ``ttft_percentile``, TPOT at
``tpot_percentile``), among candidates that have a value for *every* enabled
metric ("complete data"):

    ratio_m(c) = value_m(c) / min_{c' complete} value_m(c')
    score(c)   = mean_m ratio_m(c)

Lower is better; the best candidate scores 1.0. Candidates without complete
data get no score (``None``). With no metric enabled, or no candidate with
complete data, there is nothing to rank and callers fall back to the first
candidate (``reason`` tells which). That is the compatible score (the
``lowest_score`` picker, :mod:`sidecar.core.compat_sr`); the weights of tailroute's
own pipeline use :func:`partial_ratios`, which keeps a route's evidence on one
metric when it lacks the other.
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


def partial_ratios(
    candidates: Sequence[str],
    values: Mapping[str, Mapping[str, float | None]],
    metrics: Sequence[str],
) -> dict[str, float]:
    """The ratio of every candidate that has a value for at least one metric::

        known_m  = the candidates with a value for m (a metric none has is left out)
        v_m(c)   = value_m(c), or max over known_m of value_m   (missing = the worst known)
        r(c)     = mean over the metrics left of v_m(c) / min over known_m of value_m
        ratio(c) = r(c) for a candidate with every metric left (complete),
                   max(r(c), max over complete c' of r(c')) for one lacking some

    so a missing metric never makes a route look better than the worst route that has
    them all (a blind route's TPOT alone, say), while what it does know can make it
    look worse. The same as :func:`latency_aware_scores` when every candidate has
    complete data.
    tailroute's weights use this, not the complete-data rule: TPOT needs ``usage`` in
    the stream (opt-in for OpenAI clients) and, in native mode, comes from
    ``envoy.usage_sample`` of the requests, so a route down-weighted for a slow first
    token gathers TTFT samples faster than TPOT ones. Under the complete-data rule its
    TPOT falling short of ``min_samples`` dropped its TTFT evidence too, and it scored as
    the worst route *with* data (seen: a cluster 15x slower to the first token went from
    2.5 % of the weight to a third for a second or two whenever that happened); with no
    TPOT anywhere, no route had a score at all.
    """
    known = {m: [float(v) for c in candidates
                 if (v := values.get(c, {}).get(m)) is not None] for m in metrics}
    used = [m for m in metrics if known[m]]
    best = {m: max(min(known[m]), _EPS) for m in used}
    worst = {m: max(known[m]) for m in used}
    out: dict[str, float] = {}
    partial: set[str] = set()
    for c in candidates:
        own = values.get(c, {})
        missing = sum(own.get(m) is None for m in used)
        if missing == len(used):
            continue  # no evidence at all: the caller's rule for unknown routes
        if missing:
            partial.add(c)
        out[c] = sum(max(float(v) if (v := own.get(m)) is not None else worst[m], _EPS)
                     / best[m] for m in used) / len(used)
    floor = max((r for c, r in out.items() if c not in partial), default=0.0)
    for c in partial:
        out[c] = max(out[c], floor)
    return out


def pick_lowest(candidates: Sequence[str], scores: Mapping[str, float]) -> str:
    """Lowest score wins; ties go to the earlier candidate (config order)."""
    best = candidates[0]
    best_score = float("inf")
    for c in candidates:
        s = scores.get(c)
        if s is not None and s < best_score:
            best, best_score = c, s
    return best if best_score != float("inf") else candidates[0]
