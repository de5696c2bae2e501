"""Prometheus metrics, gathered at scrape time from the core's own counters.

Two things are recorded as requests happen: the ext_proc phase histogram and,
once per finished response, the OpenTelemetry GenAI client histograms
(:mod:`sidecar.ops.genai_metrics`, ``gen_ai_client_*``). Everything else is
read from the Router when Prometheus scrapes. Labels are bounded: cluster,
class, reason, state, slice label (capped by ``stats.max_slices``); never
tenant ids.

tailroute's own views use ``tailroute_`` names, among them the rolling-window
percentiles the router decides on (``tailroute_route_ttft_seconds`` and
friends: gauges with a ``window_quantile`` label, not histograms; ``quantile`` is
reserved for summaries, and ``promtool check metrics`` refuses it on a gauge).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import NamedTuple

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sidecar.core.health import HealthState
from sidecar.core.router import Router
from sidecar.core.stats import METRICS
from sidecar.fleet.metrics import FLEET_METRIC_NAMES
from sidecar.fleet.worker_status import WORKER_METRIC_NAMES
from sidecar.ops.cooperative import STEP_ROUTES, Steps, run_steps, run_steps_async
from sidecar.ops.genai_metrics import FAMILIES, exported_name
from sidecar.ops.metric_families import counter, gauge
from sidecar.ops.state import QUANTILES

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
    "tailroute_live_missing_total",
    "tailroute_outcomes_total",
    "tailroute_health_transitions_total",
    "tailroute_route_state",
    "tailroute_route_weight",
    "tailroute_inflight",
    "tailroute_concurrency_limit",
    "tailroute_stats_slices",
    "tailroute_errors_total",
    "tailroute_config_reloads_total",
    "tailroute_config_last_reload_ok",
    "tailroute_config_stats_resets_total",
    "tailroute_fail_open_total",
    "tailroute_admission_total",
    "tailroute_extproc_phase_seconds",
    "tailroute_access_log_entries_total",
    "tailroute_access_log_streams",
    "tailroute_access_log_wait_seconds",
    "tailroute_first_token_samples_total",
    "tailroute_stream_errors_total",
    "tailroute_upstream_retries_total",
    "tailroute_retry_after_total",
    "tailroute_retry_after_seconds_total",
    "tailroute_gc_freezes_total",
    "tailroute_gc_frozen_objects",
    *_QUANTILE_METRICS.values(),
    *(exported_name(f) for f in FAMILIES),
    *FLEET_METRIC_NAMES,  # only with a fleet: section (sidecar.fleet.metrics)
    *WORKER_METRIC_NAMES,  # only under serve --workers (sidecar.fleet.worker_status)
)
# Bounds of the ext_proc phase histogram. Past 50 ms up to Envoy's message timeout
# (limits.decision_timeout_ms, 500 ms by default) and beyond: with 50 ms the highest,
# histogram_quantile put any slower p99 at 0.05 (the +Inf bucket reads as the bound
# below it), so TailrouteDecisionSlow (p99 > 0.05) could never fire.
PHASE_BUCKETS = (5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25,
                 0.5, 1.0, 2.5)
# The histograms among them (exposed as <name>_bucket, _sum and _count).
HISTOGRAM_NAMES = ("tailroute_extproc_phase_seconds", *(exported_name(f) for f in FAMILIES))


class RouterCollector(Collector):
    """Reads the router (and shell counters) at scrape time."""

    def __init__(self, router: Callable[[], Router], now: Callable[[], float],
                 shell_counters: Callable[[], dict[str, int]]) -> None:
        self._router = router
        self._now = now
        self._shell = shell_counters
        self._prepared: list[Metric] | None = None

    def collect(self) -> Iterator[Metric]:
        prepared, self._prepared = self._prepared, None
        if prepared is not None:  # gathered for this scrape by prepare()
            return iter(prepared)
        now = self._now()
        return iter(run_steps(self.steps(lambda: now)))

    async def prepare(self) -> None:
        """Gather the next :meth:`collect`'s families, giving the event loop a turn
        every :data:`~sidecar.ops.cooperative.STEP_ROUTES` routes (the admin server
        calls it before each scrape, then collects at once)."""
        self._prepared = await run_steps_async(self.steps(self._now))

    def discard(self) -> None:
        """Forget what :meth:`prepare` gathered if no collect took it (a failed scrape)."""
        self._prepared = None

    def steps(self, clock: Callable[[], float]) -> Steps[list[Metric]]:
        """The families, as steps (sidecar.ops.cooperative): the rolling-window
        percentiles of every route in slices of routes, each at its slice's clock."""
        r, shell = self._router(), self._shell()
        out = [*self._router_families(r, shell)]
        state = GaugeMetricFamily("tailroute_route_state",
                                  "1 for the current health state of cluster x slice",
                                  labels=["cluster", "slice", "state"])
        weight = GaugeMetricFamily("tailroute_route_weight", "Health weight of cluster x slice",
                                   labels=["cluster", "slice"])
        # The board keeps only routes that differ from a fresh healthy one; export every
        # routed (narrow) series too, so "count routes by state" queries see all of them.
        board = dict(r.board.items())
        for i, (cluster, slice) in enumerate(sorted({*r.stats.narrow_keys(), *board},
                                                    key=lambda k: (k[0], k[1].label()))):
            if i and not i % (4 * STEP_ROUTES):  # a quarter of a route's percentiles each
                yield
            label = slice.label()
            h = board.get((cluster, slice))
            state.add_metric([cluster, label, h.state.value if h else "healthy"], 1.0)
            weight.add_metric([cluster, label], h.weight if h else 1.0)
        out += (state, weight, *_cluster_families(r))
        yield
        windows = {metric: GaugeMetricFamily(
            _QUANTILE_METRICS[metric], f"Observed {_QUANTILE_HELP[metric]} of cluster x slice "
            "at quantiles 0.5/0.95/0.99 over the rolling window (what latency routing sees)",
            labels=["cluster", "slice", "window_quantile"]) for metric in METRICS}
        now = clock()
        narrow = [(key, rs) for key, rs in r.stats.items() if r.stats.is_narrow(*key)]
        for i, ((cluster, slice), rs) in enumerate(narrow):
            if i and not i % STEP_ROUTES:
                yield
                now = clock()
            label = slice.label()
            for metric, g in windows.items():
                values, _ = rs.quantiles(metric, QUANTILES, now)
                for q, value in zip(QUANTILES, values, strict=True):
                    if value is not None:
                        g.add_metric([cluster, label, str(q)], value)
        return [*out, *windows.values(), *_shell_families(shell)]

    def _router_families(self, r: Router, shell: dict[str, int]) -> Iterator[Metric]:
        """Decisions, outcomes, health transitions, admission, fallbacks."""
        by_kind: defaultdict[str, list[tuple[list[str], int]]] = defaultdict(list)
        for (kind, label), v in r.counters.items():
            by_kind[kind].append(([label], v))
        yield counter("tailroute_decisions", "Routing decisions by cluster, class and reason",
                      r.decisions.items(), labels=["cluster", "class", "reason"])
        yield counter("tailroute_outcomes", "Outcomes of decided requests: ok, "
                      "error, timeout, cancel (observed, evidence) and lost (its "
                      "access-log entry never came: not evidence)",
                      [(["lost"], shell.get("outcome:lost", 0)), *by_kind["outcome"]],
                      labels=["outcome"])
        yield counter("tailroute_health_transitions", "Health-state transitions by new state",
                      by_kind["transition"], labels=["state"])
        yield counter("tailroute_admission", "Admission outcomes", by_kind["admission"],
                      labels=["outcome"])
        yield counter("tailroute_fallbacks",
                      "Decisions without full narrow-slice evidence, by kind",
                      by_kind["fallback"], labels=["kind"])
        yield counter("tailroute_live_missing",
                      "Decisions (native mode: slice weight computations) that kept a route "
                      "out of a slice because its recent requests missed the slice's budget "
                      "far beyond its allowed share",
                      by_kind["live_missing"], labels=["cluster"])


