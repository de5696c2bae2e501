"""Learning many successes at once (``Router.observe_ok`` and the histogram, series and
store calls under it) is bit-identical to learning them one observation at a time."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core.config import parse_config
from sidecar.core.histogram import MAX_VALUE, LogHistogram
from sidecar.core.histogram_snapshot import hist_to_dict
from sidecar.core.router import Router
from sidecar.core.subwindow import OkSample
from sidecar.core.types import Observation, SliceKey
from sidecar.ops import snapshot

S = SliceKey("m", "interactive", "short", True)
OTHER = SliceKey("m", "batch", "long", False)

_seconds = st.one_of(
    st.none(), st.just(math.nan), st.just(0.0), st.just(-1.0), st.just(MAX_VALUE * 2),
    st.floats(1e-7, 30.0, allow_nan=False))
_samples = st.lists(st.tuples(_seconds, _seconds, _seconds,
                              st.one_of(st.none(), st.integers(1, 9))), max_size=12)


def _hist_view(h: LogHistogram) -> tuple[Any, ...]:
    span = h.span()  # the allocated span too, not only its non-empty part
    return (hist_to_dict(h), h.count, None if span is None else (span[0], len(span[1])))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(-2000, 600)), max_size=40),
       st.sampled_from([0.0, 0.3]), st.lists(st.integers(-400, 400), max_size=5))
def test_add_indices_is_add_index_one_by_one(
        indices: list[int | None], start_weight: float, before: list[int]) -> None:
    geometry = LogHistogram().buckets

    def valid(i: int) -> int:  # a bucket index_of could give
        return min(max(i, geometry.lo_idx), geometry.hi_idx)

    known = [None if i is None else valid(i) for i in indices]
    one, many = LogHistogram(), LogHistogram()
    for h in (one, many):
        if start_weight:
            h.add(1.0, start_weight)  # a fractional total: counted one by one
        for i in before:
            h.add_index(valid(i))
    for i in known:
        one.add_index(i)
    many.add_indices(known)
    assert _hist_view(one) == _hist_view(many)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(allow_nan=False) | st.just(0.0), max_size=30))
def test_indices_of_is_index_of(values: list[float]) -> None:
    h = LogHistogram()
    assert h.buckets.indices_of(values) == [h.buckets.index_of(v) for v in values]


def _router(compat: bool) -> Router:
    cfg = parse_config({
        "clusters": [{"name": n, "address": f"127.0.0.1:{9000 + i}", "models": ["m"]}
                     for i, n in enumerate("ab")],
        "models": [{"name": "m", "candidates": ["a", "b"],
                    **({"compat": "semantic-router"} if compat else {})}],
        "stats": {"subwindow_s": 5.0, "min_samples": 3},
    }, "observe_ok.yaml")
    return Router(cfg)


def _learned(r: Router) -> tuple[Any, ...]:
    series = {k: (rs.version, rs.last_seen) for k, rs in r.stats.items()}
    return (snapshot.build(r, 100.0, 0.0), series, dict(r.counters),
            {k: repr(s.value(90)) for k, s in r.compat_sr.series.items()})


# Outcomes before the batch: hard failures leave health records whose runs the
# successes must end exactly as one by one (a run long enough ejects the cluster).
_history = st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from([S, OTHER]),
                              st.sampled_from(["ok", "error", "timeout"]),
                              st.floats(0.001, 3.0)), max_size=10)


@settings(max_examples=80, deadline=None)
@given(_history, _samples, _samples, st.booleans())
def test_observe_ok_is_observe_one_by_one(
        history: list[tuple[str, SliceKey, Any, float]], first: list[OkSample],
        second: list[OkSample], compat: bool) -> None:
    one, many = _router(compat), _router(compat)
    for r in (one, many):
        for i, (cluster, s, outcome, e2e) in enumerate(history):
            r.observe(Observation(cluster, s, outcome, 503 if outcome == "error" else 200,
                                  None, None, e2e), 10.0 + 0.01 * i)
    for now, cluster, s, samples in ((11.0, "a", S, first), (11.0, "b", OTHER, second),
                                     (16.0, "a", S, second)):
        for ttft, tpot, e2e, tokens in samples:
            one.observe(Observation(cluster, s, "ok", 200, ttft, tpot, e2e, tokens), now)
        many.observe_ok(cluster, s, samples, now)
    assert _learned(one) == _learned(many)
