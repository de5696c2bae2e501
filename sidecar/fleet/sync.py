"""One replica's side of fleet sharing, sans I/O: :class:`FleetSync`.

Every push interval the link (or the policy lab) asks :meth:`FleetSync.outgoing`
for one :class:`Exchange`, has a store carry it out, and hands the
:class:`Reply` to :meth:`FleetSync.incoming`. Between the two calls the router
keeps deciding on what it has: nothing here is on the request path.

**Statistics.** The router's store holds this replica's own observations
*plus* what it merged from peers. Per narrow series and sub-window::

    own    = local contents - merged-from-peers        (codec.diff)
    pushed = own, whenever it changed since the last push (an idempotent overwrite)

A peer's pushed contents for a sub-window only grow, so each pull merges the
growth since the previous pull (``new - last seen``) into the local series
(:func:`sidecar.core.fleet_share.merge_subwindow`) and adds it to
merged-from-peers. Lost, repeated or re-sent (after a store flush) writes
therefore never count twice. Writes per push are one field per *changed*
sub-window (normally the current one of each active series): never a write
per request, and the stored fields are bounded by series x sub-windows.

**Health.** One owner per route (cluster, narrow slice) at a time: a lease in
the store, taken when free or expired, renewed on every push, expiring after
``lease_ttl_s``. The owner evaluates the route on the fleet-wide evidence and
publishes its state on change; every other replica *follows*: its
:class:`~sidecar.core.fleet_share.FollowerBoard` skips the route and adopts the
published state, and forwards the probe results it sees to the owner, whose
single tally they join. A replica that takes over a lease first adopts the
previous owner's published state (if newer than its own), so a handover does
not flap. When the store is unreachable, :meth:`FleetSync.disconnected` makes
every route local again.

Invariants:

1. A route is followed only while the store answered within the last push.
2. Merged-from-peers never exceeds the local contents (both grow together).
3. Fields this replica stops having are deleted from its hash; everything it
   holds in the store expires by TTL if it stops pushing.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sidecar.core.fleet_share import (
    FollowerBoard,
    SubWindowData,
    adopt_route,
    closes_circuit,
    live_subwindows,
    merge_placed,
    route_signature,
    route_state,
)
from sidecar.core.health_board import CLUSTER_SLICE
from sidecar.core.router import Router
from sidecar.core.stats import StatsStore
from sidecar.core.types import SliceKey, TransitionEvent
from sidecar.fleet import codec

Route = tuple[str, SliceKey]


@dataclass(slots=True)
class Exchange:
    """What one push/pull cycle asks of the store (carried out in one round trip)."""

    rid: str
    meta: bytes
    routes: list[str]  # route fields to take, renew or ask the lease holder of
    stats_set: dict[str, bytes]  # this replica's changed sub-windows
    stats_del: list[str]  # its sub-windows that left the window
    health_set: dict[str, bytes]  # states of routes it owns, where changed
    probes: dict[str, list[bytes]]  # owner -> probe results seen here
    fetch: list[str]  # peers whose statistics to read
    stats_ttl_ms: int
    lease_ttl_ms: int
    health_ttl_ms: int


@dataclass(slots=True)
class Reply:
    holders: list[str]  # lease holder of each of Exchange.routes
    replicas: list[str]  # replicas that pushed within stats_ttl (this one included)
    stats: dict[str, dict[str, bytes]]  # peer -> its fields (as fetched)
    metas: dict[str, bytes | None]  # peer -> its meta record
    health: dict[str, bytes]
    probes: list[bytes]  # results other replicas forwarded to this one
    stored_fields: int  # sub-window fields this replica's hash held before this write


@dataclass
class SyncCounters:
    merged_subwindows: int = 0
    adopted_states: int = 0
    forwarded_probes: int = 0
    applied_probes: int = 0
    bad_peer_records: int = 0
    mismatched_peers: int = 0


_Health = tuple[str, int, dict[str, Any]]  # (owner, wall-clock ms written, route state)


@dataclass
class FleetSync:
    """Sync state of one replica. ``wall_offset`` = wall clock - ``now`` clock (fixed)."""

    router: Router
    rid: str
    stats_ttl_s: float
    lease_ttl_s: float
    wall_offset: float = 0.0
    counters: SyncCounters = field(default_factory=SyncCounters)
    owned: set[str] = field(default_factory=set)
    peers: list[str] = field(default_factory=list)
    # Requests in flight the router does not count (native routing: the last window's
    # average per cluster, from Envoy's log); published with the router's own.
    extra_load: Callable[[], Mapping[str, float]] | None = None

    def __post_init__(self) -> None:
        self.board = FollowerBoard.wrap(self.router.board)
        self.router.board = self.board
        self._store: StatsStore = self.router.stats
        # Peers' contents merged into each local (cluster, narrow key, sub-window).
        self._merged: dict[tuple[str, SliceKey, int], SubWindowData] = {}
        self._baseline: dict[tuple[str, SliceKey, int], SubWindowData] = {}
        self._seen: dict[str, dict[str, tuple[bytes, SubWindowData]]] = {}  # peer -> field
        self._pushed: dict[str, float] = {}  # stats field -> contents total when pushed
        self._expect_stored = 0
        self._signature: dict[str, tuple[Any, ...]] = {}  # owned route -> state published
        self._adopted: dict[str, bytes] = {}  # followed route -> entry adopted
        self._holders: dict[str, str] = {}
        self._asked: list[str] = []
        self._health_seen: set[str] = set()
        self._republish = True
        self._load_pushed = b""
        self._peer_load: dict[str, tuple[int, dict[str, int]]] = {}

    # ------------------------------------------------------------ time

    @property
    def _sub_s(self) -> float:
        return self.router.config.stats.subwindow_s

    def _mid_ms(self, index: int) -> int:
        return round(((index + 0.5) * self._sub_s + self.wall_offset) * 1000.0)

    def _local_index(self, mid_ms: int) -> int:
        return math.floor((mid_ms / 1000.0 - self.wall_offset) / self._sub_s)

    def wall_ms(self, now: float) -> int:
        return round((now + self.wall_offset) * 1000.0)

    # ------------------------------------------------------------ state

    def _check_store(self) -> None:
        """A reload that changed ``stats`` replaced the store: start merging afresh."""
        if self.router.stats is not self._store:
            self._store = self.router.stats
            self._merged.clear()
            self._seen.clear()
            self._baseline.clear()
            self._republish = True
        if self.router.board is not self.board:  # a snapshot restore swapped it
            self.board = FollowerBoard.wrap(self.router.board)
            self.router.board = self.board

    def mark_baseline(self, now: float) -> None:
        """Treat what the store holds now (loaded from a warm-restart snapshot of a
        fleet-merged store) as not this replica's own: it is never pushed."""
        self._check_store()
        self._baseline = {(c, s, sub.index): sub
                          for (c, s), subs in live_subwindows(self._store, now) for sub in subs}

    def disconnected(self) -> None:
        """The store did not answer: every route is decided locally until it does."""
        self.board.followed.clear()
        self._peer_load.clear()
        self.router.peer_inflight.clear()
        self.owned.clear()
        self._holders.clear()
        self._republish = True

    @property
    def followed(self) -> int:
        return len(self.board.followed)

    # ------------------------------------------------------------ out

    def outgoing(self, now: float) -> Exchange:
        """The next push/pull; call :meth:`incoming` with the store's reply (or
        :meth:`disconnected` if there was none)."""
        self._check_store()
        cfg = self.router.config
        stats_set: dict[str, bytes] = {}
        live: dict[str, float] = {}
        for (cluster, s), subs in live_subwindows(self._store, now):
            for sub in subs:
                key = (cluster, s, sub.index)
                own = codec.diff(sub, self._merged.get(key))
                if key in self._baseline:
                    own = codec.diff(own, self._baseline[key])
                if own.empty:
                    continue
                name = codec.stats_field(cluster, s, self._mid_ms(sub.index))
                live[name] = total = own.total()
                if self._republish or self._pushed.get(name) != total:
                    stats_set[name] = codec.encode_sub(own)
        router = self.router
        extra = {} if self.extra_load is None else self.extra_load()
        load = codec.encode_load(self.wall_ms(now), {
            c: n for c in cfg.cluster_names
            if (n := router.inflight(c) - router.peer_inflight.get(c, 0)
                + round(extra.get(c, 0.0)))})
        if load != self._load_pushed or self._republish:
            stats_set[codec.LOAD_FIELD] = self._load_pushed = load
        stats_del = [f for f in self._pushed if f not in live]
        self._expect_stored = 0 if self._republish else len(self._pushed)
        self._pushed = live
        health_set: dict[str, bytes] = {}
        for rf in sorted(self.owned):
            cluster, s = codec.parse_route(rf)
            sig = route_signature(self.board, cluster, s)
            if self._republish or self._signature.get(rf) != sig:
                state = route_state(self.board, cluster, s, now)
                health_set[rf] = codec.encode_health(self.rid, self.wall_ms(now), state)
                self._signature[rf] = sig
        probes: dict[str, list[bytes]] = {}
        for cluster, s, ok in self.board.probe_outbox:
            rf = codec.route_field(cluster, s)
            holder = self._holders.get(rf)
            if holder is not None and holder != self.rid:
                probes.setdefault(holder, []).append(codec.encode_probe(rf, ok))
                self.counters.forwarded_probes += 1
        self.board.probe_outbox.clear()
        self._republish = False
        self._asked = sorted(self._routes_of_interest())
        return Exchange(
            rid=self.rid,
            meta=codec.encode_meta(cfg.stats.subwindow_s, self._store.accuracy),
            routes=self._asked,
            stats_set=stats_set,
            stats_del=stats_del,
            health_set=health_set,
            probes=probes,
            fetch=[p for p in self.peers if p != self.rid],
            stats_ttl_ms=round(self.stats_ttl_s * 1000),
            lease_ttl_ms=round(self.lease_ttl_s * 1000),
            health_ttl_ms=round(max(cfg.stats.stale_after_s, self.stats_ttl_s) * 2000),
        )

    def _routes_of_interest(self) -> set[str]:
        routes = {codec.route_field(c, s) for c, s in self._store.narrow_keys()}
        routes |= {codec.route_field(c, s) for (c, s), _ in self.board.items()}
        return routes | self._health_seen

    # ------------------------------------------------------------ in

    def incoming(self, reply: Reply, now: float) -> list[TransitionEvent]:
        """Apply the store's answer to the last :meth:`outgoing`; returns state changes."""
        self._check_store()
        if len(reply.holders) != len(self._asked):
            raise ValueError("lease answer does not match the routes asked")
        events: list[TransitionEvent] = []
        health = self._decode_health(reply.health)
        self._health_seen = set(health)
        before = set(self.owned)
        self._holders = dict(zip(self._asked, reply.holders, strict=True))
        self.owned = {rf for rf, h in self._holders.items() if h == self.rid}
        followed: set[Route] = set()
        for rf, holder in self._holders.items():
            try:
                route = codec.parse_route(rf)
            except ValueError:
                continue
            entry = health.get(rf)
            if holder != self.rid:
                followed.add(route)
                if entry is not None and entry[0] == holder:
                    events += self._adopt(rf, route, entry, now, f"fleet: following {holder}")
            elif rf not in before and entry is not None and entry[0] != self.rid:
                events += self._take_over(rf, route, entry, now)
        self.board.followed = followed
        events += self._apply_probes(reply.probes, now)
        self._merge_stats(reply, now)
        self.peers = list(reply.replicas)
        lost_health = any(rf not in health for rf in self.owned if rf in self._signature)
        if reply.stored_fields < self._expect_stored or lost_health:
            self._republish = True  # the store lost what we wrote (flushed or restarted)
        self._prune(now)
        return events

    def _decode_health(self, raw: dict[str, bytes]) -> dict[str, _Health]:
        out: dict[str, _Health] = {}
        for rf, value in raw.items():
            try:
                out[rf] = codec.decode_health(value)
            except ValueError:
                self.counters.bad_peer_records += 1
        return out

    def _adopt(self, rf: str, route: Route, entry: _Health, now: float,
               reason: str) -> list[TransitionEvent]:
        owner, wall_ms, state = entry
        raw = codec.encode_health(owner, wall_ms, state)
        if self._adopted.get(rf) == raw:
            return []
        self._adopted[rf] = raw
        at = min(wall_ms / 1000.0 - self.wall_offset, now)
        before = self.board.peek(*route)
        try:
            event = adopt_route(self.board, route[0], route[1], state, at, now, reason)
        except ValueError:
            self.counters.bad_peer_records += 1
            return []
        if closes_circuit(before, self.board.peek(*route)):
            self._fence(route, now)
        self.counters.adopted_states += 1
        self._signature.pop(rf, None)
        return [event] if event is not None else []

    def _take_over(self, rf: str, route: Route, entry: _Health,
                   now: float) -> list[TransitionEvent]:
        """This replica just got the lease: continue from the last published state
        unless its own changed later (it decided alone while the store was away)."""
        owner, wall_ms, state = entry
        mine = self.board.peek(*route)
        if mine is not None:
            theirs_since = wall_ms / 1000.0 - self.wall_offset - float(state.get("since") or 0.0)
            if not state or mine.since >= theirs_since:
                return []
        return self._adopt(rf, route, entry, now, f"fleet: took over from {owner}")

    def _apply_probes(self, raw: list[bytes], now: float) -> list[TransitionEvent]:
        events: list[TransitionEvent] = []
        for value in raw:
            try:
                rf, ok = codec.decode_probe(value)
                cluster, s = codec.parse_route(rf)
            except ValueError:
                self.counters.bad_peer_records += 1
                continue
            if rf in self.owned:
                got = self.board.record_probe(cluster, s, ok, now)
                if any(e.old == "probing" and e.new == "restoring" for e in got):
                    self._fence((cluster, s), now)
                events += got
                self.counters.applied_probes += 1
        return events

    def _fence(self, route: Route, now: float) -> None:
        """The route's circuit closed here without the router seeing the transition (a
        peer's probe closed it, or it was adopted): fence its evidence as the router
        does on probing -> restoring, so it is judged and scored afresh everywhere."""
        cluster, s = route
        self._store.fence(cluster, None if s == CLUSTER_SLICE else s, now)

    def _merge_stats(self, reply: Reply, now: float) -> None:
        mine = (self._sub_s, self._store.accuracy)
        for peer, fields in reply.stats.items():
            if peer == self.rid:
                continue
            meta = codec.decode_meta(reply.metas.get(peer))
            if meta is None or not math.isclose(meta[0], mine[0]) or meta[1] != mine[1]:
                self.counters.mismatched_peers += bool(fields)
                continue
            seen = self._seen.setdefault(peer, {})
            load = fields.get(codec.LOAD_FIELD)
            if load is not None:
                try:
                    self._peer_load[peer] = codec.decode_load(load)
                except ValueError:
                    self.counters.bad_peer_records += 1
            for name, raw in fields.items():
                if name.startswith("_"):
                    continue
                prev = seen.get(name)
                if prev is not None and prev[0] == raw:
                    continue
                try:
                    cluster, s, mid = codec.parse_stats_field(name)
                    data = codec.decode_sub(raw, self._local_index(mid), mine[1])
                except ValueError:
                    self.counters.bad_peer_records += 1
                    continue
                seen[name] = (raw, data)
                delta = codec.diff(data, None if prev is None else prev[1])
                if delta.empty:
                    continue
                end = (data.index + 1) * self._sub_s
                placed = merge_placed(self._store, cluster, s, delta, now, seen_at=end)
                if placed is not None:
                    mk = (cluster, *placed)
                    self._merged[mk] = codec.add(self._merged.get(mk), delta)
                    self.counters.merged_subwindows += 1
        self._sum_peer_load(now, set(reply.stats))
        # What a peer pushed is remembered until it leaves the window, even when the peer
        # or its fields vanish from the store (flushed, restarted): re-pushed contents
        # then merge only their growth, never twice.

    def _sum_peer_load(self, now: float, fetched: set[str]) -> None:
        """Peers' in-flight counts, fresh ones only (a dead peer's last count must not
        block capacity until its statistics expire)."""
        fresh_ms = self.wall_ms(now) - 1000.0 * self.lease_ttl_s
        total: Counter[str] = Counter()
        for peer, (wall_ms, counts) in list(self._peer_load.items()):
            if peer not in fetched or wall_ms < fresh_ms:
                del self._peer_load[peer]
                continue
            total.update(counts)
        self.router.peer_inflight = dict(total)

    def _prune(self, now: float) -> None:
        oldest = math.floor(now / self._sub_s) - self.router.config.stats.subwindows
        for d in (self._merged, self._baseline):
            for k in [k for k in d if k[2] <= oldest]:
                del d[k]
        for peer, seen in list(self._seen.items()):
            for name in [n for n, (_, data) in seen.items() if data.index <= oldest]:
                del seen[name]
            if not seen:
                del self._seen[peer]
        keep = self._routes_of_interest()
        for d2 in (self._signature, self._adopted):
            for rf in [rf for rf in d2 if rf not in keep]:
                del d2[rf]
