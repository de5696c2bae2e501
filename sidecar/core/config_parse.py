"""Parse and validate a plain mapping (from YAML) into a :class:`~sidecar.core.config.Config`.

Pure, so the simulator and tests build configs the same way the server does.
Every error names the source file, the field path and the problem, e.g.
``tailroute.yaml: clusters[1].max_concurrency: must be >= 1, got 0``; unknown
keys are errors (see :mod:`sidecar.core.fields`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sidecar.core.config import (
    DEFAULT_CLASSES,
    AdmissionConfig,
    Algorithm,
    ClassConfig,
    ClusterConfig,
    Config,
    EnvoyConfig,
    HealthConfig,
    LatencyAwareConfig,
    LimitsConfig,
    ListenConfig,
    ModelConfig,
    RoutingConfig,
    SloConfig,
    StatsConfig,
    TimingConfig,
    Weights,
)
from sidecar.core.fields import ConfigReader


def _percentile_or_none(r: ConfigReader, key: str) -> int | None:
    v = r.raw(key)
    if v is None:
        return None
    return int(r.num(key, 0, lo=1, hi=100, integer=True))


def _latency_aware(r: ConfigReader) -> LatencyAwareConfig:
    cfg = LatencyAwareConfig(
        ttft_percentile=_percentile_or_none(r, "ttft_percentile"),
        tpot_percentile=_percentile_or_none(r, "tpot_percentile"),
        description=r.str_("description", ""),
    )
    r.done()
    return cfg


def _algorithm(r: ConfigReader) -> tuple[Algorithm, LatencyAwareConfig]:
    """Accept semantic-router's fragment: ``{type: latency_aware, latency_aware: {...}}``."""
    kind = r.choice("type", "latency_aware", ("latency_aware", "static"))
    la = _latency_aware(r.sub("latency_aware")) if "latency_aware" in r.data else None
    r.done()
    if la is None:
        la = LatencyAwareConfig(ttft_percentile=95, tpot_percentile=90)
    return kind, la


def _cluster(r: ConfigReader) -> ClusterConfig:
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


def _model(r: ConfigReader, clusters: Mapping[str, ClusterConfig]) -> ModelConfig:
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


def _class(name: str, r: ConfigReader) -> ClassConfig:
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


def _stats(r: ConfigReader) -> StatsConfig:
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


def _health(r: ConfigReader) -> HealthConfig:
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


def _admission(r: ConfigReader) -> AdmissionConfig:
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


def _listen(r: ConfigReader) -> ListenConfig:
    cfg = ListenConfig(
        grpc=r.str_("grpc", "127.0.0.1:50051"),
        grpc_unix=r.opt_str("grpc_unix"),
        admin=r.str_("admin", "127.0.0.1:9911"),
    )
    r.done()
    return cfg


def _limits(r: ConfigReader) -> LimitsConfig:
    cfg = LimitsConfig(
        max_body_bytes=r.num("max_body_bytes", 8 * 1024 * 1024, lo=1024, integer=True),
        max_header_value_bytes=r.num("max_header_value_bytes", 256, lo=8, integer=True),
        decision_timeout_ms=r.num("decision_timeout_ms", 500, lo=10, hi=60000, integer=True),
    )
    r.done()
    return cfg


def _envoy(r: ConfigReader) -> EnvoyConfig:
    cfg = EnvoyConfig(
        listen=r.str_("listen", "127.0.0.1:10000"),
        admin=r.str_("admin", "127.0.0.1:9901"),
        route_buffer_bytes=r.num("route_buffer_bytes", 16 * 1024 * 1024, lo=1024, integer=True),
        sidecar_max_requests=None if r.raw("sidecar_max_requests") is None else r.num(
            "sidecar_max_requests", 1024, lo=16, hi=1_000_000, integer=True),
        access_log_flush_ms=r.num("access_log_flush_ms", 100, lo=10, hi=10_000, integer=True),
    )
    for gone in ("observe_mode", "overlap_headers"):
        if gone in r.data:
            r.fail("removed: responses are timed from Envoy's access log now "
                   "(see docs/response-timing.md); delete this field", gone)
    r.done()
    return cfg


