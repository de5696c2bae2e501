"""Parse the routing targets of a config: ``clusters[]``, ``models[]`` (with their
latency-aware algorithm and semantic-router compatibility) and ``classes``.

Part of :mod:`sidecar.core.config_parse` (which assembles the whole config and
runs the cross-field checks); every error names the file, the field path and the
problem.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import partial
from typing import Any, Final

from sidecar.core.config import (
    DEFAULT_CLASSES,
    QUEUE_WEIGHT,
    SEMANTIC_ROUTER,
    SIDECAR_CLUSTER,
    Algorithm,
    ClassConfig,
    ClusterConfig,
    Compat,
    LatencyAwareConfig,
    ModelConfig,
    SloConfig,
    Weights,
)
from sidecar.core.fields import ConfigReader, did_you_mean, shown
from sidecar.core.hostport import split_hostport
from sidecar.core.tls_config import SYSTEM_CA_FILE
from sidecar.core.types import ANY, NAME_OK, OVERFLOW_CLASS, UNKNOWN_MODEL

COMPATS: Final[tuple[Compat, ...]] = ("tailroute", SEMANTIC_ROUTER)
# The rendered Envoy circuit breakers are 4 x max_concurrency (sidecar.shell.bootstrap),
# UInt32 fields in Envoy: this keeps them (and a sum over a few hundred clusters) in range.
MAX_CONCURRENCY: Final = 1_000_000
# A week: past any LLM request's budget, and far inside what Envoy's Duration holds.
MAX_TIMEOUT_MS: Final = 7 * 24 * 3600 * 1000


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


def parse_algorithm(r: ConfigReader, compat: Compat = "tailroute",
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
    # The range first: NaN fails it, and a huge integer never reaches float().
    if not number or not 1 <= v <= 100 or not float(v).is_integer():
        r.fail(f"must be an integer between 1 and 100 (0 or absent = unset), got {shown(v)}", key)
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


_NAME_RULE: Final = "1-128 letters, digits or . _ : / @ + -"


def _cluster(r: ConfigReader) -> ClusterConfig:
    name = r.str_("name", required=True)
    if name == SIDECAR_CLUSTER:
        r.fail(f"{name!r} is reserved: the rendered Envoy bootstrap's cluster for the "
               "sidecar has that name", "name")
    if not NAME_OK.match(name):
        # Envoy route keys are cluster|class|sampled; labels and headers carry it too.
        r.fail(f"must be {_NAME_RULE}, got {name!r}", "name")
    models_raw = r.raw("models", {})
    models: dict[str, str] = {}
    if isinstance(models_raw, list):
        for m in models_raw:
            if not isinstance(m, str):
                r.fail(f"model names must be strings, got {shown(m)}", "models")
            models[m] = m
    elif isinstance(models_raw, Mapping):
        for k, v in models_raw.items():
            if not isinstance(k, str) or not isinstance(v, str) or not v:
                r.fail("must map model name to upstream model name, got "
                       f"{shown(k)}: {shown(v)}", "models")
            models[k] = v
    else:
        r.fail("must be a list of model names or a mapping name -> upstream name", "models")
    address = r.str_("address", required=True)
    try:
        split_hostport(address)  # Envoy connects there: port 0 is no port
    except ValueError as exc:
        r.fail(str(exc), "address")
    tls, verify, ca_file = _provider_tls(r)
    cfg = ClusterConfig(
        name=name,
        address=address,
        models=models,
        max_concurrency=r.num("max_concurrency", 64, lo=1, hi=MAX_CONCURRENCY, integer=True),
        cost_per_1k_tokens=r.num("cost_per_1k_tokens", 1.0, lo=0),
        quality=r.num("quality", 1.0, lo=0),
        region=r.str_("region", ""),
        provider=_provider(r),
        tls=tls, tls_verify=verify, tls_ca_file=ca_file,
    )
    r.done()
    return cfg


def _provider_tls(r: ConfigReader) -> tuple[bool, bool, str]:
    """``tls``, ``tls_verify`` and ``tls_ca_file``: the two refine ``tls: true`` only, and
    a CA file with verification off would be a setting that does nothing, so both refuse."""
    tls = r.bool_("tls", False)
    verify = r.bool_("tls_verify", True)
    ca = r.str_("tls_ca_file", SYSTEM_CA_FILE)
    if not ca:
        ca = r.bad("must be a non-empty path to a PEM CA bundle", "tls_ca_file", SYSTEM_CA_FILE)
    for key in ("tls_verify", "tls_ca_file"):
        if r.has(key) and not tls:
            r.bad("applies only with tls: true (the upstream speaks plaintext)", key, None)
    if r.has("tls_ca_file") and not verify:
        r.bad("unused with tls_verify: false (nothing is verified): remove one",
              "tls_ca_file", None)
    return tls, verify, ca


_PROVIDER: Final = re.compile(r"^[a-z0-9][a-z0-9._]{0,63}$")


def _provider(r: ConfigReader) -> str:
    """``gen_ai.provider.name``: a well-known value such as ``openai``, ``anthropic``,
    ``aws.bedrock``, ``azure.ai.openai``, ``gcp.vertex_ai``, or a custom one."""
    v = r.str_("provider", "openai")
    if not _PROVIDER.match(v):
        r.fail(f"must be lower-case letters, digits, '.' or '_' (e.g. openai), got {shown(v)}",
               "provider")
    return v


def _model(r: ConfigReader, clusters: Mapping[str, ClusterConfig],
           compat: Compat = "tailroute", broken: set[str] | None = None) -> ModelConfig:
    name = r.str_("name", required=True)
    if name in (ANY, UNKNOWN_MODEL, OVERFLOW_CLASS):
        r.fail(f"{name!r} is reserved: the sidecar's own slices use it", "name")
    if "|" in name or not name.isprintable():
        # Clients send any model name, so only what breaks a slice label ('|' joins its
        # parts) or a log line is refused.
        r.fail(f"must not contain '|' or control characters, got {name!r}", "name")
    compat = r.choice("compat", compat, COMPATS)
    cands = r.strings("candidates", required=True, strict=True)
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
    kind, la = parse_algorithm(r.sub("algorithm"), compat, given="algorithm" in r.data)
    regions = tuple(r.strings("regions"))
    if all(c in clusters for c in cands):  # else the candidates' own problem is reported
        _check_regions(r, regions, [clusters[c] for c in cands], clusters)
    cfg = ModelConfig(name, tuple(cands), kind, la, regions, compat)
    r.done()
    return cfg


def _check_regions(r: ConfigReader, regions: tuple[str, ...],
                   candidates: list[ClusterConfig],
                   clusters: Mapping[str, ClusterConfig]) -> None:
    """Every entry of ``models[].regions`` must be the ``region`` of one of the model's
    candidates. The region filter only ever looks at the candidates, so an entry no
    candidate carries (a typo, a cluster name, a region served by other clusters) is
    dead, and a list none of them matches leaves the model no route at all: every
    request would go to ``default_cluster`` undecided."""
    if not regions or not candidates:
        return
    have = {c.region for c in candidates}
    where = ", ".join(f"{c.name} ({c.region or 'no region'})" for c in candidates)
    raw = r.raw("regions")
    for region in regions:
        if region in have:
            continue
        if region in clusters:
            hint = " (that is a cluster name; regions lists clusters[].region labels)"
        elif any(c.region == region for c in clusters.values()):
            hint = " (only clusters that are not candidates of this model are there)"
        else:
            hint = f" (no cluster has region {region!r})"
        r.bad(f"no candidate of this model is in region {region!r}{hint}; "
              f"candidates' regions: {where}", f"regions[{raw.index(region)}]", None)


def _class(name: str, r: ConfigReader) -> ClassConfig:
    mark = r.mark()
    s = r.sub("slo")
    slo = SloConfig(
        metric=s.choice("metric", "ttft", ("ttft", "tpot", "e2e")),
        percentile=s.num("percentile", 95, lo=1, hi=100),
        budget_ms=s.num("budget_ms", 1000, lo=1, hi=MAX_TIMEOUT_MS),
        timeout_ms=s.num("timeout_ms", 30000, lo=1, hi=MAX_TIMEOUT_MS),
        max_stream_ms=s.num("max_stream_ms", 1, lo=1, hi=MAX_TIMEOUT_MS)
        if s.has("max_stream_ms") else s.raw("max_stream_ms"),  # absent or null: None
    )
    s.done()
    if r.clean_since(mark) and slo.timeout_ms < slo.budget_ms:
        s.fail(f"must be >= budget_ms ({slo.budget_ms:g}), got {slo.timeout_ms:g}", "timeout_ms")
    w = r.sub("weights")
    weights = Weights(
        latency=w.num("latency", 1.0, lo=0),
        cost=w.num("cost", 0.0, lo=0),
        quality=w.num("quality", 0.0, lo=0),
        capacity=w.num("capacity", 0.5, lo=0),
        queue=w.num("queue", QUEUE_WEIGHT, lo=0, hi=12.0),
    )
    w.done()
    cfg = ClassConfig(
        name=name,
        slo=slo,
        priority=r.num("priority", 5, lo=0, hi=1000, integer=True),
        weights=weights,
        latency_sensitive=r.bool_("latency_sensitive", True),
        latency_exponent=r.num("latency_exponent", 2.0, lo=2.0, hi=12.0),
        attainment_sharpen=r.num("attainment_sharpen", 3.0, lo=0.0, hi=20.0),
        miss_ratio_exponent=r.num("miss_ratio_exponent", 1.0, lo=0.0, hi=4.0),
        pool_worse=r.bool_("pool_worse", True),
    )
    r.done()
    return cfg


def cluster_item(root: ConfigReader, i: int, raw: Any) -> ClusterConfig:
    return _cluster(root.item("clusters", i, raw))


def model_item(root: ConfigReader, i: int, raw: Any, clusters: Mapping[str, ClusterConfig],
                compat: Compat, broken: set[str]) -> ModelConfig:
    return _model(root.item("models", i, raw), clusters, compat, broken)


def parse_classes(root: ConfigReader, source: str,
                  broken: set[str] | None = None) -> tuple[ClassConfig, ...]:
    """The ``classes`` mapping; the names of classes left out for a mistake go to
    ``broken``, so a reference to one is not reported a second time as unknown."""
    classes_raw = root.raw("classes")
    if classes_raw is None:
        return DEFAULT_CLASSES
    if not isinstance(classes_raw, Mapping) or not classes_raw:
        root.fail("must be a non-empty mapping of class name -> settings", "classes")
    out: list[ClassConfig] = []
    seen: dict[str, object] = {}  # class name -> its key as YAML read it
    for k, v in classes_raw.items():
        r = ConfigReader(v, source, f"classes.{k}") if isinstance(v, Mapping | None) else None
        name = str(k)  # a bare 7 is the class "7" (the header's value); on and 1.5 are not
        first = seen.setdefault(name, k)
        if isinstance(k, bool) or not isinstance(k, str | int):
            root.bad(f"class name must be a string, but YAML read {shown(k)} as "
                     f"{type(k).__name__}: quote it as written (unquoted, YAML reads on, off, "
                     "yes, no, true and false as booleans, 1.5 as a number)",
                     f"classes.{k}", None)
        elif name in (ANY, OVERFLOW_CLASS):
            root.bad(f"class name {shown(name)} is reserved: the sidecar's own slices use it",
                     f"classes.{k}", None)
        elif not NAME_OK.match(name):
            root.bad(f"class name must be {_NAME_RULE} (what the x-tailroute-class header "
                     f"accepts; '|' separates slice labels), got {shown(name)}",
                     f"classes.{k}", None)
        elif first is not k:  # 7 and '7': two YAML keys, one header value
            root.bad(f"class {name!r} is defined twice (as {shown(first)} and {shown(k)}: "
                     "one class name)", f"classes.{k}", None)
            continue
        elif r is None:
            root.bad(f"expected a mapping, got {type(v).__name__}", f"classes.{k}", None)
        else:
            r.errors = root.errors
            c: ClassConfig | None = root.attempt(partial(_class, name, r), None)
            if c is not None:
                out.append(c)
                continue
        if broken is not None:
            broken.add(str(k))
    return tuple(out) or DEFAULT_CLASSES
