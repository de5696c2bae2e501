"""Every route's health: the :class:`HealthBoard`.

Holds a :class:`~sidecar.core.health.RouteHealth` for routes that differ from
a fresh healthy one (including routes with history or a failure run), runs
window verdicts, probe results, outcome runs and cooldown ticks through them,
and snapshots them for warm restarts.

Besides one entry per (cluster, slice) there is one per cluster under
:data:`CLUSTER_SLICE` (``*|*|*|*``): the fast path counts a cluster-wide run of
hard failures there, so a provider that is down is ejected for every slice
after ``K`` failures in total, not ``K`` per slice; a slice whose run grows
while the cluster's does not (other slices succeed) is ejected alone. The
router combines both entries into what selection sees.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from typing import Any, Final

from sidecar.core.config import HealthConfig, StatsConfig
from sidecar.core.health import HealthState, RouteHealth
from sidecar.core.health_signals import History, WindowVerdict
from sidecar.core.rescue_probe import counts_as_probe
from sidecar.core.types import ANY, SliceKey, TransitionEvent

_Step = Callable[[RouteHealth], list[TransitionEvent]]

#: The key of a cluster-wide entry (hard failures across every slice of a cluster).
CLUSTER_SLICE: Final = SliceKey(ANY, ANY, ANY, None)


class HealthBoard:
    """Every route's :class:`RouteHealth`; stores only routes that differ from a
    fresh healthy one, so it is bounded by the series the caller evaluates."""

    def __init__(self, cfg: HealthConfig, stats_cfg: StatsConfig) -> None:
        self.cfg, self.stats_cfg = cfg, stats_cfg
        self._routes: dict[tuple[str, SliceKey], RouteHealth] = {}
        # Moves on every change a selection could see (caches keyed on health notice).
        self.version = 0
        self._deadline: tuple[int, float | None] = (-1, None)  # (version, next deadline)
        # Routes with an open run of hard failures (a superset: entries are checked).
        self.runs: set[tuple[str, SliceKey]] = set()

    def peek(self, cluster: str, slice: SliceKey) -> RouteHealth | None:
        """The stored state, or None for a (default) healthy route."""
        return self._routes.get((cluster, slice))

    def get(self, cluster: str, slice: SliceKey) -> RouteHealth:
        """The state; a fresh healthy (unstored) one if none is kept. Read-only use."""
        h = self._routes.get((cluster, slice))
        return h if h is not None else RouteHealth(cluster, slice, self.cfg, self.stats_cfg, 0.0)

    def reconfigure(self, cfg: HealthConfig, stats_cfg: StatsConfig) -> None:
        """Config reload: keep every route's state, judge by the new thresholds.

        A new ``stats.subwindow_s`` renumbers the sub-windows (``floor(t / subwindow_s)``):
        each route's newest judged window is carried over as the last new-length window
        that ended by its end. Left in the old numbering, a longer sub-window gave every
        later window a smaller index than the one judged last, and verdicts were dropped
        as already applied for as long as the loop clock had run (a degraded route stayed
        degraded for days on a host up for days)."""
        old_step, new_step = self.stats_cfg.subwindow_s, stats_cfg.subwindow_s
        self.cfg, self.stats_cfg = cfg, stats_cfg
        for h in self._routes.values():
            h.cfg, h.stats_cfg = cfg, stats_cfg
            if h.last_index is not None and new_step != old_step:
                h.last_index = math.floor((h.last_index + 1) * old_step / new_step) - 1
        self.version += 1

    def _run(
        self, cluster: str, slice: SliceKey, now: float, step: _Step
    ) -> list[TransitionEvent]:
        key = (cluster, slice)
        h = self._routes.get(key) or RouteHealth(cluster, slice, self.cfg, self.stats_cfg, now)
        before = (h.state, h.weight)
        events = step(h)
        if h.is_default:
            self._routes.pop(key, None)
        else:
            self._routes[key] = h
        if events or (h.state, h.weight) != before:
            self.version += 1
        return events

    def judge(
        self, cluster: str, slice: SliceKey, v: WindowVerdict, now: float,
        may_quarantine: bool = True, may_quarantine_failing: bool | None = None,
    ) -> list[TransitionEvent]:  # fmt: skip
        """Apply a completed window's verdict (``WindowVerdict.of`` its summary; the router
        builds it once and also reads it: :mod:`sidecar.core.window_evaluation`)."""
        return self._run(cluster, slice, now,
                         lambda h: h.evaluate(v, now, may_quarantine, may_quarantine_failing))

    def evaluate_outcomes(
        self, cluster: str, slice: SliceKey, index: int, requests: int, failures: int,
        now: float,
    ) -> list[TransitionEvent]:  # fmt: skip
        """Judge a kept entry (a cluster-wide one) on outcomes alone: a share of
        failures at ``error_rate_quarantine`` or more re-opens the circuit."""
        if (cluster, slice) not in self._routes:
            return []
        v = WindowVerdict.failures_only(index, requests, failures, self.cfg.error_rate_quarantine)
        return self._run(cluster, slice, now, lambda h: h.evaluate(v, now))

    def record_probe(
        self, cluster: str, slice: SliceKey, ok: bool, now: float, sent: float | None = None,
    ) -> list[TransitionEvent]:
        """A probe finished; ignored unless the route is kept. ``sent``: when a rescue
        was sent (:mod:`sidecar.core.rescue_probe`), None for any other probe (a peer's
        too: one forwarded without a send time). A quarantined route takes only a
        rescue sent since it entered quarantine (:func:`counts_as_probe`), so no other
        probe ends its cooldown: not a slice's probe of its probing cluster entry, nor
        a peer's probe of a copy it still saw probing after the owner had put the route
        back in quarantine."""
        h = self._routes.get((cluster, slice))
        if h is None or (h.state is HealthState.QUARANTINED and not counts_as_probe(h, sent)):
            return []
        rescue = sent is not None
        return self._run(cluster, slice, now, lambda h: h.record_probe(ok, now, rescue))

    def note_outcome(
        self, cluster: str, slice: SliceKey, hard_failure: bool, now: float,
        sent_at: float | None = None, part: str | None = None, timeout: bool = False,
    ) -> bool:
        """Fast path: extend or end the route's run of hard failures; True when it
        reached its ejection threshold (see :meth:`RouteHealth.note_outcome`)."""
        key = (cluster, slice)
        h = self._routes.get(key)
        if h is None:
            if not hard_failure:
                return False  # a success on a fresh route changes nothing
            h = self._routes[key] = RouteHealth(cluster, slice, self.cfg, self.stats_cfg, now)
        tripped = h.note_outcome(hard_failure, now, sent_at, part, timeout)
        if h.streak:
            self.runs.add(key)
        else:
            self.runs.discard(key)
        if h.is_default:
            del self._routes[key]
        return tripped

    def _open_runs(self, cluster: str, slice: SliceKey) -> list[RouteHealth]:
        """The cluster-wide entry and the slice's, where a run is open."""
        out = []
        for key in ((cluster, CLUSTER_SLICE), (cluster, slice)):
            if key in self.runs:
                h = self._routes.get(key)
                if h is not None and h.streak:
                    out.append(h)
                else:
                    self.runs.discard(key)
        return out

    def note_sent(self, cluster: str, slice: SliceKey, now: float) -> None:
        """A request of ``slice`` was sent to ``cluster``: a trial of any open run."""
        for h in self._open_runs(cluster, slice):
            h.note_sent(now)

    def run_held(self, cluster: str, slice: SliceKey, now: float) -> bool:
        """Does an open run's trial limit hold ``cluster`` back for ``slice``
        (:meth:`RouteHealth.run_held`)?"""
        return any(h.run_held(now) for h in self._open_runs(cluster, slice))

    def trial_due(self, cluster: str, slice: SliceKey, now: float) -> bool:
        """Should ``cluster`` take the next request of ``slice`` as a trial
        (:meth:`RouteHealth.trial_due`, and no open run holds it back)?"""
        runs = self._open_runs(cluster, slice)
        return any(h.trial_due(now) for h in runs) and not any(h.run_held(now) for h in runs)

    def on_trial(self, cluster: str, slice: SliceKey) -> bool:
        """Is an open run of ``cluster`` (cluster-wide or the slice's) on paced trial
        (:attr:`RouteHealth.paced`)?"""
        return any(h.paced for h in self._open_runs(cluster, slice))

    def eject(
        self, cluster: str, slice: SliceKey, now: float, may_quarantine: bool = True
    ) -> list[TransitionEvent]:
        """Open the route's circuit after a run of hard failures (fast path)."""
        return self._run(cluster, slice, now, lambda h: h.eject(now, may_quarantine))

    def reset_run(self, cluster: str, slice: SliceKey) -> None:
        """Forget a route's current run (its cluster was ejected as a whole)."""
        h = self._routes.get((cluster, slice))
        if h is not None:
            h.end_run()
        self.runs.discard((cluster, slice))

    def tick(self, now: float) -> list[TransitionEvent]:
        """Expire cooldowns (quarantined -> probing) and forgive old offences."""
        events: list[TransitionEvent] = []
        for (cluster, slice), h in list(self._routes.items()):
            if h.offences or h.relapses or h.state is HealthState.QUARANTINED:
                events += self._run(cluster, slice, now, lambda h: h.tick(now))
        return events

    def next_deadline(self) -> float | None:
        """Earliest cooldown end, when :meth:`tick` has work; None if none pending.
        (Cooldowns only change with a state change, which moves :attr:`version`.)"""
        if self._deadline[0] == self.version:
            return self._deadline[1]
        times = [t for h in self._routes.values() if (t := h.next_deadline()) is not None]
        self._deadline = (self.version, min(times) if times else None)
        return self._deadline[1]

    def items(self) -> list[tuple[tuple[str, SliceKey], RouteHealth]]:
        """Stored (non-default) routes; any other route is healthy at weight 1."""
        return list(self._routes.items())

    def prune(self, live: Collection[tuple[str, SliceKey]]) -> int:
        """Forget routes whose series are gone, except quarantined ones (cooldown pending)
        and the cluster-wide entries of clusters that still have live series."""
        clusters = {c for c, _ in live}
        dead = [k for k, h in self._routes.items()
                if k not in live and h.next_deadline() is None
                and not (k[1] == CLUSTER_SLICE and k[0] in clusters)]  # fmt: skip
        for k in dead:
            del self._routes[k]
        if dead:
            self.version += 1
        return len(dead)

    def to_dict(self, now: float) -> dict[str, Any]:
        return {"routes": [{"cluster": c, "slice": s.label(), "health": _route_to_dict(h, now)}
                           for (c, s), h in self._routes.items()]}  # fmt: skip

    @classmethod
    def from_dict(
        cls, data: dict[str, Any], cfg: HealthConfig, stats_cfg: StatsConfig, now: float
    ) -> HealthBoard:
        """Rebuild a :meth:`to_dict` snapshot as if taken at ``now``; ValueError if malformed."""
        board = cls(cfg, stats_cfg)
        try:
            for r in data["routes"]:
                c, s = str(r["cluster"]), SliceKey.parse(str(r["slice"]))
                h = RouteHealth(c, s, cfg, stats_cfg, now)
                _load_route(h, r["health"], now)
                board._routes[(c, s)] = h
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed health snapshot: {exc!r}") from exc
        return board


