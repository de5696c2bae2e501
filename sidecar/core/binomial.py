"""The binomial test of the live misses: how many misses of ``m`` are too many to be
a route's allowed share by chance.

``binomial_threshold(m, p, alpha)`` is the least ``k`` with ``P(X >= k) < alpha`` for
``X ~ Binomial(m, p)``: summed upward from ``P(X = 0)`` with the pmf's ratio
recurrence, or, when ``(1 - p) ** m`` underflows (large ``m``), downward from
``k = m`` in logs. :class:`~sidecar.core.live_misses.LiveMisses` caches it per
``(p, m)``.
"""

from __future__ import annotations

import math


def binomial_threshold(m: int, p: float, alpha: float) -> int:
    """The least ``k`` with ``P(X >= k) < alpha`` for ``X ~ Binomial(m, p)`` (``m + 1``
    when none: even ``m`` misses of ``m`` are not that unlikely)."""
    if m <= 0:
        return 1
    q = 1.0 - p
    pmf = q ** m  # P(X = 0)
    if pmf == 0.0:  # underflow at large m: start from the normal approximation's mean
        return _threshold_by_logs(m, p, alpha)
    below = 0.0  # P(X < k)
    for k in range(m + 1):
        if 1.0 - below < alpha:
            return k
        below += pmf
        pmf *= (m - k) / (k + 1) * p / q
    return m + 1


def _threshold_by_logs(m: int, p: float, alpha: float) -> int:
    """:func:`binomial_threshold` with the tail summed in logs (large ``m``)."""

    def log_pmf(k: int) -> float:
        return (math.lgamma(m + 1) - math.lgamma(k + 1) - math.lgamma(m - k + 1)
                + k * math.log(p) + (m - k) * math.log1p(-p))

    tail = 0.0  # P(X >= k) for k from m down
    for k in range(m, -1, -1):
        tail += math.exp(log_pmf(k))
        if tail >= alpha:
            return k + 1
    return 0
