"""A ``random.Random`` whose draw is one number given in advance.

:meth:`sidecar.core.request_lane.LanePick.result` rebuilds the pipeline result
of a pick made on the fast lane: it runs the full per-request stage again and
the picker must land where the lane did, so its one ``rng.random()`` answers
with the lane's draw.

This class lives alone because it subclasses a type implemented in C
(``random.Random``): the compiled build of the lab (:mod:`sidecar.devtools.compiled`)
keeps this module interpreted, since a compiled class cannot extend one.
"""

from __future__ import annotations

import random


class ReplayedDraw(random.Random):
    """Answers every ``random()`` with ``u`` (the picker draws once)."""

    def __init__(self, u: float) -> None:
        super().__init__(0)
        self._u = u

    def random(self) -> float:
        return self._u
