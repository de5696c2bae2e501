"""What fleet mode reads from and writes into the core: sub-window contents and route states.

Pure (no clock, no I/O): :mod:`sidecar.fleet` does the talking to the store and
calls these with ``now``. Three pieces, each the narrowest hook into the core:

* **Statistics out**: :func:`live_subwindows` copies every narrow series' live
  sub-windows (counters and per-metric histograms) as :class:`SubWindowData`.
* **Statistics in**: :func:`merge_subwindow` adds another replica's sub-window
  contents into the series the local store records that slice under (the
  admitted narrow key, as :meth:`StatsStore.admit` would choose it) *and* each
  of its ``broader()`` slices, exactly as :meth:`StatsStore.observe` records an
  observation. So after merging, ``lookup`` and ``window_summary`` answer from
  the union of the local and the merged evidence::

      merge_subwindow(A, B's sub-windows)  ==  A as if it had observed B's requests too

  (property-tested in ``tests/test_fleet_share.py``), up to time placement: a
  merged sub-window lands in the local sub-window of the same index.
* **Health**: :class:`FollowerBoard` is a :class:`HealthBoard` that does not
  evaluate, tick or take probe results for routes another replica owns (it
  queues those probe results for the owner instead) -- except that its own
  run of hard failures on such a route ejects it here at once, and the route is
  then this replica's to decide until the owner publishes a newer state;
  :func:`route_state` and :func:`adopt_route` move one route's state between
  boards through the warm-restart snapshot codec of :mod:`sidecar.core.health_board`.

Invariants:

1. Merging never removes evidence: counters and histogram weights only grow.
2. A merged sub-window older than the local window is dropped; one newer than
   the local current sub-window (a peer's clock ahead) lands in the current one;
   one the local health evaluation already judged (it arrived after the
   sub-window closed: a push interval late) lands in the current one too, so
   the next verdict counts it instead of no verdict ever seeing it -- unless it
   is older than the series' fence (:meth:`RouteStats.fence`: the circuit
   closed since), then it lands in its own sub-window, which the fence keeps
   out of the evidence, as it does the local replica's own requests of then.
3. Merging invalidates every cached merge and quantile of the series it touches.
4. A followed route's state changes only through :func:`adopt_route`, or by this
   replica's own fast path, which makes it :attr:`FollowerBoard.escalated` (no
   longer followed); whoever adopts a state that closes the route's circuit
   (:func:`closes_circuit`) fences the route's evidence, as the owner's router did.
5. Runs of hard failures are each replica's own: :func:`adopt_route` keeps the
   local run, trials, failure rate and episode, never the publisher's.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from sidecar.core.config import HealthConfig, Metric, StatsConfig
from sidecar.core.health import HealthState, RouteHealth
from sidecar.core.health_board import HealthBoard, _load_route, _route_to_dict
from sidecar.core.histogram import LogHistogram
from sidecar.core.series import RouteStats
from sidecar.core.stats import OVERFLOW_CLASS, StatsStore
from sidecar.core.subwindow import DecayedWindow
from sidecar.core.types import SliceKey, TransitionEvent

Route = tuple[str, SliceKey]
# A probe result for a route's owner: cluster, slice, ok, local send time of a rescue.
ProbeResult = tuple[str, SliceKey, bool, float | None]
COUNTERS: Final = ("ok", "error", "timeout", "cancel")


@dataclass(slots=True)
class SubWindowData:
    """The contents of one sub-window of one series (``index`` = floor(start / subwindow_s))."""

    index: int
    ok: int = 0
    error: int = 0
    timeout: int = 0
    cancel: int = 0
    hists: dict[Metric, LogHistogram] = field(default_factory=dict)  # non-empty ones only
    # Of the cancels, those whose measured first token is a TTFT sample
    # (SubWindow.first); travels apart from the four counters (codec: older replicas).
    first: int = 0

    @property
    def empty(self) -> bool:
        return not (self.ok or self.error or self.timeout or self.cancel
                    or any(h.count for h in self.hists.values()))  # fmt: skip

    def total(self) -> float:
        """Counters plus histogram weights: changes whenever the contents change."""
        return (self.ok + self.error + self.timeout + self.cancel + self.first
                + sum(h.count for h in self.hists.values()))  # fmt: skip


def hist_minus(a: LogHistogram, b: LogHistogram) -> LogHistogram:
    """``a - b`` bucket by bucket (the zero bucket too), each weight clamped at zero,
    over ``a``'s non-empty span: as one vector operation. Every push takes it of every
    live sub-window of every series and of every grown peer record; bucket by bucket in
    Python it held the event loop (and every decision) for a tenth of a second and more
    a push with a few hundred series and four peers."""
    zero = max(a.zero - b.zero, 0.0)
    span_a, span_b = a.span(), b.span()
    # Unchecked: a's weights less b's, clamped at zero, as a's own are.
    if span_a is None:
        return LogHistogram.from_span(a.relative_accuracy, zero, 0, None, checked=False)
    lo_a, counts = span_a[0], span_a[1].copy()
    if span_b is not None:
        lo_b, src = span_b
        lo, hi = max(lo_a, lo_b), min(lo_a + len(counts), lo_b + len(src)) - 1
        if lo <= hi:
            counts[lo - lo_a : hi - lo_a + 1] -= src[lo - lo_b : hi - lo_b + 1]
            np.maximum(counts, 0.0, out=counts)
    nz = np.flatnonzero(counts)
    if not len(nz):
        return LogHistogram.from_span(a.relative_accuracy, zero, 0, None, checked=False)
    # The span of what is left, as hist_to_dict / hist_from_dict would keep it.
    left = counts[nz[0] : nz[-1] + 1].copy()
    return LogHistogram.from_span(a.relative_accuracy, zero, lo_a + int(nz[0]), left,
                                  checked=False)


def live_subwindows(store: StatsStore, now: float) -> Iterator[tuple[Route, list[SubWindowData]]]:
    """Every non-stale narrow series with copies of its live sub-windows, oldest first."""
    for cluster, s in store.narrow_keys():
        rs = store.series(cluster, s)
        if rs is None or rs.is_stale(now):
            continue
        rs._sync(now)  # rotate through the series (see _add), never the bare ring
        subs = [
            SubWindowData(slot.index, slot.ok, slot.error, slot.timeout, slot.cancel,
                          {m: h.copy() for m, h in slot.hists.items() if h.count},
                          slot.first)
            for _, slot in rs.window.live(now)
            if slot.requests or slot.cancel or any(h.count for h in slot.hists.values())
        ]  # fmt: skip
        if subs:
            yield (cluster, s), subs[::-1]


def merge_subwindow(
    store: StatsStore, cluster: str, slice: SliceKey, data: SubWindowData, now: float,
    seen_at: float | None = None,
) -> SliceKey | None:
    """Add ``data`` into the local series of ``slice`` and its broader slices.

    Returns the narrow key it was recorded under (None if ``data`` is outside the
    local window). ``seen_at`` (the peer's newest observation, on the local
    clock) keeps merged-only series from being judged stale.
    """
    return None if (got := merge_placed(store, cluster, slice, data, now, seen_at)) is None \
        else got[0]


def merge_placed(
    store: StatsStore, cluster: str, slice: SliceKey, data: SubWindowData, now: float,
    seen_at: float | None = None,
) -> tuple[SliceKey, int] | None:
    """:func:`merge_subwindow` that also says which local sub-window it landed in."""
    key = _admit(store, cluster, slice)
    index = _placement(store.series(cluster, key), data.index, now, store.cfg)
    if index is None:
        return None
    for s in (key, *key.broader()):
        _add(store.ensure_series(cluster, s), data, index, now, seen_at)
    return key, index


def _placement(rs: RouteStats | None, index: int, now: float, cfg: StatsConfig) -> int | None:
    """Invariant 2: where a peer's sub-window ``index`` lands locally (None: dropped)."""
    k = math.floor(now / cfg.subwindow_s) if rs is None else rs._sync(now)
    if index <= k - cfg.subwindows:
        return None
    if index > k:
        return k
    if rs is None:
        return index
    if index < rs.fence_index:
        return index  # before a fence: kept in the ring, as the local's own, never evidence
    unjudged = rs.span.unjudged
    return k if unjudged is not None and index < unjudged else index


