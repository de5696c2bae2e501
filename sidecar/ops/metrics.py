"""Prometheus metrics, gathered at scrape time from the core's own counters.

Two things are recorded as requests happen: the ext_proc phase histogram and,
once per finished response, the OpenTelemetry GenAI client histograms
(:mod:`sidecar.ops.genai_metrics`, ``gen_ai_client_*``). Everything else is
read from the Router when Prometheus scrapes. Labels are bounded: cluster,
class, reason, state, slice label (capped by ``stats.max_slices``); never
tenant ids.

tailroute's own views use ``tailroute_`` names, among them the rolling-window
percentiles the router decides on (``tailroute_route_ttft_seconds`` and
friends: gauges with a ``quantile`` label, not histograms).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sidecar.core.health import HealthState
from sidecar.core.router import Router
from sidecar.core.stats import METRICS
from sidecar.ops.genai_metrics import FAMILIES, exported_name

STATES = [s.value for s in HealthState]
# The router's rolling-window percentiles per metric (what latency routing sees).
_QUANTILE_METRICS = {
    "ttft": "tailroute_route_ttft_seconds",
    "tpot": "tailroute_route_tpot_seconds",
    "e2e": "tailroute_route_e2e_seconds",
}
_QUANTILE_HELP = {"ttft": "time to first token", "tpot": "time per output token",
                  "e2e": "end-to-end duration"}

# Every metric name this module can export (the dashboard test checks against it).
METRIC_NAMES = (
    "tailroute_decisions_total",
    "tailroute_fallbacks_total",
    "tailroute_outcomes_total",
    "tailroute_health_transitions_total",
    "tailroute_route_state",
    "tailroute_route_weight",
    "tailroute_inflight",
    "tailroute_errors_total",
    "tailroute_config_reloads_total",
    "tailroute_config_last_reload_ok",
    "tailroute_fail_open_total",
    "tailroute_admission_total",
    "tailroute_extproc_phase_seconds",
    "tailroute_access_log_entries_total",
    "tailroute_access_log_streams",
    *_QUANTILE_METRICS.values(),
    *(exported_name(f) for f in FAMILIES),
)
# The histograms among them (exposed as <name>_bucket, _sum and _count).
HISTOGRAM_NAMES = ("tailroute_extproc_phase_seconds", *(exported_name(f) for f in FAMILIES))


class RouterCollector(Collector):
    """Reads the router (and shell counters) at scrape time."""

    def __init__(self, router: Callable[[], Router], now: Callable[[], float],
                 shell_counters: Callable[[], dict[str, int]]) -> None:
        self._router = router
        self._now = now
        self._shell = shell_counters

    def collect(self) -> Iterator[Metric]:
        r = self._router()
        now = self._now()
        dec = CounterMetricFamily("tailroute_decisions",
                                  "Routing decisions by cluster, class and reason",
                                  labels=["cluster", "class", "reason"])
        for (cluster, klass, reason), v in r.decisions.items():
            dec.add_metric([cluster, klass, reason], v)
        fb = CounterMetricFamily("tailroute_fallbacks",
                                 "Decisions without full narrow-slice evidence, by kind",
                                 labels=["kind"])
        out = CounterMetricFamily("tailroute_outcomes", "Observed outcomes", labels=["outcome"])
        tr = CounterMetricFamily("tailroute_health_transitions",
                                 "Health-state transitions by new state", labels=["state"])
        adm = CounterMetricFamily("tailroute_admission", "Admission outcomes",
                                  labels=["outcome"])
        for (kind, label), v in r.counters.items():
            fam = {"outcome": out, "transition": tr, "admission": adm, "fallback": fb}.get(kind)
            if fam is not None:
                fam.add_metric([label], v)
        yield from (dec, out, tr, adm, fb)

        state = GaugeMetricFamily("tailroute_route_state",
                                  "1 for the current health state of cluster x slice",
                                  labels=["cluster", "slice", "state"])
        weight = GaugeMetricFamily("tailroute_route_weight", "Health weight of cluster x slice",
                                   labels=["cluster", "slice"])
        # The board keeps only routes that differ from a fresh healthy one; export every
        # routed (narrow) series too, so "count routes by state" queries see all of them.
        board = dict(r.board.items())
        for cluster, slice in sorted({*r.stats.narrow_keys(), *board},
                                     key=lambda k: (k[0], k[1].label())):
            label = slice.label()
            h = board.get((cluster, slice))
            state.add_metric([cluster, label, h.state.value if h else "healthy"], 1.0)
            weight.add_metric([cluster, label], h.weight if h else 1.0)
        yield from (state, weight)

        infl = GaugeMetricFamily("tailroute_inflight", "Requests in flight per cluster",
                                 labels=["cluster"])
        for c in r.config.cluster_names:
            infl.add_metric([c], r.inflight(c))
        yield infl

        for metric in METRICS:
            name = _QUANTILE_METRICS[metric]
            g = GaugeMetricFamily(
                name, f"Observed {_QUANTILE_HELP[metric]} of cluster x slice at quantiles "
                "0.5/0.95/0.99 over the rolling window (what latency routing sees)",
                labels=["cluster", "slice", "quantile"])
            for (cluster, slice), rs in r.stats.items():
                if not r.stats.is_narrow(cluster, slice):
                    continue
                for q in (0.5, 0.95, 0.99):
                    value = rs.quantile(metric, q, now)
                    if value is not None:
                        g.add_metric([cluster, slice.label(), str(q)], value)
            yield g

        shell = self._shell()
        errs = CounterMetricFamily("tailroute_errors", "Shell-side errors by kind",
                                   labels=["kind"])
        for k, v in shell.items():
            if k.startswith("error:"):
                errs.add_metric([k[6:]], v)
        yield errs
        reloads = CounterMetricFamily("tailroute_config_reloads", "Config reload attempts",
                                      labels=["result"])
        reloads.add_metric(["ok"], shell.get("reload:ok", 0))
        reloads.add_metric(["invalid"], shell.get("reload:invalid", 0))
        yield reloads
        ok = GaugeMetricFamily("tailroute_config_last_reload_ok",
                               "1 if the last config (re)load succeeded")
        ok.add_metric([], shell.get("reload:last_ok", 1))
        yield ok
        fo = CounterMetricFamily("tailroute_fail_open",
                                 "Requests routed to the default cluster without a decision",
                                 labels=["reason"])
        for k, v in shell.items():
            if k.startswith("failopen:"):
                fo.add_metric([k[9:]], v)
        yield fo
        # Envoy's access log, as the sidecar received it (sidecar.shell.outcomes).
        entries = CounterMetricFamily(
            "tailroute_access_log_entries",
            "Envoy access-log entries by kind: decided, fail_open (an LLM request Envoy "
            "served without a decision), not_routed, orphan", labels=["kind"])
        for kind in ("decided", "fail_open", "not_routed", "orphan"):
            entries.add_metric([kind], shell.get(f"envoy:{kind}", 0))
        yield entries
        streams = GaugeMetricFamily("tailroute_access_log_streams",
                                    "Envoy access-log streams currently connected")
        streams.add_metric([], shell.get("envoy:log_streams_open", 0))
        yield streams


def build_registry(router: Callable[[], Router], now: Callable[[], float],
                   shell_counters: Callable[[], dict[str, int]]) -> tuple[CollectorRegistry,
                                                                            Histogram]:
    """A fresh registry (not the global one, so tests can run several sidecars)."""
    reg = CollectorRegistry()
    reg.register(RouterCollector(router, now, shell_counters))
    phase = Histogram("tailroute_extproc_phase_seconds",
                      "Sidecar handling time per ext_proc message", ["phase"], registry=reg,
                      buckets=(5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 5e-2))
    return reg, phase
