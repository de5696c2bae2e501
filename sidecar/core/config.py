"""The one frozen, validated configuration object.

``parse_config(data, source)`` turns a plain mapping (from YAML) into a
:class:`Config`; it is pure, so the simulator and tests build configs the same
way the server does. Every error names the source file, the field path and the
problem, e.g. ``tailroute.yaml: clusters[1].max_concurrency: must be >= 1, got 0``.

Unknown keys are errors (a typo must not silently fall back to a default).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, cast

Metric = Literal["ttft", "tpot", "e2e"]
PickerMode = Literal["weighted_random", "lowest_score"]
Algorithm = Literal["latency_aware", "static"]

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration mistake; the message names the file and the field path."""


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """One upstream cluster (a provider, region or deployment)."""

    name: str
    address: str  # host:port of the upstream, used to render the Envoy bootstrap
    models: Mapping[str, str]  # model name clients ask for -> name the upstream serves
    max_concurrency: int = 64
    cost_per_1k_tokens: float = 1.0
    quality: float = 1.0
    region: str = ""
    tls: bool = False


@dataclass(frozen=True, slots=True)
class LatencyAwareConfig:
    """semantic-router ``latency_aware`` settings: percentiles in 1..100, or None = metric off."""

    ttft_percentile: int | None = None
    tpot_percentile: int | None = None
    description: str = ""


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """A model clients may ask for and the clusters that can serve it, in preference order."""

    name: str
    candidates: tuple[str, ...]
    algorithm: Algorithm = "latency_aware"
    latency_aware: LatencyAwareConfig = LatencyAwareConfig(ttft_percentile=95, tpot_percentile=90)
    regions: tuple[str, ...] = ()  # data-policy constraint: allowed regions (empty = any)


@dataclass(frozen=True, slots=True)
class SloConfig:
    """What a workload class promises: ``percentile`` of ``metric`` within ``budget_ms``."""

    metric: Metric = "ttft"
    percentile: float = 95.0
    budget_ms: float = 1000.0
    timeout_ms: float = 30000.0


@dataclass(frozen=True, slots=True)
class Weights:
    """How much a class cares about each scoring dimension (non-negative, any scale)."""

    latency: float = 1.0
    cost: float = 0.0
    quality: float = 0.0
    capacity: float = 0.5


@dataclass(frozen=True, slots=True)
class ClassConfig:
    """A workload class (interactive, batch, agentic, ...)."""

    name: str
    slo: SloConfig = SloConfig()
    priority: int = 5  # higher = more important; admission sheds low priority first
    weights: Weights = Weights()
    latency_sensitive: bool = True  # False: tolerant class, still uses degraded/restricted routes


@dataclass(frozen=True, slots=True)
class StatsConfig:
    """Rolling statistics: a window of ``subwindows`` sub-windows of ``subwindow_s`` seconds."""

    subwindow_s: float = 10.0
    subwindows: int = 6
    min_samples: int = 20  # fewer samples: percentile not trusted
    decay: float = 0.7  # weight of sub-window i back is decay**i (recency weighting)
    stale_after_s: float = 300.0  # no samples for this long: verdict expires
    max_slices: int = 512  # per cluster; beyond this, fold into an overflow slice
    # Share of responses timed by the observing filter once a route's current
    # sub-window holds min_samples samples (below that, every response is timed).
    observe_share: float = 1.0


@dataclass(frozen=True, slots=True)
class HealthConfig:
    """Thresholds of the graduated health policy; ratios are relative to the class SLO budget."""

    watch_ratio: float = 0.8  # tail above 0.8 x budget: watching
    degrade_windows: int = 3  # sustained for K evaluation windows: degraded
    degraded_weight: float = 0.3
    restrict_ratio: float = 1.0  # tail at or above the budget: restricted for this class
    restrict_windows: int = 2
    recover_ratio: float = 0.6  # must fall below this (hysteresis) to step back
    recover_windows: int = 2
    error_rate_quarantine: float = 0.5  # error+timeout share in a window that opens the circuit
    error_min_samples: int = 5
    restricted_windows_to_quarantine: int = 6
    cooldown_s: float = 15.0
    cooldown_max_s: float = 300.0
    probe_share: float = 0.05
    probe_successes: int = 5
    restore_step: float = 0.25  # weight returned per healthy window while restoring


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """Admission control when every eligible route is over budget or capacity."""

    enabled: bool = True
    queue_max: int = 64
    queue_wait_ms: float = 250.0
    defer_retry_after_s: int = 2
    shed_below_priority: int = 5  # priorities below this are shed first
    retry_budget_ratio: float = 0.2  # retries allowed per route as a share of recent requests


