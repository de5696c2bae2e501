"""How many requests per second may have ``x-tailroute-explain: 1`` honoured.

An explained request is a debugging aid: it takes Envoy's rich path (three gRPC
messages instead of one), skips the router's cached plans and lanes, and builds
the explain JSON -- about 2.5x a plain decision's cost in the sidecar. Any client
may send the header, so without a bound one client asking on every request makes
every one of its requests cost that (and, with enough of them, everyone's
decisions wait behind them). A token bucket bounds it per sidecar process:

    tokens(now) = min(BURST, tokens(last) + (now - last) * RATE_PER_S)
    honoured    = tokens >= 1   (then tokens -= 1)

An explain request over the bound is routed like any other request (it is never
refused): it only loses its explain header, and is counted
(``tailroute_errors_total{kind="explain_limited"}``). The bound is far above what a
person or a debugging script asks for, and far below what load does.
"""

from __future__ import annotations

import math
from typing import Final

RATE_PER_S: Final = 10.0
BURST: Final = 20.0


class ExplainBudget:
    """A token bucket, refilled by the loop's time (pure: ``now`` comes in)."""

    __slots__ = ("last", "tokens")

    def __init__(self) -> None:
        self.tokens = BURST
        self.last = -math.inf  # the first take refills to BURST

    def take(self, now: float) -> bool:
        """May this request's explain be honoured? Spends a token if so."""
        if now > self.last:  # a clock that goes back refills nothing
            self.tokens = min(BURST, self.tokens + (now - self.last) * RATE_PER_S)
            self.last = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True
