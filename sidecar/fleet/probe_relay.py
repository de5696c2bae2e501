"""Probe results on their way to the routes' owners, sans I/O: :class:`ProbeRelay`.

One replica owns each route's health (:mod:`sidecar.fleet.sync`), and its
single tally counts every replica's probes. A follower's board
(:class:`~sidecar.core.fleet_share.FollowerBoard`) queues the results of the
probes it sent on a followed route in ``probe_outbox``; each push hands them to
the inbox of the route's lease holder as the last reply named it (one whose
holder is unknown or this replica is not forwarded: it leaves the outbox all
the same).
The owner takes its inbox with the reply and counts the results of routes it
still owns (:meth:`ProbeRelay.incoming`), each with the send time of a rescue
moved onto its own clock.

Until the reply to the push that carried them comes, the relay keeps what it
forwarded: a push that failed may not have delivered them, and
:meth:`ProbeRelay.take_back` returns them, with those queued since, for this
replica's own board to count (:meth:`~sidecar.fleet.sync.FleetSync.disconnected`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from sidecar.core.fleet_share import FollowerBoard, ProbeResult
from sidecar.fleet import codec
from sidecar.fleet.exchange import SyncCounters


class ProbeRelay:
    """One replica's side: what it forwards and what its inbox brings."""

    def __init__(self, counters: SyncCounters) -> None:
        self.counters = counters
        # Probe results the last push forwarded to their owners, until its reply comes.
        self._forwarded: list[ProbeResult] = []

    def outgoing(
        self, board: FollowerBoard, holders: Mapping[str, str], rid: str,
        wall_ms: Callable[[float], int],
    ) -> dict[str, list[bytes]]:
        """Empty the board's outbox into the holders' inboxes (holder -> encoded results)."""
        probes: dict[str, list[bytes]] = {}
        self._forwarded = []
        for result in board.probe_outbox:
            cluster, s, ok, sent = result
            rf = codec.route_field(cluster, s)
            holder = holders.get(rf)
            if holder is not None and holder != rid:
                sent_ms = None if sent is None else wall_ms(sent)
                probes.setdefault(holder, []).append(codec.encode_probe(rf, ok, sent_ms))
                self._forwarded.append(result)
                self.counters.forwarded_probes += 1
        board.probe_outbox.clear()
        return probes

    def delivered(self) -> None:
        """The store answered the push that carried the forwarded results."""
        self._forwarded = []

    def take_back(self, board: FollowerBoard) -> list[ProbeResult]:
        """The store did not answer: the failed push's results and those queued since,
        oldest first, for this replica's own board (the board's outbox is emptied: the
        next push would drop them, no holder being known until the store answers).
        Before, both were lost, and a probing route here waited for probes it had
        already seen."""
        results = self._forwarded + board.probe_outbox
        self._forwarded = []
        board.probe_outbox.clear()
        return results

    def incoming(
        self, raw: list[bytes], owned: Collection[str], wall_offset: float,
    ) -> list[ProbeResult]:
        """The results peers forwarded to this replica, of the routes it owns (route
        fields in ``owned``), in the order they came; a malformed one is skipped."""
        results: list[ProbeResult] = []
        for value in raw:
            try:
                rf, ok, sent_ms = codec.decode_probe(value)
                cluster, s = codec.parse_route(rf)
            except ValueError as exc:
                self.counters.skip("a forwarded probe result", exc)
                continue
            if rf in owned:
                sent = None if sent_ms is None else sent_ms / 1000.0 - wall_offset
                results.append((cluster, s, ok, sent))
                self.counters.applied_probes += 1
        return results
