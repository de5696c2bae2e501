"""What the health machine (:mod:`sidecar.core.health`) is told: one :class:`Signal`
per evaluation window, per run of hard failures, per cooldown and per probe.

This module turns a window into its signal. **Windows** (latency and outcome
evidence): once per evaluation window
(:meth:`~sidecar.core.series.RouteStats.window_summary`: one sub-window, or as
many as a sparse route needs to reach ``min_samples``) the route's summary and
the class SLO become a :class:`WindowVerdict`. With
``a = 1 - percentile / 100`` the share of requests the SLO allows to miss,
``n = samples + failures`` and ``x_r = failures + samples slower than r x
budget``, the verdict is classified into one :class:`Signal`, in this
priority::

    BURST                (errors + timeouts) / requests >= error_rate_quarantine
                         with confidence, with requests >= error_min_samples
    INSUFFICIENT_ERRORS  samples < min_samples, failures but < error_min_samples requests
    STALE                no verdict, no failures, no verdict for >= stats.stale_after_s
    INSUFFICIENT         no verdict, no failures
    THREATENING          x_restrict / n above a with confidence (binomial test)
    ELEVATED             x_watch / n above max(a, 1.5 x own history) with confidence,
                         once the route has history_windows windows of history
    OK                   x_recover / n <= max(a, own history at the recover level)
    BAND                 otherwise (hysteresis band)

(a window with failures but too few latency samples is judged on its failures
alone once it has ``error_min_samples`` requests). "With confidence" is the
one-sided binomial test of :func:`sidecar.core.evidence.significant` at
``health.confidence``: a stationary heavy-tailed route whose tail sits inside
its SLO produces a few slow samples in most windows, and those must not read as
a breach. The route's *own history* is an EWMA (``1 / history_windows``) of
``x_watch / n`` and ``x_recover / n`` over windows judged while it was healthy
or watching: the watch level escalates only on a change, the budget level on
a breach.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from sidecar.core.config import HealthConfig, SloConfig
from sidecar.core.evidence import binom_sf, significant
from sidecar.core.subwindow import WindowSummary

# A change: the watch-level share half as much again as the route's usual.
HISTORY_MARGIN: Final = 1.5


class Signal(StrEnum):
    """The health machine's inputs: window signals (:func:`classify`), the fast
    path's FAST_FAIL and PARTIAL_FAIL, COOLDOWN_OVER and the probe results (RESCUE_OK:
    an ok answer to a rescue, a probe sent instead of a refusal,
    :mod:`sidecar.core.rescue_probe`)."""

    OK = "ok"
    BAND = "band"
    ELEVATED = "elevated"
    THREATENING = "threatening"
    INSUFFICIENT = "insufficient"
    INSUFFICIENT_ERRORS = "insufficient_errors"
    STALE = "stale"
    BURST = "burst"
    FAST_FAIL = "fast_fail"
    PARTIAL_FAIL = "partial_fail"
    COOLDOWN_OVER = "cooldown_over"
    PROBE_OK = "probe_ok"
    PROBE_FAIL = "probe_fail"
    RESCUE_OK = "rescue_ok"


@dataclass(frozen=True, slots=True)
class WindowVerdict:
    """One evaluation window judged against a class SLO.

    ``over`` counts latency samples slower than ``(recover, watch, restrict) x
    budget``; a verdict without latency (``ratio`` None) may still be judged on
    its failures."""

    index: int  # sub-window index (WindowSummary.index)
    metric: str
    percentile: float  # 1..100
    tail_s: float | None  # None: too few samples
    ratio: float | None  # tail_s * 1000 / budget_ms (descriptive)
    samples: int
    requests: int  # ok + error + timeout + cancels with a measured first token
    failures: int  # error + timeout
    over: tuple[int, int, int] = (0, 0, 0)

    @classmethod
    def of(cls, summary: WindowSummary, slo: SloConfig, cfg: HealthConfig) -> WindowVerdict:
        """Judge ``summary`` (which must be of ``slo.metric`` at ``slo.percentile``)."""
        if summary.metric != slo.metric or abs(summary.q * 100.0 - slo.percentile) > 1e-6:
            raise ValueError(
                f"summary is p{summary.q * 100:g} {summary.metric}, "
                f"SLO is p{slo.percentile:g} {slo.metric}"
            )
        tail = summary.quantile
        budget = slo.budget_ms / 1000.0
        ratio = None if tail is None else tail / budget
        over = tuple(summary.samples_over(r * budget)
                     for r in (cfg.recover_ratio, cfg.watch_ratio, cfg.restrict_ratio))
        return cls(summary.index, summary.metric, slo.percentile, tail, ratio, summary.samples,
                   summary.requests, summary.errors + summary.timeouts,
                   (over[0], over[1], over[2]))  # fmt: skip

    @classmethod
    def failures_only(
        cls, index: int, requests: int, failures: int, allowed_share: float
    ) -> WindowVerdict:
        """A verdict on outcomes alone (e.g. a whole cluster), allowing ``allowed_share``."""
        pct = 100.0 * (1.0 - allowed_share)
        return cls(index, "outcome", pct, None, None, 0, requests, failures)

    @property
    def allowed_share(self) -> float:
        return max(1.0 - self.percentile / 100.0, 1e-6)

    def counts(self) -> tuple[int, tuple[int, int, int]]:
        """``(n, (x_recover, x_watch, x_restrict))`` as the module docstring defines them."""
        if self.ratio is None:
            f = self.failures
            return self.requests, (f, f, f)
        f = self.failures
        return self.samples + f, (self.over[0] + f, self.over[1] + f, self.over[2] + f)

    def describe(self) -> str:
        n, x = self.counts()
        f = self.failures
        if self.metric == "outcome":
            return f"{f} of {self.requests} requests failed"
        if self.ratio is None and not f:
            return f"{self.samples} {self.metric} samples (too few)"
        allowed = f"allowed {self.allowed_share:.0%}"
        if self.ratio is None:
            return f"{f} of {n} requests failed ({x[2] / n:.0%}; {allowed})"
        # Failures count as misses (x_r); naming them keeps a route with a fast tail
        # and a few errors from reading "0.4x budget; 15 % over budget".
        miss = (f"{x[2] / n:.0%} of {n} over budget or failed ({f} failed; {allowed})" if f
                else f"{x[2] / n:.0%} of {n} over budget ({allowed})")
        return f"p{self.percentile:g} {self.metric} {self.ratio:.2f}x budget; {miss}"


@dataclass(slots=True)
class History:
    """A route's own stable history: EWMA shares of evidence beyond the watch and
    recover levels over windows judged while healthy or watching."""

    windows: int = 0
    watch: float = 0.0
    recover: float = 0.0

    def mature(self, cfg: HealthConfig) -> bool:
        return self.windows >= cfg.history_windows

    def update(self, v: WindowVerdict, cfg: HealthConfig) -> None:
        n, x = v.counts()
        if n <= 0 or v.ratio is None:
            return
        self.windows += 1
        alpha = 1.0 / min(self.windows, cfg.history_windows)
        self.watch += alpha * (x[1] / n - self.watch)
        self.recover += alpha * (x[0] / n - self.recover)


def classify(
    v: WindowVerdict, cfg: HealthConfig, stale: bool, history: History | None = None
) -> Signal:
    """The window's signal (priority order in the module docstring)."""
    alpha = 1.0 - cfg.confidence
    burst = cfg.error_rate_quarantine
    if (v.requests >= cfg.error_min_samples and v.failures >= burst * v.requests
            and _burst_significant(v.failures, v.requests, burst, alpha)):
        return Signal.BURST
    if v.ratio is None and not (v.failures and v.requests >= cfg.error_min_samples):
        if v.failures:
            return Signal.INSUFFICIENT_ERRORS
        return Signal.STALE if stale else Signal.INSUFFICIENT
    n, (x_recover, x_watch, x_restrict) = v.counts()
    allow = v.allowed_share
    if significant(x_restrict, n, allow, alpha):
        return Signal.THREATENING
    known = history is not None and history.mature(cfg) and v.ratio is not None
    if known and significant(
        x_watch, n, max(allow, HISTORY_MARGIN * history.watch), alpha  # type: ignore[union-attr]
    ):
        return Signal.ELEVATED
    ref = max(allow, history.recover) if known else allow  # type: ignore[union-attr]
    return Signal.OK if x_recover <= ref * n else Signal.BAND


def escalates_on_failures(v: WindowVerdict, cfg: HealthConfig) -> bool:
    """Is ``v`` judged on its failures alone (too few latency samples) and does that
    judgement escalate (BURST or THREATENING)? Such a window's span is closed
    (:mod:`sidecar.core.evaluation_span`): its failures must not vote again."""
    if v.ratio is not None or not v.failures:
        return False
    return classify(v, cfg, False) in (Signal.BURST, Signal.THREATENING)


def _burst_significant(failures: int, requests: int, share: float, alpha: float) -> bool:
    """Is the failure share at least ``share`` with confidence? ``P(X >= failures | n,
    p)`` below ``alpha`` for ``p`` just under ``share``: five of five failures
    qualify, three of five (a 30 % failing route, one window in six) do not."""
    return binom_sf(failures, requests, share * (1.0 - 1e-9)) < alpha