@dataclass(frozen=True, slots=True)
class ListenConfig:
    """Where the sidecar listens. ``grpc_unix`` may be set in addition to ``grpc``."""

    grpc: str = "127.0.0.1:50051"
    grpc_unix: str | None = None
    admin: str = "127.0.0.1:9911"


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    max_body_bytes: int = 8 * 1024 * 1024
    max_header_value_bytes: int = 256
    decision_timeout_ms: int = 500  # Envoy's message_timeout for the ext_proc filter


@dataclass(frozen=True, slots=True)
class EnvoyConfig:
    """What the rendered Envoy bootstrap uses."""

    listen: str = "127.0.0.1:10000"
    admin: str = "127.0.0.1:9901"
    route_buffer_bytes: int = 16 * 1024 * 1024
    observe_mode: Literal["observability", "streamed", "headers_only"] = "observability"
    # Envoy sends the request body without waiting for the headers answer: one
    # round trip less before routing, but no per-request mode override (so no
    # opt-in explain response header in observability mode).
    overlap_headers: bool = False


@dataclass(frozen=True, slots=True)
class Config:
    """The whole sidecar configuration. Build with :func:`parse_config`."""

    clusters: tuple[ClusterConfig, ...]
    models: tuple[ModelConfig, ...]
    classes: tuple[ClassConfig, ...]
    default_cluster: str
    default_class: str = "interactive"
    picker: PickerMode = "weighted_random"
    stats: StatsConfig = StatsConfig()
    health: HealthConfig = HealthConfig()
    admission: AdmissionConfig = AdmissionConfig()
    listen: ListenConfig = ListenConfig()
    limits: LimitsConfig = LimitsConfig()
    envoy: EnvoyConfig = EnvoyConfig()
    snapshot_path: str | None = None
    source: str = "<memory>"
    _by_cluster: dict[str, ClusterConfig] = field(default_factory=dict, compare=False, repr=False)
    _by_model: dict[str, ModelConfig] = field(default_factory=dict, compare=False, repr=False)
    _by_class: dict[str, ClassConfig] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._by_cluster.update({c.name: c for c in self.clusters})
        self._by_model.update({m.name: m for m in self.models})
        self._by_class.update({c.name: c for c in self.classes})

    def cluster(self, name: str) -> ClusterConfig:
        return self._by_cluster[name]

    def has_cluster(self, name: str) -> bool:
        return name in self._by_cluster

    def model(self, name: str) -> ModelConfig | None:
        return self._by_model.get(name)

    def workload_class(self, name: str) -> ClassConfig | None:
        return self._by_class.get(name)

    @property
    def cluster_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.clusters)


DEFAULT_CLASSES: tuple[ClassConfig, ...] = (
    ClassConfig(
        "interactive",
        SloConfig("ttft", 95, 1000, 30000),
        priority=10,
        weights=Weights(1.0, 0.0, 0.0, 0.5),
    ),
    ClassConfig(
        "agentic",
        SloConfig("e2e", 95, 8000, 60000),
        priority=8,
        weights=Weights(1.0, 0.1, 0.2, 0.5),
    ),
    ClassConfig(
        "batch",
        SloConfig("e2e", 99, 60000, 300000),
        priority=1,
        weights=Weights(0.2, 1.0, 0.0, 1.0),
        latency_sensitive=False,
    ),
)


# ---------------------------------------------------------------- validation


