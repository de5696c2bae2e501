"""Parse and validate a plain mapping (from YAML) into a :class:`~sidecar.core.config.Config`.

Pure, so the simulator and tests build configs the same way the server does.
Every error names the source file, the field path and the problem, e.g.
``tailroute.yaml: clusters[1].max_concurrency: must be >= 1, got 0``; unknown
keys are errors (see :mod:`sidecar.core.fields`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, TypeVar

from sidecar.core.config import (
    DEFAULT_CLASSES,
    SEMANTIC_ROUTER,
    AdmissionConfig,
    Algorithm,
    ClassConfig,
    ClusterConfig,
    Compat,
    Config,
    EnvoyConfig,
    FleetConfig,
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
from sidecar.core.fields import ConfigError, ConfigReader, did_you_mean
from sidecar.core.tls_config import check_tls_pair, parse_listen_tls, parse_sidecar_tls

T = TypeVar("T")

COMPATS: tuple[Compat, ...] = ("tailroute", SEMANTIC_ROUTER)


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


def _algorithm(r: ConfigReader, compat: Compat = "tailroute",
               given: bool = True) -> tuple[Algorithm, LatencyAwareConfig]:
    """Accept semantic-router's fragment: ``{type: latency_aware, latency_aware: {...}}``.

    ``given``: the model (or the top level) has an ``algorithm`` at all.
    """
    kind = r.choice("type", "latency_aware", ("latency_aware", "static"))
    la: LatencyAwareConfig | None
    if compat == SEMANTIC_ROUTER:
        la = _sr_latency_aware(r, kind, given)
    else:
        la = _latency_aware(r.sub("latency_aware")) if "latency_aware" in r.data else None
    r.done()
    if la is None:
        la = LatencyAwareConfig(ttft_percentile=95, tpot_percentile=90)
    return kind, la


def _sr_percentile(r: ConfigReader, key: str) -> int | None:
    """semantic-router's percentile field: absent, null or 0 = unset, else 1..100."""
    v = r.raw(key)
    number = isinstance(v, int | float) and not isinstance(v, bool)
    if v is None or (number and v == 0):
        return None
    if not number or not float(v).is_integer() or not 1 <= v <= 100:
        r.fail(f"must be an integer between 1 and 100 (0 or absent = unset), got {v!r}", key)
    return int(v)


def _sr_latency_aware(r: ConfigReader, kind: Algorithm, given: bool) -> LatencyAwareConfig:
    """The fragment as semantic-router validates it (``compat: semantic-router``)."""
    if "latency_aware" not in r.data:
        if kind == "latency_aware" and given:
            r.fail("type latency_aware requires a latency_aware block (semantic-router "
                   "rejects it too)", "latency_aware")
        return LatencyAwareConfig()  # no percentile: semantic-router takes the first candidate
    s = r.sub("latency_aware")
    cfg = LatencyAwareConfig(
        ttft_percentile=_sr_percentile(s, "ttft_percentile"),
        tpot_percentile=_sr_percentile(s, "tpot_percentile"),
        description=s.str_("description", ""),
    )
    s.done()
    if cfg.ttft_percentile is None and cfg.tpot_percentile is None:
        s.fail("must specify at least one of tpot_percentile (1-100) or ttft_percentile "
               "(1-100), as semantic-router requires")
    return cfg


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
        provider=_provider(r),
    )
    r.done()
    return cfg


_PROVIDER = re.compile(r"^[a-z0-9][a-z0-9._]{0,63}$")


def _provider(r: ConfigReader) -> str:
    """``gen_ai.provider.name``: a well-known value such as ``openai``, ``anthropic``,
    ``aws.bedrock``, ``azure.ai.openai``, ``gcp.vertex_ai``, or a custom one."""
    v = r.str_("provider", "openai")
    if not _PROVIDER.match(v):
        r.fail(f"must be lower-case letters, digits, '.' or '_' (e.g. openai), got {v!r}",
               "provider")
    return v


