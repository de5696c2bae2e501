"""The semantic-router latency_aware formula on table-driven cases."""

from __future__ import annotations

import pytest

from sidecar.core.latency_aware import latency_aware_scores, pick_lowest

N = None


@pytest.mark.parametrize(
    ("values", "metrics", "expected_scores", "winner", "reason"),
    [
        # both metrics: mean of the ratios to the best
        ({"a": {"ttft": 0.2, "tpot": 0.02}, "b": {"ttft": 0.1, "tpot": 0.04}},
         ["ttft", "tpot"], {"a": 1.5, "b": 1.5}, "a", "scored"),  # tie: first candidate
        ({"a": {"ttft": 0.2, "tpot": 0.02}, "b": {"ttft": 0.1, "tpot": 0.02}},
         ["ttft", "tpot"], {"a": 1.5, "b": 1.0}, "b", "scored"),
        # one metric only
        ({"a": {"ttft": 0.3}, "b": {"ttft": 0.1}, "c": {"ttft": 0.2}},
         ["ttft"], {"a": 3.0, "b": 1.0, "c": 2.0}, "b", "scored"),
        ({"a": {"tpot": 0.01}, "b": {"tpot": 0.02}}, ["tpot"], {"a": 1.0, "b": 2.0}, "a", "scored"),
        # missing data: incomplete candidates are skipped, not penalised
        ({"a": {"ttft": N, "tpot": 0.01}, "b": {"ttft": 0.5, "tpot": 0.02}},
         ["ttft", "tpot"], {"b": 1.0}, "b", "scored"),
        # nobody has data -> first candidate
        ({"a": {"ttft": N}, "b": {"ttft": N}}, ["ttft"], {}, "a", "no_data"),
        # no percentile configured -> first candidate
        ({"a": {"ttft": 0.1}, "b": {"ttft": 0.05}}, [], {}, "a", "no_percentile"),
        # zero latency must not divide by zero
        ({"a": {"ttft": 0.0}, "b": {"ttft": 0.1}}, ["ttft"], None, "a", "scored"),
    ],
)
def test_latency_aware(values: dict[str, dict[str, float | None]], metrics: list[str],
                       expected_scores: dict[str, float] | None, winner: str,
                       reason: str) -> None:
    cands = list(values)
    result = latency_aware_scores(cands, values, metrics)
    assert result.reason == reason
    if expected_scores is not None:
        assert result.scores == pytest.approx(expected_scores)
    assert pick_lowest(cands, result.scores) == winner
