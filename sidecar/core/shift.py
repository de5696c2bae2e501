"""Shift detection: a few recent samples that confidently left a route's own history.

A sparse route's rate-following window (:mod:`sidecar.core.series`) is mostly
old samples: at a few requests a minute it takes minutes of aging before
samples from after a slowdown outweigh the ones from before -- and the route's
share, hence its sample rate, falls as soon as it looks slower. Yet a few
samples are enough to *know* the distribution moved when each of them lands
in the old tail. So every completed sub-window is tested against the window
before it, per metric, with a one-sided Bernoulli CUSUM in each direction::

    x   = samples above the window's p90 (up) / below its p10 (down)
    S  <- max(0, S + x ln(p1 / p0) + (n - x) ln((1 - p1) / (1 - p0)))
    shift when S >= ln(1 / alpha)            p0 = 0.1, p1 = 0.7, alpha = stats.shift_alpha

(``n`` the sub-window's samples). Under no change a sample lands beyond the
reference quantile with probability ``p0``, the drift is strongly negative and
a false alarm needs a run of several tail samples in a row -- a stationary
heavy tail (p99/p50 ~ 8) puts one in the tail now and then, not four of five.
A tripled latency puts ~9 in 10 there: two to four samples decide it (at the
default ``alpha`` 0.05 two tail samples in a row, at 0.01 three). A stationary
heavy tail read three samples per sub-window shifts about once per 1000
samples at either (5 alarms in 6000 samples of tests/test_shift.py's draw, at
0.01 and at 0.05: a sub-window's sample inside the tail pulls the statistic
below the threshold again); a busy sub-window's many
samples inside the tail pull the statistic back to 0, and the shift factor is
re-estimated from every later sample, so a false shift fades as samples come.

On a shift the series remembers the sub-window where the run began
(:attr:`ShiftState.since`). Until the evidence from before it has left the
window, the window reads that older evidence *moved* by the shift's factor::

    H = shift(H_before, F) + H_since        F = median(H_since) / median(H_before)

(:func:`shift_factor`; a whole-bucket move of the log histogram). A median is
well estimated from a few samples, a p95 is not: the many older samples keep
giving the distribution's shape and weight, the few newer ones its location,
so a tripled latency reads as roughly tripled quantiles after four or five
samples instead of after minutes of aging. ``F`` is re-estimated from every
sample since the shift, the weights and the unweighted sample count are
unchanged (whether a quantile is trusted still needs ``min_samples``).

The shift lapses (the window reads plain) once fewer than
``SHIFT_MIN_BEFORE`` samples from before it are left: a median of two or three
is one of them, and ``F`` would be off by their ratio.
"""

from __future__ import annotations

import math
from typing import Final

from sidecar.core.config import Metric
from sidecar.core.histogram import Cumulative, LogHistogram
from sidecar.core.subwindow import DecayedWindow

Parts = tuple[tuple[LogHistogram, float], ...]  # a window as (histogram, scale) parts

SHIFT_TAIL: Final = 0.1  # p0: share of samples beyond the reference quantile under no change
SHIFT_HIT: Final = 0.7  # p1: the share a shift worth acting on puts there
# Samples from before a shift needed to read its factor: a median of two is one of
# them, so F is off by their ratio (0.12 s and 1.55 s before, 3.78 s and 4.22 s
# since: F 31 moved 1.55 s to 48 s, a p90 of 53.5 s from samples up to 4.22 s).
SHIFT_MIN_BEFORE: Final = 5
_HIT: Final = math.log(SHIFT_HIT / SHIFT_TAIL)
_MISS: Final = math.log((1.0 - SHIFT_HIT) / (1.0 - SHIFT_TAIL))


class ShiftState:
    """The two CUSUM statistics of one (series, metric) and the last shift found."""

    __slots__ = ("down", "down_from", "since", "up", "up_from")

    def __init__(self) -> None:
        self.up = self.down = 0.0
        self.up_from = self.down_from = 0
        self.since: int | None = None  # sub-window index where the last shift began

    def update(self, index: int, ref: Cumulative, new: Cumulative, n: int,
               alpha: float = 0.01) -> bool:
        """Fold in completed sub-window ``index`` (``n`` samples, distribution ``new``)
        against the window before it (``ref``); True when a shift is found at
        confidence ``1 - alpha``."""
        hi, lo = ref.quantile(1.0 - SHIFT_TAIL), ref.quantile(SHIFT_TAIL)
        if hi is None or lo is None or n <= 0:
            return False
        above = max(0, round(n - new.weight_at_most(hi)))
        # Strictly beyond, as ``above`` is: a quantile is a bucket's value, so ``lo``
        # nudged down stays in its bucket and would count samples *at* the p10 as
        # below it -- a steady route (most samples in one bucket) then "shifted"
        # down on two samples like the rest.
        below = round(new.weight_below(lo))
        if self.up <= 0.0:
            self.up_from = index
        if self.down <= 0.0:
            self.down_from = index
        self.up = max(0.0, self.up + above * _HIT + (n - above) * _MISS)
        self.down = max(0.0, self.down + below * _HIT + (n - below) * _MISS)
        threshold = math.log(1.0 / alpha)
        start = self.up_from if self.up >= threshold else (
            self.down_from if self.down >= threshold else None)
        if start is None:
            return False
        self.since = start
        self.up = self.down = 0.0
        return True


def shift_factor(before: LogHistogram, since: LogHistogram) -> float:
    """``median(since) / median(before)``: how far the distribution moved (1.0 when
    either median is unknown or zero)."""
    b, s = before.quantile(0.5), since.quantile(0.5)
    if not b or not s:
        return 1.0
    return s / b


def lapsed(past: DecayedWindow, metric: Metric, since: int) -> bool:
    """Whether a shift that began at sub-window ``since`` has run its course in the
    decayed window ``past``: fewer than ``SHIFT_MIN_BEFORE`` samples from before
    it are left, or nothing weighted from its start on."""
    older = 0  # unweighted samples from before the shift
    after = 0.0  # weighted samples from its start on
    for slot, index, w in past.included:
        if n := slot.samples(metric):
            if index >= since:
                after += w * n
            else:
                older += n
    return older < SHIFT_MIN_BEFORE or after <= 0.0


def shifted_parts(past: DecayedWindow, metric: Metric, since: int,
                  accuracy: float) -> Parts | None:
    """``past``'s histogram of ``metric`` read with the evidence from before
    sub-window ``since`` moved by the shift's factor (module docstring), as
    ``(shift(H_before, F), 1), (H_since, 1)``; None: read it plain (nothing
    since). Reads only: whether the shift still holds is :func:`lapsed`'s call."""
    after = LogHistogram(accuracy)
    for slot, index, w in past.included:
        if index >= since and slot.samples(metric):
            after.merge(slot.hists[metric], w)
    if after.count <= 0.0:
        return None
    before = past.hists[metric].copy()
    before.remove(after)
    return (before.shifted(shift_factor(before, after)), 1.0), (after, 1.0)


def reference(parts: Parts, accuracy: float) -> LogHistogram:
    """The window that a sub-window is tested against, as one histogram. One part
    at scale 1 (no shift in force) is its own answer: its cumulative gives the
    reference quantiles as a merged copy's would (same buckets, same sums)."""
    if len(parts) == 1 and parts[0][1] == 1.0:
        return parts[0][0]
    ref = LogHistogram(accuracy)
    for h, scale in parts:
        ref.merge(h, scale)
    return ref
