"""Pickers: choose one candidate from the scored survivors.

* ``weighted_random`` (default): probability proportional to the combined
  weight, drawn from the injected RNG. Spreading by weight avoids herding all
  traffic onto the momentary best route.
* ``lowest_score``: deterministic semantic-router behaviour: the lowest
  ``latency_aware`` ratio among candidates with data wins, ties and no-data go
  to the first candidate in config order.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Final

from sidecar.core.live_latency import sum_in_order
from sidecar.core.selection import Candidate, Picker, SelectionContext


@dataclass(frozen=True, slots=True)
class WeightedRandom:
    name: str = "weighted_random"

    def __call__(
        self, ctx: SelectionContext, cands: list[Candidate], rng: random.Random
    ) -> Candidate:
        total = sum_in_order([c.weight for c in cands])  # as the request lane adds
        x = rng.random() * total
        for c in cands:
            x -= c.weight
            if x < 0:
                return c
        return cands[-1]


@dataclass(frozen=True, slots=True)
class LowestScore:
    name: str = "lowest_score"

    def __call__(
        self, ctx: SelectionContext, cands: list[Candidate], rng: random.Random
    ) -> Candidate:
        best = cands[0]
        best_ratio = float("inf")
        for c in cands:
            r = c.scores.get("latency_ratio", 0.0)
            if r > 0 and r < best_ratio:  # 0.0 = no complete data: skipped
                best, best_ratio = c, r
        return best


PICKERS: Final[dict[str, Picker]] = {"weighted_random": WeightedRandom(),
                                      "lowest_score": LowestScore()}
