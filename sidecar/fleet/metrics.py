"""Prometheus view of fleet mode, read at scrape time (nothing on the request path)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from sidecar.ops.metric_families import counter, gauge

if TYPE_CHECKING:
    from sidecar.fleet.link import FleetLink

FLEET_METRIC_NAMES = (
    "tailroute_fleet_store_up",
    "tailroute_fleet_syncs_total",
    "tailroute_fleet_peers",
    "tailroute_fleet_routes",
    "tailroute_fleet_sync_seconds",
    "tailroute_fleet_skipped_records_total",
)


class FleetCollector(Collector):
    def __init__(self, link: FleetLink) -> None:
        self.link = link

    def collect(self) -> Iterator[Metric]:
        link = self.link
        yield gauge("tailroute_fleet_store_up",
                    "1 while the fleet store answered the last push/pull",
                    1.0 if link.up else 0.0)
        yield counter("tailroute_fleet_syncs", "Push/pull cycles by result",
                      [(["ok"], link.syncs_ok), (["error"], link.syncs_failed)],
                      labels=["result"])
        yield gauge("tailroute_fleet_peers",
                    "Other replicas that pushed within fleet.stats_ttl_s",
                    len([p for p in link.sync.peers if p != link.rid]))
        yield gauge("tailroute_fleet_routes",
                    "Routes whose health this replica owns or follows",
                    [(["owned"], len(link.sync.owned)), (["followed"], link.sync.followed)],
                    labels=["role"])
        yield gauge("tailroute_fleet_sync_seconds", "Duration of the last push/pull cycle",
                    link.last_cycle_s)
        c = link.sync.counters
        yield counter("tailroute_fleet_skipped_records",
                      "Peer records read and skipped: unreadable, statistics that do not "
                      "compare with this replica's (mismatched), of clusters this config "
                      "lacks (foreign)",
                      [(["unreadable"], c.bad_peer_records),
                       (["mismatched"], c.mismatched_peers),
                       (["foreign"], c.foreign_records)], labels=["reason"])
