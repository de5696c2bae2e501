"""A frozen cumulative view of one log-bucket histogram.

:meth:`sidecar.core.histogram.LogHistogram.cumulative` freezes a histogram's
cumulative bucket sums into a :class:`Cumulative`, which answers any number of
quantiles and CDF points in O(log span) each: the decision path reads a
window's evidence many times between two refreshes. The geometry (``gamma``,
bucket indices, the zero bucket and the clamped top) is :mod:`sidecar.core.buckets`.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from sidecar.core.buckets import MAX_VALUE, MIN_VALUE

FloatArray = npt.NDArray[np.float64]


class Cumulative:
    """Cumulative bucket weights of one histogram at one moment (read-only).

    ``quantile(q)`` answers exactly as :meth:`LogHistogram.quantile` would;
    ``cdf(x)`` is the weight share of samples in buckets up to the one holding
    ``x`` -- ``P(X <= x)`` within the histogram's relative accuracy (a sample
    in the same bucket as ``x`` counts as ``<= x``).
    """

    __slots__ = ("_cum", "_gamma", "_hi_idx", "_inv", "_lo", "_lo_idx", "_zero", "total")

    def __init__(
        self, gamma: float, inv: float, lo: int, cum: FloatArray | None, zero: float,
        lo_idx: int, hi_idx: int,
    ) -> None:
        self._gamma, self._inv, self._lo, self._cum, self._zero = gamma, inv, lo, cum, zero
        self._lo_idx, self._hi_idx = lo_idx, hi_idx
        self.total = zero + (float(cum[-1]) if cum is not None and len(cum) else 0.0)

    def quantile(self, q: float) -> float | None:
        """Nearest-rank quantile (``None`` when empty); see :meth:`LogHistogram.quantile`."""
        cum = self._cum
        if self.total <= 0.0:
            return None
        target = q * self.total
        if cum is None or (self._zero > 0.0 and target <= self._zero):
            return 0.0
        if target <= 0.0:
            pos = int(np.flatnonzero(np.diff(cum, prepend=0.0))[0])
        else:
            pos = min(int(cum.searchsorted(target - self._zero, side="left")), len(cum) - 1)
        return 2.0 * self._gamma ** (self._lo + pos) / (self._gamma + 1.0)

    def weight_at_most(self, x: float) -> float:
        """Weight of samples in buckets up to the one holding ``x`` (0 when empty)."""
        if x <= MIN_VALUE:
            return self._zero if x >= 0.0 else 0.0
        cum = self._cum
        if cum is None:
            return self._zero
        p = self._offset(x)
        if p < 0:
            return self._zero
        return self._zero + float(cum[min(p, len(cum) - 1)])

    def weight_below(self, x: float) -> float:
        """Weight of samples in buckets below the one holding ``x`` (0 when empty): a
        sample in the same bucket as ``x`` counts as equal to it, not below."""
        if x <= MIN_VALUE:
            return 0.0
        cum = self._cum
        if cum is None:
            return self._zero
        p = self._offset(x)
        if p <= 0:
            return self._zero
        return self._zero + float(cum[min(p - 1, len(cum) - 1)])

    def _offset(self, x: float) -> int:
        """Where the bucket holding ``x`` (> MIN_VALUE) is, from the lowest one stored."""
        i = self._hi_idx if x >= MAX_VALUE else max(math.ceil(math.log(x) * self._inv),
                                                      self._lo_idx)
        return i - self._lo

    def cdf(self, x: float) -> float | None:
        """``P(X <= x)`` as a share of the total weight; ``None`` when empty."""
        if self.total <= 0.0:
            return None
        return self.weight_at_most(x) / self.total
