from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core.histogram import MAX_VALUE, MIN_VALUE, LogHistogram
from sidecar.core.histogram_snapshot import hist_from_dict, hist_to_dict

FAST = settings(max_examples=50, deadline=None)
# In-range latencies (seconds) and the quantiles routing asks for.
values = st.floats(min_value=2e-6, max_value=5e3, allow_nan=False, allow_infinity=False)
quantiles = st.sampled_from([0.0, 0.01, 0.1, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0])
accuracies = st.sampled_from([0.005, 0.01, 0.02, 0.05])


def rel_err(got: float, want: float) -> float:
    return abs(got - want) / want


def within(got: float | None, want: float, a: float = 0.02) -> bool:
    """Relative error at most ``a`` (plus float slop at bucket boundaries)."""
    return got is not None and rel_err(got, want) <= a * (1 + 1e-9)


def exact(data: list[float], q: float) -> float:
    return float(np.quantile(np.asarray(data), q, method="inverted_cdf"))


def test_geometry_and_memory_bound() -> None:
    h = LogHistogram(0.02)
    assert h.buckets.gamma == pytest.approx(1.02 / 0.98)
    assert h.buckets.max_buckets == 577  # the bound stated in the module docstring
    assert LogHistogram(0.01).buckets.max_buckets == 1152
    # bucket i holds (gamma**(i-1), gamma**i]
    for i in (-300, -10, 0, 1, 57, 200):
        hi = h.buckets.gamma**i
        assert h.buckets.bucket_index(hi * (1 - 1e-9)) == i
        assert h.buckets.bucket_index(hi * (1 + 1e-9)) == i + 1


@pytest.mark.parametrize("a", [0.005, 0.01, 0.02, 0.05])
def test_representative_within_relative_accuracy(a: float) -> None:
    h = LogHistogram(a)
    for x in np.geomspace(1.1e-6, 9e3, 2000):
        assert within(h.buckets.bucket_value(h.buckets.bucket_index(float(x))), float(x), a)


def test_empty_zero_bucket_and_clamping() -> None:
    h = LogHistogram()
    assert h.quantile(0.5) is None and h.count == 0 and len(h) == 0
    h.add(0.0)
    h.add(-3.0)  # a clock bug, not a crash
    h.add(MIN_VALUE)
    assert h.quantile(1.0) == 0.0 and h.count == 3
    h.add(math.inf)
    h.add(MAX_VALUE * 10)
    top = h.quantile(1.0)
    assert top is not None and MAX_VALUE <= top <= MAX_VALUE * 1.05  # clamped: under-reports
    assert h.quantile(0.0) == 0.0


def test_invalid_inputs() -> None:
    h = LogHistogram()
    with pytest.raises(ValueError):
        h.add(math.nan)
    with pytest.raises(ValueError):
        h.add(1.0, -1.0)
    with pytest.raises(ValueError):
        h.add(1.0, math.nan)
    with pytest.raises(ValueError):
        h.quantile(1.5)
    with pytest.raises(ValueError):
        LogHistogram(0.0)
    with pytest.raises(ValueError):
        h.merge(LogHistogram(0.01))
    assert h.count == 0  # a rejected add leaves no trace
    h.add(1.0, 0.0)
    assert h.quantile(0.5) is None


def test_weighted_add_and_scaled_merge() -> None:
    a, b = LogHistogram(), LogHistogram()
    a.add(0.1, 3.0)
    b.add(1.0)
    a.merge(b, scale=2.0)
    assert a.count == 5.0
    assert within(a.quantile(0.6), 0.1)  # 3 of 5 weight at 0.1
    assert within(a.quantile(0.61), 1.0)
    assert b.count == 1.0  # merge leaves the source alone


def test_growth_in_both_directions_keeps_counts() -> None:
    h = LogHistogram()
    xs = [1.0, 0.5, 2.0, 1e-4, 50.0, 3e-6, 4e3]
    for x in xs:
        h.add(x)
    assert len(h) <= h.buckets.max_buckets
    for q, want in zip([i / len(xs) for i in range(1, len(xs) + 1)], sorted(xs), strict=True):
        assert within(h.quantile(q), want)