def _cluster_families(r: Router) -> Iterator[Metric]:
    """In flight and the trusted concurrency, per cluster."""
    yield gauge("tailroute_inflight", "Requests in flight per cluster",
                [([c], r.held(c)) for c in r.config.cluster_names], labels=["cluster"])
    yield gauge("tailroute_concurrency_limit",
                "Concurrency each cluster is trusted with: max_concurrency, lowered by "
                "the provider's 429s or by where its requests began to queue "
                "(sidecar.core.pushback, sidecar.core.queue_signs)",
                [([c], r.pushback.limit(c)) for c in r.config.cluster_names],
                labels=["cluster"])
    counts = {c: r.stats.slice_counts(c) for c in r.config.cluster_names}
    yield gauge("tailroute_stats_slices",
                "Workload slices each cluster's statistics track: narrow (admitted, at "
                "most stats.max_slices) and overflow (slices in use that the further "
                "ones fold into: above 0, their requests are routed on pooled evidence)",
                [([c, kind], n[i]) for c, n in counts.items()
                 for i, kind in enumerate(("narrow", "overflow"))],
                labels=["cluster", "kind"])


def _shell_families(shell: dict[str, int]) -> Iterator[Metric]:
    """The shell's counters (errors, reloads, fail-opens, Envoy's access log)."""
    yield counter("tailroute_errors", "Shell-side errors by kind",
                  _prefixed(shell, "error:"), labels=["kind"])
    yield counter("tailroute_gc_freezes", "Times the long-lived objects were frozen out of "
                  "the garbage collector's full passes after the routes grew "
                  "(sidecar.shell.gc_freeze)", shell.get("gc:freezes", 0))
    yield gauge("tailroute_gc_frozen_objects", "Objects frozen out of the garbage collector's "
                "passes: start-up's and the routes' statistics", shell.get("gc:frozen", 0))
    yield counter("tailroute_config_reloads", "Config reload attempts",
                  [(["ok"], shell.get("reload:ok", 0)),
                   (["invalid"], shell.get("reload:invalid", 0))], labels=["result"])
    yield counter("tailroute_config_stats_resets", "Config reloads that started every "
                  "route's statistics afresh (a new stats.subwindow_s)",
                  shell.get("reload:stats_reset", 0))
    yield gauge("tailroute_config_last_reload_ok", "1 if the last config (re)load succeeded",
                shell.get("reload:last_ok", 1))
    yield counter("tailroute_fail_open",
                  "Requests routed to the default cluster without a decision",
                  _prefixed(shell, "failopen:"), labels=["reason"])
    # Envoy's access log, as the sidecar received it (sidecar.shell.outcomes).
    yield counter(
        "tailroute_access_log_entries",
        "Envoy access-log entries by kind: decided, fail_open (an LLM request Envoy "
        "served without a decision), unrouted (an LLM request Envoy answered itself "
        "before routing: 413, client gone mid-upload), not_routed, orphan, late (the "
        "entry of a request already counted lost), elsewhere (the entry of a request "
        "decided here, received by another fleet process and forwarded), misrouted (a "
        "decided request Envoy sent to another cluster: its bootstrap lacks the route; or "
        "a native slice route's request to a cluster the config does not route it to), "
        "native (native/hybrid: an LLM request a slice route sent by the published "
        "weights), native_default (native/hybrid: an LLM request no slice route matched)",
        [([kind], shell.get(f"envoy:{kind}", 0))
         for kind in ("decided", "fail_open", "unrouted", "not_routed", "orphan", "late",
                      "elsewhere", "misrouted", "native", "native_default")],
        labels=["kind"])
    yield gauge("tailroute_access_log_streams",
                "Envoy access-log streams currently connected",
                shell.get("envoy:log_streams_open", 0))
    yield gauge(
        "tailroute_access_log_wait_seconds",
        "How long the oldest finished request has waited for its access-log entry "
        "(about the flush interval when entries flow; climbs while they do not)",
        shell.get("envoy:oldest_wait_ms", 0) / 1000.0)
    yield counter(
        "tailroute_first_token_samples",
        "Sampled responses read for their first token, by result: timed, no_token (a "
        "readable stream without one), encoded (a content-encoding such as gzip: not "
        "read), not_sse (not text/event-stream)",
        _prefixed(shell, "first_token:"), labels=["result"])
    yield counter(
        "tailroute_stream_errors",
        "Access-log entries of 2xx responses whose stream carried an error event (a "
        "provider that failed mid-stream behind its 200; also counted as outcome "
        "error when observed), by upstream cluster",
        _prefixed(shell, "stream_error:"), labels=["cluster"])
    yield counter(
        "tailroute_upstream_retries",
        "Upstream attempts Envoy retried on its own (a route retry_policy), by upstream "
        "cluster: each failed on that cluster before the attempt the access log shows; "
        "the sidecar observes only the last attempt of each request",
        _prefixed(shell, "upstream_retry:"), labels=["cluster"])
    yield counter(
        "tailroute_retry_after",
        "Upstream 429s and 503s that declared a wait (retry-after-ms / Retry-After), by "
        "upstream cluster: a provider's time-based quota or declared unavailability",
        _prefixed(shell, "retry_after:"), labels=["cluster"])
    yield counter(
        "tailroute_retry_after_seconds",
        "Sum of the waits upstream 429s and 503s declared, by upstream cluster (over "
        "tailroute_retry_after_total: the mean declared wait)",
        [(k, v / 1000.0) for k, v in _prefixed(shell, "retry_after_ms:")],
        labels=["cluster"])


def _prefixed(counters: dict[str, int], prefix: str) -> list[tuple[list[str], int]]:
    """The shell counters named ``<prefix><label>``, as samples labelled ``label``."""
    return [([k.removeprefix(prefix)], v) for k, v in counters.items() if k.startswith(prefix)]


class Registries(NamedTuple):
    """What :func:`build_registry` makes: the registry to scrape, the ext_proc phase
    histogram the shell records into, and the per-route collector in the registry
    (the admin server gathers it a slice at a time: sidecar.ops.cooperative)."""

    registry: CollectorRegistry
    phase: Histogram
    router: RouterCollector


def build_registry(router: Callable[[], Router], now: Callable[[], float],
                   shell_counters: Callable[[], dict[str, int]]) -> Registries:
    """A fresh registry (not the global one, so tests can run several sidecars)."""
    reg = CollectorRegistry()
    collector = RouterCollector(router, now, shell_counters)
    reg.register(collector)
    phase = Histogram("tailroute_extproc_phase_seconds",
                      "Sidecar handling time per ext_proc message", ["phase"], registry=reg,
                      buckets=PHASE_BUCKETS)
    return Registries(reg, phase, collector)
