"""percentile_of_runs gives np.percentile's values, bit for bit (sidecar.sim.run_percentiles)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.sim.run_percentiles import percentile_of_runs

_values = st.floats(min_value=0.0, max_value=1e7, allow_nan=False, allow_infinity=False)
_runs = st.lists(st.lists(st.one_of(_values, st.sampled_from([0.0, 1.0, 250.5])),
                          max_size=40), min_size=1, max_size=12)
_q = st.one_of(st.sampled_from([0.0, 50.0, 95.0, 99.0, 99.9, 100.0]),
               st.floats(min_value=0.0, max_value=100.0))


def _flat(runs: list[list[float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    values = np.array([x for r in runs for x in sorted(r)], dtype=np.float64)
    sizes = np.array([len(r) for r in runs], dtype=np.int64)
    hi = np.cumsum(sizes)
    return values, hi - sizes, hi


@settings(max_examples=400, deadline=None)
@given(_runs, _q)
def test_each_run_gets_np_percentiles_value_bit_for_bit(runs: list[list[float]],
                                                         q: float) -> None:
    values, lo, hi = _flat(runs)
    got = percentile_of_runs(values, lo, hi, q)
    for k, r in enumerate(runs):
        if not r:
            assert np.isnan(got[k])
            continue
        want = np.percentile(np.array(r, dtype=np.float64), q)
        assert got[k].tobytes() == np.float64(want).tobytes(), (r, q, got[k], want)


def test_the_p99_of_small_runs_interpolates_near_the_top() -> None:
    values = np.array([1.0, 2.0, 10.0, 20.0, 30.0, 5.0], dtype=np.float64)
    lo, hi = np.array([0, 2, 5, 6]), np.array([2, 5, 6, 6])
    got = percentile_of_runs(values, lo, hi, 99)
    assert got[0] == np.percentile([1.0, 2.0], 99) and got[2] == 5.0
    assert got[1] == np.percentile([10.0, 20.0, 30.0], 99) and np.isnan(got[3])


def test_large_and_heavy_tailed_runs_match_too() -> None:
    rng = np.random.default_rng(7)
    sizes = rng.integers(0, 3000, size=60)
    runs = [np.sort(rng.lognormal(5.0, 1.5, size=int(s)).round(int(rng.integers(0, 4))))
            for s in sizes]
    values = np.concatenate(runs)
    hi = np.cumsum(sizes)
    for q in (50.0, 95.0, 99.0):
        got = percentile_of_runs(values, hi - sizes, hi, q)
        for k, r in enumerate(runs):
            if r.size:
                assert got[k].tobytes() == np.float64(np.percentile(r, q)).tobytes()
