"""Rolling latency statistics per (cluster, slice): the :class:`StatsStore`.

Each series is a :class:`~sidecar.core.series.RouteStats` (the sub-window
ring, its rate-following window, accuracy and memory: see
:mod:`sidecar.core.series`). Every observation is recorded under its admitted
narrow slice and each of that slice's ``broader()`` slices; :class:`StatsStore`
caps a cluster at ``5 x max_slices + 2`` series (:meth:`StatsStore.admit`).
:meth:`StatsStore.evidence` blends a slice with its broader slices
(:mod:`sidecar.core.evidence`) and caches the result until one of the series
it was built from moves on.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from sidecar.core.buckets import buckets
from sidecar.core.config import Metric, StatsConfig
from sidecar.core.evidence import RouteEvidence, blend
from sidecar.core.series import REFRESH_SHARE_OF_SUBWINDOW, RouteStats
from sidecar.core.series_snapshot import series_from_dict, series_to_dict
from sidecar.core.subwindow import (
    METRICS,
    OkSample,
    SeriesWindow,
    WindowSummary,
    as_metric,
    latency_indices,
    ok_index_lists,
)
from sidecar.core.types import ANY, OVERFLOW_CLASS, Observation, SliceKey

__all__ = [
    "GLOBAL_OVERFLOW",
    "LAYOUT_FIELDS",
    "METRICS",
    "OVERFLOW_CLASS",
    "Lookup",
    "RouteEvidence",
    "RouteStats",
    "SeriesWindow",
    "StatsStore",
    "WindowSummary",
    "as_metric",
]

GLOBAL_OVERFLOW: Final = SliceKey(OVERFLOW_CLASS, OVERFLOW_CLASS, ANY, None)
# Stats fields a store cannot be carried across (StatsStore.reconfigure): sub-windows
# are numbered floor(t / subwindow_s), so those of another length cover other spans
# of time and cannot be merged, split or compared.
LAYOUT_FIELDS: Final = ("subwindow_s",)
# A slice and its broader slices on one cluster, narrow first, with their series (if any).
_Levels = tuple[tuple[SliceKey, RouteStats | None], ...]


@dataclass(frozen=True, slots=True)
class Lookup:
    """Answer of :meth:`StatsStore.lookup`: the value and which slice gave it."""

    value: float | None  # seconds
    used: SliceKey | None
    fell_back: bool  # a broader slice answered because the narrow one lacked data
    samples: int  # window samples of the slice used (of the narrow one when value is None)


class StatsStore:
    """All series: ``(cluster, SliceKey) -> RouteStats``, bounded per cluster."""

    def __init__(self, cfg: StatsConfig, relative_accuracy: float = 0.02) -> None:
        self.cfg = cfg
        self.accuracy = relative_accuracy
        self._series: dict[tuple[str, SliceKey], RouteStats] = {}
        self._narrow: dict[str, set[SliceKey]] = {}  # admitted narrow slices per cluster
        self._overflow: dict[str, set[SliceKey]] = {}  # overflow slices in use per cluster
        # Moves when series are created or dropped (caches keyed on series must notice).
        self.layout = 0
        self._blends: dict[tuple[str, SliceKey, Metric], _Blend] = {}
        # _levels()' answers: ((layout, number of series), levels) per (cluster, slice).
        self._level_cache: dict[tuple[str, SliceKey], tuple[tuple[int, int], _Levels]] = {}
        self._max_age_s = cfg.subwindow_s * REFRESH_SHARE_OF_SUBWINDOW
        self._geometry = buckets(relative_accuracy)  # bucket indices for observe()
        # observe()'s answer per (cluster, observed slice): the layout it holds for, the
        # admitted key and the series it records into. An admitted narrow or per-model
        # overflow key stays admitted until a prune, which moves the layout.
        self._routes: dict[tuple[str, SliceKey], tuple[int, SliceKey, tuple[RouteStats, ...]]] = {}

    def reconfigure(self, cfg: StatsConfig) -> bool:
        """Config reload: keep every series and read it by ``cfg`` from now on
        (:meth:`RouteStats.reconfigure`); False, and nothing changed, when a field of
        :data:`LAYOUT_FIELDS` differs: then the series cannot be kept. A lowered
        ``max_slices`` caps the slices admitted from now on; those already admitted
        stay until they go stale."""
        if any(getattr(cfg, f) != getattr(self.cfg, f) for f in LAYOUT_FIELDS):
            return False
        self.cfg = cfg
        for rs in self._series.values():
            rs.reconfigure(cfg)
        self.layout += 1  # drops the blends, built with the old prior and sample counts
        return True

    def admit(self, cluster: str, slice: SliceKey) -> SliceKey:
        """The narrow key an observation of ``slice`` is recorded under: the first
        ``max_slices`` distinct slices of a cluster are kept, later ones fold into
        ``SliceKey(model, "_overflow", "*", None)`` (class and profile come from
        request headers: caller-controlled cardinality), and once ``max_slices``
        models overflow, into :data:`GLOBAL_OVERFLOW`. With their ``broader()``
        slices: at most ``3 x max_slices + 2 x (max_slices + 1)`` series."""
        narrow = self._narrow.setdefault(cluster, set())
        if slice in narrow or len(narrow) < self.cfg.max_slices:
            narrow.add(slice)
            return slice
        over = self._overflow.setdefault(cluster, set())
        key = SliceKey(slice.model, OVERFLOW_CLASS, ANY, None)
        if key not in over and len(over) >= self.cfg.max_slices:
            key = GLOBAL_OVERFLOW
        over.add(key)
        return key

    def keep_overflow(self, cluster: str, key: SliceKey) -> None:
        """Record overflow key ``key`` as in use on ``cluster`` (narrow from now on), as
        :meth:`admit` does when it folds a slice into it: for a key that arrives as one
        (a snapshot's series, a peer's sub-window), never to be admitted again."""
        self._overflow.setdefault(cluster, set()).add(key)

    def key_of(self, cluster: str, slice: SliceKey) -> SliceKey:
        """The narrow key :meth:`observe` records ``slice`` under (admitting it)."""
        return self._hit(cluster, slice)[1]

    def _hit(self, cluster: str, slice: SliceKey) -> tuple[int, SliceKey, tuple[RouteStats, ...]]:
        hit = self._routes.get((cluster, slice))
        if hit is None or hit[0] != self.layout:
            hit = self._route(cluster, slice)
        return hit

    def observe(self, obs: Observation, now: float) -> SliceKey:
        """Record into the admitted narrow slice and each of its ``broader()``
        slices (so broader slices are true aggregates); returns the narrow key."""
        hit = self._hit(obs.cluster, obs.slice)
        indices = latency_indices(obs, self._geometry)
        k = math.floor(now / self.cfg.subwindow_s)  # every series shares the sub-window length
        for rs in hit[2]:
            rs.record(obs.outcome, indices, now, k)
        return hit[1]

    def observe_ok(self, cluster: str, slice: SliceKey, samples: Sequence[OkSample],
                   now: float) -> SliceKey:
        """:meth:`observe` of many ``ok`` first attempts of one route at ``now``, each
        value's bucket index computed once for all its series; returns the narrow key."""
        hit = self._hit(cluster, slice)
        indices = ok_index_lists(samples, self._geometry)
        n = len(samples)
        for rs in hit[2]:
            rs.record_ok(n, indices, now)
        return hit[1]

    def _route(
        self, cluster: str, slice: SliceKey
    ) -> tuple[int, SliceKey, tuple[RouteStats, ...]]:
        """Admit ``slice`` and create its series (:meth:`observe`); remembered per layout."""
        key = self.admit(cluster, slice)
        series = []
        for s in (key, *key.broader()):
            rs = self._series.get((cluster, s))
            if rs is None:
                rs = self._series[(cluster, s)] = RouteStats(self.cfg, self.accuracy)
                self.layout += 1
            series.append(rs)
        hit = (self.layout, key, tuple(series))
        if key != GLOBAL_OVERFLOW:  # that one may turn into a per-model key later
            if len(self._routes) >= 4096:
                self._routes.clear()
            self._routes[(cluster, slice)] = hit
        return hit

    def evidence(
        self, cluster: str, slice: SliceKey, metric: Metric, now: float,
        max_age_s: float | None = None,
    ) -> RouteEvidence | None:
        """The blended estimate of ``slice`` on ``cluster`` (see
        :mod:`sidecar.core.evidence`); None when no level has any outcome.
        Reused within its sub-window while no contributing series saw a new
        observation, or while younger than ``max_age_s`` (default: half a
        sub-window; 0 asks for fresh evidence), and the set of series is the same."""
        k = math.floor(now / self.cfg.subwindow_s)
        age = self._max_age_s if max_age_s is None else max_age_s
        bkey = (cluster, slice, metric)
        hit = self._blends.get(bkey)
        if hit is not None and hit.k == k and hit.layout == self.layout and (
                now - hit.built < age or hit.unchanged()):
            return hit.value
        deps = self._levels(cluster, slice)
        levels = [(s, None if rs is None else rs.evidence(metric, now, age)) for s, rs in deps]
        value = blend(levels, self.cfg.prior_samples, self.cfg.min_samples, self.accuracy)
        if len(self._blends) >= 4096:
            self._blends.clear()
        self._blends[bkey] = _Blend(k, now, self.layout, deps, value)
        return value

    def _levels(self, cluster: str, slice: SliceKey) -> _Levels:
        """``slice`` and its ``broader()`` slices on ``cluster`` with their series (None:
        none yet), narrow first. Kept while the layout and the number of series stay
        (a prune moves the layout; a peer's merge may create series without moving it)."""
        hit = self._level_cache.get((cluster, slice))
        if hit is not None and hit[0] == (self.layout, len(self._series)):
            return hit[1]
        levels = tuple((s, self._series.get((cluster, s))) for s in (slice, *slice.broader()))
        if len(self._level_cache) >= 4096:
            self._level_cache.clear()
        self._level_cache[(cluster, slice)] = ((self.layout, len(self._series)), levels)
        return levels

    def lookup(self, cluster: str, slice: SliceKey, metric: str, q: float, now: float) -> Lookup:
        """Quantile from the narrowest of ``(slice, *slice.broader())`` holding
        ``>= min_samples`` window samples; slices are never mixed."""
        m = as_metric(metric)
        narrow_n = 0
        for s in (slice, *slice.broader()):
            rs = self._series.get((cluster, s))
            if rs is None:
                continue
            value, n = rs.quantile_and_count(m, q, now)
            narrow_n = n if s == slice else narrow_n
            if value is not None:
                return Lookup(value, s, s != slice, n)
        return Lookup(None, None, False, narrow_n)

    def window_summary(
        self, cluster: str, slice: SliceKey, metric: str, q: float, now: float
    ) -> WindowSummary:
        """:meth:`RouteStats.window_summary` of one series (an empty one if unknown)."""
        rs = self._series.get((cluster, slice)) or RouteStats(self.cfg, self.accuracy)
        return rs.window_summary(now, as_metric(metric), q)

    def close_span(self, cluster: str, slice: SliceKey, now: float) -> None:
        """The verdict just given judged the series' open evaluation span: the next one
        starts at the current sub-window (:mod:`sidecar.core.evaluation_span`)."""
        rs = self._series.get((cluster, slice))
        if rs is not None:
            rs.close_span(now)

    def fence(self, cluster: str, slice: SliceKey | None, now: float) -> None:
        """Start ``slice``'s evidence on ``cluster`` afresh (every series of the
        cluster when None); see :meth:`RouteStats.fence`."""
        for (c, s), rs in self._series.items():
            if c == cluster and (slice is None or s == slice):
                rs.fence(now)

    def series(self, cluster: str, slice: SliceKey) -> RouteStats | None:
        return self._series.get((cluster, slice))

    def ensure_series(self, cluster: str, slice: SliceKey) -> RouteStats:
        """The series of ``slice`` on ``cluster``, created empty if there is none. Unlike
        :meth:`observe`'s it does not move the layout (a peer's merge: :meth:`_levels`
        notices the new series by their number)."""
        rs = self._series.get((cluster, slice))
        if rs is None:
            rs = self._series[(cluster, slice)] = RouteStats(self.cfg, self.accuracy)
        return rs

    def is_narrow(self, cluster: str, slice: SliceKey) -> bool:
        """True for slices observations are recorded under directly (not aggregates)."""
        return slice in self._narrow.get(cluster, ()) or slice in self._overflow.get(cluster, ())

    def slice_counts(self, cluster: str) -> tuple[int, int]:
        """``(narrow, overflow)``: the slices ``cluster`` admitted (at most ``max_slices``)
        and the overflow slices in use (:meth:`admit`): above 0 while requests of
        slices beyond the cap are recorded, and routed, as their model's overflow
        slice. Read at scrape time, so folding costs no request anything more."""
        return len(self._narrow.get(cluster, ())), len(self._overflow.get(cluster, ()))

    def narrow_keys(self) -> list[tuple[str, SliceKey]]:
        """Keys recorded under directly, incl. overflow keys (what health evaluates), sorted."""
        keys = [(c, s) for c, ss in (*self._narrow.items(), *self._overflow.items()) for s in ss]
        return sorted(keys, key=lambda k: (k[0], k[1].label()))

    def items(self) -> list[tuple[tuple[str, SliceKey], RouteStats]]:
        """A copy of all series, safe to iterate while observing."""
        return list(self._series.items())

    def __len__(self) -> int:
        return len(self._series)

    def prune(self, now: float) -> list[tuple[str, SliceKey]]:
        """Drop stale series (they report no data anyway), freeing their cap slots."""
        dead = [key for key, rs in self._series.items() if rs.is_stale(now)]
        if dead:
            self.layout += 1
        for cluster, s in dead:
            del self._series[(cluster, s)]
            self._narrow.get(cluster, set()).discard(s)
            self._overflow.get(cluster, set()).discard(s)
        return dead

    def to_dict(self, now: float) -> dict[str, Any]:
        """JSON-safe warm-restart snapshot (times as ages relative to ``now``)."""
        return {**self.to_dict_head(), "series": list(self.series_dicts(now))}

    def to_dict_head(self) -> dict[str, Any]:
        """:meth:`to_dict` but for its last key, ``series``."""
        return {"subwindow_s": self.cfg.subwindow_s, "relative_accuracy": self.accuracy}

    def series_dicts(self, now: float) -> Iterator[dict[str, Any]]:
        """The ``series`` of :meth:`to_dict`, one at a time, so a caller may pause between
        them (the routes are the ones held when it starts; one observed meanwhile is
        read as of its newest sub-window, never with an age below 0)."""
        narrow = set(self.narrow_keys())
        for (c, s), rs in list(self._series.items()):
            if not rs.is_stale(now):
                yield {"cluster": c, "slice": s.label(), "narrow": (c, s) in narrow,
                       "stats": series_to_dict(rs, now)}

    @classmethod
    def from_dict(
        cls, data: dict[str, Any], cfg: StatsConfig, now: float, relative_accuracy: float = 0.02
    ) -> StatsStore:
        """Rebuild a :meth:`to_dict` snapshot as if taken at ``now``; ``ValueError``
        if it is malformed or used another sub-window length or accuracy."""
        if data.get("subwindow_s") != cfg.subwindow_s:
            raise ValueError("snapshot sub-window length differs from the configuration")
        if data.get("relative_accuracy") != relative_accuracy:
            raise ValueError("snapshot histogram accuracy differs from the configuration")
        store = cls(cfg, relative_accuracy)
        try:
            for entry in data.get("series", []):
                cluster, s = str(entry["cluster"]), SliceKey.parse(str(entry["slice"]))
                if s.klass == OVERFLOW_CLASS:
                    store.keep_overflow(cluster, s)
                elif entry.get("narrow") and store.admit(cluster, s) != s:
                    continue  # max_slices shrank: drop what no longer fits
                store._series[(cluster, s)] = series_from_dict(
                    entry["stats"], cfg, now, relative_accuracy
                )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed stats snapshot: {exc!r}") from exc
        return store


class _Blend:
    """A cached :meth:`StatsStore.evidence` answer and what it was built from."""

    __slots__ = ("built", "deps", "k", "layout", "value", "versions")

    def __init__(
        self, k: int, built: float, layout: int, levels: _Levels, value: RouteEvidence | None,
    ) -> None:
        self.k, self.built, self.layout, self.value = k, built, layout, value
        self.deps = [rs for _, rs in levels if rs is not None]
        self.versions = [rs.version for rs in self.deps]

    def unchanged(self) -> bool:
        """No contributing series saw an observation since this was built."""
        return all(rs.version == v for rs, v in zip(self.deps, self.versions, strict=True))
