"""One percentile of many runs of a sorted array at once, as ``np.percentile`` gives it.

The summary's time series (:mod:`sidecar.sim.metrics_summary`) takes the p99 of
every time bucket, several hundred small arrays per run. ``np.percentile`` per
bucket spent most of its time in numpy's Python-level argument handling, not
in the arithmetic. :func:`percentile_of_runs` does the same arithmetic for all
runs together, in whole-array operations, and gives the same float64 values,
bit for bit (``tests/test_run_percentiles.py`` holds it to ``np.percentile``).

numpy's default method ("linear", Hyndman & Fan's 7th), for a run of ``n``
sorted values ``x[0..n-1]`` and the percentile ``q``::

    v     = (n - 1) * (q / 100)                  the virtual index
    i     = floor(v), j = i + 1                  both n - 1 when v >= n - 1
    g     = v - i                                (v + 1 there: numpy's i is -1)
    d     = x[j] - x[i]
    p     = x[i] + d g                           when g <  0.5
    p     = x[j] - d (1 - g)                     when g >= 0.5

Each run must be sorted and hold no NaN (the caller sorts; NaN is not a
latency). An empty run gives NaN.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FArr = npt.NDArray[np.float64]
IArr = npt.NDArray[np.int64]


def percentile_of_runs(values: FArr, lo: IArr, hi: IArr, q: float) -> FArr:
    """``np.percentile(values[lo[k]:hi[k]], q)`` for every ``k`` (NaN for an empty
    run), each run of ``values`` sorted ascending and without NaN."""
    n = hi - lo
    out = np.full(n.shape, np.nan)
    has = n > 0
    if not has.any():
        return out
    n, start = n[has], lo[has]
    last = n - 1
    v = last * np.true_divide(q, 100)
    above = v >= last
    i = np.floor(v)
    i[above] = -1.0  # numpy's index for "the last value", which g is taken from
    g = v - i
    i_at = np.where(above, last, i.astype(np.int64))
    j_at = np.where(above, last, i_at + 1)
    a = values[start + i_at]
    b = values[start + j_at]
    d = b - a
    p = a + d * g
    upper = g >= 0.5
    p[upper] = (b - d * (1.0 - g))[upper]
    out[has] = p
    return out