def _model(r: ConfigReader, clusters: Mapping[str, ClusterConfig],
           compat: Compat = "tailroute", broken: set[str] | None = None) -> ModelConfig:
    name = r.str_("name", required=True)
    compat = r.choice("compat", compat, COMPATS)
    cands = r.list_("candidates", required=True)
    if not cands:
        r.fail("must list at least one cluster", "candidates")
    for c in cands:
        if broken and c in broken:
            continue  # that cluster's own mistake is reported already
        if c not in clusters:
            known = ", ".join(clusters)
            r.fail(f"unknown cluster {c!r}{did_you_mean(str(c), set(clusters))} "
                   f"(known: {known})", "candidates")
        if name not in clusters[c].models:
            r.fail(f"cluster {c!r} does not list model {name!r} in its models", "candidates")
    if len(set(cands)) != len(cands):
        r.fail("lists a cluster twice", "candidates")
    kind, la = _algorithm(r.sub("algorithm"), compat, given="algorithm" in r.data)
    regions = tuple(str(x) for x in r.list_("regions"))
    cfg = ModelConfig(name, tuple(cands), kind, la, regions, compat)
    r.done()
    return cfg


def _class(name: str, r: ConfigReader) -> ClassConfig:
    mark = r.mark()
    s = r.sub("slo")
    slo = SloConfig(
        metric=s.choice("metric", "ttft", ("ttft", "tpot", "e2e")),
        percentile=s.num("percentile", 95, lo=1, hi=100),
        budget_ms=s.num("budget_ms", 1000, lo=1),
        timeout_ms=s.num("timeout_ms", 30000, lo=1),
    )
    s.done()
    if r.clean_since(mark) and slo.timeout_ms < slo.budget_ms:
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
        subwindows=r.num("subwindows", 30, lo=1, hi=720, integer=True),
        min_samples=r.num("min_samples", 20, lo=1, integer=True),
        decay=r.num("decay", 0.85, lo=0.01, hi=1.0),
        stale_after_s=r.num("stale_after_s", 300.0, lo=1),
        max_slices=r.num("max_slices", 512, lo=1, hi=100000, integer=True),
        observe_share=r.num("observe_share", 1.0, lo=0.0, hi=1.0),
        prior_samples=r.num("prior_samples", 10.0, lo=0.0, hi=100000),
    )
    r.done()
    return cfg


def _health(r: ConfigReader) -> HealthConfig:
    mark = r.mark()
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
        confidence=r.num("confidence", d.confidence, lo=0.5, hi=0.999999),
        history_windows=r.num("history_windows", d.history_windows, lo=1, hi=10000,
                              integer=True),
        eject_consecutive=r.num("eject_consecutive", d.eject_consecutive, lo=1, hi=1000,
                                integer=True),
        relapse_factor=r.num("relapse_factor", d.relapse_factor, lo=0.01, hi=1.0),
        forgive_after_s=r.num("forgive_after_s", d.forgive_after_s, lo=1),
    )
    r.done()
    if not r.clean_since(mark):
        return cfg
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
        tls=parse_listen_tls(r.sub("tls")),
    )
    r.done()
    return cfg


def _limits(r: ConfigReader) -> LimitsConfig:
    cfg = LimitsConfig(
        max_body_bytes=r.num("max_body_bytes", 8 * 1024 * 1024, lo=1024, integer=True),
        max_header_value_bytes=r.num("max_header_value_bytes", 256, lo=8, integer=True),
        # Well below Python's recursion limit (1000): walks over the document recurse too.
        max_json_depth=r.num("max_json_depth", 128, lo=8, hi=256, integer=True),
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
        sidecar_health_interval_s=r.num("sidecar_health_interval_s", 5.0, lo=0, hi=3600),
        sidecar_keepalive_s=r.num("sidecar_keepalive_s", 10.0, lo=0, hi=3600),
        sidecar_tls=parse_sidecar_tls(r.sub("sidecar_tls")),
    )
    for gone in ("observe_mode", "overlap_headers"):
        if gone in r.data:
            r.fail("removed: responses are timed from Envoy's access log now "
                   "(see docs/response-timing.md); delete this field", gone)
    if 0 < cfg.sidecar_health_interval_s < 0.1:
        r.fail(f"must be 0 (off) or >= 0.1, got {cfg.sidecar_health_interval_s:g}",
               "sidecar_health_interval_s")
    if 0 < cfg.sidecar_keepalive_s < 1.0:
        r.fail(f"must be 0 (off) or >= 1, got {cfg.sidecar_keepalive_s:g}",
               "sidecar_keepalive_s")
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


