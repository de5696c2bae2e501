"""Prometheus metrics of native and hybrid routing, read at scrape time.

Labels are bounded like the router's: ``cluster`` from config, ``slice`` from
the rendered slice routes (models x classes x 3 profiles x 2).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from sidecar.ops.metric_families import counter, gauge
from sidecar.shell.native import NativeRouting

METRIC_NAMES = (
    "tailroute_native_weight",
    "tailroute_native_publications_total",
    "tailroute_native_layer_version",
    "tailroute_native_envoys",
    "tailroute_native_load",
)


class NativeCollector(Collector):
    """The published weights and the RTDS streams of one :class:`NativeRouting`."""

    def __init__(self, native: NativeRouting) -> None:
        self.native = native

    def collect(self) -> Iterator[Metric]:
        n = self.native
        yield gauge("tailroute_native_weight",
                    "weight published to Envoy for a slice route's cluster (of 10000)",
                    [([c, s.label()], w) for s, sw in n.weights.items() for c, w in sw.weights],
                    labels=["cluster", "slice"])
        yield counter("tailroute_native_publications",
                      "runtime layer versions pushed to Envoy over RTDS", n.layer.publications)
        yield gauge("tailroute_native_layer_version",
                    "version of the weights layer in force at the sidecar", n.layer.version)
        streams = n.rtds.state() if n.rtds is not None else []
        latest = sum(1 for s in streams if s["acked_version"] == n.layer.version)
        yield gauge(
            "tailroute_native_envoys",
            "Envoys subscribed to the weights layer, by whether they acked the latest version",
            [(["true"], latest), (["false"], len(streams) - latest)], labels=["acked"])
        yield gauge(
            "tailroute_native_load",
            "average requests in flight per cluster over the last interval (native path)",
            [([c], v) for c, v in n.load.last.items()], labels=["cluster"])