def _admit(store: StatsStore, cluster: str, slice: SliceKey) -> SliceKey:
    """The narrow key, as ``observe`` would choose; a peer's overflow key stays one."""
    if slice.klass == OVERFLOW_CLASS:
        store.keep_overflow(cluster, slice)
        return slice
    return store.admit(cluster, slice)


def _add(rs: RouteStats, data: SubWindowData, idx: int, now: float,
         seen_at: float | None) -> None:
    # Rotate through the series' own path (never the bare ring): the decayed window
    # must fold and expire the sub-windows it holds before their slots are reused.
    k = rs._sync(now)
    n = rs.cfg.subwindows
    if idx <= k - n:
        return
    slot = rs.window._ring[idx % n]
    if slot.index != idx:
        slot.reset(idx)
    for c in COUNTERS:
        setattr(slot, c, getattr(slot, c) + getattr(data, c))
    slot.first += min(data.first, data.cancel)  # a first is one of the cancels
    for m, h in data.hists.items():
        slot.hists[m].merge(h)
    # Invariant 3: the decayed window (when a completed sub-window changed) and the
    # evidence cache are stale now; a fresh DecayedWindow is rebuilt from the ring on
    # the next read, which also honours the route's fence.
    if idx < k:
        rs._past = DecayedWindow(rs.accuracy)
    rs._evidence.clear()
    rs.version += 1
    seen = now if seen_at is None else min(seen_at, now)
    rs.last_seen = seen if rs.last_seen is None else max(rs.last_seen, seen)