class _Reader:
    """Walks a mapping while remembering the field path, for precise errors."""

    def __init__(self, data: Any, source: str, path: str) -> None:
        self.source = source
        self.path = path
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            self.fail(f"expected a mapping, got {type(data).__name__}")
        self.data: Mapping[str, Any] = data
        self.used: set[str] = set()

    def fail(self, problem: str, key: str | None = None) -> Any:
        where = self.path if key is None else (f"{self.path}.{key}" if self.path else key)
        raise ConfigError(f"{self.source}: {where or '<root>'}: {problem}")

    def sub(self, key: str) -> _Reader:
        self.used.add(key)
        return _Reader(self.data.get(key), self.source, self._join(key))

    def _join(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def raw(self, key: str, default: Any = None) -> Any:
        self.used.add(key)
        return self.data.get(key, default)

    def str_(self, key: str, default: str | None = None, required: bool = False) -> str:
        self.used.add(key)
        if key not in self.data:
            if required or default is None:
                self.fail("required field is missing", key)
            return cast(str, default)
        v = self.data[key]
        if not isinstance(v, str) or (required and not v):
            self.fail(f"must be a non-empty string, got {v!r}", key)
        return cast(str, v)

    def opt_str(self, key: str) -> str | None:
        self.used.add(key)
        v = self.data.get(key)
        if v is not None and not isinstance(v, str):
            self.fail(f"must be a string, got {v!r}", key)
        return v

    def num(
        self,
        key: str,
        default: float,
        lo: float | None = None,
        hi: float | None = None,
        integer: bool = False,
    ) -> Any:
        self.used.add(key)
        v = self.data.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int | float):
            self.fail(f"must be a number, got {v!r}", key)
        if integer and not float(v).is_integer():
            self.fail(f"must be an integer, got {v!r}", key)
        if lo is not None and v < lo:
            self.fail(f"must be >= {lo}, got {v!r}", key)
        if hi is not None and v > hi:
            self.fail(f"must be <= {hi}, got {v!r}", key)
        return int(v) if integer else float(v)

    def bool_(self, key: str, default: bool) -> bool:
        self.used.add(key)
        v = self.data.get(key, default)
        if not isinstance(v, bool):
            self.fail(f"must be true or false, got {v!r}", key)
        return cast(bool, v)

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> Any:
        self.used.add(key)
        v = self.data.get(key, default)
        if v not in choices:
            self.fail(f"must be one of {', '.join(choices)}; got {v!r}", key)
        return v

    def list_(self, key: str, required: bool = False) -> list[Any]:
        self.used.add(key)
        if key not in self.data:
            if required:
                self.fail("required field is missing", key)
            return []
        v = self.data[key]
        if not isinstance(v, list):
            self.fail(f"must be a list, got {type(v).__name__}", key)
        return cast(list[Any], v)

    def item(self, key: str, index: int, value: Any) -> _Reader:
        return _Reader(value, self.source, f"{self._join(key)}[{index}]")

    def done(self) -> None:
        extra = sorted(set(self.data) - self.used)
        if extra:
            self.fail(f"unknown field(s): {', '.join(map(str, extra))}")


def _percentile_or_none(r: _Reader, key: str) -> int | None:
    v = r.raw(key)
    if v is None:
        return None
    return int(r.num(key, 0, lo=1, hi=100, integer=True))


def _latency_aware(r: _Reader) -> LatencyAwareConfig:
    cfg = LatencyAwareConfig(
        ttft_percentile=_percentile_or_none(r, "ttft_percentile"),
        tpot_percentile=_percentile_or_none(r, "tpot_percentile"),
        description=r.str_("description", ""),
    )
    r.done()
    return cfg


def _algorithm(r: _Reader) -> tuple[Algorithm, LatencyAwareConfig]:
    """Accept semantic-router's fragment: ``{type: latency_aware, latency_aware: {...}}``."""
    kind = r.choice("type", "latency_aware", ("latency_aware", "static"))
    la = _latency_aware(r.sub("latency_aware")) if "latency_aware" in r.data else None
    r.done()
    if la is None:
        la = LatencyAwareConfig(ttft_percentile=95, tpot_percentile=90)
    return kind, la


