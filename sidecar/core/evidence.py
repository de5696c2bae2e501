"""Estimators over a route's evidence: the blended slice estimate and the binomial test.

**Slices without the fallback trap.** A narrow slice (say long prompts on one
provider) often has few samples, while its broader slices (same class, any
token profile; then the whole model) have many -- dominated by other traffic.
Falling back to the broad value when the narrow one is thin keeps sending the
slice to a provider that is fast only for *other* traffic. Instead every
estimate blends the levels by how much each knows: the narrow window counts in
full and the broader ones lend ``m = stats.prior_samples`` pseudo-samples
between them, narrowest first::

    H = H_narrow + s_1 H_broad1 + s_2 H_broad2
    s_1 = min(m, W_1) / W_1          s_2 = min(m - min(m, W_1), W_2) / W_2

(``W_j`` the effective sample weight of level ``j``'s window; outcome counts
are blended the same way with request weights). With no narrow data the
estimate is the broad one; with ``n`` narrow samples the broad share is
``m / (n + m)``, so a thin slice moves away from the broad value with every
sample it gets instead of waiting for ``min_samples`` (shrinkage by sample
count). A quantile of ``H`` is reported only when some level holds
``>= min_samples`` unweighted samples (:attr:`RouteEvidence.trusted`).

**P(success within budget)**, the outcome-aware estimate the attainment
scorer and admission read::

    P(B) = p_ok * F(B)        p_ok = ok / (ok + errors + timeouts),  F = CDF of H

errors (5xx, 429), timeouts and judged cancels enter through ``p_ok``; slow
successes through ``F``. A cancel whose first token was measured within budget
(:func:`sidecar.core.judging.judge_censored`: the OpenAI SDK's default client
leaves at ``[DONE]``, and Envoy often logs a complete answer so) is an answer that
came by its first token: for TTFT it counts in ``ok`` and among the requests, and
its TTFT is in ``H``; for e2e and TPOT it is no outcome (its end is unknown).
Both are blended as above, so both are shrunk toward the broader slices when
the narrow slice is thin; :func:`with_prior` then fills the pseudo-weight still
missing up to ``m`` with a neutral value (a route nobody has seen yet is
assumed to just meet its SLO). ``P`` is in ``[0, 1]``
and moves monotonically with evidence: one more success within budget never
lowers it, one more failure never raises it.

**Binomial test** (:func:`binom_sf`, :func:`significant`): health escalates
only on evidence that a violation share exceeds a reference share with
confidence, ``P(X >= x | n, p_ref) < alpha`` -- exact for small counts (a
stationary heavy tail produces a few slow samples in most windows, which must
not read as a breach), normal approximation with continuity correction once
``n p (1 - p) > 30``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sidecar.core.histogram import Cumulative, LogHistogram
from sidecar.core.subwindow import Evidence
from sidecar.core.types import SliceKey


class RouteEvidence:
    """The blended estimate of one (cluster, slice, metric) at one moment (read-only)."""

    __slots__ = ("_p", "_q", "cum", "fell_back", "ok", "prior", "requests", "samples",
                 "trusted", "used", "weight")

    def __init__(
        self, cum: Cumulative, samples: int, weight: float, prior: float, ok: float,
        requests: float, trusted: bool, used: SliceKey | None, fell_back: bool,
    ) -> None:
        self.cum = cum
        self.samples = samples  # unweighted narrow latency samples
        self.weight = weight  # effective narrow sample weight
        self.prior = prior  # pseudo-samples lent by broader slices
        self.ok, self.requests = ok, requests  # blended outcome weights
        self.trusted = trusted
        self.used = used  # the narrowest level with >= min_samples samples (None: none)
        self.fell_back = fell_back  # the narrow slice itself has fewer than min_samples
        self._q: dict[float, float | None] = {}
        self._p: dict[float, float | None] = {}

    def quantile(self, q: float) -> float | None:
        """Quantile of the blended window (seconds); None unless :attr:`trusted`."""
        if q in self._q:
            return self._q[q]
        value = self.cum.quantile(q) if self.trusted else None
        self._q[q] = value
        return value

    @property
    def p_ok(self) -> float | None:
        return self.ok / self.requests if self.requests > 0 else None

    def p_within(self, budget_s: float) -> float | None:
        """``P(B) = p_ok * F(B)`` (module docstring); None without any outcome."""
        hit = self._p.get(budget_s, -1.0)
        if hit != -1.0:
            return hit
        p_ok = self.p_ok
        if p_ok is None:
            value = None
        else:
            f = self.cum.cdf(budget_s)
            value = p_ok * (1.0 if f is None else f)
        if len(self._p) > 16:
            self._p.clear()
        self._p[budget_s] = value
        return value

    @property
    def evidence_weight(self) -> float:
        """Effective outcomes behind :meth:`p_within` (narrow and borrowed)."""
        return self.requests


def blend(
    levels: Sequence[tuple[SliceKey, Evidence | None]], prior_samples: float,
    min_samples: int, accuracy: float,
) -> RouteEvidence | None:
    """Blend ``levels`` (narrow first, then broader) as the module docstring says."""
    narrow_key, e0 = levels[0]
    parts: list[tuple[LogHistogram, float]] = []  # H's terms, summed at the end
    ok = req = prior = 0.0
    samples = 0
    weight = 0.0
    if e0 is not None:
        parts.extend(e0.parts)
        ok, req, samples, weight = e0.ok, e0.requests, e0.samples, e0.weight
    left_s = left_r = float(prior_samples)
    used: SliceKey | None = narrow_key if samples >= min_samples else None
    for key, e in levels[1:]:
        if e is None:
            continue
        if used is None and e.samples >= min_samples:
            used = key
        if left_s > 0.0 and e.weight > 0.0:
            take = min(left_s, e.weight)
            parts.extend((part, scale * take / e.weight) for part, scale in e.parts)
            left_s -= take
            prior += take
        if left_r > 0.0 and e.requests > 0.0:
            take = min(left_r, e.requests)
            scale = take / e.requests
            ok += e.ok * scale
            req += e.requests * scale
            left_r -= take
    h = LogHistogram.weighted_sum(accuracy, parts)
    if req <= 0.0 and h.count <= 0.0:
        return None
    return RouteEvidence(h.cumulative(), samples, weight, prior, ok, req, used is not None,
                         used, samples < min_samples)


def with_prior(p: float | None, weight: float, prior_samples: float, neutral: float) -> float:
    """Fill the pseudo-weight missing up to ``prior_samples`` with ``neutral``::

        P* = (W p + max(0, m - W) neutral) / max(W, m)

    ``p`` None (no outcome at all) gives ``neutral``."""
    if p is None or weight <= 0.0:
        return neutral
    m = float(prior_samples)
    if weight >= m:
        return p
    return (weight * p + (m - weight) * neutral) / m


def binom_sf(x: int, n: int, p: float) -> float:
    """``P(X >= x)`` for ``X ~ Binomial(n, p)``; 1.0 whenever ``x <= n p``.

    Exact (summing the pmf upward from ``x``) for small variance, else the
    normal approximation with continuity correction. Callers only compare the
    result against small ``alpha``, so the region ``x <= n p`` (never
    significant) is answered without computing it."""
    if x <= 0 or p >= 1.0:
        return 1.0
    if x > n:
        return 0.0
    if p <= 0.0:
        return 0.0
    if x <= n * p:
        return 1.0
    var = n * p * (1.0 - p)
    if var > 30.0:
        z = (x - 0.5 - n * p) / math.sqrt(var)
        return 0.5 * math.erfc(z / math.sqrt(2.0))
    log_term = (math.lgamma(n + 1) - math.lgamma(x + 1) - math.lgamma(n - x + 1)
                + x * math.log(p) + (n - x) * math.log1p(-p))
    term = math.exp(log_term)
    total = term
    ratio = p / (1.0 - p)
    k = x
    while k < n and term > total * 1e-12:
        term *= (n - k) / (k + 1) * ratio
        total += term
        k += 1
    return min(total, 1.0)


def significant(x: int, n: int, p_ref: float, alpha: float) -> bool:
    """Is a share ``x / n`` above ``p_ref`` with confidence ``1 - alpha``?"""
    return n > 0 and binom_sf(x, n, min(max(p_ref, 0.0), 1.0)) < alpha