# ---------------------------------------------------------------- health


class FollowerBoard(HealthBoard):
    """A :class:`HealthBoard` that leaves routes in :attr:`followed` to their owner.

    For a followed route, window verdicts and cooldown ticks are ignored and
    probe results are queued in :attr:`probe_outbox` (for the owner, which
    counts every replica's probes toward one tally); its state changes only
    by :func:`adopt_route` -- or by this replica's own run of hard failures
    (:meth:`eject`): the owner sees its own share of the traffic only, and a
    provider that fails every request here must not keep this share until the
    owner's run trips and a push carries its verdict (that made shared replicas
    slower to leave a dead provider than isolated ones). The route is then in
    :attr:`escalated` and decided here; :class:`~sidecar.fleet.sync.FleetSync`
    follows it again once the owner publishes a newer state or it is healthy
    again. With ``followed`` empty it is a plain board.
    """

    def __init__(self, cfg: HealthConfig, stats_cfg: StatsConfig) -> None:
        super().__init__(cfg, stats_cfg)
        self.followed: set[Route] = set()
        # (cluster, slice, ok, when sent: only for a rescue, as record_probe has it)
        self.probe_outbox: list[ProbeResult] = []
        self.escalated: dict[Route, float] = {}  # route -> when this replica ejected it

    @classmethod
    def wrap(cls, board: HealthBoard) -> FollowerBoard:
        """A follower board holding ``board``'s routes (``board`` itself is not used again)."""
        if isinstance(board, FollowerBoard):
            return board
        out = cls(board.cfg, board.stats_cfg)
        out._routes = board._routes
        return out

    def _run(self, cluster: str, slice: SliceKey, now: float, step: Any) -> list[TransitionEvent]:
        if (cluster, slice) in self.followed:
            return []
        return super()._run(cluster, slice, now, step)

    def eject(
        self, cluster: str, slice: SliceKey, now: float, may_quarantine: bool = True
    ) -> list[TransitionEvent]:
        """This replica's own run of hard failures tripped: eject here, followed route
        or not (class docstring); a followed one becomes :attr:`escalated`."""
        key = (cluster, slice)
        if key in self.followed:
            self.followed.discard(key)
            self.escalated[key] = now
        return super().eject(cluster, slice, now, may_quarantine)

    def next_deadline(self) -> float | None:
        """Cooldowns of followed routes are the owner's to end: a passed one must not
        make the caller tick again and again."""
        times = [t for key, h in self._routes.items()
                 if key not in self.followed and (t := h.next_deadline()) is not None]
        return min(times) if times else None

    def record_probe(
        self, cluster: str, slice: SliceKey, ok: bool, now: float, sent: float | None = None,
    ) -> list[TransitionEvent]:
        if (cluster, slice) in self.followed:
            # ``sent`` is a rescue's send time (None: any other probe), and goes as it
            # is: the owner checks it against its own quarantine, which no other probe
            # may end (an owner that quarantined the route again ignores those).
            if len(self.probe_outbox) < 10_000:  # bounded while the store is slow
                self.probe_outbox.append((cluster, slice, ok, sent))
            return []
        return super().record_probe(cluster, slice, ok, now, sent)


