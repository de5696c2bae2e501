"""OpenTelemetry GenAI *client* metrics, as Prometheus histograms, one record per response.

tailroute calls its upstreams on the application's behalf, so its view of an
upstream is the client side of the GenAI semantic conventions
(``gen_ai.client.*``; ``gen_ai.server.*`` is the model server's own view).
Instruments, units and the recommended explicit bucket boundaries follow the
conventions' metrics page; names and attributes are mapped to Prometheus the
way the OpenTelemetry Prometheus exporter maps them: dots become underscores,
the UCUM unit becomes a suffix (``s`` -> ``_seconds``; a ``{token}``
annotation is dropped), and a histogram is exposed as ``_bucket{le}``,
``_sum`` and ``_count``.

* ``gen_ai.client.operation.duration`` (s) ->
  ``gen_ai_client_operation_duration_seconds``
* ``gen_ai.client.operation.time_to_first_chunk`` (s) ->
  ``gen_ai_client_operation_time_to_first_chunk_seconds``
* ``gen_ai.client.operation.time_per_output_chunk`` (s) ->
  ``gen_ai_client_operation_time_per_output_chunk_seconds``
* ``gen_ai.client.token.usage`` ({token}) -> ``gen_ai_client_token_usage``

What is recorded, from each :class:`~sidecar.core.types.Observation`:

* duration: the response's end-to-end time; for a timeout or a cancel, the
  time waited, labelled ``error_type`` ``timeout`` / ``cancelled``; an upstream
  error carries its status code (``"503"``) when its duration is known;
* time to first chunk: streaming responses only, time to the first chunk that
  carries a token;
* time per output chunk: streaming responses with two or more tokens. The
  shell keeps one figure per response (mean interval = (last - first) /
  (tokens - 1)), so it is recorded *weighted* by the response's number of
  intervals: ``_sum`` and ``_count`` are exact, and each interval of a
  response falls in the bucket of that response's mean;
* token usage: output tokens of successful responses
  (``gen_ai_token_type="output"``). Input tokens are not reported: the sidecar
  only estimates them from the request size, and the conventions say an
  instrumentation that cannot obtain counts must not report the metric.

Labels (attributes): ``gen_ai_operation_name`` (``chat`` for chat completions
and responses, ``text_completion`` for completions), ``gen_ai_provider_name``
(``clusters[].provider``), ``gen_ai_request_model`` (the model name sent
upstream, after any per-cluster rewrite), ``server_address`` and
``server_port`` (``clusters[].address``), ``error_type`` (only on failed
operations), plus tailroute's own ``cluster``. Every value comes from the
config or a closed set, never from the caller: a model that is not configured
gets no ``gen_ai_request_model`` label, an observation for a cluster a reload
removed is dropped.

Every observation the router receives is recorded (:meth:`GenAIClientMetrics.record`,
``App.on_observation``), whichever routing mode produced it; native mode's access-log
batches hand a route's successes over together (:meth:`GenAIClientMetrics.record_ok`,
``App.on_ok_samples``: the same counts and sums as one ``record`` each).

Cost per response: one dict lookup for the cached label set, then one bisect
and two additions per instrument. Recording never allocates once a label set
has been seen. The families are built when Prometheus scrapes.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from sidecar.core.config import Config
from sidecar.core.subwindow import OkSample
from sidecar.core.types import Api, Observation, SliceKey

# Recommended ExplicitBucketBoundaries of the GenAI metrics page.
SECONDS_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                   40.96, 81.92)
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
                 16777216, 67108864)

# gen_ai.operation.name by API; other paths are never routed, so never observed.
_OPERATION: dict[Api, str] = {"chat": "chat", "responses": "chat",
                              "completions": "text_completion"}


class Family(NamedTuple):
    name: str  # Prometheus name without the unit suffix
    unit: str  # OpenMetrics unit ("" when the OTel unit is an annotation)
    otel: str
    doc: str
    buckets: tuple[float, ...]


DURATION = Family("gen_ai_client_operation_duration", "seconds",
                  "gen_ai.client.operation.duration", "GenAI operation duration",
                  SECONDS_BUCKETS)
TIME_TO_FIRST_CHUNK = Family(
    "gen_ai_client_operation_time_to_first_chunk", "seconds",
    "gen_ai.client.operation.time_to_first_chunk",
    "Time from sending the request upstream to the first chunk carrying a token (streams)",
    SECONDS_BUCKETS)
TIME_PER_OUTPUT_CHUNK = Family(
    "gen_ai_client_operation_time_per_output_chunk", "seconds",
    "gen_ai.client.operation.time_per_output_chunk",
    "Time per output chunk after the first (streams; each response's mean interval, weighted)",
    SECONDS_BUCKETS)
TOKEN_USAGE = Family("gen_ai_client_token_usage", "", "gen_ai.client.token.usage",
                     "Number of output tokens used", TOKEN_BUCKETS)
FAMILIES = (DURATION, TIME_TO_FIRST_CHUNK, TIME_PER_OUTPUT_CHUNK, TOKEN_USAGE)


def exported_name(f: Family) -> str:
    return f"{f.name}_{f.unit}" if f.unit else f.name


class _Hist:
    """Per-bucket (not cumulative) counts and the sum; cumulated at scrape time."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # last: above the highest bound (+Inf)
        self.total = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        # bisect_left: a value equal to a bound belongs to that bucket (le = "<=").
        self.counts[bisect_left(self.bounds, value)] += n
        self.total += value * n

    def observe_all(self, values: Sequence[float]) -> None:
        """:meth:`observe` of each value in turn (the sum added in the same order)."""
        counts, bounds, total = self.counts, self.bounds, self.total
        for value in values:
            counts[bisect_left(bounds, value)] += 1
            total += value
        self.total = total


