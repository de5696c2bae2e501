"""Prometheus metrics of native and hybrid routing, read at scrape time.

Labels are bounded like the router's: ``cluster`` from config, ``slice`` from
the rendered slice routes (models x classes x 3 profiles x 2).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

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
        weight = GaugeMetricFamily(
            "tailroute_native_weight",
            "weight published to Envoy for a slice route's cluster (of 10000)",
            labels=["cluster", "slice"])
        for s, sw in n.weights.items():
            for c, w in sw.weights:
                weight.add_metric([c, s.label()], w)
        yield weight
        pubs = CounterMetricFamily("tailroute_native_publications",
                                   "runtime layer versions pushed to Envoy over RTDS")
        pubs.add_metric([], n.layer.publications)
        yield pubs
        version = GaugeMetricFamily("tailroute_native_layer_version",
                                    "version of the weights layer in force at the sidecar")
        version.add_metric([], n.layer.version)
        yield version
        envoys = GaugeMetricFamily(
            "tailroute_native_envoys",
            "Envoys subscribed to the weights layer, by whether they acked the latest version",
            labels=["acked"])
        streams = n.rtds.state() if n.rtds is not None else []
        latest = sum(1 for s in streams if s["acked_version"] == n.layer.version)
        envoys.add_metric(["true"], latest)
        envoys.add_metric(["false"], len(streams) - latest)
        yield envoys
        load = GaugeMetricFamily(
            "tailroute_native_load",
            "average requests in flight per cluster over the last interval (native path)",
            labels=["cluster"])
        for c, v in n.load.last.items():
            load.add_metric([c], v)
        yield load
