"""One replica's side of fleet sharing, sans I/O: :class:`FleetSync`.

Every push interval the link (or the policy lab) asks :meth:`FleetSync.outgoing`
for one :class:`Exchange`, has a store carry it out, and hands the
:class:`Reply` to :meth:`FleetSync.incoming`. Between the two calls the router
keeps deciding on what it has: nothing here is on the request path.

**Statistics.** :class:`~sidecar.fleet.stats_sync.StatsSync` pushes this
replica's own sub-windows (local contents minus what it merged from peers) and
merges the growth of the peers' ones, so no observation counts twice.

**Learned concurrency limits** (from providers' 429s) go beside the statistics:
:class:`~sidecar.fleet.limits_sync.LimitsSync`.

**Probe results** of followed routes go to the routes' owners:
:class:`~sidecar.fleet.probe_relay.ProbeRelay`.

**Health.** One owner per route (cluster, narrow slice) at a time: a lease in
the store, taken when free or expired, renewed on every push, expiring after
``lease_ttl_s``. The owner evaluates the route on the fleet-wide evidence and
publishes its state on change; every other replica *follows*: its
:class:`~sidecar.core.fleet_share.FollowerBoard` skips the route and adopts the
published state, and forwards the probe results it sees to the owner, whose
single tally they join. A follower's own run of hard failures still ejects the
route at once (:class:`~sidecar.core.fleet_share.FollowerBoard`): the route is
then decided locally, *escalated*, until the owner publishes a state newer than
that ejection (adopted then) or the route is healthy here again; an older
published state never undoes it. A replica that takes over a lease first adopts
the previous owner's published state (if newer than its own), so a handover does
not flap. When the store is unreachable, :meth:`FleetSync.disconnected` makes
every route local again, and the probe results it was forwarding (the failed
push's, and those seen since) count on this replica's own board instead.

Invariants:

1. A route is followed only while the store answered within the last push.
2. Everything this replica holds in the store expires by TTL if it stops pushing
   (the statistics' own invariants are in :mod:`sidecar.fleet.stats_sync`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sidecar.core.fleet_share import (
    FollowerBoard,
    ProbeResult,
    adopt_route,
    closes_circuit,
    route_signature,
    route_state,
)
from sidecar.core.health import HealthState
from sidecar.core.health_board import CLUSTER_SLICE
from sidecar.core.router import Router
from sidecar.core.steps import Steps, run_steps
from sidecar.core.types import SliceKey, TransitionEvent
from sidecar.fleet import codec
from sidecar.fleet.exchange import Exchange, Reply, SyncCounters
from sidecar.fleet.limits_sync import LimitsSync
from sidecar.fleet.probe_relay import ProbeRelay
from sidecar.fleet.stats_sync import StatsSync

__all__ = ["Exchange", "FleetSync", "Reply", "SyncCounters"]  # the stores' types, re-exported

Route = tuple[str, SliceKey]


_Health = tuple[str, int, dict[str, Any]]  # (owner, wall-clock ms written, route state)
PRUNE_MAX = 256  # health fields offered for deletion per push (Exchange.prune)


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
        self.stats_sync = StatsSync(self.router, self.lease_ttl_s, self.wall_offset,
                                    self.counters)
        self.limits_sync = LimitsSync(self.router, self.wall_offset, self.counters)
        self.probe_relay = ProbeRelay(self.counters)
        self._signature: dict[str, tuple[Any, ...]] = {}  # owned route -> state published
        self._adopted: dict[str, bytes] = {}  # followed route -> entry adopted
        self._holders: dict[str, str] = {}
        self._asked: list[str] = []
        self._health_seen: set[str] = set()
        self._unasked: list[str] = []  # health fields to prune (Exchange.prune)
        self._republish = True

    def wall_ms(self, now: float) -> int:
        return self.stats_sync.wall_ms(now)

    # ------------------------------------------------------------ state

    def _check_store(self) -> None:
        """A reload that changed ``stats`` replaced the store: start merging afresh."""
        if self.stats_sync.follow_store():
            self._republish = True
        if self.router.board is not self.board:  # a snapshot restore swapped it
            self.board = FollowerBoard.wrap(self.router.board)
            self.router.board = self.board

    def mark_baseline(self, now: float) -> None:
        """Treat what the store holds now (loaded from a warm-restart snapshot of a
        fleet-merged store) as not this replica's own: it is never pushed."""
        self._check_store()
        self.stats_sync.mark_baseline(now)

    def reanchor(self, wall_offset: float) -> bool:
        """Place everything by ``wall_offset`` from now on (the store's clock, where this
        host's is off), if nothing was placed by the old one yet: nothing of ours
        offered, nothing of the peers' taken. False, unchanged, otherwise."""
        if self.stats_sync.placed_any() or self.limits_sync.placed_any() or self._adopted:
            return False
        self.wall_offset = self.stats_sync.wall_offset = wall_offset
        self.limits_sync.wall_offset = wall_offset
        return True

    def disconnected(self, now: float) -> list[TransitionEvent]:
        """The store did not answer: every route is decided locally until it does.
        Returns the state changes of applying here the probe results that were on
        their way to the routes' owners (record them as :meth:`incoming`'s)."""
        self._check_store()
        results = self.probe_relay.take_back(self.board)  # the failed push's, and since
        self.board.followed.clear()
        self.stats_sync.age_peer_load(now)
        self.owned.clear()
        self._holders.clear()
        self._republish = True
        # What this push offered may never have reached the store: every owned route's
        # state is published again once it is owned again. Before, the next outgoing()
        # found nothing owned (cleared above), spent the republish on nothing, and a
        # quarantine entered as the push failed never reached the followers at all.
        self._signature.clear()
        # The routes are local now: the results join this board's tally. One the store
        # did deliver counts in the owner's tally as well, which this board does not
        # share: it is adopted from the owner again once the store answers.
        return self._apply_results(results, now)

    @property
    def followed(self) -> int:
        return len(self.board.followed)

    # ------------------------------------------------------------ out

    def outgoing(self, now: float) -> Exchange:
        """The next push/pull; call :meth:`incoming` with the store's reply (or
        :meth:`disconnected` if there was none)."""
        self._check_store()
        cfg = self.router.config
        extra = {} if self.extra_load is None else self.extra_load()
        stats_set, stats_del = self.stats_sync.outgoing(now, self._republish, extra)
        if (limits := self.limits_sync.outgoing(now, self._republish)) is not None:
            stats_set[codec.LIMITS_FIELD] = limits
        if (holds := self.limits_sync.outgoing_holds(now, self._republish)) is not None:
            stats_set[codec.HOLDS_FIELD] = holds
        if (quotas := self.limits_sync.outgoing_quotas(now, self._republish)) is not None:
            stats_set[codec.QUOTAS_FIELD] = quotas
        health_set: dict[str, bytes] = {}
        for rf in sorted(self.owned):
            cluster, s = codec.parse_route(rf)
            sig = route_signature(self.board, cluster, s)
            if self._republish or self._signature.get(rf) != sig:
                state = route_state(self.board, cluster, s, now)
                health_set[rf] = codec.encode_health(self.rid, self.wall_ms(now), state)
                self._signature[rf] = sig
        probes = self.probe_relay.outgoing(self.board, self._holders, self.rid, self.wall_ms)
        self._republish = False
        self._asked = sorted(self._routes_of_interest())
        return Exchange(
            rid=self.rid,
            meta=codec.encode_meta(cfg.stats.subwindow_s, self.stats_sync.store.accuracy),
            routes=self._asked,
            stats_set=stats_set,
            stats_del=stats_del,
            health_set=health_set,
            probes=probes,
            fetch=[p for p in self.peers if p != self.rid],
            stats_ttl_ms=round(self.stats_ttl_s * 1000),
            lease_ttl_ms=round(self.lease_ttl_s * 1000),
            health_ttl_ms=round(max(cfg.stats.stale_after_s, self.stats_ttl_s) * 2000),
            prune=self._unasked,
        )

    def _routes_of_interest(self) -> set[str]:
        routes = {codec.route_field(c, s) for c, s in self.stats_sync.store.narrow_keys()}
        routes |= {codec.route_field(c, s) for (c, s), _ in self.board.items()}
        return routes | self._health_seen

    # ------------------------------------------------------------ in

    def incoming(self, reply: Reply, now: float) -> list[TransitionEvent]:
        """Apply the store's answer to the last :meth:`outgoing`; returns state changes."""
        return run_steps(self.incoming_steps(reply, now))

    def incoming_steps(self, reply: Reply, now: float) -> Steps[list[TransitionEvent]]:
        """:meth:`incoming`, pausing while it merges the peers' statistics."""
        self._check_store()
        self.probe_relay.delivered()
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
                published = entry if entry is not None and entry[0] == holder else None
                if self._escalated(route, published):
                    continue  # decided here until the owner catches up
                followed.add(route)
                if published is not None:
                    events += self._adopt(rf, route, published, now,
                                          f"fleet: following {holder}")
                continue
            self.board.escalated.pop(route, None)
            if rf not in before and entry is not None and entry[0] != self.rid:
                events += self._take_over(rf, route, entry, now)
        self.board.followed = followed
        for key in reply.unreadable:
            self.counters.skip(f"key {key}", "holds another type than the fleet keeps there")
        for inbox, dropped in reply.oversized.items():
            self.counters.skip(f"{dropped.items} item(s) of this replica's {inbox} inbox",
                               dropped.why(), dropped.items)
        events += self._apply_results(
            self.probe_relay.incoming(reply.probes, self.owned, self.wall_offset), now)
        yield from self.stats_sync.merge_steps(reply, self.rid, now)
        self.limits_sync.merge(reply.stats, self.rid, now)
        self.peers = list(reply.replicas)
        lost_health = any(rf not in health for rf in self.owned if rf in self._signature)
        if self.stats_sync.lost_writes(reply.stored_fields) or lost_health:
            self._republish = True  # the store lost what we wrote (flushed or restarted)
        self._prune(now)
        return events

    def _decode_health(self, raw: dict[str, bytes]) -> dict[str, _Health]:
        out: dict[str, _Health] = {}
        known = set(self.router.config.cluster_names)
        self._unasked = []
        for rf, value in raw.items():
            try:
                # A field that names no route would be asked for a lease and owned,
                # and failed the next cycle's publishing (parse_route): every other
                # cycle failed for as long as it stayed in the hash.
                cluster, _ = codec.parse_route(rf)
            except ValueError as exc:
                self.counters.skip(f"health field {rf[:100]!r}", exc)
                self._unasked.append(rf)
                continue
            if cluster not in known:  # else leased, owned and judged here, blind
                self.counters.foreign(f"health field {rf[:100]!r}", cluster)
                self._unasked.append(rf)
                continue
            try:
                out[rf] = codec.decode_health(value)
            except ValueError as exc:  # its owner publishes it again (lost_health)
                self.counters.skip(f"health field {rf[:100]!r}", exc)
        # Bounded: what a round trip carries back (a hash full of garbage shrinks by
        # as much each push); names no replica could write are left to the operator.
        self._unasked = [rf for rf in self._unasked if len(rf) <= 1024][:PRUNE_MAX]
        return out

    def _adopt(self, rf: str, route: Route, entry: _Health, now: float,
               reason: str) -> list[TransitionEvent]:
        owner, wall_ms, state = entry
        raw = codec.encode_health(owner, wall_ms, state)
        prev = self._adopted.get(rf)
        if prev == raw:
            return []
        if prev is not None:
            prev_owner, prev_ms, _ = codec.decode_health(prev)
            if prev_owner == owner and wall_ms < prev_ms:
                # Older than what its owner published since: a store back with older
                # contents (an older snapshot, a lagging replica promoted).
                return []
        self._adopted[rf] = raw
        at = min(wall_ms / 1000.0 - self.wall_offset, now)
        before = self.board.peek(*route)
        try:
            event = adopt_route(self.board, route[0], route[1], state, at, now, reason)
        except ValueError as exc:
            self.counters.skip(f"{owner}'s state of {rf[:100]!r}", exc)
            return []
        if closes_circuit(before, self.board.peek(*route)):
            self._fence(route, now)
        self.counters.adopted_states += 1
        self._signature.pop(rf, None)
        return [event] if event is not None else []

    def _since(self, entry: _Health) -> float | None:
        """When the published state was entered, on the local clock (None: default)."""
        _, wall_ms, state = entry
        if not state:
            return None
        return wall_ms / 1000.0 - self.wall_offset - float(state.get("since") or 0.0)

    def _escalated(self, route: Route, published: _Health | None) -> bool:
        """Is ``route``, which another replica owns, still decided here? It is from
        this replica's own ejection of it until the owner publishes a state entered
        later (that one is adopted) or the route is healthy here again."""
        at = self.board.escalated.get(route)
        if at is None:
            return False
        mine = self.board.peek(*route)
        theirs = None if published is None else self._since(published)
        if (mine is None or mine.state is HealthState.HEALTHY
                or (theirs is not None and theirs >= at)):
            del self.board.escalated[route]
            return False
        return True

    def _take_over(self, rf: str, route: Route, entry: _Health,
                   now: float) -> list[TransitionEvent]:
        """This replica just got the lease: continue from the last published state
        unless its own changed later (it decided alone while the store was away)."""
        mine = self.board.peek(*route)
        if mine is not None:
            theirs_since = self._since(entry)
            if theirs_since is None or mine.since >= theirs_since:
                return []
        return self._adopt(rf, route, entry, now, f"fleet: took over from {entry[0]}")

    def _apply_results(self, results: list[ProbeResult], now: float) -> list[TransitionEvent]:
        """Probe results of routes this board decides, into its tally."""
        events: list[TransitionEvent] = []
        for cluster, s, ok, sent in results:
            got = self.board.record_probe(cluster, s, ok, now, sent)
            if any(e.old == "probing" and e.new == "restoring" for e in got):
                self._fence((cluster, s), now)
            events += got
        return events

    def _fence(self, route: Route, now: float) -> None:
        """The route's circuit closed here without the router seeing the transition (a
        peer's probe closed it, or it was adopted): fence its evidence as the router
        does on probing -> restoring, so it is judged and scored afresh everywhere."""
        cluster, s = route
        self.stats_sync.store.fence(cluster, None if s == CLUSTER_SLICE else s, now)

    def _prune(self, now: float) -> None:
        self.stats_sync.prune(now)
        keep = self._routes_of_interest()
        for d2 in (self._signature, self._adopted):
            for rf in [rf for rf in d2 if rf not in keep]:
                del d2[rf]
        for route in [r for r in self.board.escalated if codec.route_field(*r) not in keep]:
            del self.board.escalated[route]
