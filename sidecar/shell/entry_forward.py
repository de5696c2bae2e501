"""Access-log entries that reached another process than the one that decided them.

Envoy sends its access log over one stream per Envoy worker thread and its
ext_proc streams over connections of its own, so with several sidecar processes
(``serve --workers N``, replicas behind one sidecar cluster) the entry of a
request often reaches a process that did not decide it. That process observes
the entry from its metadata (counted ``orphan``) and the fleet shares the
evidence; but the deciding process kept waiting for the entry and, after
``LOG_GRACE_S``, counted the request ``lost`` -- measured with ``serve --workers
2``: 6,614 of 16,030 requests "lost" on the worker Envoy's access-log stream did
not reach, its book of finished requests full, and its access log "silent".

So the receiving process notes the request id for its decider, and the fleet
link carries the ids through the store on its next cycle (``{P}:entries:<prefix>``,
:mod:`sidecar.fleet.redis_store`); the decider then stops waiting for them
(:meth:`sidecar.shell.app.App.settled_elsewhere`, counted ``elsewhere``). A
request id is ``<prefix>-<n>``, the prefix eight hex digits drawn per process;
anything else is not forwarded (the metadata is the sidecar's own, but an entry
is still input). The outbox is bounded: beyond :data:`FORWARD_MAX` ids per cycle
(the store down for long), the rest are dropped and counted
(``forward_dropped``); their deciders count them ``lost`` as before.
"""

from __future__ import annotations

import re

#: Ids kept for forwarding between two fleet cycles (about a minute at 2,000 req/s).
FORWARD_MAX = 100_000
_PREFIX = re.compile(r"[0-9a-f]{8}")


def decider_of(rid: str) -> str | None:
    """The prefix of the process that made ``rid``, or None if it is not one of ours."""
    prefix, sep, n = rid.rpartition("-")
    if not sep or not n.isdigit() or _PREFIX.fullmatch(prefix) is None:
        return None
    return prefix


class EntryForwards:
    """Request ids to tell their deciders about, by decider prefix."""

    __slots__ = ("by_decider", "count", "dropped", "own")

    def __init__(self, own: str) -> None:
        self.own = own
        self.by_decider: dict[str, list[str]] = {}
        self.count = 0
        self.dropped = 0

    def note(self, rid: str) -> None:
        """An entry of ``rid`` came here but this process did not decide it."""
        prefix = decider_of(rid)
        if prefix is None or prefix == self.own:
            return
        if self.count >= FORWARD_MAX:
            self.dropped += 1
            return
        self.by_decider.setdefault(prefix, []).append(rid)
        self.count += 1

    def take(self) -> dict[str, list[str]]:
        """Everything noted since the last take (the fleet link sends it)."""
        out, self.by_decider, self.count = self.by_decider, {}, 0
        return out

    def put_back(self, taken: dict[str, list[str]]) -> None:
        """A cycle failed: keep what it took for the next one (within the bound)."""
        for rids in taken.values():
            for rid in rids:
                self.note(rid)