def _cluster(r: _Reader) -> ClusterConfig:
    name = r.str_("name", required=True)
    models_raw = r.raw("models", {})
    models: dict[str, str] = {}
    if isinstance(models_raw, list):
        for m in models_raw:
            if not isinstance(m, str):
                r.fail(f"model names must be strings, got {m!r}", "models")
            models[m] = m
    elif isinstance(models_raw, Mapping):
        for k, v in models_raw.items():
            if not isinstance(k, str) or not isinstance(v, str) or not v:
                r.fail(f"must map model name to upstream model name, got {k!r}: {v!r}", "models")
            models[k] = v
    else:
        r.fail("must be a list of model names or a mapping name -> upstream name", "models")
    address = r.str_("address", required=True)
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        r.fail(f"must be host:port, got {address!r}", "address")
    cfg = ClusterConfig(
        name=name,
        address=address,
        models=models,
        max_concurrency=r.num("max_concurrency", 64, lo=1, integer=True),
        cost_per_1k_tokens=r.num("cost_per_1k_tokens", 1.0, lo=0),
        quality=r.num("quality", 1.0, lo=0),
        region=r.str_("region", ""),
        tls=r.bool_("tls", False),
    )
    r.done()
    return cfg


def _model(r: _Reader, clusters: Mapping[str, ClusterConfig]) -> ModelConfig:
    name = r.str_("name", required=True)
    cands = r.list_("candidates", required=True)
    if not cands:
        r.fail("must list at least one cluster", "candidates")
    for c in cands:
        if c not in clusters:
            r.fail(f"unknown cluster {c!r} (known: {', '.join(clusters)})", "candidates")
        if name not in clusters[c].models:
            r.fail(f"cluster {c!r} does not list model {name!r} in its models", "candidates")
    if len(set(cands)) != len(cands):
        r.fail("lists a cluster twice", "candidates")
    kind, la = _algorithm(r.sub("algorithm"))
    regions = tuple(str(x) for x in r.list_("regions"))
    cfg = ModelConfig(name, tuple(cands), kind, la, regions)
    r.done()
    return cfg


def _class(name: str, r: _Reader) -> ClassConfig:
    s = r.sub("slo")
    slo = SloConfig(
        metric=s.choice("metric", "ttft", ("ttft", "tpot", "e2e")),
        percentile=s.num("percentile", 95, lo=1, hi=100),
        budget_ms=s.num("budget_ms", 1000, lo=1),
        timeout_ms=s.num("timeout_ms", 30000, lo=1),
    )
    s.done()
    if slo.timeout_ms < slo.budget_ms:
        s.fail(f"timeout_ms ({slo.timeout_ms}) must be >= budget_ms ({slo.budget_ms})")
    w = r.sub("weights")
    weights = Weights(
        latency=w.num("latency", 1.0, lo=0),
        cost=w.num("cost", 0.0, lo=0),
        quality=w.num("quality", 0.0, lo=0),
        capacity=w.num("capacity", 0.5, lo=0),
    )
    w.done()
    cfg = ClassConfig(
        name=name,
        slo=slo,
        priority=r.num("priority", 5, lo=0, hi=1000, integer=True),
        weights=weights,
        latency_sensitive=r.bool_("latency_sensitive", True),
    )
    r.done()
    return cfg


def _stats(r: _Reader) -> StatsConfig:
    cfg = StatsConfig(
        subwindow_s=r.num("subwindow_s", 10.0, lo=0.05, hi=3600),
        subwindows=r.num("subwindows", 6, lo=1, hi=120, integer=True),
        min_samples=r.num("min_samples", 20, lo=1, integer=True),
        decay=r.num("decay", 0.7, lo=0.01, hi=1.0),
        stale_after_s=r.num("stale_after_s", 300.0, lo=1),
        max_slices=r.num("max_slices", 512, lo=1, hi=100000, integer=True),
        observe_share=r.num("observe_share", 1.0, lo=0.0, hi=1.0),
    )
    r.done()
    return cfg