# ---------------------------------------------------------------- one route's snapshot

# Snapshot verbatim (fields added later are optional when reading older snapshots).
_PLAIN: Final = ("offences", "panic", "restore_base", "restore_from_circuit")
_PLAIN_OPTIONAL: Final = ("relapses", "streak", "fail_rate")
_TIMES: Final = ("since", "cooldown_until", "last_evidence", "healthy_since")  # snapshot as ages
_NULLABLE: Final = ("cooldown_until",)  # the other times always hold one
_TIMES_OPTIONAL: Final = ("restored_at", "streak_since")


def _route_to_dict(h: RouteHealth, now: float) -> dict[str, Any]:
    """JSON-safe; times as ages before ``now``, window index as sub-windows before it."""
    k = math.floor(now / h.stats_cfg.subwindow_s)
    out: dict[str, Any] = {f: getattr(h, f) for f in (*_PLAIN, *_PLAIN_OPTIONAL)}
    out |= {f: None if (t := getattr(h, f)) is None else now - t
            for f in (*_TIMES, *_TIMES_OPTIONAL)}  # fmt: skip
    out["state"] = h.state.value
    out["votes"] = {t.value: n for t, n in h.votes.items()}
    out["last_index"] = None if h.last_index is None else k - h.last_index
    out["history"] = {"windows": h.history.windows, "watch": h.history.watch,
                      "recover": h.history.recover}  # fmt: skip
    out["run"] = {"parts": sorted(h.run_parts), "confined": h.run_confined}
    return out


