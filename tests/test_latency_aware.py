"""The semantic-router latency_aware formula on table-driven cases."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core.latency_aware import latency_aware_scores, partial_ratios, pick_lowest

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


# ------------------------------------------------------------ partial_ratios
# tailroute's weights: a route keeps its evidence on the metric it has data for.

@pytest.mark.parametrize(
    ("values", "expected"),
    [
        # c: a first token 15x slower and too few TPOT samples yet -- judged on TTFT,
        # its TPOT taken as the worst known (before: no score, so the best's peer)
        ({"a": {"ttft": 0.03, "tpot": 0.003}, "b": {"ttft": 0.03, "tpot": 0.003},
          "c": {"ttft": 0.45, "tpot": N}}, {"a": 1.0, "b": 1.0, "c": 8.0}),
        # no TPOT anywhere (no usage in the streams): ranked on TTFT alone
        ({"a": {"ttft": 0.1, "tpot": N}, "b": {"ttft": 0.3, "tpot": N}},
         {"a": 1.0, "b": 3.0}),
        # a missing metric never makes a route look best on it
        ({"a": {"ttft": 0.1, "tpot": 0.02}, "b": {"ttft": 0.1, "tpot": N}},
         {"a": 1.0, "b": 1.0}),
        ({"a": {"ttft": 0.1, "tpot": 0.01}, "b": {"ttft": 0.1, "tpot": 0.03},
          "c": {"ttft": 0.1, "tpot": N}}, {"a": 1.0, "b": 2.0, "c": 2.0}),
        # ... nor better than the worst complete route (a blind route's TPOT alone)
        ({"a": {"ttft": 0.1, "tpot": 0.03}, "b": {"ttft": 0.1, "tpot": 0.01},
          "c": {"ttft": N, "tpot": 0.01}}, {"a": 2.0, "b": 1.0, "c": 2.0}),
        # no data at all: left to the caller's rule for unknown routes
        ({"a": {"ttft": 0.1, "tpot": 0.01}, "b": {"ttft": N, "tpot": N}}, {"a": 1.0}),
        ({"a": {"ttft": N}, "b": {"ttft": N}}, {}),
    ],
)
def test_partial_ratios(values: dict[str, dict[str, float | None]],
                        expected: dict[str, float]) -> None:
    metrics = list(next(iter(values.values())))
    assert partial_ratios(list(values), values, metrics) == pytest.approx(expected)


_value = st.one_of(st.none(), st.floats(1e-4, 10.0))
_table = st.dictionaries(st.sampled_from("abcde"),
                         st.fixed_dictionaries({"ttft": _value, "tpot": _value}), min_size=1)


@given(_table)
def test_partial_ratios_properties(values: dict[str, dict[str, float | None]]) -> None:
    """At least 1 (the best scores 1); the complete-data score where every route has
    complete data; a route lacking a metric some route has never better than the worst
    route with them all; where every route with data is complete, raising a route's own
    value never improves it against any other (its ratio to theirs: the ratios move with
    the best values; a missing value follows the worst, by design)."""
    cands, metrics = list(values), ["ttft", "tpot"]
    r = partial_ratios(cands, values, metrics)
    assert all(x >= 1.0 - 1e-9 for x in r.values())
    used = [m for m in metrics if any(values[c][m] is not None for c in cands)]
    whole = [r[c] for c in r if all(values[c][m] is not None for m in used)]
    for c in r:
        if whole and any(values[c][m] is None for m in used):
            assert r[c] >= max(whole) - 1e-9
    assert set(r) == {c for c in cands if any(values[c][m] is not None for m in metrics)}
    if all(v is not None for row in values.values() for v in row.values()):
        assert r == pytest.approx(latency_aware_scores(cands, values, metrics).scores)
    if len(whole) < len(r):
        return
    for c in r:
        for m in metrics:
            v = values[c][m]
            if v is not None:
                after = partial_ratios(cands, {**values, c: {**values[c], m: v * 2}},
                                       metrics)
                for d in r:
                    assert after[c] / after[d] >= r[c] / r[d] * (1 - 1e-9)


_exact_value = st.one_of(st.sampled_from([0.0, -0.0, 1e-12, 1e-9, 0.25, 0.25, 3.0]),
                         st.floats(0.0, 1e4))


@settings(max_examples=300)
@given(st.dictionaries(st.sampled_from("abcdef"),
                       st.fixed_dictionaries({"ttft": _exact_value, "tpot": _exact_value})),
       st.sampled_from([[], ["ttft"], ["tpot"], ["ttft", "tpot"], ["tpot", "ttft"]]))
def test_partial_ratios_are_the_complete_data_scores_bit_for_bit(
        values: dict[str, dict[str, float | None]], metrics: list[str]) -> None:
    """Where every candidate has every metric the two rules are one computation: the
    LatencyRatio scorer takes partial_ratios' answer as the complete-data ratio then
    (the same keys in the same order, the same float64 bits), so it must be exact."""
    cands = list(values)
    got = partial_ratios(cands, values, metrics)
    want = latency_aware_scores(cands, values, metrics).scores
    assert [(c, r.hex()) for c, r in got.items()] == [(c, r.hex()) for c, r in want.items()]
