"""Parse and validate a plain mapping (from YAML) into a :class:`~sidecar.core.config.Config`.

Pure, so the simulator and tests build configs the same way the server does.
Every error names the source file, the field path and the problem, e.g.
``tailroute.yaml: clusters[1].max_concurrency: must be >= 1, got 0``; unknown
keys are errors (see :mod:`sidecar.core.fields`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Final, TypeVar

from sidecar.core.config import (
    DEFAULT_CLASSES,
    AdmissionConfig,
    ClassConfig,
    ClusterConfig,
    Compat,
    Config,
    EnvoyConfig,
    FleetConfig,
    HealthConfig,
    LimitsConfig,
    ListenConfig,
    ModelConfig,
    RoutingConfig,
    StatsConfig,
    TimingConfig,
)
from sidecar.core.config_listen import check_listen_ports
from sidecar.core.config_routes import (
    COMPATS,
    cluster_item,
    model_item,
    parse_algorithm,
    parse_classes,
)
from sidecar.core.fields import ConfigError, ConfigReader
from sidecar.core.hints import HintsConfig, parse_hints
from sidecar.core.store_url import redacted, url_problem
from sidecar.core.tls_config import check_tls_pair, parse_listen_tls, parse_sidecar_tls
from sidecar.core.workers_config import WorkersConfig, parse_workers

T = TypeVar("T")

def _stats(r: ConfigReader) -> StatsConfig:
    cfg = StatsConfig(
        subwindow_s=r.num("subwindow_s", 10.0, lo=0.05, hi=3600),
        subwindows=r.num("subwindows", 30, lo=1, hi=720, integer=True),
        min_samples=r.num("min_samples", 20, lo=1, integer=True),
        decay=r.num("decay", 0.85, lo=0.01, hi=1.0),
        min_aging=r.num("min_aging", 0.5, lo=0.0, hi=1.0),
        enough_samples=r.num("enough_samples", 400.0, lo=0.0),
        stale_after_s=r.num("stale_after_s", 300.0, lo=1),
        max_slices=r.num("max_slices", 512, lo=1, hi=100000, integer=True),
        observe_share=r.num("observe_share", 1.0, lo=0.0, hi=1.0),
        prior_samples=r.num("prior_samples", 10.0, lo=0.0, hi=100000),
        shift_alpha=r.num("shift_alpha", 0.05, lo=0.0, hi=0.5),
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
        explore_share=r.num("explore_share", d.explore_share, lo=0.001, hi=1.0),
        probe_successes=r.num("probe_successes", d.probe_successes, lo=1, integer=True),
        restricted_probe_successes=r.num("restricted_probe_successes",
                                         d.restricted_probe_successes, lo=1, integer=True),
        restore_step=r.num("restore_step", d.restore_step, lo=0.01, hi=1.0),
        confidence=r.num("confidence", d.confidence, lo=0.5, hi=0.999999),
        history_windows=r.num("history_windows", d.history_windows, lo=1, hi=10000,
                              integer=True),
        eject_consecutive=r.num("eject_consecutive", d.eject_consecutive, lo=1, hi=1000,
                                integer=True),
        relapse_factor=r.num("relapse_factor", d.relapse_factor, lo=0.01, hi=1.0),
        forgive_after_s=r.num("forgive_after_s", d.forgive_after_s, lo=1),
        live_horizon_s=r.num("live_horizon_s", d.live_horizon_s, lo=0, hi=3600),
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
        # Part of the sidecar cluster's rendered breaker, 4 x (capacity + queue_max).
        queue_max=r.num("queue_max", 64, lo=0, hi=1_000_000, integer=True),
        queue_wait_ms=r.num("queue_wait_ms", 250.0, lo=0),
        defer_retry_after_s=r.num("defer_retry_after_s", 2, lo=1, integer=True),
        shed_below_priority=r.num("shed_below_priority", 5, lo=0, integer=True),
        yield_after_s=r.num("yield_after_s", 5.0, lo=0, hi=3600),
        yield_hold_s=r.num("yield_hold_s", 10.0, lo=0, hi=3600),
        yield_reserve=r.num("yield_reserve", 0.1, lo=0, hi=1),
        retry_budget_ratio=r.num("retry_budget_ratio", 0.2, lo=0, hi=10),
        beyond_capacity=r.choice("beyond_capacity", "shed", ("shed", "best_effort")),
    )
    r.done()
    return cfg


def _listen(r: ConfigReader) -> ListenConfig:
    cfg = ListenConfig(
        grpc=r.address("grpc", "127.0.0.1:50051", off=True),
        grpc_unix=r.opt_str("grpc_unix"),
        admin=r.address("admin", "127.0.0.1:9911"),
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
        max_json_containers=r.num("max_json_containers", 100_000, lo=1_000, hi=10_000_000,
                                  integer=True),
        decision_timeout_ms=r.num("decision_timeout_ms", 500, lo=10, hi=60000, integer=True),
    )
    r.done()
    return cfg


UINT32_MAX: Final = 4_294_967_295


def _envoy(r: ConfigReader) -> EnvoyConfig:
    cfg = EnvoyConfig(
        listen=r.address("listen", "127.0.0.1:10000"),
        admin=r.address("admin", "127.0.0.1:9901"),
        # Rendered into Envoy's uint32 buffer limits (max_request_bytes and the route's and
        # listener's buffer limits): a larger value renders a bootstrap Envoy cannot load.
        route_buffer_bytes=r.num("route_buffer_bytes", 16 * 1024 * 1024, lo=1024,
                                 hi=UINT32_MAX, integer=True),
        sidecar_max_requests=None if r.raw("sidecar_max_requests") is None else r.num(
            "sidecar_max_requests", 1024, lo=16, hi=1_000_000, integer=True),
        access_log_flush_ms=r.num("access_log_flush_ms", 100, lo=10, hi=10_000, integer=True),
        usage_sample=None if r.raw("usage_sample") is None else r.num(
            "usage_sample", 1.0, lo=0.0625, hi=1.0),
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
        ask_usage=r.bool_("ask_usage", False), done_mark=r.bool_("done_mark", True),
    )
    r.done()
    return cfg


_FLEET_SCHEMES: Final = ("redis://", "rediss://", "unix://")


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
        r.fail(f"must start with {', '.join(_FLEET_SCHEMES)}; got {redacted(cfg.url)!r}",
               "url")
    elif (problem := url_problem(cfg.url)) is not None:
        r.fail(f"cannot be read as a Redis URL: it {problem}", "url")
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
    r: ConfigReader, classes: tuple[ClassConfig, ...], stats: StatsConfig,
    broken: set[str] | None = None,
) -> RoutingConfig:
    known = [c.name for c in classes]
    per_request = tuple(r.strings("per_request_classes"))
    for name in per_request:
        if name not in known and name not in (broken or ()):
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
    # A missing or non-list clusters/models is reported and the rest of the file still
    # read (an empty file: both are missing, and an unknown key beside them is a typo).
    clusters_raw = root.attempt(lambda: root.list_("clusters", required=True), None)
    for i, raw in enumerate(clusters_raw or ()):
        c: ClusterConfig | None = root.attempt(
            partial(cluster_item, root, i, raw), None)
        if c is None:
            if isinstance(raw, Mapping) and isinstance(raw.get("name"), str):
                broken.add(raw["name"])
            continue
        if c.name in clusters:
            root.bad(f"duplicate cluster name {c.name!r}", f"clusters[{i}].name", None)
        clusters[c.name] = c
    if clusters_raw is not None and not clusters and not broken:
        root.fail("must define at least one cluster", "clusters")

    # semantic-router style: a global algorithm (and routing profile) applies to
    # every model without its own.
    global_compat: Compat = root.choice("compat", "tailroute", COMPATS)
    global_alg = root.sub("algorithm") if "algorithm" in root.data else None
    if global_alg is not None and root.attempt(
            partial(parse_algorithm, global_alg, global_compat), None) is None:
        global_alg = None  # reported once here, not again for every model
    models: list[ModelConfig] = []
    models_raw = root.attempt(lambda: root.list_("models", required=True), None)
    if models_raw == []:
        # Every request would go to default_cluster undecided: a config that routes nothing.
        root.bad("must define at least one model (with none, tailroute routes nothing: "
                 "every request goes to default_cluster)", "models", None)
    # Without clusters every candidate would be "unknown": that says nothing more.
    for i, raw in enumerate(models_raw if clusters_raw is not None and models_raw else ()):
        if global_alg is not None and isinstance(raw, Mapping) and "algorithm" not in raw:
            raw = {**raw, "algorithm": dict(global_alg.data)}
        m: ModelConfig | None = root.attempt(
            partial(model_item, root, i, raw, clusters, global_compat, broken), None)
        if m is None:
            continue
        if any(x.name == m.name for x in models):
            root.bad(f"duplicate model {m.name!r}", f"models[{i}].name", None)
        models.append(m)

    broken_classes: set[str] = set()  # reported already: references say nothing more
    classes = root.attempt(lambda: parse_classes(root, source, broken_classes),
                           DEFAULT_CLASSES)
    default_class = root.str_("default_class", classes[0].name)
    if default_class not in {c.name for c in classes} and default_class not in broken_classes:
        root.bad(f"unknown class {default_class!r}", "default_class", None)

    default_cluster = root.str_("default_cluster", next(iter(clusters), ""))
    if (clusters_raw is not None and default_cluster not in clusters
            and default_cluster not in broken):
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
        routing=section(partial(_routing, classes=classes, stats=stats,
                                broken=broken_classes), "routing", RoutingConfig()),
        snapshot_path=root.opt_str("snapshot_path"),
        fleet=fleet_section(stats),
        workers=section(parse_workers, "workers", WorkersConfig()),
        hints=section(parse_hints, "hints", HintsConfig()),
        source=source,
    )
    root.done()
    if root.clean_since(0):
        _check_queue_wait(root, cfg)
        check_tls_pair(root, cfg.listen.tls, cfg.envoy.sidecar_tls)
        check_listen_ports(root, cfg)
        _check_native_routing(root, cfg)
    return cfg


QUEUE_MARGIN_MS: Final = 50  # decision time and gRPC overhead on top of the longest queue wait


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