_FLEET_SCHEMES = ("redis://", "rediss://", "unix://")


def _fleet(r: ConfigReader, stats: StatsConfig) -> FleetConfig | None:
    """The ``fleet:`` section (absent or null: standalone, the default)."""
    d = FleetConfig()
    window_s = stats.subwindow_s * stats.subwindows
    cfg = FleetConfig(
        backend=r.choice("backend", d.backend, ("redis",)),
        url=r.str_("url", required=True),
        key_prefix=r.str_("key_prefix", d.key_prefix),
        push_interval_s=r.num("push_interval_s", d.push_interval_s, lo=0.05, hi=60),
        stats_ttl_s=r.num("stats_ttl_s", window_s, lo=1, hi=86400),
        lease_ttl_s=r.num("lease_ttl_s", d.lease_ttl_s, lo=0.1, hi=600),
        timeout_ms=r.num("timeout_ms", d.timeout_ms, lo=10, hi=60000),
    )
    r.done()
    if not cfg.url.startswith(_FLEET_SCHEMES):
        r.fail(f"must start with {', '.join(_FLEET_SCHEMES)}; got {cfg.url!r}", "url")
    if not all(c.isalnum() or c in "-_." for c in cfg.key_prefix) or not cfg.key_prefix:
        r.fail(f"letters, digits, '-', '_' and '.' only; got {cfg.key_prefix!r}", "key_prefix")
    if cfg.lease_ttl_s < 2 * cfg.push_interval_s:
        r.fail(f"must be >= 2 x push_interval_s ({2 * cfg.push_interval_s:g}) so an owner "
               f"renews before it expires; got {cfg.lease_ttl_s:g}", "lease_ttl_s")
    if cfg.stats_ttl_s < stats.subwindow_s:
        r.fail(f"must be >= stats.subwindow_s ({stats.subwindow_s:g}); got "
               f"{cfg.stats_ttl_s:g}", "stats_ttl_s")
    return cfg


def _routing(
    r: ConfigReader, classes: tuple[ClassConfig, ...], stats: StatsConfig
) -> RoutingConfig:
    known = [c.name for c in classes]
    per_request = tuple(str(x) for x in r.list_("per_request_classes"))
    for name in per_request:
        if name not in known:
            r.bad(f"unknown class {name!r} (known: {', '.join(known)})",
                  "per_request_classes", None)
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
                    f"{cfg.routing.mode} routing cannot rewrite the request body, but "
                    f"clusters[{i}].models maps {client_name!r} to {upstream!r}; serve the "
                    "model under the name clients send, or use routing.mode extproc",
                    "routing.mode",
                )


def parse_config(data: Any, source: str = "<memory>") -> Config:
    """Validate a mapping (parsed YAML) into a frozen :class:`Config`.

    Reads the whole file even after a mistake, then raises one
    :class:`ConfigError` listing every problem (``problems``), each naming
    ``source``, the field path and the problem.
    """
    root = ConfigReader(data, source, "")
    root.errors = []
    cfg = _parse(root, source)
    problems = tuple(dict.fromkeys(root.errors))  # in order, without repeats
    if problems:
        raise ConfigError("\n".join(problems), problems)
    return cfg