Labels = tuple[tuple[str, str], ...]


class _Route:
    """The series of one label set; a histogram is created on its first measurement
    (an instrument that never measured exports nothing, as an OpenTelemetry SDK does)."""

    __slots__ = ("failed", "hists", "labels", "store")

    def __init__(self, store: dict[str, dict[Labels, _Hist]], labels: Labels,
                 failed: bool) -> None:
        self.store = store
        self.labels = labels
        self.failed = failed  # error_type set: only the duration is recorded
        self.hists: dict[str, _Hist] = {}  # by family name (a str hashes once)

    def hist(self, fam: Family) -> _Hist:
        h = self.hists.get(fam.name)
        if h is None:
            labels = (*self.labels, ("gen_ai_token_type", "output")) if fam is TOKEN_USAGE \
                else self.labels
            series = self.store[fam.name]
            h = series.get(labels)
            if h is None:
                h = series[labels] = _Hist(fam.buckets)
            self.hists[fam.name] = h
        return h


def error_type(obs: Observation) -> str | None:
    """``error.type`` of an operation (None: it succeeded). A closed vocabulary."""
    if obs.outcome == "ok":
        return None
    if obs.outcome == "timeout":
        return "timeout"
    if obs.outcome == "cancel":
        return "cancelled"
    status = obs.status
    return str(status) if status is not None and 100 <= status <= 599 else "_OTHER"


class GenAIClientMetrics(Collector):
    """Records observations into histograms and exposes them at scrape time.

    ``config`` returns the config in force (it changes on reload): label
    values are looked up in it and cached per (cluster, model, api, error).
    """

    def __init__(self, config: Callable[[], Config]) -> None:
        self._config = config
        self._seen: Config | None = None
        self._cache: dict[tuple[str, str, Api, str | None], _Route | None] = {}
        self._series: dict[str, dict[Labels, _Hist]] = {f.name: {} for f in FAMILIES}

    def record(self, obs: Observation, api: Api) -> None:
        """Hook for the shell: called once per finished, measured response."""
        route = self._lookup(obs.cluster, obs.slice.model, api, error_type(obs))
        if route is None:
            return
        if route.failed:
            if obs.e2e_s is not None:
                route.hist(DURATION).observe(obs.e2e_s)
            return  # a failure carries no chunk timing or usage
        _ok(route, bool(obs.slice.streaming), obs.ttft_s, obs.tpot_s, obs.e2e_s,
            obs.output_tokens)

    def record_ok(self, cluster: str, slice: SliceKey, samples: Sequence[OkSample],
                  apis: Sequence[Api]) -> None:
        """Hook for the shell: successes of one route learned together (native mode's
        access-log batches, ``Router.observe_ok``), ``apis[i]`` the API of
        ``samples[i]``; the same as one :meth:`record` per sample."""
        start = 0
        while start < len(samples):  # runs of one API (nearly always one run)
            api, end = apis[start], start + 1
            while end < len(samples) and apis[end] == api:
                end += 1
            route = self._lookup(cluster, slice.model, api, None)
            if route is not None:
                _ok_run(route, bool(slice.streaming), samples[start:end])
            start = end

    def _lookup(self, cluster: str, model: str, api: Api, err: str | None) -> _Route | None:
        """The label set of one operation, cached per (cluster, model, api, error)."""
        cfg = self._config()
        if cfg is not self._seen:  # reloaded: label values may have changed
            self._seen = cfg
            self._cache.clear()
        key = (cluster, model, api, err)
        if key in self._cache:
            return self._cache[key]
        route = self._cache[key] = self._route(cfg, key)
        return route

    def _route(self, cfg: Config, key: tuple[str, str, Api, str | None]) -> _Route | None:
        cluster, model, api, err = key
        operation = _OPERATION.get(api)
        if operation is None or not cfg.has_cluster(cluster):
            return None  # not an LLM call, or a cluster a reload removed mid-request
        c = cfg.cluster(cluster)
        host, _, port = c.address.rpartition(":")
        labels: dict[str, str] = {"cluster": cluster, "gen_ai_operation_name": operation,
                                  "gen_ai_provider_name": c.provider}
        if cfg.model(model) is not None and model in c.models:
            labels["gen_ai_request_model"] = c.models[model]
        labels["server_address"] = host
        labels["server_port"] = port
        if err is not None:
            labels["error_type"] = err
        return _Route(self._series, tuple(sorted(labels.items())), failed=err is not None)

    def collect(self) -> Iterator[Metric]:
        for fam in FAMILIES:
            out = HistogramMetricFamily(fam.name, f"{fam.doc} ({fam.otel})", unit=fam.unit)
            for labels, h in list(self._series[fam.name].items()):
                _add_series(out, dict(labels), h)
            yield out


