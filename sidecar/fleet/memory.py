"""An in-process store with the Redis store's semantics, on a given clock.

The policy lab shares state between simulated replicas through it (virtual
time, no I/O), and unit tests of :mod:`sidecar.fleet.sync` use it as the
fake. It carries out an :class:`~sidecar.fleet.exchange.Exchange` exactly as
:class:`~sidecar.fleet.redis_store.RedisStore` does (the Lua lease script
included), so both are exercised by the same sync code; the Redis store is
tested against a real ``redis-server``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sidecar.fleet.exchange import Exchange, Oversized, Reply, take_small


@dataclass
class _Expiring:
    fields: dict[str, bytes] = field(default_factory=dict)
    expires_ms: float = float("inf")


@dataclass
class MemoryStore:
    stats: dict[str, _Expiring] = field(default_factory=dict)  # rid -> its hash
    metas: dict[str, bytes] = field(default_factory=dict)
    replicas: dict[str, float] = field(default_factory=dict)  # rid -> last push (ms)
    leases: dict[str, tuple[str, float]] = field(default_factory=dict)  # route -> holder, exp
    health: _Expiring = field(default_factory=_Expiring)
    probes: dict[str, list[bytes]] = field(default_factory=dict)
    entries: dict[str, list[bytes]] = field(default_factory=dict)  # decider prefix -> ids
    commands: int = 0  # what the Redis store would have sent, for sizing in the lab

    def flush(self) -> None:
        """Lose everything, as FLUSHALL or a restart without persistence does."""
        self.stats.clear()
        self.metas.clear()
        self.replicas.clear()
        self.leases.clear()
        self.health = _Expiring()
        self.probes.clear()
        self.entries.clear()

    def exchange(self, ex: Exchange, now_ms: float) -> Reply:
        self._expire(now_ms)
        mine = self.stats.setdefault(ex.rid, _Expiring())
        stored = len(mine.fields)
        holders = []
        for rf in ex.routes:
            holder = self.leases.get(rf)
            if holder is None or holder[1] <= now_ms or holder[0] == ex.rid:
                self.leases[rf] = (ex.rid, now_ms + ex.lease_ttl_ms)
                holders.append(ex.rid)
            else:
                holders.append(holder[0])
        for rf in ex.prune:  # as the Redis store's lease script does
            held = self.leases.get(rf)
            if held is None or held[1] + ex.health_ttl_ms <= now_ms:
                self.leases.pop(rf, None)
                self.health.fields.pop(rf, None)
        mine.fields.update(ex.stats_set)
        for f in ex.stats_del:
            mine.fields.pop(f, None)
        mine.expires_ms = now_ms + ex.stats_ttl_ms
        self.metas[ex.rid] = ex.meta
        self.replicas[ex.rid] = now_ms
        self.health.fields.update(ex.health_set)
        self.health.expires_ms = now_ms + ex.health_ttl_ms
        for owner, values in ex.probes.items():
            self.probes.setdefault(owner, []).extend(values)
        oversized: dict[str, Oversized] = {}
        inbox = _taken(self.probes.pop(ex.rid, []), "probes", oversized)
        for prefix, rids in ex.entries.items():
            self.entries.setdefault(prefix, []).extend(rids)
        forwarded = _taken(self.entries.pop(ex.entries_for or ex.rid, []), "entries",
                           oversized)
        live = sorted(r for r, t in self.replicas.items() if t >= now_ms - ex.stats_ttl_ms)
        stats = {p: dict(self.stats[p].fields) for p in ex.fetch if p in self.stats}
        self.commands += 10 + len(ex.fetch) + bool(ex.probes) + bool(ex.stats_del) \
            + 2 * len(ex.entries)
        return Reply(holders, live, stats, {p: self.metas.get(p) for p in ex.fetch},
                     dict(self.health.fields), inbox, stored, forwarded,
                     oversized=oversized)

    def _expire(self, now_ms: float) -> None:
        for rid in [r for r, h in self.stats.items() if h.expires_ms <= now_ms]:
            del self.stats[rid]
            self.metas.pop(rid, None)
        if self.health.expires_ms <= now_ms:
            self.health = _Expiring()


def _taken(items: list[bytes], inbox: str, oversized: dict[str, Oversized]) -> list[bytes]:
    """``items`` as a take returns them (:func:`~sidecar.fleet.exchange.take_small`);
    what it dropped is noted in ``oversized``."""
    kept, dropped = take_small(items)
    if dropped is not None:
        oversized[inbox] = dropped
    return kept
