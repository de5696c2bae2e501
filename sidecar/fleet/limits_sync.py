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

**Holds** travel the same way (``codec.HOLDS_FIELD``: ``{cluster: end of the hold
on the wall clock in ms}``): a 429 that declared its wait holds the cluster on
the replica that got it (:meth:`~sidecar.core.pushback.PushBack.hold`), and the
quota is the provider's, so every peer holds it until the same moment instead of
meeting a 429 of its own first. Only holds still running are published, and a
peer takes one whose end is later than its own (a hold only ever extends, and
never beyond ``pushback.MAX_HOLD_S`` from now).

**Quotas** too (``codec.QUOTAS_FIELD``: ``{cluster: its last 429 read as a quota's,
on the wall clock in ms}``): a replica that reads a cluster's 429s as a quota's
(:meth:`~sidecar.core.pushback.PushBack.quota`: one came back while the fleet had
nothing in flight there) publishes it while it lasts, and every peer reads its
own 429s of that cluster so (:meth:`~sidecar.core.pushback.PushBack.adopt_quota`)
instead of ratcheting a concurrency limit down on them. Only quotas younger than
``pushback.QUOTA_MEMORY_S`` are published or taken.
"""

from __future__ import annotations

from sidecar.core.pushback import HOLD_S, MAX_HOLD_S, QUOTA_MEMORY_S
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
        self._pushed_holds = codec.encode_holds({})
        self._pushed_quotas = codec.encode_times({})
        self._applied: dict[tuple[str, str], int] = {}  # (peer, cluster) -> refusal ms

    def placed_any(self) -> bool:
        """Was a limit, hold or quota offered, or a peer's limit taken?"""
        empty = codec.encode_limits({})
        return bool(self._applied) or self._pushed != empty or self._pushed_holds != empty \
            or self._pushed_quotas != empty

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

    def outgoing_holds(self, now: float, republish: bool) -> bytes | None:
        """This replica's running holds when they changed (or ``republish`` and it has
        some)."""
        running = {c: round((until + self.wall_offset) * 1000.0)
                   for c, until in self.router.pushback.held().items() if until > now}
        raw = codec.encode_holds(running)
        if raw == self._pushed_holds and not (republish and running):
            return None
        self._pushed_holds = raw
        return raw

    def outgoing_quotas(self, now: float, republish: bool) -> bytes | None:
        """This replica's quotas when they changed (or ``republish`` and it has some)."""
        quotas = {c: round((last + self.wall_offset) * 1000.0)
                  for c, last in self.router.pushback.quotas(now).items()}
        raw = codec.encode_times(quotas)
        if raw == self._pushed_quotas and not (republish and quotas):
            return None
        self._pushed_quotas = raw
        return raw

    def merge(self, fields: dict[str, dict[str, bytes]], rid: str, now: float) -> None:
        """Adopt the peers' fresh limits whose last refusal is newer than the one taken,
        and their running holds."""
        pushback = self.router.pushback
        for peer, got in fields.items():
            if peer == rid:
                continue
            held = got.get(codec.HOLDS_FIELD)
            if held is not None:
                self._merge_holds(peer, held, now)
            quotas = got.get(codec.QUOTAS_FIELD)
            if quotas is not None:
                self._merge_quotas(peer, quotas, now)
            raw = got.get(codec.LIMITS_FIELD)
            if raw is None:
                continue
            try:
                limits = codec.decode_limits(raw)
            except ValueError as exc:
                self.counters.skip(f"{peer}'s {codec.LIMITS_FIELD}", exc)
                continue
            for cluster, (limit, refused_ms) in limits.items():
                if cluster not in self.router.config.cluster_names:
                    continue  # another config's cluster (its statistics say so: foreign)
                at = min(refused_ms / 1000.0 - self.wall_offset, now)
                if refused_ms <= self._applied.get((peer, cluster), -1) or now - at >= HOLD_S:
                    continue
                self._applied[(peer, cluster)] = refused_ms
                pushback.adopt(cluster, limit, at)
                self.counters.adopted_limits += 1
        for key in [k for k in self._applied if k[0] not in fields]:
            del self._applied[key]  # the peer is gone (its record expired with it)

    def _merge_holds(self, peer: str, raw: bytes, now: float) -> None:
        try:
            holds = codec.decode_holds(raw)
        except ValueError as exc:
            self.counters.skip(f"{peer}'s {codec.HOLDS_FIELD}", exc)
            return
        pushback = self.router.pushback
        for cluster, until_ms in holds.items():
            wait = until_ms / 1000.0 - self.wall_offset - now
            if 0.0 < wait <= MAX_HOLD_S:
                pushback.hold(cluster, wait, now)  # ignored unless it ends later

    def _merge_quotas(self, peer: str, raw: bytes, now: float) -> None:
        try:
            quotas = codec.decode_times(raw, "quotas")
        except ValueError as exc:
            self.counters.skip(f"{peer}'s {codec.QUOTAS_FIELD}", exc)
            return
        pushback = self.router.pushback
        for cluster, last_ms in quotas.items():
            last = min(last_ms / 1000.0 - self.wall_offset, now)
            if now - last < QUOTA_MEMORY_S:
                pushback.adopt_quota(cluster, last)
