"""The scrape-time family builders produce what the client's own families do."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sidecar.ops.metric_families import Samples, counter, gauge


def _exposition(family: Metric) -> str:
    class One(Collector):
        def collect(self) -> Iterable[Metric]:
            return [family]

    reg = CollectorRegistry()
    reg.register(One())
    return generate_latest(reg).decode()


def _by_hand(kind: str, samples: list[tuple[list[str], float]], labels: list[str]) -> Metric:
    cls = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
    family = cls("tailroute_x", "help text", labels=labels)
    for values, value in samples:
        family.add_metric(values, value)
    return family


@pytest.mark.parametrize("kind", ["gauge", "counter"])
@pytest.mark.parametrize(("samples", "labels", "expected"), [
    (0.25, [], [([], 0.25)]),
    (3, [], [([], 3)]),
    ([], ["cluster"], []),
    ([(["a"], 1), (("b",), 2.5)], ["cluster"], [(["a"], 1), (["b"], 2.5)]),
    ({("a", "s"): 4}.items(), ["cluster", "slice"], [(["a", "s"], 4)]),
])
def test_builders_match_the_clients_families(
    kind: str, samples: Samples, labels: list[str], expected: list[tuple[list[str], float]]
) -> None:
    build = gauge if kind == "gauge" else counter
    got = build("tailroute_x", "help text", samples, labels=labels)
    assert _exposition(got) == _exposition(_by_hand(kind, expected, labels))


@pytest.mark.parametrize(("samples", "labels"), [
    ([(["a", "b"], 1)], ["cluster"]),  # a value too many: the client would drop it
    ([(["a"], 1)], ["cluster", "slice"]),  # a value short
    (1.0, ["cluster"]),  # an unlabelled value for a labelled family
])
def test_label_values_must_match_the_labels(samples: Samples, labels: list[str]) -> None:
    with pytest.raises(ValueError, match="tailroute_x: label values"):
        gauge("tailroute_x", "help text", samples, labels=labels)