def _timing(r: ConfigReader) -> TimingConfig:
    cfg = TimingConfig(
        token_sample_share=r.num("token_sample_share", 0.05, lo=0.0, hi=1.0),
        token_sample_min=r.num("token_sample_min", 8, lo=0, hi=10_000, integer=True),
        role_first_share=r.num("role_first_share", 0.25, lo=0.0, hi=1.0),
    )
    r.done()
    return cfg


def _routing(
    r: ConfigReader, classes: tuple[ClassConfig, ...], stats: StatsConfig
) -> RoutingConfig:
    known = [c.name for c in classes]
    per_request = tuple(str(x) for x in r.list_("per_request_classes"))
    for name in per_request:
        if name not in known:
            r.fail(f"unknown class {name!r} (known: {', '.join(known)})", "per_request_classes")
    cfg = RoutingConfig(
        mode=r.choice("mode", "extproc", ("extproc", "native", "hybrid")),
        per_request_classes=per_request,
        publish_interval_s=r.num("publish_interval_s", min(1.0, stats.subwindow_s), lo=0.05,
                                 hi=stats.subwindow_s),
    )
    r.done()
    return cfg


def _check_native_routing(root: ConfigReader, cfg: Config) -> None:
    """Envoy's native path cannot rewrite the body: no cluster may rename a model."""
    if cfg.routing.mode == "extproc":
        return
    for i, c in enumerate(cfg.clusters):
        for client_name, upstream in c.models.items():
            if client_name != upstream:
                root.fail(
                    f"routing.mode {cfg.routing.mode} cannot rewrite the request body, but "
                    f"clusters[{i}].models maps {client_name!r} to {upstream!r}; serve the "
                    "model under the name clients send, or use routing.mode extproc",
                    "routing.mode",
                )


def parse_config(data: Any, source: str = "<memory>") -> Config:
    """Validate a mapping (parsed YAML) into a frozen :class:`Config`.

    Raises :class:`ConfigError` naming ``source``, the field path and the problem.
    """
    root = ConfigReader(data, source, "")
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
            _class(str(k), ConfigReader(v, source, f"classes.{k}")) for k, v in classes_raw.items()
        )
    default_class = root.str_("default_class", classes[0].name)
    if default_class not in {c.name for c in classes}:
        root.fail(f"unknown class {default_class!r}", "default_class")

    default_cluster = root.str_("default_cluster", next(iter(clusters)))
    if default_cluster not in clusters:
        root.fail(f"unknown cluster {default_cluster!r}", "default_cluster")

    snapshot = root.opt_str("snapshot_path")
    stats = _stats(root.sub("stats"))
    cfg = Config(
        clusters=tuple(clusters.values()),
        models=tuple(models),
        classes=classes,
        default_cluster=default_cluster,
        default_class=default_class,
        picker=root.choice("picker", "weighted_random", ("weighted_random", "lowest_score")),
        stats=stats,
        health=_health(root.sub("health")),
        admission=_admission(root.sub("admission")),
        listen=_listen(root.sub("listen")),
        limits=_limits(root.sub("limits")),
        envoy=_envoy(root.sub("envoy")),
        timing=_timing(root.sub("timing")),
        routing=_routing(root.sub("routing"), classes, stats),
        snapshot_path=snapshot,
        source=source,
    )
    root.done()
    _check_queue_wait(root, cfg)
    _check_native_routing(root, cfg)
    return cfg


QUEUE_MARGIN_MS = 50  # decision time and gRPC overhead on top of the longest queue wait


def _check_queue_wait(root: ConfigReader, cfg: Config) -> None:
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