def route_state(board: HealthBoard, cluster: str, slice: SliceKey, now: float) -> dict[str, Any]:
    """One route's state in the snapshot codec (times as ages before ``now``);
    ``{}`` for a route in the default healthy state."""
    h = board.peek(cluster, slice)
    return {} if h is None else _route_to_dict(h, now)


def route_signature(board: HealthBoard, cluster: str, slice: SliceKey) -> tuple[Any, ...]:
    """Changes exactly when the route's state does (unlike :func:`route_state`'s ages)."""
    h = board.peek(cluster, slice)
    if h is None:
        return ()
    # Relapse memory and the route's own history included: a handover must carry them
    # (the history moves once per judged window: one field per route and window).
    return (h.state.value, h.since, h.cooldown_until, h.offences, h.relapses, h.panic,
            h.restore_base, h.restore_from_circuit, tuple(sorted(h.votes.items())),
            h.last_index, h.history.windows)


def closes_circuit(old: RouteHealth | None, new: RouteHealth | None) -> bool:
    """Does replacing state ``old`` by ``new`` close the route's circuit (open before,
    or restoring from a circuit after while not before)? Adopting such a state
    must fence the route's evidence, as the owner's router did on the transition."""
    def restoring(h: RouteHealth | None) -> bool:
        return h is not None and h.state is HealthState.RESTORING and h.restore_from_circuit

    was_open = old is not None and old.circuit_open
    is_open = new is not None and new.circuit_open
    return (was_open and not is_open) or (restoring(new) and not restoring(old))


def adopt_route(
    board: HealthBoard, cluster: str, slice: SliceKey, data: dict[str, Any], at: float,
    now: float, reason: str,
) -> TransitionEvent | None:
    """Replace one route's state with ``data`` (:func:`route_state` output written at
    local time ``at``; ``{}`` = default healthy). Returns the event if the state
    changed; ``ValueError`` if ``data`` is malformed (the board is then unchanged)."""
    key = (cluster, slice)
    old = board.peek(cluster, slice)
    old_state = "healthy" if old is None else old.state.value
    h = RouteHealth(cluster, slice, board.cfg, board.stats_cfg, at)
    if data:
        try:
            _load_route(h, data, at)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed route state: {exc!r}") from exc
    # Invariant 5: the publisher's run counted its outcomes, not ours (a streak it had
    # when it published would otherwise make our next failures eject early).
    h.keep_run_of(old, now)
    if h.is_default:
        board._routes.pop(key, None)
    else:
        board._routes[key] = h
    if h.streak:
        board.runs.add(key)
    new_state = h.state.value
    board.version += 1  # what selection sees may have changed: cached plans rebuild
    if new_state == old_state:
        return None
    return TransitionEvent(now, cluster, slice.label(), old_state, new_state, reason)
