"""What one push/pull cycle carries between a replica and the store.

:class:`~sidecar.fleet.sync.FleetSync` builds an :class:`Exchange`; a store
(:class:`~sidecar.fleet.redis_store.RedisStore` in one pipelined round trip,
:class:`~sidecar.fleet.memory.MemoryStore` in the policy lab and unit tests)
carries it out and answers with a :class:`Reply`. Stores depend on these types
only, never on the sync state machine. :class:`SyncCounters` counts what the
cycles did with the replies (exported as metrics and read by tests).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# An item of a replica's inboxes (a forwarded request id: an 8-hex-digit prefix, "-" and
# a counter; a probe result: JSON of a route field made of config names and a bool) is
# tens of bytes, a few hundred with long names. A larger one no replica wrote: a take
# drops it (Redis: in the take script, so it never crosses the network). Before, a take
# of two 50 MB items took 0.5-0.7 s over a loopback, past the default fleet.timeout_ms:
# the cycle failed, the store read as down, and the same take was delivered again.
INBOX_ITEM_MAX_BYTES = 4096
# What a list of n items within that size may take in the store (measured: a 4 KiB item
# takes 5.2 KB of Redis memory, 29 bytes take 31); a list over it holds an item over the
# limit, and reading it would cost more than n such items: it is dropped whole, unread
# (reading a 50 MB item into the take script held Redis, every replica's store, 165 ms).
INBOX_ITEM_ALLOWANCE = 2 * INBOX_ITEM_MAX_BYTES
INBOX_SLACK_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Oversized:
    """What a take of an inbox dropped: ``items`` over :data:`INBOX_ITEM_MAX_BYTES`
    (``size``: the largest one's), or, ``whole``, every item unread (``size``: the
    list's)."""

    items: int
    size: int
    whole: bool = False

    def why(self) -> str:
        if self.whole:
            return (f"their list takes {self.size} bytes, more than {self.items} item(s) "
                    f"of at most {INBOX_ITEM_MAX_BYTES} bytes can: dropped unread, all")
        return f"over {INBOX_ITEM_MAX_BYTES} bytes (the largest {self.size}): dropped"


def take_small(items: list[bytes]) -> tuple[list[bytes], Oversized | None]:
    """A take of ``items`` as the Redis store's take script makes it (its size measured
    by the items' bytes): the items kept, and what was dropped."""
    if (size := sum(map(len, items))) > len(items) * INBOX_ITEM_ALLOWANCE + INBOX_SLACK_BYTES:
        return [], Oversized(len(items), size, whole=True)
    big = [len(v) for v in items if len(v) > INBOX_ITEM_MAX_BYTES]
    kept = [v for v in items if len(v) <= INBOX_ITEM_MAX_BYTES]
    return kept, Oversized(len(big), max(big)) if big else None


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
    # Access-log entries seen here of requests another process decided: the decider's
    # request-id prefix -> those request ids, so it stops waiting for them; and the
    # prefix whose forwarded ids this process takes (sidecar.shell.app, forwarding).
    entries: dict[str, list[bytes]] = field(default_factory=dict)
    entries_for: str = ""
    # Taking this replica's inboxes (forwarded entries and probes): the number of this
    # take, and the last take whose reply was processed (acknowledged: the store may
    # drop it). Until acknowledged, a take whose reply was lost is delivered again.
    take_gen: int = 0
    ack_gen: int | None = None
    # Health fields the last reply held that this replica asks no lease of (a cluster its
    # config lacks, a field naming no route): the store deletes each, with its lease,
    # once no replica renewed that lease for health_ttl_ms. Nothing else did: a rollout
    # that removed a cluster left its fields, counted as foreign by every replica, for good.
    prune: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Reply:
    holders: list[str]  # lease holder of each of Exchange.routes
    replicas: list[str]  # replicas that pushed within stats_ttl (this one included)
    stats: dict[str, dict[str, bytes]]  # peer -> its fields (as fetched)
    metas: dict[str, bytes | None]  # peer -> its meta record
    health: dict[str, bytes]
    probes: list[bytes]  # results other replicas forwarded to this one
    stored_fields: int  # sub-window fields this replica's hash held before this write
    entries: list[bytes] = field(default_factory=list)  # request ids others saw the entry of
    unreadable: list[str] = field(default_factory=list)  # peers' keys of another type
    oversized: dict[str, Oversized] = field(default_factory=dict)  # "probes", "entries"
    server_ms: float | None = None  # the store's clock when it answered (Redis: TIME)


@dataclass
class SyncCounters:
    merged_subwindows: int = 0
    adopted_states: int = 0
    forwarded_probes: int = 0
    applied_probes: int = 0
    bad_peer_records: int = 0  # records read and skipped as unreadable (at every read)
    mismatched_peers: int = 0
    adopted_limits: int = 0
    last_bad: str = ""  # what the last one was and why, for the log and /state
    last_mismatch: str = ""  # the last peer not merged (mismatched_peers), and why
    foreign_records: int = 0  # records of clusters this config lacks (at every read)
    last_foreign: str = ""

    def skip(self, what: str, why: object, n: int = 1) -> None:
        """``n`` records another replica (or program) wrote could not be read: skipped."""
        self.bad_peer_records += n
        self.last_bad = f"{what}: {str(why)[:200]}"

    def foreign(self, what: str, cluster: str) -> None:
        """A record of a cluster this replica's config lacks (a replica with another
        config: a rollout in progress, or another fleet on the same prefix): skipped."""
        self.foreign_records += 1
        self.last_foreign = f"{what}: no cluster {cluster[:100]!r} here"
