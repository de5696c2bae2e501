"""From a slice's traffic shares to what Envoy is told (native mode,
:mod:`sidecar.core.weights`): the trial floor a route on trial keeps, and the
largest-remainder rounding to integer weights that sum to a fixed scale.

Both are pure functions of their arguments: no config, no view, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Final

# A route on trial takes at least this share of its slice (sidecar.core.weights, step 3):
# at 20 req/s the two trials after a first failure then take ~0.2 s, and the chance
# that fewer than two come within a second is below 0.5 %.
TRIAL_SHARE: Final = 0.5


def integer_weights(shares: Mapping[str, float], order: tuple[str, ...],
                    scale: int) -> tuple[tuple[str, int], ...]:
    """Largest-remainder rounding of ``shares`` (any non-negative scale) to sum ``scale``.

    A zero total falls back to an equal split (never all zero); each positive
    share keeps at least 1, taken from the largest weight.
    """
    total = sum(max(shares.get(c, 0.0), 0.0) for c in order)
    if not order:
        return ()
    if total <= 0 or not math.isfinite(total):
        shares, total = dict.fromkeys(order, 1.0), float(len(order))
    exact = [max(shares.get(c, 0.0), 0.0) / total * scale for c in order]
    units = [math.floor(x) for x in exact]
    rest = scale - sum(units)
    by_remainder = sorted(range(len(order)), key=lambda i: (-(exact[i] - units[i]), i))
    for i in by_remainder[:rest]:
        units[i] += 1
    for i, x in enumerate(exact):
        if x > 0 and units[i] == 0:
            biggest = max(range(len(order)), key=lambda j: (units[j], -j))
            if units[biggest] > 1:
                units[biggest] -= 1
                units[i] = 1
    return tuple(zip(order, units, strict=True))


def trial_floor(shares: Mapping[str, float], on_trial: Iterable[str]) -> dict[str, float]:
    """Give each route in ``on_trial`` at least ``f = min(TRIAL_SHARE, 1 / #on_trial) x T``
    of the total ``T``, keeping ``T`` (:mod:`sidecar.core.weights`, step 3), by water-filling:
    routes below ``f`` are set to ``f`` and the rest scaled by ``(T - their sum) /
    (the rest's sum)``, repeated while that scaling takes a route on trial below ``f``
    (``#on_trial x f <= T``, so it ends). Routes not on trial never gain."""
    out = dict(shares)
    chosen = {c for c in on_trial if c in out}
    total = sum(out.values())
    if not chosen or total <= 0:
        return out
    floor = min(TRIAL_SHARE, 1.0 / len(chosen)) * total
    fixed = {c for c in chosen if out[c] < floor}
    scale = 1.0
    while True:
        rest = sum(v for c, v in out.items() if c not in fixed)
        scale = max(total - floor * len(fixed), 0.0) / rest if rest > 0 else 0.0
        low = {c for c in chosen - fixed if out[c] * scale < floor}
        if not low:
            break
        fixed |= low
    return {c: floor if c in fixed else v * scale for c, v in out.items()}
