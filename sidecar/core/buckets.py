"""The log-bucket geometry every latency histogram shares (DDSketch-style).

For relative accuracy ``a`` (default 0.02)::

    gamma  = (1 + a) / (1 - a)
    index  = ceil(log(x) / log(gamma))          bucket i holds (gamma**(i-1), gamma**i]
    value  = 2 * gamma**i / (gamma + 1)         the bucket's representative

Every value in bucket ``i`` is within ``a`` of the representative:
``|value - x| / x <= (gamma - 1) / (gamma + 1) = a``.

Range: values ``<= MIN_VALUE`` (1 microsecond, including negatives produced
by clock bugs) land in a zero bucket reported as ``0.0``; values above
``MAX_VALUE`` (1e4 s, longer than any request timeout) are clamped into the top
bucket, so they are *under*-reported there. ``MIN_VALUE .. MAX_VALUE`` spans
``ceil(ln(1e10) / ln(gamma)) + 1`` buckets: 577 for ``a = 0.02`` (1152 for
``a = 0.01``), the bound on any histogram's array.

A :class:`Buckets` is immutable and shared (:func:`buckets` caches one per
accuracy): the statistics compute an observation's bucket index once, with
:meth:`Buckets.index_of`, for every histogram the value goes to.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Final

MIN_VALUE: Final = 1e-6  # seconds; at or below this a value goes to the zero bucket
MAX_VALUE: Final = 1e4  # seconds; above this a value is clamped into the top bucket


class Buckets:
    """Bucket indices and representatives for one relative accuracy (module docstring)."""

    __slots__ = ("accuracy", "gamma", "hi_idx", "inv", "lo_idx")

    def __init__(self, relative_accuracy: float) -> None:
        if not 0.0 < relative_accuracy < 1.0:
            raise ValueError(f"relative_accuracy must be in (0, 1), got {relative_accuracy!r}")
        self.accuracy = relative_accuracy
        self.gamma = (1.0 + relative_accuracy) / (1.0 - relative_accuracy)
        self.inv = 1.0 / math.log(self.gamma)  # 1 / ln(gamma): a log base change per index
        self.lo_idx = math.ceil(math.log(MIN_VALUE) * self.inv)  # lowest covered index
        self.hi_idx = math.ceil(math.log(MAX_VALUE) * self.inv)  # highest (the clamped top)

    @property
    def max_buckets(self) -> int:
        """Upper bound on a histogram's array length (its memory bound is 8 bytes times this)."""
        return self.hi_idx - self.lo_idx + 1

    def bucket_index(self, x: float) -> int:
        """``ceil(log_gamma(x))`` clamped to the covered range; ``x > MIN_VALUE`` required."""
        if x >= MAX_VALUE:  # also +inf, whose log cannot be ceil'ed
            return self.hi_idx
        i = math.ceil(math.log(x) * self.inv)
        return self.lo_idx if i < self.lo_idx else self.hi_idx if i > self.hi_idx else i

    def bucket_value(self, index: int) -> float:
        """The representative ``2 * gamma**i / (gamma + 1)`` of bucket ``index``."""
        return 2.0 * self.gamma**index / (self.gamma + 1.0)

    def index_of(self, x: float) -> int | None:
        """The bucket ``x`` (seconds) falls in; None for the zero bucket. NaN raises."""
        if x <= MIN_VALUE:
            return None
        if x < MAX_VALUE:
            i = math.ceil(math.log(x) * self.inv)
            return self.lo_idx if i < self.lo_idx else i
        if x == x:
            return self.hi_idx
        raise ValueError("cannot add NaN")

    def indices_of(self, values: Sequence[float]) -> list[int | None]:
        """:meth:`index_of` of each value (NaN raises), in one call."""
        log, ceil, inv = math.log, math.ceil, self.inv
        lo_idx, hi_idx = self.lo_idx, self.hi_idx
        out: list[int | None] = []
        for x in values:
            if x <= MIN_VALUE:
                out.append(None)
            elif x < MAX_VALUE:
                i = ceil(log(x) * inv)
                out.append(lo_idx if i < lo_idx else i)
            elif x == x:
                out.append(hi_idx)
            else:
                raise ValueError("cannot add NaN")
        return out


@lru_cache(maxsize=16)
def buckets(relative_accuracy: float) -> Buckets:
    """The shared :class:`Buckets` of an accuracy (``ValueError`` outside (0, 1))."""
    return Buckets(relative_accuracy)
