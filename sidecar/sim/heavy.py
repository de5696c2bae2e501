"""Heavy-tailed latency distributions: lognormal mixtures with an optional Pareto tail.

A real provider's latency is rarely one lognormal: a fast path and a slow path
(cache hit or miss, short or long queue inside the provider) make a mixture,
and the slowest requests follow a power law rather than a lognormal's
quickly-thinning tail. :class:`HeavyTailed` models both:

* **components** ``(w_i, Lognormal_i)`` with ``sum w_i = 1``: a lognormal mixture;
* an optional **Pareto tail** taking share ``w_t`` of the samples:
  ``x = x_m * (1 - v) ** (-1 / alpha)`` for ``v`` uniform, capped at ``cap``
  (``alpha <= 2``: infinite variance; ``alpha <= 1``: infinite mean, before the cap).

One sample needs a standard normal ``z`` (the lognormal's deviate) and one
uniform ``u`` that picks the part: ``u < w_t`` is the tail (``v = u / w_t``,
exactly uniform again), else component ``i`` where the cumulative weights of
``(u - w_t) / (1 - w_t)`` fall. So the provider pre-draws ``(z, u)`` per
request like it pre-draws ``z`` for a plain lognormal, and the oracle can see a
request's draws before it is served.

``median`` and ``p99`` are the mixture's true quantiles (bisection on its CDF),
so the provider's model ``TTFT = (median + prefill) * noise`` keeps its meaning
with ``noise = sample / median``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sidecar.sim.dists import Lognormal


@dataclass(frozen=True, slots=True)
class ParetoTail:
    """Share ``weight`` of samples from a Pareto(``start``, ``alpha``) capped at ``cap``."""

    weight: float  # 0 < weight < 1
    alpha: float  # > 0; smaller is heavier
    start: float  # x_m: the smallest tail value (same unit as the body)
    cap: float  # >= start

    def cdf(self, x: float) -> float:
        if x < self.start:
            return 0.0
        if x >= self.cap:
            return 1.0
        return 1.0 - float((self.start / x) ** self.alpha)

    def value(self, v: float) -> float:
        """The tail value at uniform ``v`` in [0, 1)."""
        x = self.start * (1.0 - v) ** (-1.0 / self.alpha)
        return x if x < self.cap else self.cap


@dataclass(frozen=True, slots=True)
class HeavyTailed:
    """A lognormal mixture, optionally with a Pareto tail (see the module docstring)."""

    components: tuple[tuple[float, Lognormal], ...]  # (weight, component); weights sum to 1
    tail: ParetoTail | None = None
    median: float = field(init=False, compare=False)
    p99: float = field(init=False, compare=False)
    _cum: tuple[float, ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        cum, acc = [], 0.0
        for w, _ in self.components:
            acc += w
            cum.append(acc)
        cum[-1] = 1.0  # rounding: the last component takes what is left
        object.__setattr__(self, "_cum", tuple(cum))
        object.__setattr__(self, "median", self.quantile(0.5))
        object.__setattr__(self, "p99", self.quantile(0.99))

    # ------------------------------------------------------------ sampling

    def value(self, z: float, u: float) -> float:
        """The sample for standard normal ``z`` and uniform ``u`` (module docstring)."""
        t = self.tail
        if t is not None:
            if u < t.weight:
                return t.value(u / t.weight)
            u = (u - t.weight) / (1.0 - t.weight)
        for c, (_, comp) in zip(self._cum, self.components, strict=True):
            if u < c:
                return comp.at(z)
        return self.components[-1][1].at(z)

    def noise(self, z: float, u: float) -> float:
        """``value / median``: the multiplier the provider applies to its median."""
        return self.value(z, u) / self.median

    # ------------------------------------------------------------ quantiles

    def cdf(self, x: float) -> float:
        body = sum(w * _lognormal_cdf(c, x) for w, c in self.components)
        t = self.tail
        if t is None:
            return body
        return t.weight * t.cdf(x) + (1.0 - t.weight) * body

    def quantile(self, q: float) -> float:
        """The ``q`` quantile, by bisection on ``log x`` (60 steps: far below 1e-9 relative)."""
        lo = min(c.median for _, c in self.components) * 1e-6
        hi = max([c.cap for _, c in self.components] + [self.tail.cap if self.tail else 0.0])
        lo_l, hi_l = math.log(max(lo, 1e-12)), math.log(max(hi, 1e-12))
        for _ in range(60):
            mid = 0.5 * (lo_l + hi_l)
            if self.cdf(math.exp(mid)) < q:
                lo_l = mid
            else:
                hi_l = mid
        return math.exp(hi_l)

    def scaled(self, factor: float) -> HeavyTailed:
        t = self.tail
        return HeavyTailed(
            tuple((w, c.scaled(factor)) for w, c in self.components),
            None if t is None else ParetoTail(t.weight, t.alpha, t.start * factor,
                                              t.cap * factor))

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "mixture": [{"weight": w, **c.to_json()} for w, c in self.components]}
        if self.tail is not None:
            t = self.tail
            out["pareto_tail"] = {"weight": t.weight, "alpha": t.alpha, "from": t.start,
                                  "max": t.cap}
        return out


#: Any latency distribution of a scenario (seconds once loaded).
Latency = Lognormal | HeavyTailed


def latency_value(d: Latency, z: float, u: float) -> float:
    """A sample of ``d`` for pre-drawn ``z`` (normal) and ``u`` (uniform; plain
    lognormals ignore it)."""
    if isinstance(d, Lognormal):
        return d.at(z)
    return d.value(z, u)


def _lognormal_cdf(d: Lognormal, x: float) -> float:
    if x >= d.cap:
        return 1.0
    if d.sigma == 0.0:
        return 1.0 if x >= d.median else 0.0
    if x <= 0.0:
        return 0.0
    return 0.5 * (1.0 + math.erf(math.log(x / d.median) / (d.sigma * math.sqrt(2.0))))
