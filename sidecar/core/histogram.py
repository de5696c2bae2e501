"""A mergeable log-bucket histogram (DDSketch-style) for latencies in seconds.

The bucket geometry (indices, representatives, range, zero bucket) is
:mod:`sidecar.core.buckets`. A quantile is the representative of the bucket holding
the nearest-rank sample (``inverted_cdf``: the smallest sample whose cumulative
weight reaches ``q * total``): relative error ``<= a`` for samples in range. The
JSON form (snapshots, fleet records) is :mod:`sidecar.core.histogram_snapshot`.

Memory: counts are a dense float64 numpy array over the occupied index range only
(grown on demand, as DDSketch's dense store: :mod:`sidecar.core.dense_store`):
``8 bytes x occupied span`` -- about 0.9 KiB for latencies over 50 ms .. 5 s -- never
more than 4.6 KiB (577 buckets at ``a = 0.02``); an empty histogram allocates no array.

``add`` is O(1); ``merge`` is one vector add; ``quantile`` one cumulative sum
over the occupied span (:meth:`LogHistogram.cumulative` freezes it for repeated
reads: :mod:`sidecar.core.cumulative`). numpy rather than a Python list: a merge
of ~300 buckets costs ~1.5 us vs ~35 us and a quantile ~4.5 us vs ~30 us (CPython
3.11), and both are on every decision's read path. Unit samples by bucket index
(:meth:`LogHistogram.add_index`, a few per observation) are kept as a list of
indices and folded in on the next read, merge or weighted write
(:meth:`LogHistogram._flush`): an append costs a fraction of a numpy scalar
store, and every bucket still gets the same ``+ 1.0`` additions in the same
order, so every figure is bit-identical to adding at once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

import numpy as np

from sidecar.core.buckets import MAX_VALUE, MIN_VALUE, Buckets, buckets
from sidecar.core.cumulative import Cumulative, FloatArray
from sidecar.core.dense_store import add_scaled, grown_span, plus_units, widened

__all__ = ["MAX_VALUE", "MIN_VALUE", "Buckets", "Cumulative", "LogHistogram"]

# remove(): what is left of a weight at or below this share of it is rounding, not
# samples (a sum of float64 terms cancels to within ~1e-15 of its magnitude; a
# window's real weights are at least its 0.05 cutoff against totals far below 1e7).
_RESIDUE: Final = 1e-9


class LogHistogram:
    """Weighted log-bucket histogram with relative-error quantiles (see module docstring)."""

    __slots__ = ("_a", "_counts", "_gamma", "_hi", "_hi_idx", "_inv", "_lo", "_lo_idx",
                 "_pending", "_total", "_zero", "buckets")

    def __init__(self, relative_accuracy: float = 0.02) -> None:
        self._a = relative_accuracy
        self.buckets = g = buckets(relative_accuracy)  # the geometry, shared
        # Copied: every add and read uses them, an attribute hop less each time.
        self._gamma, self._inv, self._lo_idx, self._hi_idx = g.gamma, g.inv, g.lo_idx, g.hi_idx
        self._zero = 0.0  # weight of values <= MIN_VALUE
        self._total = 0.0  # running sum of all weights, for O(1) ``count``
        self._lo = 0  # bucket index of self._counts[0]
        self._hi = -1  # bucket index of self._counts[-1] (below _lo while unallocated)
        self._counts: FloatArray | None = None  # None while empty: no allocation
        # Bucket indices of unit samples not yet in _counts (add_index; see _flush).
        self._pending: list[int] = []

    @property
    def relative_accuracy(self) -> float:
        return self._a

    # ------------------------------------------------------------ writing

    def add(self, x: float, w: float = 1.0) -> None:
        """Add value ``x`` (seconds) with weight ``w >= 0``. O(1)."""
        if not 0.0 <= w < math.inf:  # also rejects NaN
            raise ValueError(f"weight must be finite and >= 0, got {w!r}")
        self._total += w
        if x <= MIN_VALUE:
            self._zero += w
            return
        # Buckets.bucket_index() inlined: the hot path of every observation.
        if x < MAX_VALUE:
            i = math.ceil(math.log(x) * self._inv)
            if i < self._lo_idx:
                i = self._lo_idx
        elif x == x:
            i = self._hi_idx
        else:
            self._total -= w
            raise ValueError("cannot add NaN")
        if self._pending:
            self._flush()  # keep each bucket's additions in order (rounding)
        counts = self._counts
        p = i - self._lo
        if counts is None or not 0 <= p < len(counts):
            counts = self._cover(i, i)
            p = i - self._lo
        counts[p] += w

    def add_index(self, i: int | None) -> None:
        """Add one sample (weight 1) in bucket ``i`` from :meth:`Buckets.index_of`.

        The array grows now (as :meth:`add` would grow it); the count itself is
        deferred to :meth:`_flush` (module docstring)."""
        self._total += 1.0
        if i is None:
            self._zero += 1.0
            return
        if not self._lo <= i <= self._hi:
            self._cover(i, i)
        self._pending.append(i)

    def add_indices(self, indices: Sequence[int | None]) -> None:
        """:meth:`add_index` for each of ``indices`` in order, in one call: the same
        additions (the totals counted one by one whenever a bulk count could round
        differently), the same array growth (index by index when any falls outside)
        and the same deferred counts, so every figure stays bit-identical."""
        n = len(indices)
        if not n:
            return
        self._total = plus_units(self._total, n)
        known = [i for i in indices if i is not None]
        if len(known) < n:
            self._zero = plus_units(self._zero, n - len(known))
        if not known:
            return
        if self._lo <= min(known) and max(known) <= self._hi:
            self._pending.extend(known)
            return
        pending = self._pending
        for i in known:
            if not self._lo <= i <= self._hi:
                self._cover(i, i)
            pending.append(i)

    def _flush(self) -> None:
        """Fold the deferred unit samples in, in order: ``np.add.at`` is unbuffered (a bucket
        named k times gets k successive ``+ 1.0``); a few are cheaper one by one."""
        pending = self._pending
        counts = self._counts
        assert counts is not None  # add_index allocated it; clear() drops pending too
        lo = self._lo
        if len(pending) < 8:
            for i in pending:
                counts[i - lo] += 1.0
        else:
            idx = np.array(pending, dtype=np.intp)
            idx -= lo
            np.add.at(counts, idx, 1.0)
        pending.clear()

    def merge(self, other: LogHistogram, scale: float = 1.0) -> None:
        """Add ``scale`` x every weight of ``other`` (same accuracy required) into this one."""
        if other._a != self._a:
            raise ValueError(f"cannot merge accuracy {other._a} into {self._a}")
        if not scale >= 0.0:
            raise ValueError(f"scale must be >= 0, got {scale!r}")
        if other._pending:
            other._flush()
        if self._pending:
            self._flush()
        self._zero += other._zero * scale
        self._total += other._total * scale
        src = other._counts
        if src is None:
            return
        counts = self._counts
        if counts is None or not self._lo <= other._lo <= other._hi <= self._hi:
            counts = self._cover(other._lo, other._hi)
        add_scaled(counts, other._lo - self._lo, src, scale)

    def scale(self, factor: float) -> None:
        """Multiply every weight by ``factor >= 0`` (exponential forgetting)."""
        if not factor >= 0.0:
            raise ValueError(f"factor must be >= 0, got {factor!r}")
        if self._pending:
            self._flush()
        self._zero *= factor
        self._total *= factor
        if self._counts is not None:
            self._counts *= factor

    def remove(self, other: LogHistogram, scale: float = 1.0) -> None:
        """Take ``scale`` x ``other`` back out (inverse of :meth:`merge`).

        A weight that the removal leaves at or below ``_RESIDUE`` of what it was is
        set to 0: taking out exactly what was merged in leaves rounding residues
        (~1e-16, either sign) that would otherwise stay in the bucket forever, and a
        quantile of a window whose real samples have all left could land on one."""
        if other._a != self._a:
            raise ValueError(f"cannot remove accuracy {other._a} from {self._a}")
        if other._pending:
            other._flush()
        if self._pending:
            self._flush()
        src = other._counts
        zero = self._zero - other._zero * scale
        self._zero = zero if zero > self._zero * _RESIDUE else 0.0
        if src is not None and self._counts is not None:
            counts = self._cover(other._lo, other._lo + len(src) - 1)
            start = other._lo - self._lo
            view = counts[start : start + len(src)]
            was = view * _RESIDUE
            view -= src * scale
            view[view <= was] = 0.0
            # add.reduce is what ndarray.sum runs, without its two Python-level wrappers
            self._total = self._zero + float(np.add.reduce(counts))
        else:
            self._total = max(self._total - other._total * scale, 0.0)

    def clear(self) -> None:
        """Forget every sample (and release the array)."""
        self._zero = 0.0
        self._total = 0.0
        self._counts = None
        self._hi = self._lo - 1
        self._pending.clear()

    def copy(self) -> LogHistogram:
        if self._pending:
            self._flush()
        out = LogHistogram(self._a)
        out._zero, out._total, out._lo, out._hi = self._zero, self._total, self._lo, self._hi
        out._counts = None if self._counts is None else self._counts.copy()
        return out

    def shifted(self, factor: float) -> LogHistogram:
        """A copy with every value multiplied by ``factor > 0`` (to the nearest bucket:
        a whole-bucket move of the array, clamped to the covered range)."""
        out = self.copy()
        if out._counts is None or not factor > 0.0:
            return out
        k = round(math.log(factor) * self._inv)
        move = max(self._lo_idx - out._lo, min(k, self._hi_idx - out._hi))
        out._lo += move  # the span moves as a whole: _hi tracks the array's last bucket
        out._hi += move
        return out

    def _cover(self, lo: int, hi: int) -> FloatArray:
        """Grow the dense array so bucket indices ``lo..hi`` fit; returns it."""
        counts = self._counts
        if counts is not None and lo >= self._lo and hi <= self._hi:
            return counts
        span = grown_span(None if counts is None else (self._lo, self._hi), lo, hi,
                          self._lo_idx, self._hi_idx)
        grown = widened(counts, self._lo, span)
        (self._lo, self._hi), self._counts = span, grown
        return grown

    @classmethod
    def weighted_sum(
        cls, accuracy: float, parts: Sequence[tuple[LogHistogram, float]]
    ) -> LogHistogram:
        """``sum(scale * h for h, scale in parts)`` as a new histogram, bit-identical to
        merging the parts in order into an empty one (same span; per bucket the same
        additions in the same order) but allocated once, not grown part by part."""
        out = cls(accuracy)
        span: tuple[int, int] | None = None
        for h, scale in parts:
            if h._a != accuracy:
                raise ValueError(f"cannot merge accuracy {h._a} into {accuracy}")
            if not scale >= 0.0:
                raise ValueError(f"scale must be >= 0, got {scale!r}")
            if h._pending:
                h._flush()
            if h._counts is not None:
                span = grown_span(span, h._lo, h._hi, out._lo_idx, out._hi_idx)
        if span is not None:
            out._lo, out._hi = span
            out._counts = np.zeros(span[1] - span[0] + 1, dtype=np.float64)
        counts = out._counts
        for h, scale in parts:
            out._zero += h._zero * scale
            out._total += h._total * scale
            src = h._counts
            if src is None or counts is None:
                continue
            add_scaled(counts, h._lo - out._lo, src, scale)
        return out

    @classmethod
    def from_span(
        cls, accuracy: float, zero: float, offset: int, counts: FloatArray | None,
        checked: bool = True,
    ) -> LogHistogram:
        """The inverse of :meth:`span`, with ``zero`` in the zero bucket: ``counts`` from
        bucket ``offset`` on (kept, not copied: pass an array nothing else holds, never
        another histogram's span), the total ``zero`` plus ``math.fsum(counts)``.
        ``ValueError`` for buckets out of range, and while ``checked`` for a negative or
        non-finite weight (``checked=False``: weights made from a histogram's own, where
        the two reductions would cost a quarter of
        :func:`~sidecar.core.fleet_share.hist_minus`)."""
        h = cls(accuracy)
        if counts is not None and not len(counts):
            counts = None
        if checked and (not 0.0 <= zero < math.inf or (counts is not None and not (  # NaN
                counts.min() >= 0.0 and counts.max() < math.inf))):  # fails, min/max pass it on
            raise ValueError("histogram has negative or non-finite weights")
        h._zero = zero
        if counts is None:
            h._total = zero + 0.0  # what zero + math.fsum([]) gives (-0.0 becomes 0.0)
            return h
        if not h._lo_idx <= offset <= offset + len(counts) - 1 <= h._hi_idx:
            raise ValueError("histogram buckets outside the covered range")
        h._total = zero + math.fsum(counts.tolist())
        h._lo, h._hi, h._counts = offset, offset + len(counts) - 1, counts
        return h

    # ------------------------------------------------------------ reading

    @property
    def count(self) -> float:
        """Total weight added (the number of samples when every weight is 1)."""
        return self._total

    @property
    def zero(self) -> float:
        """Weight of the values at or below ``MIN_VALUE`` (the zero bucket)."""
        return self._zero

    def __len__(self) -> int:
        """Buckets currently allocated (not samples); for memory accounting."""
        return 0 if self._counts is None else len(self._counts)

    def span(self) -> tuple[int, FloatArray] | None:
        """The allocated buckets as (index of the first, their weights; empty ones at
        either end included), None while none is. The weights are this histogram's own
        array, not a copy: read them, never write them (a read-only view made
        :func:`~sidecar.core.fleet_share.hist_minus` about 15 % slower)."""
        if self._pending:
            self._flush()
        counts = self._counts
        return None if counts is None else (self._lo, counts)

    def quantile(self, q: float) -> float | None:
        """Nearest-rank quantile: representative of the first bucket whose
        cumulative weight reaches ``q * total``; ``None`` when empty.

        Relative error ``<= relative_accuracy`` against the exact
        ``numpy.quantile(..., method="inverted_cdf")`` of in-range samples.
        """
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must be in [0, 1], got {q!r}")
        if self._pending:
            self._flush()
        counts = self._counts
        if counts is None:
            return 0.0 if self._zero > 0.0 else None
        cum = counts.cumsum()  # the method: np.cumsum adds two Python-level wrappers
        # The total comes from the same cumulative sum, so the search target
        # can never exceed the last cumulative value through rounding.
        total = float(cum[-1]) + self._zero
        if total <= 0.0:
            return None
        target = q * total
        if self._zero > 0.0 and target <= self._zero:
            return 0.0
        if target <= 0.0:  # q == 0: the smallest non-empty bucket
            pos = int(np.flatnonzero(counts)[0])
        else:
            pos = min(int(cum.searchsorted(target - self._zero, side="left")), len(cum) - 1)
        return self.buckets.bucket_value(self._lo + pos)

    def cumulative(self) -> Cumulative:
        """A frozen cumulative view for repeated quantile and CDF reads."""
        if self._pending:
            self._flush()
        counts = self._counts
        cum = None if counts is None else counts.cumsum()
        return Cumulative(self._gamma, self._inv, self._lo, cum, self._zero, self._lo_idx,
                          self._hi_idx)

    def __repr__(self) -> str:
        return f"LogHistogram(a={self._a}, count={self._total:g}, buckets={len(self)})"