def _finite(raw: Any) -> float:
    """A snapshot number that is a number: NaN or an infinity in a time would reach the
    health machine's arithmetic (a NaN cooldown crashed every tick, and was written back
    into the next snapshot)."""
    x = float(raw)
    if not math.isfinite(x):
        raise ValueError(f"not a finite number: {raw!r}")
    return x


def _count(raw: Any) -> int:
    n = int(raw)
    if n < 0:
        raise ValueError(f"negative count: {raw!r}")
    return n


def _like(current: Any, raw: Any) -> Any:
    """``raw`` read as the type of the field's current value, checked."""
    if isinstance(current, bool):
        return bool(raw)
    if isinstance(current, int):
        return _count(raw)
    if isinstance(current, float):
        return _finite(raw)
    return type(current)(raw)


def _load_route(h: RouteHealth, d: dict[str, Any], now: float) -> None:
    """Inverse of :func:`_route_to_dict`; raises KeyError/ValueError/TypeError if malformed
    (non-finite times and shares, negative counts included)."""
    k = math.floor(now / h.stats_cfg.subwindow_s)
    for f in _PLAIN:
        setattr(h, f, _like(getattr(h, f), d[f]))
    for f in _PLAIN_OPTIONAL:
        if f in d:
            setattr(h, f, _like(getattr(h, f), d[f]))
    if not (0.0 <= h.restore_base <= 1.0 and 0.0 <= h.fail_rate <= 1.0):
        raise ValueError("restore_base and fail_rate must be shares in [0, 1]")
    for f in _TIMES:
        # Only a cooldown may be absent: a null ``since`` or ``last_evidence`` was
        # restored as a "warm start" and the first tick died on it (exit 1), and the
        # shutdown snapshot wrote it back -- a restart loop.
        if d[f] is None and f not in _NULLABLE:
            raise ValueError(f"{f} is null")
        setattr(h, f, None if d[f] is None else now - _finite(d[f]))
    for f in _TIMES_OPTIONAL:
        if d.get(f) is not None:
            setattr(h, f, now - _finite(d[f]))
    h.state = HealthState(d["state"])
    h.votes = {HealthState(t): _count(n) for t, n in d["votes"].items()}
    h.last_index = None if d["last_index"] is None else k - int(d["last_index"])
    hist = d.get("history")
    if hist is not None:
        h.history = History(_count(hist["windows"]), _finite(hist["watch"]),
                            _finite(hist["recover"]))
    run = d.get("run")
    if run is not None:
        h.run_parts, h.run_confined = {str(p) for p in run["parts"]}, bool(run["confined"])
