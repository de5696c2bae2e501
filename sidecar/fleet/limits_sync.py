"""Learned concurrency limits shared across the fleet, sans I/O: :class:`LimitsSync`.

A provider's 429s teach the replica that sees them the concurrency the provider
accepts (:mod:`sidecar.core.pushback`). That limit belongs to the provider, not
to the replica: a replica counts its peers' requests in flight when it learns
it, and its capacity rules compare the limit with the whole fleet's load. So a
replica publishes its learned limits beside its in-flight counts, in its own
statistics hash (``codec.LIMITS_FIELD``: ``{cluster: [limit, last refusal on the
wall clock in ms]}``), and every peer adopts a limit whose refusal is newer than
the last it took from that peer (:meth:`~sidecar.core.pushback.PushBack.adopt`:
the lower limit and the later refusal). Without it each of k replicas had to meet
its own refusals before it held back, k times as many 429s for the callers.

Only *fresh* limits travel: those whose last refusal is less than
``pushback.HOLD_S`` old, the quiet spell before a limit may grow. Growth is each
replica's own (the pressure it saw itself), and a limit older than that may have
grown back on the replica that learned it; were it still published, a replica
that joins later (or restarts from a snapshot) would adopt it and hand it on, and
pull replicas whose limit had grown back down to a refusal long answered. So a
peer's higher limit never raises one, an old one never lowers one, and a
replica that joins after the spell meets the provider's next refusal itself.
The field is written only when the fresh limits changed, so a fleet that never
met a 429 writes nothing more.
"""

from __future__ import annotations

from sidecar.core.pushback import HOLD_S
from sidecar.core.router import Router
from sidecar.fleet import codec
from sidecar.fleet.exchange import SyncCounters


class LimitsSync:
    """One replica's side. ``wall_offset`` = wall clock - ``now`` clock (fixed)."""

    def __init__(self, router: Router, wall_offset: float, counters: SyncCounters) -> None:
        self.router = router
        self.wall_offset = wall_offset
        self.counters = counters
        self._pushed = codec.encode_limits({})  # what the store holds of ours
        self._applied: dict[tuple[str, str], int] = {}  # (peer, cluster) -> refusal ms

    def outgoing(self, now: float, republish: bool) -> bytes | None:
        """This replica's fresh limits when they changed (or ``republish`` and it has
        some)."""
        learned = {c: (limit, round((at + self.wall_offset) * 1000.0))
                   for c, (limit, at) in self.router.pushback.learned().items()
                   if now - at < HOLD_S}
        raw = codec.encode_limits(learned)
        if raw == self._pushed and not (republish and learned):
            return None
        self._pushed = raw
        return raw

    def merge(self, fields: dict[str, dict[str, bytes]], rid: str, now: float) -> None:
        """Adopt the peers' fresh limits whose last refusal is newer than the one taken."""
        pushback = self.router.pushback
        for peer, got in fields.items():
            raw = got.get(codec.LIMITS_FIELD)
            if peer == rid or raw is None:
                continue
            try:
                limits = codec.decode_limits(raw)
            except ValueError:
                self.counters.bad_peer_records += 1
                continue
            for cluster, (limit, refused_ms) in limits.items():
                at = min(refused_ms / 1000.0 - self.wall_offset, now)
                if refused_ms <= self._applied.get((peer, cluster), -1) or now - at >= HOLD_S:
                    continue
                self._applied[(peer, cluster)] = refused_ms
                pushback.adopt(cluster, limit, at)
                self.counters.adopted_limits += 1
        for key in [k for k in self._applied if k[0] not in fields]:
            del self._applied[key]  # the peer is gone (its record expired with it)
