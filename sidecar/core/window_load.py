"""The load a published window carries, and the route views that add it.

Native weights hold for a whole interval, so the load they act on is not what
the router counts in flight right now (the native path never tells it of a
request until Envoy logs it) but what a window carries:

* :class:`WindowLoad` measures it: the average requests in flight per cluster
  and per slice over the last window (Little's law).
* :class:`LoadedView` is a :class:`~sidecar.core.selection.RouteView` that reads
  another view and counts such a load on top of its in-flight counts -- the
  load a window averaged, or the load :func:`sidecar.core.weights.compute_weights`
  plans for the next one.
* :class:`WindowView` is a :class:`LoadedView` over a router whose latency and
  evidence are read fresh (the one difference, and why, in its docstring).

Added loads are rounded per cluster (``round``, half to even), as in-flight
counts are integers.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping

from sidecar.core.evidence import RouteEvidence
from sidecar.core.router import Router
from sidecar.core.selection import HealthView, LatencyValue, RouteView
from sidecar.core.types import SliceKey


class LoadedView:
    """A :class:`RouteView` that is ``base`` but for in-flight counts:
    ``inflight_c = base.inflight(c) + round(extra[c])``."""

    def __init__(self, base: RouteView, extra: Mapping[str, float]) -> None:
        self._base = base
        self._extra = extra

    def latency(
        self, cluster: str, slice: SliceKey, metric: str, percentile: float, now: float
    ) -> LatencyValue:
        return self._base.latency(cluster, slice, metric, percentile, now)

    def evidence(
        self, cluster: str, slice: SliceKey, metric: str, now: float
    ) -> RouteEvidence | None:
        return self._base.evidence(cluster, slice, metric, now)

    def health(self, cluster: str, slice: SliceKey) -> HealthView:
        return self._base.health(cluster, slice)

    def inflight(self, cluster: str) -> int:
        return self._base.inflight(cluster) + round(self._extra.get(cluster, 0.0))

    def limit_note(self, cluster: str) -> str | None:
        return self._base.limit_note(cluster)


class WindowView(LoadedView):
    """A :class:`LoadedView` over a router's statistics and health, whose in-flight
    counts add the last window's average from the native path (:class:`WindowLoad`).

    Latency and evidence are the router's own (the blended slice evidence of
    :mod:`sidecar.core.evidence`), so native weights judge what per-request
    decisions judge -- but read fresh, as a per-request plan is built:
    published weights hold for a whole interval, so they must not start from a
    blend cached half a sub-window ago. That is all this class changes.
    """

    def __init__(self, router: Router, native_inflight: Mapping[str, float]) -> None:
        super().__init__(router, native_inflight)
        self._router = router

    def latency(
        self, cluster: str, slice: SliceKey, metric: str, percentile: float, now: float
    ) -> LatencyValue:
        return self._router.latency(cluster, slice, metric, percentile, now, fresh=True)

    def evidence(
        self, cluster: str, slice: SliceKey, metric: str, now: float
    ) -> RouteEvidence | None:
        return self._router.evidence(cluster, slice, metric, now, fresh=True)


class WindowLoad:
    """Average requests in flight per cluster (and per slice) over a window.

    Little's law, ``L = sum(durations of requests that ended in the window) / window``:
    exact on average in steady state, one addition per request, and it needs no
    start events (the native path only learns of a request when it is logged).
    """

    def __init__(self) -> None:
        self._busy: defaultdict[tuple[SliceKey, str], float] = defaultdict(float)
        self._since: float | None = None
        self.last: dict[str, float] = {}  # cluster -> average in flight
        self.demand: dict[SliceKey, dict[str, float]] = {}  # slice -> cluster -> average
        self._seen: dict[SliceKey, float] = {}  # slice -> end of the last window with load

    def add(self, slice: SliceKey, cluster: str, duration_s: float) -> None:
        if duration_s > 0 and math.isfinite(duration_s):
            self._busy[(slice, cluster)] += duration_s

    def add_all(self, slice: SliceKey, cluster: str, durations: Iterable[float | None]) -> None:
        """:meth:`add` of each known duration, in order."""
        key = (slice, cluster)
        busy = self._busy.get(key)
        for d in durations:
            if d is not None and d > 0 and math.isfinite(d):
                busy = d if busy is None else busy + d
        if busy is not None:
            self._busy[key] = busy

    def roll(self, now: float) -> dict[str, float]:
        """Close the window ending at ``now``; returns (and keeps as ``last``) its averages."""
        if self._since is not None and now > self._since:
            span = now - self._since
            per_cluster: defaultdict[str, float] = defaultdict(float)
            demand: dict[SliceKey, dict[str, float]] = {}
            for (s, c), busy in self._busy.items():
                per_cluster[c] += busy / span
                demand.setdefault(s, {})[c] = busy / span
            self.last, self.demand = dict(per_cluster), demand
            self._seen.update(dict.fromkeys(demand, now))
        self._since = now
        self._busy.clear()
        return self.last

    def cold(self, slices: Iterable[SliceKey], now: float, horizon_s: float
             ) -> frozenset[SliceKey]:
        """Those of ``slices`` whose last window with load ended over ``horizon_s`` ago,
        or never (:func:`~sidecar.core.weights.compute_weights`: split once, not per
        round of its load planning). Slices idle that long are forgotten here."""
        for s in [s for s, t in self._seen.items() if now - t > horizon_s]:
            del self._seen[s]
        return frozenset(s for s in slices if s not in self._seen)
