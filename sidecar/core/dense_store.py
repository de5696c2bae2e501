"""The dense bucket array under a :class:`~sidecar.core.histogram.LogHistogram`.

A histogram keeps its weights in one float64 array over the bucket indices
``lo..hi`` it has needed so far (DDSketch's dense store). This module is that
array's arithmetic, apart from what the weights mean: how its span grows
(:func:`grown_span`, :func:`widened`: headroom around a new index and growth by
half the span, so a histogram filling up copies its array O(log n) times, not
once per new bucket), and the additions whose rounding the histogram promises
to keep bit-identical to adding one sample at a time (:func:`plus_units`,
:func:`add_scaled`).
"""

from __future__ import annotations

from typing import Final

import numpy as np

from sidecar.core.cumulative import FloatArray

PAD: Final = 8  # buckets of headroom added around a new index (about +-17% at a = 0.02)
_EXACT_INTEGERS: Final = float(2**53)  # every whole float64 below this is exact, as is its + 1

Span = tuple[int, int]  # the first and last bucket index an array covers


def grown_span(span: Span | None, lo: int, hi: int, lo_idx: int, hi_idx: int) -> Span:
    """The span an array over ``span`` (None: no array) grows to for ``lo..hi``: ``PAD``
    buckets of headroom, growth by half the span at least (amortised O(1) copies),
    never past the covered range ``lo_idx..hi_idx``."""
    if span is None:
        return max(lo_idx, lo - PAD), min(hi_idx, hi + PAD)
    cur_lo, cur_hi = span
    if lo >= cur_lo and hi <= cur_hi:
        return span
    slack = max(PAD, (cur_hi - cur_lo + 1) // 2)
    return (max(lo_idx, lo - slack) if lo < cur_lo else cur_lo,
            min(hi_idx, hi + slack) if hi > cur_hi else cur_hi)


def widened(counts: FloatArray | None, lo: int, span: Span) -> FloatArray:
    """A zeroed array over ``span`` holding ``counts`` (first bucket ``lo``; None: no
    array yet) at their indices."""
    new_lo, new_hi = span
    grown = np.zeros(new_hi - new_lo + 1, dtype=np.float64)
    if counts is not None:
        grown[lo - new_lo : lo - new_lo + len(counts)] = counts
    return grown


def plus_units(x: float, n: int) -> float:
    """``x`` plus ``1.0`` added ``n`` times: at once while that is exact (a whole ``x``
    well inside float64's integers), else one addition at a time."""
    if x.is_integer() and abs(x) + n < _EXACT_INTEGERS:
        return x + n
    for _ in range(n):
        x += 1.0
    return x


def add_scaled(counts: FloatArray, start: int, src: FloatArray, scale: float) -> None:
    """``counts[start:start + len(src)] += scale * src`` in place (no temporary when
    ``scale`` is 1: merges of equal weight are the common case)."""
    view = counts[start : start + len(src)]
    if scale == 1.0:
        view += src
    else:
        view += src * scale
