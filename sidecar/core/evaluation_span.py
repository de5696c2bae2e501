"""Which completed sub-windows of a series the next health verdict covers.

Normally that is just the last completed sub-window ``k - 1``. A sparse route
may not reach ``min_samples`` (latency) or ``min_samples`` failures in one
sub-window; its evaluation window then grows over the following sub-windows
(unweighted merge, at most ``subwindows - 1`` of them: the maximum age) until
it does. Windows never overlap, so no sample is judged twice and one spike
cannot count as "sustained" across several verdicts. Until the span is
complete the summary carries ``quantile=None`` (insufficient) and the span is
kept for the next call.

A span still accumulating may already be judged on its *failures* (health
judges a window with too few latency samples on its errors and timeouts once it
has ``error_min_samples`` requests). When that verdict escalates, the caller
closes the span (:meth:`EvaluationSpan.fence` at the current sub-window, via
:meth:`~sidecar.core.stats.StatsStore.close_span`): left open, the next
verdicts would judge the same failures again, and two timeouts among a sparse
route's six requests voted three windows for degraded and two more for
restricted, with one new request, a success, among them (a generated outage
scenario, family seed 97, #10: the fast route of a slice restricted for 300 s).

Invariant: ``unjudged`` only moves forward, to the sub-window after the last
one a verdict covered (or to a fence: evidence before it is never judged).
"""

from __future__ import annotations

from sidecar.core.config import Metric, StatsConfig
from sidecar.core.histogram import LogHistogram
from sidecar.core.subwindow import SeriesWindow, WindowSummary


class EvaluationSpan:
    """The first completed sub-window not yet covered by a verdict (None: none seen)."""

    __slots__ = ("unjudged",)

    def __init__(self) -> None:
        self.unjudged: int | None = None

    def fence(self, k: int) -> None:
        """Nothing before sub-window ``k`` is judged any more."""
        if self.unjudged is None or self.unjudged < k:
            self.unjudged = k

    def next_summary(self, window: SeriesWindow, cfg: StatsConfig, k: int, stale: bool,
                     metric: Metric, q: float) -> WindowSummary:
        """The next evaluation window of ``window`` whose current sub-window is ``k``
        (module docstring); a stale series gives an empty summary and starts afresh."""
        end = k * cfg.subwindow_s
        oldest = k - (cfg.subwindows - 1)
        first = k - 1 if self.unjudged is None else max(self.unjudged, oldest)
        first = min(first, k - 1)
        start = first * cfg.subwindow_s
        if stale:
            self.unjudged = k
            return WindowSummary(k - 1, start, end, metric, q, 0, None, 0, 0, 0, 0)
        merged: LogHistogram | None = None  # the first sub-window's own until a second comes
        copied = False
        n = req = err = tmo = canc = 0
        for idx in range(first, k):
            slot = window.get(idx)
            if slot is None:
                continue
            if m := slot.samples(metric):
                if merged is None:
                    merged = slot.hists[metric]
                else:
                    if not copied:
                        merged, copied = merged.copy(), True
                    merged.merge(slot.hists[metric])
                n += m
            # A cancel's measured first token is an outcome for TTFT only (subwindow).
            firsts = 0 if metric == "ttft" else slot.first
            req, err, tmo, canc = (req + slot.requests - firsts, err + slot.error,
                                   tmo + slot.timeout, canc + slot.cancel)  # fmt: skip
        enough = n >= cfg.min_samples
        full_span = first <= oldest
        if enough or full_span or (req and (err + tmo) >= cfg.min_samples):
            self.unjudged = k  # verdict given: the next window starts fresh
        else:
            self.unjudged = first  # keep accumulating
        cum = None if merged is None else merged.cumulative()
        value = cum.quantile(q) if enough and cum is not None else None
        return WindowSummary(k - 1, start, end, metric, q, n, value, req, err, tmo, canc, cum)
