"""Baselines that look at no latency at all, or only at the median.

* ``round_robin``: the model's candidates in turn (one counter per model).
* ``random``: uniform among the model's candidates.
* ``least_inflight``: fewest requests this router has in flight on the cluster
  (its own count, as a proxy sees it); ties broken at random.
* ``p50_only``: a "median-aware" router: per (model, cluster, metric) the median
  of the last 200 successful samples of the request class's SLO metric (TTFT
  for streams -- end-to-end for non-streaming requests, whose first token
  arrives with the body -- or end-to-end, or TPOT). Lowest median wins; a
  cluster without samples is tried first (exploration); errors and timeouts are
  not samples. It shows what a good median hides: it keeps sending traffic to a
  route whose p99 blew up as long as its median is fine.
"""

from __future__ import annotations

import bisect
import random
from collections import Counter, deque

from sidecar.core.types import Decision
from sidecar.sim.policies import BasePolicy, PolicyContext
from sidecar.sim.records import Attempt


class RoundRobin(BasePolicy):
    name = "round_robin"

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self._next: Counter[str] = Counter()

    def choose(self, att: Attempt, now: float, rng: random.Random) -> str | Decision:
        model = att.call.model
        cands = att.call.candidates
        i = self._next[model]
        self._next[model] = i + 1
        return cands[i % len(cands)]


class RandomPick(BasePolicy):
    name = "random"

    def choose(self, att: Attempt, now: float, rng: random.Random) -> str | Decision:
        cands = att.call.candidates
        return cands[int(rng.random() * len(cands))]


class LeastInflight(BasePolicy):
    name = "least_inflight"

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self.inflight: Counter[str] = Counter()

    def choose(self, att: Attempt, now: float, rng: random.Random) -> str | Decision:
        cands = att.call.candidates
        inflight = self.inflight
        best = min(inflight[c] for c in cands)
        ties = [c for c in cands if inflight[c] == best]
        return ties[0] if len(ties) == 1 else ties[int(rng.random() * len(ties))]

    def on_start(self, att: Attempt, now: float) -> None:
        self.inflight[att.cluster] += 1

    def on_result(self, att: Attempt, now: float) -> None:
        self.inflight[att.cluster] -= 1


class _Window:
    """The last ``size`` samples, kept both in arrival order and sorted (O(log n) median)."""

    __slots__ = ("order", "size", "sorted")

    def __init__(self, size: int) -> None:
        self.size = size
        self.order: deque[float] = deque()
        self.sorted: list[float] = []

    def add(self, v: float) -> None:
        self.order.append(v)
        bisect.insort(self.sorted, v)
        if len(self.order) > self.size:
            old = self.order.popleft()
            del self.sorted[bisect.bisect_left(self.sorted, old)]

    def percentile(self, q: float) -> float:
        """Linearly interpolated percentile (numpy's default), ``q`` in [0, 1]."""
        s = self.sorted
        idx = q * (len(s) - 1)
        lo = int(idx)
        if lo + 1 >= len(s):
            return s[-1]
        w = idx - lo
        return s[lo] * (1.0 - w) + s[lo + 1] * w

    def __len__(self) -> int:
        return len(self.order)


def slo_sample(att: Attempt) -> float | None:
    """The request class's SLO metric for a successful attempt, as a router measures it."""
    metric = att.call.cls.slo.metric
    if metric == "ttft":
        return att.ttft_s if att.call.stream else att.e2e_s
    if metric == "e2e":
        return att.e2e_s
    if att.tpot_s is not None:
        return att.tpot_s
    e2e = att.e2e_s
    return None if e2e is None else e2e / max(att.tokens_done, 1)


class P50Only(BasePolicy):
    name = "p50_only"
    WINDOW = 200

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self.windows: dict[tuple[str, str, str], _Window] = {}

    def choose(self, att: Attempt, now: float, rng: random.Random) -> str | Decision:
        call = att.call
        metric = call.cls.slo.metric
        best, best_v = call.candidates[0], float("inf")
        for c in call.candidates:
            w = self.windows.get((call.model, c, metric))
            if w is None or not len(w):
                return c  # no data yet: try it
            v = w.percentile(0.5)
            if v < best_v:
                best, best_v = c, v
        return best

    def on_result(self, att: Attempt, now: float) -> None:
        if att.outcome != "ok":
            return
        v = slo_sample(att)
        if v is None:
            return
        key = (att.call.model, att.cluster, att.call.cls.slo.metric)
        w = self.windows.get(key)
        if w is None:
            w = self.windows[key] = _Window(self.WINDOW)
        w.add(v)