def test_copy_clear_and_snapshot_roundtrip() -> None:
    h = LogHistogram()
    for x in (0.0, 0.2, 0.3, 0.3, 7.0):
        h.add(x)
    c = h.copy()
    c.add(100.0)
    assert h.count == 5 and c.count == 6
    back = hist_from_dict(json.loads(json.dumps(hist_to_dict(h))))
    assert back.count == h.count
    for q in (0.0, 0.2, 0.5, 0.9, 1.0):
        assert back.quantile(q) == h.quantile(q)
    h.clear()
    assert h.count == 0 and h.quantile(0.5) is None and len(h) == 0
    assert hist_from_dict(hist_to_dict(h)).quantile(0.5) is None


@pytest.mark.parametrize(
    "bad",
    [
        {},
        {"relative_accuracy": 0.02, "counts": [-1.0], "offset": 0},
        {"relative_accuracy": 0.02, "counts": [1.0], "offset": 10_000},
        {"relative_accuracy": 0.02, "counts": "xx", "offset": 0},
        # A peer's record (fleet) or a snapshot: a NaN or infinite weight in the zero
        # bucket was taken, and every later read of the series raised on it.
        {"relative_accuracy": 0.02, "zero": float("nan")},
        {"relative_accuracy": 0.02, "zero": float("inf")},
        {"relative_accuracy": 0.02, "counts": [1.0], "offset": float("inf")},
    ],
)
def test_malformed_snapshot(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        hist_from_dict(bad)


# ---------------------------------------------------------------- properties


@FAST
@given(st.lists(values, min_size=1, max_size=300), quantiles, accuracies)
def test_quantile_within_relative_error_of_numpy(data: list[float], q: float, a: float) -> None:
    """(e) nearest-rank estimate is within ``a`` of numpy's exact inverted_cdf percentile."""
    h = LogHistogram(a)
    for x in data:
        h.add(x)
    assert within(h.quantile(q), exact(data, q), a)


@FAST
@given(
    st.lists(st.tuples(values, st.integers(1, 5)), min_size=1, max_size=100),
    quantiles,
    st.integers(1, 4),
)
def test_merge_of_parts_equals_whole(
    data: list[tuple[float, int]], q: float, parts: int
) -> None:
    """Integer weights and merges behave as repeated samples (same nearest rank)."""
    shards = [LogHistogram() for _ in range(parts)]
    expanded: list[float] = []
    for i, (x, w) in enumerate(data):
        shards[i % parts].add(x, float(w))
        expanded += [x] * w
    whole = LogHistogram()
    for s in shards:
        whole.merge(s)
    assert whole.count == len(expanded)
    assert within(whole.quantile(q), exact(expanded, q))


# One step of a histogram's life: a unit sample by bucket index (or many), a weighted add,
# a scaled merge of another histogram, a scale, or a read.
_steps = st.lists(st.one_of(
    st.tuples(st.just("index"), values),
    st.tuples(st.just("burst"), st.lists(values, min_size=8, max_size=30)),  # np.add.at
    st.tuples(st.just("add"), values, st.floats(0.0, 3.0)),
    st.tuples(st.just("merge"), st.lists(values, max_size=5), st.floats(0.0, 2.0)),
    st.tuples(st.just("scale"), st.floats(0.0, 1.5)),
    st.tuples(st.just("read"), quantiles),
), max_size=60)


@settings(max_examples=200, deadline=None)
@given(_steps)
def test_deferred_unit_adds_are_bit_identical_to_immediate_ones(steps: list[Any]) -> None:
    """add_index defers its counts to the next read; every figure must equal, bit
    for bit, what adding each sample at once (add(x), weight 1) gives."""
    deferred, eager = LogHistogram(), LogHistogram()
    for step in steps:
        if step[0] == "index":
            deferred.add_index(deferred.buckets.index_of(step[1]))
            eager.add(step[1])
        elif step[0] == "burst":
            for x in step[1]:
                deferred.add_index(deferred.buckets.index_of(x))
                eager.add(x)
        elif step[0] == "add":
            deferred.add(step[1], step[2])
            eager.add(step[1], step[2])
        elif step[0] == "merge":
            other = LogHistogram()
            for x in step[1]:
                other.add_index(other.buckets.index_of(x))
            deferred.merge(other, step[2])
            eager.merge(other, step[2])
        elif step[0] == "scale":
            deferred.scale(step[1])
            eager.scale(step[1])
        else:
            assert deferred.quantile(step[1]) == eager.quantile(step[1])
    assert hist_to_dict(deferred) == hist_to_dict(eager)
    assert deferred.count == eager.count


@FAST
@given(st.lists(st.tuples(st.lists(values, max_size=40), st.floats(0.0, 2.0)), max_size=6))
def test_weighted_sum_is_bit_identical_to_merging_in_order(
    parts: list[tuple[list[float], float]],
) -> None:
    hists = []
    for data, scale in parts:
        h = LogHistogram()
        for x in data:
            h.add_index(h.buckets.index_of(x))
        hists.append((h, scale))
    merged = LogHistogram()
    for h, scale in hists:
        merged.merge(h, scale)
    summed = LogHistogram.weighted_sum(0.02, hists)
    assert hist_to_dict(summed) == hist_to_dict(merged)
    assert (len(summed), summed.count) == (len(merged), merged.count)  # same span, same total
    assert summed.cumulative().quantile(1.0) == merged.cumulative().quantile(1.0)


@FAST
@given(st.lists(st.tuples(st.lists(st.tuples(values, st.floats(0.0, 3.0)), max_size=30),
                          st.one_of(st.just(1.0), st.floats(0.0, 2.0), st.just(math.inf))),
                max_size=7))
def test_weighted_sum_adds_weighted_parts_bit_for_bit_in_order(
    parts: list[tuple[list[tuple[float, float]], float]],
) -> None:
    """Fractional weights and scales round at every step, so the order of the
    additions shows: the weighted sum must leave every bucket's float64 bits as
    merging the parts one by one does."""
    hists = []
    for data, scale in parts:
        h = LogHistogram()
        for x, w in data:
            h.add(x, w)
        hists.append((h, scale))
    merged = LogHistogram()
    with np.errstate(invalid="ignore"):
        for h, scale in hists:
            merged.merge(h, scale)
        summed = LogHistogram.weighted_sum(0.02, hists)
    got, want = summed.span(), merged.span()
    if want is None:
        assert got is None
    else:
        assert got is not None
        assert got[0] == want[0] and got[1].tobytes() == want[1].tobytes()
    assert repr((summed.zero, summed.count)) == repr((merged.zero, merged.count))  # NaN too


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.lists(values, min_size=1, max_size=12), st.floats(0.05, 1.0)),
             min_size=1, max_size=8),
    st.data(),
)
def test_removing_what_was_merged_leaves_no_residue(
    parts: list[tuple[list[float], float]], data: st.DataObject
) -> None:
    """A decayed window merges sub-windows at their weights and later takes the
    same ones out. What stays is exactly the buckets of the parts still in, with
    no rounding residue elsewhere; with every part out, the histogram is empty
    (no quantile), not 1e-16 of a bucket."""
    hists = [hist_of(xs) for xs, _ in parts]
    window = LogHistogram()
    for h, (_, w) in zip(hists, parts, strict=True):
        window.merge(h, w)
    out = data.draw(st.sets(st.integers(0, len(parts) - 1)))
    for i in sorted(out):
        window.remove(hists[i], parts[i][1])
    kept = [i for i in range(len(parts)) if i not in out]
    expect = LogHistogram()
    for i in kept:
        expect.merge(hists[i], parts[i][1])
    got = hist_to_dict(window)
    want = hist_to_dict(expect)
    assert got.get("offset") == want.get("offset")
    assert len(got.get("counts", [])) == len(want.get("counts", []))
    for g, e in zip(got.get("counts", []), want.get("counts", []), strict=True):
        assert (g == 0.0) == (e == 0.0) and math.isclose(g, e, rel_tol=1e-9)
    if not kept:
        assert window.count == 0.0 and window.quantile(0.5) is None


def hist_of(xs: list[float]) -> LogHistogram:
    h = LogHistogram()
    for x in xs:
        h.add(x)
    return h


def test_span_and_from_span_round_trip_and_checks() -> None:
    h = LogHistogram()
    assert h.span() is None
    for x in (0.0, 0.2, 0.3, 0.3, 7.0):
        h.add(x)
    span = h.span()
    assert span is not None
    back = LogHistogram.from_span(0.02, h.zero, span[0], span[1].copy())
    assert hist_to_dict(back) == hist_to_dict(h) and back.count == h.count
    with pytest.raises(ValueError, match="negative or non-finite"):
        LogHistogram.from_span(0.02, 0.0, span[0], np.array([1.0, -1.0]))
    with pytest.raises(ValueError, match="negative or non-finite"):
        LogHistogram.from_span(0.02, math.nan, span[0], None)
    with pytest.raises(ValueError, match="outside the covered range"):
        LogHistogram.from_span(0.02, 0.0, 10_000, np.array([1.0]))
