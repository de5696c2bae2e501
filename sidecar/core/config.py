"""The one frozen, validated configuration object.

``parse_config(data, source)`` turns a plain mapping (from YAML) into a
:class:`Config`; it is pure, so the simulator and tests build configs the same
way the server does. Every error names the source file, the field path and the
problem, e.g. ``tailroute.yaml: clusters[1].max_concurrency: must be >= 1, got 0``.

Unknown keys are errors (a typo must not silently fall back to a default).
The validation itself lives in :mod:`sidecar.core.config_parse`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from sidecar.core.fields import ConfigError as ConfigError  # re-exported
from sidecar.core.hints import HintsConfig
from sidecar.core.tls_config import SYSTEM_CA_FILE, ListenTlsConfig, SidecarTlsConfig
from sidecar.core.workers_config import WorkersConfig

# The rendered Envoy bootstrap's cluster for the sidecar (sidecar.shell.bootstrap): an
# upstream cluster of that name would be a duplicate Envoy refuses.
SIDECAR_CLUSTER: Final = "tailroute_sidecar"

Metric = Literal["ttft", "tpot", "e2e"]
PickerMode = Literal["weighted_random", "lowest_score"]
RoutingMode = Literal["extproc", "native", "hybrid"]
Algorithm = Literal["latency_aware", "static"]
Compat = Literal["tailroute", "semantic-router"]  # a model's routing profile (compat_sr)
SEMANTIC_ROUTER: Final[Compat] = "semantic-router"


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
    tls_verify: bool = True  # with tls: check the provider's certificate (CA, host's SAN)
    tls_ca_file: str = SYSTEM_CA_FILE  # the CA bundle Envoy checks it against
    provider: str = "openai"  # gen_ai.provider.name (OpenTelemetry GenAI), a metrics label


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
    compat: Compat = "tailroute"


@dataclass(frozen=True, slots=True)
class SloConfig:
    """What a workload class promises: ``percentile`` of ``metric`` within ``budget_ms``."""

    metric: Metric = "ttft"
    percentile: float = 95.0
    budget_ms: float = 1000.0
    timeout_ms: float = 30000.0
    max_stream_ms: float | None = None  # a stream's whole length; None: 20 x timeout_ms


# Default class weight of the live latency ratio (sidecar.core.live_latency).
QUEUE_WEIGHT: Final = 2.0


@dataclass(frozen=True, slots=True)
class Weights:
    """How much a class cares about each scoring dimension (non-negative, any scale)."""

    latency: float = 1.0
    cost: float = 0.0
    quality: float = 0.0
    capacity: float = 0.5
    # Exponent of the live latency ratio from in-flight counts (sidecar.core.live_latency).
    queue: float = QUEUE_WEIGHT


@dataclass(frozen=True, slots=True)
class ClassConfig:
    """A workload class (interactive, batch, agentic, ...)."""

    name: str
    slo: SloConfig = SloConfig()
    priority: int = 5  # higher = more important; admission sheds low priority first
    weights: Weights = Weights()
    latency_sensitive: bool = True  # False: tolerant class, still uses degraded/restricted routes
    # Steepness of the latency preference (sidecar.core.steepness): the latency score is
    # r ** -E with E rising from 2 to this with the route's samples. 2: the gentle curve.
    latency_exponent: float = 2.0
    # How much more the sure part of a route's excess violation share weighs in the
    # attainment score (sidecar.core.scorers.Attainment): 3 judges it on a / 4; 0 is
    # the gentle scale a for all of it.
    attainment_sharpen: float = 3.0
    # How a route's light-load violation share weighs against the best route's as a
    # ratio (sidecar.core.scorers.MissRatio): the score is (ratio) ** -this. 0: not at
    # all (docs/policy-lab.md, "The miss-ratio score on by default").
    miss_ratio_exponent: float = 1.0
    # Routes clearly worse than the best pool their static weight (sidecar.core.pooling),
    # so many slow alternatives do not outweigh the best one. False: each keeps its own.
    pool_worse: bool = True


@dataclass(frozen=True, slots=True)
class StatsConfig:
    """Rolling statistics: a ring of ``subwindows`` sub-windows of ``subwindow_s`` seconds
    (the maximum age of evidence); the window a decision reads follows the traffic
    rate inside it (see :mod:`sidecar.core.series`)."""

    subwindow_s: float = 10.0
    subwindows: int = 30  # maximum age of evidence: subwindows x subwindow_s
    min_samples: int = 20  # fewer samples: percentile not trusted; also the forgetting unit
    decay: float = 0.85  # a newer sub-window ages evidence by decay ** min(1, requests / min)
    # ... and by at least decay ** min_aging, however few requests it held (time also ages).
    min_aging: float = 0.5
    # ... and, on a busy route, so that about this many samples stay in the window:
    # a sub-window with r requests keeps at most 1 - r / enough_samples of the older
    # evidence (0: off). At high rates the window is then a short time window.
    enough_samples: float = 400.0
    stale_after_s: float = 300.0  # no samples for this long: verdict expires
    max_slices: int = 512  # per cluster; beyond this, fold into an overflow slice
    # Share of responses timed by the observing filter once a route's current
    # sub-window holds min_samples samples (below that, every response is timed).
    observe_share: float = 1.0
    # Pseudo-samples a narrow slice borrows from its broader slices (shrinkage).
    prior_samples: float = 10.0
    # Confidence of the shift test on each completed sub-window (sidecar.core.shift); 0: off.
    shift_alpha: float = 0.05


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
    # Exploration floor: every eligible route keeps at least this share of the best
    # route's weight, so a route that fell behind by score keeps fresh statistics.
    explore_share: float = 0.05
    probe_successes: int = 5
    # Consecutive probes within budget that move a restricted route back to degraded.
    # A restricted route was slow, not down: it may still miss a share of its requests,
    # and any such route passes a run of probes some time (a failed probe restarts the
    # count). At 25 % misses ten in a row take ~67 probes, five only ~13.
    restricted_probe_successes: int = 10
    restore_step: float = 0.25  # weight returned per healthy window while restoring
    # Escalation needs evidence at this confidence (one-sided binomial test).
    confidence: float = 0.95
    # Windows of a route's own history (EWMA) before watch-level escalation can fire.
    history_windows: int = 10
    # Consecutive hard failures (5xx, connect failures, resets, timeouts) that eject a
    # route at once; raised for routes whose stable failure rate makes such runs likely.
    eject_consecutive: int = 3
    # Restore steps and probe shares are multiplied by this per recent offence.
    relapse_factor: float = 0.5
    forgive_after_s: float = 600.0  # healthy this long: one offence forgotten
    # Outcomes resolved this long ago still say whether a route misses its budget now
    # (sidecar.core.live_misses); 0 turns that off.
    live_horizon_s: float = 10.0


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """Admission control when every eligible route is over budget or capacity."""

    enabled: bool = True
    queue_max: int = 64
    queue_wait_ms: float = 250.0
    defer_retry_after_s: int = 2
    shed_below_priority: int = 5  # priorities below this are shed first
    # Strict priority among the rest (sidecar.core.admission_priority): a class whose
    # routes are all near capacity and full or over its budget for yield_after_s is
    # "pressed", and stays so until yield_hold_s pass without that (0: off); less
    # important classes sharing those routes leave this share of each route's
    # max_concurrency free for it, yielding (defer/shed) beyond that.
    yield_after_s: float = 5.0
    yield_hold_s: float = 10.0
    yield_reserve: float = 0.1
    retry_budget_ratio: float = 0.2  # retries allowed per route as a share of recent requests
    # What the classes at or above shed_below_priority get once every usable route is
    # at max_concurrency and their queue wait is over: "shed" (defer/shed, reason
    # "full") or "best_effort" (sent beyond max_concurrency anyway).
    beyond_capacity: Literal["shed", "best_effort"] = "shed"

    def high(self, priority: int) -> bool:
        """Is work of ``priority`` at or above ``shed_below_priority`` (queued, then
        served, yielding or deferred beyond capacity) rather than shed first?"""
        return priority >= self.shed_below_priority


@dataclass(frozen=True, slots=True)
class ListenConfig:
    """Where the sidecar listens. ``grpc_unix`` may be set in addition to ``grpc``."""

    grpc: str = "127.0.0.1:50051"
    grpc_unix: str | None = None
    admin: str = "127.0.0.1:9911"
    tls: ListenTlsConfig | None = None  # TLS (or mutual TLS) on the gRPC TCP listener


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    max_body_bytes: int = 8 * 1024 * 1024
    max_header_value_bytes: int = 256
    max_json_depth: int = 128  # deeper request bodies get a 400 before parsing
    max_json_containers: int = 100_000  # arrays + objects: more get a 400 before parsing
    decision_timeout_ms: int = 500  # Envoy's message_timeout for the ext_proc filter


@dataclass(frozen=True, slots=True)
class EnvoyConfig:
    """What the rendered Envoy bootstrap uses."""

    listen: str = "127.0.0.1:10000"
    admin: str = "127.0.0.1:9901"
    route_buffer_bytes: int = 16 * 1024 * 1024
    # Circuit breaker of the sidecar cluster (streams to it); None: derived (bootstrap).
    sidecar_max_requests: int | None = None
    # How often Envoy flushes its batched access-log entries to the sidecar.
    access_log_flush_ms: int = 100
    # Share of requests whose SSE stream Envoy parses for the usage object (TPOT's token
    # count); None: 1 in extproc mode, 0.25 in native and hybrid mode.
    usage_sample: float | None = None
    # Envoy's active gRPC health check of the sidecar cluster (grpc.health.v1); 0 = none.
    sidecar_health_interval_s: float = 5.0
    # Envoy's HTTP/2 keepalive to the sidecar: a PING every this many seconds; an unanswered
    # one closes the connection (sidecar gone without FIN/RST), so its streams fail over; 0 = none.
    sidecar_keepalive_s: float = 10.0
    sidecar_tls: SidecarTlsConfig | None = None  # how Envoy reaches a TLS sidecar


@dataclass(frozen=True, slots=True)
class TimingConfig:
    """How responses are timed (see docs/response-timing.md).

    Outcome and timing come from Envoy's access log; a sampled share of streams is
    also timed at its first token (the first-body-byte to first-token offset)."""

    token_sample_share: float = 0.05
    token_sample_min: int = 8  # sample every streamed response until a route has this many
    # Routes whose first body byte comes well before the first token (a role-only
    # event first): their TTFT comes from sampled responses only, sampled at this share.
    role_first_share: float = 0.25
    ask_usage: bool = False  # ask streams for usage (sidecar.shell.upstream_body)
    done_mark: bool = True  # Envoy marks a stream at [DONE] (sidecar.shell.bootstrap_done)


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """Fleet mode: replicas share statistics and health through Redis/Valkey.

    Absent from the config (``Config.fleet is None``): standalone, nothing shared.
    """

    backend: Literal["redis"] = "redis"
    url: str = "redis://127.0.0.1:6379/0"  # redis://, rediss:// or unix://
    key_prefix: str = "tailroute"  # every key is "{<prefix>}:...": one Redis Cluster slot
    push_interval_s: float = 1.0  # how often a replica pushes its sub-windows and pulls others'
    stats_ttl_s: float = 60.0  # a replica's pushed statistics expire this long after its last push
    lease_ttl_s: float = 3.0  # a route's decision owner must renew within this
    timeout_ms: float = 500.0  # per store round trip; slower counts as the store being down


@dataclass(frozen=True, slots=True)
class RoutingConfig:
    """Who picks the cluster (docs/native-mode.md).

    ``extproc``: the sidecar decides every request (ext_proc). ``native``: Envoy
    picks from per-slice ``weighted_clusters`` whose weights the sidecar publishes
    once per evaluation window (RTDS). ``hybrid``: requests that need a
    per-request decision (deadline, workflow step, explain, ``per_request_classes``)
    go through ext_proc, all others take the native path.
    """

    mode: RoutingMode = "extproc"
    # hybrid: classes whose requests always get a per-request decision (admission, queueing).
    per_request_classes: tuple[str, ...] = ()
    # native/hybrid: how often weights are recomputed from the live load (health and
    # latency verdicts still change once per evaluation window, stats.subwindow_s).
    publish_interval_s: float = 1.0


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
    timing: TimingConfig = TimingConfig()
    routing: RoutingConfig = RoutingConfig()
    snapshot_path: str | None = None
    fleet: FleetConfig | None = None  # None: standalone
    # serve --workers N's liveness; whose x-tailroute-* hints count (sidecar.core.hints)
    workers: WorkersConfig = field(default_factory=WorkersConfig)
    hints: HintsConfig = field(default_factory=HintsConfig)
    source: str = "<memory>"
    # Lookups built from the tuples above. Not init fields: dataclasses.replace would hand
    # the new config the old one's dicts, and its __post_init__ would rewrite them.
    _by_cluster: dict[str, ClusterConfig] = field(
        default_factory=dict, init=False, compare=False, repr=False)
    _by_model: dict[str, ModelConfig] = field(
        default_factory=dict, init=False, compare=False, repr=False)
    _by_class: dict[str, ClassConfig] = field(
        default_factory=dict, init=False, compare=False, repr=False)

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


DEFAULT_CLASSES: Final[tuple[ClassConfig, ...]] = (
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


def parse_config(data: Any, source: str = "<memory>") -> Config:
    """Validate a mapping (parsed YAML) into a frozen :class:`Config`.

    Raises :class:`ConfigError` naming ``source``, the field path and the problem.
    """
    from sidecar.core.config_parse import parse_config as parse  # late: it imports this module

    return parse(data, source)