def _health(r: _Reader) -> HealthConfig:
    d = HealthConfig()
    cfg = HealthConfig(
        watch_ratio=r.num("watch_ratio", d.watch_ratio, lo=0.01, hi=10),
        degrade_windows=r.num("degrade_windows", d.degrade_windows, lo=1, integer=True),
        degraded_weight=r.num("degraded_weight", d.degraded_weight, lo=0.0, hi=1.0),
        restrict_ratio=r.num("restrict_ratio", d.restrict_ratio, lo=0.01, hi=10),
        restrict_windows=r.num("restrict_windows", d.restrict_windows, lo=1, integer=True),
        recover_ratio=r.num("recover_ratio", d.recover_ratio, lo=0.01, hi=10),
        recover_windows=r.num("recover_windows", d.recover_windows, lo=1, integer=True),
        error_rate_quarantine=r.num(
            "error_rate_quarantine", d.error_rate_quarantine, lo=0.01, hi=1.0
        ),
        error_min_samples=r.num("error_min_samples", d.error_min_samples, lo=1, integer=True),
        restricted_windows_to_quarantine=r.num(
            "restricted_windows_to_quarantine",
            d.restricted_windows_to_quarantine,
            lo=1,
            integer=True,
        ),
        cooldown_s=r.num("cooldown_s", d.cooldown_s, lo=0.1),
        cooldown_max_s=r.num("cooldown_max_s", d.cooldown_max_s, lo=0.1),
        probe_share=r.num("probe_share", d.probe_share, lo=0.001, hi=1.0),
        probe_successes=r.num("probe_successes", d.probe_successes, lo=1, integer=True),
        restore_step=r.num("restore_step", d.restore_step, lo=0.01, hi=1.0),
    )
    r.done()
    if not cfg.recover_ratio < cfg.watch_ratio <= cfg.restrict_ratio:
        r.fail("need recover_ratio < watch_ratio <= restrict_ratio (hysteresis)")
    if cfg.cooldown_max_s < cfg.cooldown_s:
        r.fail("cooldown_max_s must be >= cooldown_s")
    return cfg


def _admission(r: _Reader) -> AdmissionConfig:
    cfg = AdmissionConfig(
        enabled=r.bool_("enabled", True),
        queue_max=r.num("queue_max", 64, lo=0, integer=True),
        queue_wait_ms=r.num("queue_wait_ms", 250.0, lo=0),
        defer_retry_after_s=r.num("defer_retry_after_s", 2, lo=1, integer=True),
        shed_below_priority=r.num("shed_below_priority", 5, lo=0, integer=True),
        retry_budget_ratio=r.num("retry_budget_ratio", 0.2, lo=0, hi=10),
    )
    r.done()
    return cfg


def _listen(r: _Reader) -> ListenConfig:
    cfg = ListenConfig(
        grpc=r.str_("grpc", "127.0.0.1:50051"),
        grpc_unix=r.opt_str("grpc_unix"),
        admin=r.str_("admin", "127.0.0.1:9911"),
    )
    r.done()
    return cfg


def _limits(r: _Reader) -> LimitsConfig:
    cfg = LimitsConfig(
        max_body_bytes=r.num("max_body_bytes", 8 * 1024 * 1024, lo=1024, integer=True),
        max_header_value_bytes=r.num("max_header_value_bytes", 256, lo=8, integer=True),
        decision_timeout_ms=r.num("decision_timeout_ms", 500, lo=10, hi=60000, integer=True),
    )
    r.done()
    return cfg


def _envoy(r: _Reader) -> EnvoyConfig:
    cfg = EnvoyConfig(
        listen=r.str_("listen", "127.0.0.1:10000"),
        admin=r.str_("admin", "127.0.0.1:9901"),
        route_buffer_bytes=r.num("route_buffer_bytes", 16 * 1024 * 1024, lo=1024, integer=True),
        observe_mode=r.choice(
            "observe_mode", "observability", ("observability", "streamed", "headers_only")
        ),
        overlap_headers=r.bool_("overlap_headers", False),
    )
    r.done()
    return cfg


