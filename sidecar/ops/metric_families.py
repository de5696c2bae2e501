"""Prometheus families built whole at scrape time, from samples already in hand.

Every tailroute collector reads live state when Prometheus scrapes and turns it
into families of one sample per label combination. These two builders are that
step, so a collector says only what it exports::

    gauge(name, help, 0.25)                                  one unlabelled sample
    counter(name, help, [(["ok"], 5), (["error"], 1)], labels=["result"])

``samples`` is either one value (a family without labels) or ``(label values,
value)`` pairs in exposition order -- a dict's ``.items()`` does. A counter's
``name`` is given without ``_total``: the client adds it. A pair whose label
values do not match ``labels`` one for one is a programming error and raises
(the client would silently drop the extra values or labels).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

# Label values as a list or tuple: never a bare str, which would pass as one value a letter.
LabelValues = list[str] | tuple[str, ...]
Samples = Iterable[tuple[LabelValues, float]] | float
_Family = TypeVar("_Family", GaugeMetricFamily, CounterMetricFamily)


def gauge(name: str, documentation: str, samples: Samples,
          labels: Sequence[str] = ()) -> GaugeMetricFamily:
    """A gauge family holding ``samples``."""
    return _filled(GaugeMetricFamily(name, documentation, labels=labels), labels, samples)


def counter(name: str, documentation: str, samples: Samples,
            labels: Sequence[str] = ()) -> CounterMetricFamily:
    """A counter family (exported as ``<name>_total``) holding ``samples``."""
    return _filled(CounterMetricFamily(name, documentation, labels=labels), labels, samples)


def _filled(family: _Family, labels: Sequence[str], samples: Samples) -> _Family:
    if isinstance(samples, int | float):
        samples = [((), samples)]
    for values, value in samples:
        if len(values) != len(labels):
            raise ValueError(f"{family.name}: label values {list(values)} do not match "
                             f"labels {list(labels)}")
        family.add_metric(values, value)
    return family