def _ok(route: _Route, streaming: bool, ttft: float | None, tpot: float | None,
        e2e: float | None, tokens: int | None) -> None:
    """Record one successful operation: its duration; for a stream its time to first
    chunk and, from two tokens, its time per output chunk; its output tokens."""
    if e2e is not None:
        route.hist(DURATION).observe(e2e)
    if ttft is not None and streaming:
        route.hist(TIME_TO_FIRST_CHUNK).observe(ttft)
    if tpot is not None and streaming and tokens and tokens >= 2:
        route.hist(TIME_PER_OUTPUT_CHUNK).observe(tpot, tokens - 1)
    if tokens:
        route.hist(TOKEN_USAGE).observe(tokens)


def _ok_run(route: _Route, streaming: bool, samples: Sequence[OkSample]) -> None:
    """:func:`_ok` for each of ``samples`` in order, a histogram at a time (the same
    counts and the same sums, added in the same order)."""
    e2es = [e2e for _, _, e2e, _ in samples if e2e is not None]
    if e2es:
        route.hist(DURATION).observe_all(e2es)
    if streaming:
        ttfts = [ttft for ttft, _, _, _ in samples if ttft is not None]
        if ttfts:
            route.hist(TIME_TO_FIRST_CHUNK).observe_all(ttfts)
        for _, tpot, _, tokens in samples:
            if tpot is not None and tokens and tokens >= 2:
                route.hist(TIME_PER_OUTPUT_CHUNK).observe(tpot, tokens - 1)
    counts = [tokens for _, _, _, tokens in samples if tokens]
    if counts:
        route.hist(TOKEN_USAGE).observe_all(counts)


def _add_series(out: Metric, labels: dict[str, str], h: _Hist) -> None:
    running = 0
    for bound, n in zip(h.bounds, h.counts, strict=False):
        running += n
        out.samples.append(Sample(out.name + "_bucket", {**labels, "le": _le(bound)}, running))
    running += h.counts[-1]
    out.samples.append(Sample(out.name + "_bucket", {**labels, "le": "+Inf"}, running))
    out.samples.append(Sample(out.name + "_count", labels, running))
    out.samples.append(Sample(out.name + "_sum", labels, h.total))


def _le(bound: float) -> str:
    text: str = floatToGoString(bound)  # type: ignore[no-untyped-call]
    return text  # as prometheus_client writes its own buckets


def attach(registry: CollectorRegistry, config: Callable[[], Config]) -> GenAIClientMetrics:
    """Register the histograms in ``registry``; returns them, whose :meth:`record` and
    :meth:`record_ok` are the shell's observation hooks (``App.on_observation``,
    ``App.on_ok_samples``)."""
    metrics = GenAIClientMetrics(config)
    registry.register(metrics)
    return metrics
