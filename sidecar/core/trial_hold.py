"""Trial failures wait for their run's verdict before they become statistics.

The fast path (:mod:`sidecar.core.health`, "Trial limit") ejects a route after
``K`` consecutive hard failures. The attainment scorer reads the same
failures as outcome evidence, and it is steep: one failure among a dozen
outcomes costs a p95 route most of its weight. On a route that just went
down, each failure therefore cut its share, the trials that complete the run
came ever slower, and the ejection took seconds instead of the ``K`` requests
it needs (the real-Envoy ejection test, a provider killed at 20 req/s, then
saw it tried more than a second after its first failure).

So an error (5xx, a connect failure, a reset) on a route whose run is **on
trial** -- every request sent since the route's first hard failure failed
(:attr:`~sidecar.core.health.RouteHealth.trial_failures`) -- is held here
instead of entering the statistics, and recorded when the run is judged.
Timeouts are never held: each already waited out the class timeout, so their
run cannot finish quickly anyway, and on a loaded route a timeout is the
overload signal the score must see at once (held, two timeouts on a busy
provider herded the shipped ``outage_recovery`` scenario onto it: 1.07 ->
5.10 % violations). Held failures are recorded:

* a success ends the run: the held failures are recorded with it (the route is
  partly failing; the score should see it);
* the run trips (ejection or restriction), or the cluster's circuit opened:
  recorded at once -- the health state now speaks for them;
* a run still open a sub-window after its first held failure: recorded at the
  next tick -- a route too quiet to finish its run within a sub-window is
  judged by its evidence again.

Invariants: at most ``K - 1`` errors are held per route (a run that reaches
``K`` trips and releases them); nothing is dropped except by a warm restart,
whose snapshot does not carry them. The scorer, admission and the weights
never need to know: what they read is the statistics as if the run's failures
had not happened yet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from sidecar.core.types import Observation, SliceKey

Route = tuple[str, SliceKey]


class TrialHold:
    """Held trial failures per (cluster, narrow slice), with when each was held."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: dict[Route, list[tuple[Observation, float]]] = {}

    def __bool__(self) -> bool:
        return bool(self._held)

    def __len__(self) -> int:
        return sum(len(v) for v in self._held.values())

    def __contains__(self, route: object) -> bool:
        return route in self._held

    def hold(self, route: Route, obs: Observation, now: float) -> None:
        self._held.setdefault(route, []).append((obs, now))

    def release(self, route: Route) -> list[Observation]:
        """The route's held failures, oldest first (and forget them)."""
        return [obs for obs, _ in self._held.pop(route, ())]

    def release_all(self) -> list[tuple[Observation, float]]:
        """Every held failure with when it was held (and forget them)."""
        out = [item for held in self._held.values() for item in held]
        self._held.clear()
        return out

    def due(self, now: float, max_age_s: float,
            judged: Callable[[Route], bool]) -> Iterator[tuple[Route, list[Observation]]]:
        """Release every route whose run was judged, or whose oldest held failure is
        at least ``max_age_s`` old (module docstring)."""
        for route in [r for r, held in self._held.items()
                      if held[0][1] <= now - max_age_s or judged(r)]:
            yield route, self.release(route)

    def clusters(self, cluster: str) -> list[Route]:
        """The routes of ``cluster`` holding failures."""
        return [r for r in self._held if r[0] == cluster]