def parse_config(data: Any, source: str = "<memory>") -> Config:
    """Validate a mapping (parsed YAML) into a frozen :class:`Config`.

    Raises :class:`ConfigError` naming ``source``, the field path and the problem.
    """
    root = _Reader(data, source, "")
    clusters: dict[str, ClusterConfig] = {}
    for i, raw in enumerate(root.list_("clusters", required=True)):
        c = _cluster(root.item("clusters", i, raw))
        if c.name in clusters:
            root.fail(f"duplicate cluster name {c.name!r}", f"clusters[{i}].name")
        clusters[c.name] = c
    if not clusters:
        root.fail("must define at least one cluster", "clusters")

    # semantic-router style: a global algorithm applies to every model without its own.
    global_alg = root.sub("algorithm") if "algorithm" in root.data else None
    models: list[ModelConfig] = []
    for i, raw in enumerate(root.list_("models", required=True)):
        r = root.item("models", i, raw)
        if global_alg is not None and isinstance(raw, Mapping) and "algorithm" not in raw:
            raw = {**raw, "algorithm": dict(global_alg.data)}
            r = root.item("models", i, raw)
        m = _model(r, clusters)
        if any(x.name == m.name for x in models):
            root.fail(f"duplicate model {m.name!r}", f"models[{i}].name")
        models.append(m)
    if global_alg is not None:
        _algorithm(global_alg)  # validate it even if every model overrides it

    classes_raw = root.raw("classes")
    if classes_raw is None:
        classes: tuple[ClassConfig, ...] = DEFAULT_CLASSES
    else:
        if not isinstance(classes_raw, Mapping) or not classes_raw:
            root.fail("must be a non-empty mapping of class name -> settings", "classes")
        classes = tuple(
            _class(str(k), _Reader(v, source, f"classes.{k}")) for k, v in classes_raw.items()
        )
    default_class = root.str_("default_class", classes[0].name)
    if default_class not in {c.name for c in classes}:
        root.fail(f"unknown class {default_class!r}", "default_class")

    default_cluster = root.str_("default_cluster", next(iter(clusters)))
    if default_cluster not in clusters:
        root.fail(f"unknown cluster {default_cluster!r}", "default_cluster")

    snapshot = root.opt_str("snapshot_path")
    cfg = Config(
        clusters=tuple(clusters.values()),
        models=tuple(models),
        classes=classes,
        default_cluster=default_cluster,
        default_class=default_class,
        picker=root.choice("picker", "weighted_random", ("weighted_random", "lowest_score")),
        stats=_stats(root.sub("stats")),
        health=_health(root.sub("health")),
        admission=_admission(root.sub("admission")),
        listen=_listen(root.sub("listen")),
        limits=_limits(root.sub("limits")),
        envoy=_envoy(root.sub("envoy")),
        snapshot_path=snapshot,
        source=source,
    )
    root.done()
    _check_queue_wait(root, cfg)
    return cfg


QUEUE_MARGIN_MS = 50  # decision time and gRPC overhead on top of the longest queue wait


def _check_queue_wait(root: _Reader, cfg: Config) -> None:
    """A queued request holds Envoy's ext_proc answer for up to ``queue_wait_ms``;
    Envoy's ``message_timeout`` (``limits.decision_timeout_ms``) must outlast it."""
    adm = cfg.admission
    if not adm.enabled or adm.queue_max == 0 or adm.queue_wait_ms == 0:
        return
    limit = cfg.limits.decision_timeout_ms - QUEUE_MARGIN_MS
    if adm.queue_wait_ms > limit:
        root.fail(
            f"must be <= limits.decision_timeout_ms - {QUEUE_MARGIN_MS} = {limit} ms (Envoy "
            f"gives up on the decision after decision_timeout_ms), got {adm.queue_wait_ms:g}",
            "admission.queue_wait_ms",
        )