def _parse(root: ConfigReader, source: str) -> Config:
    clusters: dict[str, ClusterConfig] = {}
    broken: set[str] = set()  # clusters with a mistake: models naming them say nothing more
    for i, raw in enumerate(root.list_("clusters", required=True)):
        c: ClusterConfig | None = root.attempt(
            partial(_cluster_item, root, i, raw), None)
        if c is None:
            if isinstance(raw, Mapping) and isinstance(raw.get("name"), str):
                broken.add(raw["name"])
            continue
        if c.name in clusters:
            root.bad(f"duplicate cluster name {c.name!r}", f"clusters[{i}].name", None)
        clusters[c.name] = c
    if not clusters and not broken:
        root.fail("must define at least one cluster", "clusters")

    # semantic-router style: a global algorithm (and routing profile) applies to
    # every model without its own.
    global_compat: Compat = root.choice("compat", "tailroute", COMPATS)
    global_alg = root.sub("algorithm") if "algorithm" in root.data else None
    if global_alg is not None and root.attempt(
            partial(_algorithm, global_alg, global_compat), None) is None:
        global_alg = None  # reported once here, not again for every model
    models: list[ModelConfig] = []
    for i, raw in enumerate(root.list_("models", required=True)):
        if global_alg is not None and isinstance(raw, Mapping) and "algorithm" not in raw:
            raw = {**raw, "algorithm": dict(global_alg.data)}
        m: ModelConfig | None = root.attempt(
            partial(_model_item, root, i, raw, clusters, global_compat, broken), None)
        if m is None:
            continue
        if any(x.name == m.name for x in models):
            root.bad(f"duplicate model {m.name!r}", f"models[{i}].name", None)
        models.append(m)

    classes = root.attempt(lambda: _classes(root, source), DEFAULT_CLASSES)
    default_class = root.str_("default_class", classes[0].name)
    if default_class not in {c.name for c in classes}:
        root.bad(f"unknown class {default_class!r}", "default_class", None)

    default_cluster = root.str_("default_cluster", next(iter(clusters), ""))
    if default_cluster not in clusters and default_cluster not in broken:
        root.bad(f"unknown cluster {default_cluster!r}", "default_cluster", None)

    def section(read: Callable[[ConfigReader], T], key: str, fallback: T) -> T:
        return root.attempt(lambda: read(root.sub(key)), fallback)

    def fleet_section(stats: StatsConfig) -> FleetConfig | None:
        if not root.has("fleet"):
            return root.raw("fleet")  # type: ignore[no-any-return]  # absent or null
        return root.attempt(lambda: _fleet(root.sub("fleet"), stats), None)

    # Read in file order (picker before stats) so problems are reported in that order.
    picker = root.choice("picker", "weighted_random", ("weighted_random", "lowest_score"))
    stats = section(_stats, "stats", StatsConfig())
    cfg = Config(
        clusters=tuple(clusters.values()),
        models=tuple(models),
        classes=classes,
        default_cluster=default_cluster,
        default_class=default_class,
        picker=picker,
        stats=stats,
        health=section(_health, "health", HealthConfig()),
        admission=section(_admission, "admission", AdmissionConfig()),
        listen=section(_listen, "listen", ListenConfig()),
        limits=section(_limits, "limits", LimitsConfig()),
        envoy=section(_envoy, "envoy", EnvoyConfig()),
        timing=section(_timing, "timing", TimingConfig()),
        routing=section(partial(_routing, classes=classes, stats=stats), "routing",
                        RoutingConfig()),
        snapshot_path=root.opt_str("snapshot_path"),
        fleet=fleet_section(stats),
        source=source,
    )
    root.done()
    if root.clean_since(0):
        _check_queue_wait(root, cfg)
        check_tls_pair(root, cfg.listen.tls, cfg.envoy.sidecar_tls)
        _check_native_routing(root, cfg)
    return cfg


def _cluster_item(root: ConfigReader, i: int, raw: Any) -> ClusterConfig:
    return _cluster(root.item("clusters", i, raw))


def _model_item(root: ConfigReader, i: int, raw: Any, clusters: Mapping[str, ClusterConfig],
                compat: Compat, broken: set[str]) -> ModelConfig:
    return _model(root.item("models", i, raw), clusters, compat, broken)


def _classes(root: ConfigReader, source: str) -> tuple[ClassConfig, ...]:
    classes_raw = root.raw("classes")
    if classes_raw is None:
        return DEFAULT_CLASSES
    if not isinstance(classes_raw, Mapping) or not classes_raw:
        root.fail("must be a non-empty mapping of class name -> settings", "classes")
    out: list[ClassConfig] = []
    for k, v in classes_raw.items():
        r = ConfigReader(v, source, f"classes.{k}") if isinstance(v, Mapping | None) else None
        if r is None:
            root.bad(f"expected a mapping, got {type(v).__name__}", f"classes.{k}", None)
            continue
        r.errors = root.errors
        c: ClassConfig | None = root.attempt(partial(_class, str(k), r), None)
        if c is not None:
            out.append(c)
    return tuple(out) or DEFAULT_CLASSES


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
