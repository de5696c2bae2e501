"""The statistics half of fleet sharing, sans I/O: :class:`StatsSync`.

:class:`~sidecar.fleet.sync.FleetSync` drives it once per push/pull cycle:
:meth:`StatsSync.outgoing` gives the fields to write, :meth:`StatsSync.merge`
folds what peers pushed into the router's store.

The router's store holds this replica's own observations *plus* what it merged
from peers. Per narrow series and sub-window::

    own    = local contents - merged-from-peers        (codec.diff)
    pushed = own, whenever it changed since the last push (an idempotent overwrite)

A peer's pushed contents for a sub-window only grow, so each pull merges the
growth since the previous pull (``new - all merged of it``; contents the store
lost some of -- restarted from an older snapshot -- merge nothing until they grow
past what was merged) into the local series
(:func:`sidecar.core.fleet_share.merge_subwindow`) and adds it to
merged-from-peers. Lost, repeated or re-sent (after a store flush) writes
therefore never count twice. Writes per push are one field per *changed*
sub-window (normally the current one of each active series): never a write
per request, and the stored fields are bounded by series x sub-windows.

Alongside the sub-windows each replica publishes its requests in flight per
cluster (``codec.LOAD_FIELD``); the fresh peers' counts are summed into
``router.peer_inflight`` so capacity limits hold fleet-wide. A count no working
replica can hold (over :func:`load_bound`) is not summed but skipped, and a
low-priority count over its total is read as the total (:meth:`StatsSync._checked_load`).

Invariants:

1. Merged-from-peers never exceeds the local contents (both grow together).
2. Fields this replica stops having are deleted from its hash (``stats_del``).
3. Contents loaded from a fleet-merged snapshot (:meth:`StatsSync.mark_baseline`)
   are never pushed as this replica's own.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from sidecar.core.fleet_share import SubWindowData, live_subwindows, merge_placed
from sidecar.core.router import Router
from sidecar.core.stats import StatsStore
from sidecar.core.steps import Steps, run_steps
from sidecar.core.types import SliceKey
from sidecar.fleet import codec
from sidecar.fleet.exchange import Reply, SyncCounters

_SubKey = tuple[str, SliceKey, int]  # (cluster, narrow key, local sub-window index)
_Load = tuple[int, dict[str, int], dict[str, int]]  # (wall ms, in flight, of those low)

# Peers' sub-windows read between two pauses of StatsSync.merge_steps (about 0.1 to
# 0.3 ms each: a new series costs the most).
MERGE_STEP = 64
# Envoys whose traffic one replica may count (native mode: one sidecar per host).
PEER_LOAD_ENVOYS = 4


def load_bound(max_concurrency: int) -> int:
    """The most requests in flight on a cluster a working replica can report.

    Admission lets a replica hold ``max_concurrency`` of important work plus as many
    again of less important work (the slots beyond capacity, docs/admission.md), but
    native traffic, ``beyond_capacity: best_effort`` and admission switched off are
    bounded only by Envoy's breaker on the cluster: ``max(1024, 4 x max_concurrency)``
    per Envoy (``sidecar.shell.bootstrap.upstream_max_requests``). Four Envoys' worth,
    so that no real count is ever refused; anything above is a bug or a corrupt
    record. Any count of ``max_concurrency`` or more already reads as full, so a
    bound cannot tell a wrong count below it from a peer at capacity: it refuses only
    impossible ones, which would otherwise hold the cluster full fleet-wide.
    """
    return PEER_LOAD_ENVOYS * max(1024, 4 * max_concurrency)


@dataclass
class StatsSync:
    """Statistics sync state of one replica. ``wall_offset`` = wall clock - ``now`` clock."""

    router: Router
    lease_ttl_s: float  # a peer's in-flight count older than this is ignored
    wall_offset: float
    counters: SyncCounters

    def __post_init__(self) -> None:
        self.store: StatsStore = self.router.stats
        # Peers' contents merged into each local (cluster, narrow key, sub-window).
        self._merged: dict[_SubKey, SubWindowData] = {}
        self._baseline: dict[_SubKey, SubWindowData] = {}
        # peer -> stats field -> (raw as last fetched, decoded)
        self._seen: dict[str, dict[str, tuple[bytes, SubWindowData]]] = {}
        self._pushed: dict[str, float] = {}  # stats field -> contents total when pushed
        self._expect_stored = 0
        self._load_pushed = b""
        # peer -> (wall ms, in flight, of those low-priority) as last fetched
        self._peer_load: dict[str, _Load] = {}

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

    def follow_store(self) -> bool:
        """A reload of another ``stats.subwindow_s`` replaced the router's store: start
        merging afresh. True if it did (everything must then be pushed again)."""
        if self.router.stats is self.store:
            return False
        self.store = self.router.stats
        self._merged.clear()
        self._seen.clear()
        self._baseline.clear()
        return True

    def mark_baseline(self, now: float) -> None:
        """Treat what the store holds now (loaded from a warm-restart snapshot of a
        fleet-merged store) as not this replica's own: it is never pushed."""
        self._baseline = {(c, s, sub.index): sub
                          for (c, s), subs in live_subwindows(self.store, now) for sub in subs}

    def placed_any(self) -> bool:
        """Was a sub-window offered or merged by the current wall offset?"""
        return bool(self._pushed or self._seen or self._merged)

    def age_peer_load(self, now: float) -> None:
        """The store did not answer: keep the peers' in-flight counts while they are as
        fresh as an answer's would have to be (:meth:`_sum_peer_load`). Dropped at the
        first failed cycle, one round trip slower than ``timeout_ms`` let every
        replica admit the provider's whole ``max_concurrency`` by itself."""
        self._sum_peer_load(now, set(self._peer_load), set(self.router.config.cluster_names))

    def lost_writes(self, stored_fields: int) -> bool:
        """The store holds fewer of this replica's fields than it wrote (flushed or
        restarted)."""
        return stored_fields < self._expect_stored

    # ------------------------------------------------------------ out

    def outgoing(self, now: float, republish: bool,
                 extra_load: Mapping[str, float]) -> tuple[dict[str, bytes], list[str]]:
        """The fields to write (changed ones, all with ``republish``) and to delete."""
        stats_set: dict[str, bytes] = {}
        live: dict[str, float] = {}
        for (cluster, s), subs in live_subwindows(self.store, now):
            for sub in subs:
                key = (cluster, s, sub.index)
                own = codec.diff(sub, self._merged.get(key))
                if key in self._baseline:
                    own = codec.diff(own, self._baseline[key])
                if own.empty:
                    continue
                name = codec.stats_field(cluster, s, self._mid_ms(sub.index))
                live[name] = total = own.total()
                if republish or self._pushed.get(name) != total:
                    stats_set[name] = codec.encode_sub(own)
        router = self.router
        load = codec.encode_load(self.wall_ms(now), {
            c: n for c in router.config.cluster_names
            if (n := router.own_inflight(c)
                + round(extra_load.get(c, 0.0)))}, {
            c: n for c in router.config.cluster_names if (n := router.own_low(c))})
        if load != self._load_pushed or republish:
            stats_set[codec.LOAD_FIELD] = self._load_pushed = load
        stats_del = [f for f in self._pushed if f not in live]
        self._expect_stored = 0 if republish else len(self._pushed)
        self._pushed = live
        return stats_set, stats_del

    # ------------------------------------------------------------ in

    def merge(self, reply: Reply, rid: str, now: float) -> None:
        """Merge the growth of every matching peer's sub-windows; sum their loads."""
        run_steps(self.merge_steps(reply, rid, now))

    def merge_steps(self, reply: Reply, rid: str, now: float) -> Steps[None]:
        """:meth:`merge`, pausing after every :data:`MERGE_STEP` sub-windows read (the
        link lets the event loop serve between steps). A replica that meets its peers'
        whole windows at once (its store answered only once it was serving) merged
        them in one go: 5,764 sub-windows of 4 peers with 240 series each took 1.8 s of
        CPU, and every decision waited for it."""
        store = self.store  # one store throughout (a reload may replace the router's)
        mine = (self._sub_s, store.accuracy)
        known = set(self.router.config.cluster_names)
        read = 0
        for peer, fields in reply.stats.items():
            if peer == rid:
                continue
            meta = codec.decode_meta(reply.metas.get(peer))
            if meta is None or not math.isclose(meta[0], mine[0]) or meta[1] != mine[1]:
                if fields:
                    self.counters.mismatched_peers += 1
                    theirs = ("an unreadable meta record or another wire version" if meta
                              is None else f"subwindow_s {meta[0]:g}, accuracy {meta[1]:g}")
                    self.counters.last_mismatch = (
                        f"{peer}: {theirs}; here subwindow_s {mine[0]:g}, accuracy {mine[1]:g}")
                continue
            seen = self._seen.setdefault(peer, {})
            load = fields.get(codec.LOAD_FIELD)
            if load is not None:
                try:
                    self._peer_load[peer] = self._checked_load(peer, codec.decode_load(load))
                except ValueError as exc:
                    self.counters.skip(f"{peer}'s {codec.LOAD_FIELD}", exc)
            for name, raw in fields.items():
                if name.startswith("_"):
                    continue
                prev = seen.get(name)
                if prev is not None and prev[0] == raw:
                    continue
                read += 1
                if read % MERGE_STEP == 0:
                    yield
                try:
                    cluster, s, mid = codec.parse_stats_field(name)
                    if cluster not in known:
                        # Merged, it made a series (in /state, /metrics) of a cluster
                        # this replica cannot route to, and a route to take the lease of.
                        self.counters.foreign(f"{peer}'s field {name[:100]!r}", cluster)
                        continue
                    data = codec.decode_sub(raw, self._local_index(mid), mine[1])
                except ValueError as exc:
                    self.counters.skip(f"{peer}'s field {name[:100]!r}", exc)
                    continue
                delta = codec.diff(data, None if prev is None else prev[1])
                # Remember what was merged (all before, plus this growth), not what was
                # read: contents that went back (a store restarted from an older
                # snapshot, a lagging replica promoted) would otherwise have their
                # re-sent growth counted a second time.
                seen[name] = (raw, data if prev is None else codec.add(
                    codec.diff(prev[1], None), delta))
                if delta.empty:
                    continue
                end = (data.index + 1) * self._sub_s
                placed = merge_placed(store, cluster, s, delta, now, seen_at=end)
                if placed is not None:
                    mk = (cluster, *placed)
                    self._merged[mk] = codec.add(self._merged.get(mk), delta)
                    self.counters.merged_subwindows += 1
        self._sum_peer_load(now, set(reply.stats), known)
        # What a peer pushed is remembered until it leaves the window, even when the peer
        # or its fields vanish from the store (flushed, restarted): re-pushed contents
        # then merge only their growth, never twice.

    def _checked_load(self, peer: str, load: _Load) -> _Load:
        """``load`` without what no working replica reports, each skip counted: a count
        over :func:`load_bound` (it held the cluster full on every replica, and
        admission refused or shed its traffic fleet-wide), and a low-priority count
        over its total, read as the total (it made admission take important work's
        slots for a batch's: ``packed`` subtracts the low counts from the total).
        Clusters this config lacks are left as they are: the sum ignores them."""
        wall, counts, lows = load
        cfg = self.router.config
        known = set(cfg.cluster_names)
        what = f"{peer}'s {codec.LOAD_FIELD}"
        for c, n in list(counts.items()):
            if c in known and n > (bound := load_bound(cfg.cluster(c).max_concurrency)):
                del counts[c]
                lows.pop(c, None)  # part of the same count
                self.counters.skip(f"{what} n[{c!r}]", f"{n} in flight is over {bound}, "
                                   "more than a replica can hold: ignored")
        for c, n in list(lows.items()):
            if c in known and n > (total := counts.get(c, 0)):
                if total:
                    lows[c] = total
                else:
                    del lows[c]
                self.counters.skip(f"{what} l[{c!r}]", f"{n} low-priority of {total} in "
                                   f"flight: read as {total}")
        return wall, counts, lows

    def _sum_peer_load(self, now: float, fetched: set[str], known: set[str]) -> None:
        """Peers' in-flight counts, fresh ones only (a dead peer's last count must not
        block capacity until its statistics expire)."""
        fresh_ms = self.wall_ms(now) - 1000.0 * self.lease_ttl_s
        total: Counter[str] = Counter()
        low: Counter[str] = Counter()
        for peer, (wall_ms, counts, lows) in list(self._peer_load.items()):
            if peer not in fetched or wall_ms < fresh_ms:
                del self._peer_load[peer]
                continue
            total.update({c: n for c, n in counts.items() if c in known})
            low.update({c: n for c, n in lows.items() if c in known})
        self.router.peer_inflight = dict(total)
        # In place: admission holds this mapping (slots beyond capacity, Decision.low).
        self.router.peer_low.clear()
        self.router.peer_low.update(low)

    def prune(self, now: float) -> None:
        """Forget sub-windows that left the window."""
        oldest = math.floor(now / self._sub_s) - self.router.config.stats.subwindows
        for d in (self._merged, self._baseline):
            for k in [k for k in d if k[2] <= oldest]:
                del d[k]
        for peer, seen in list(self._seen.items()):
            for name in [n for n, (_, data) in seen.items() if data.index <= oldest]:
                del seen[name]
            if not seen:
                del self._seen[peer]
