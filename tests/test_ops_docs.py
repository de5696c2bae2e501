"""The README's configuration reference and metrics list stay complete: every config
field and every exported metric is documented (a new one without a line fails here)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from sidecar.core import config as c
from sidecar.core.hints import HINT_HEADERS, HintsConfig
from sidecar.core.tls_config import ListenTlsConfig, SidecarTlsConfig
from sidecar.core.workers_config import WorkersConfig
from sidecar.ops.metrics import METRIC_NAMES
from sidecar.ops.native_metrics import METRIC_NAMES as NATIVE_METRIC_NAMES

DOC = Path(__file__).resolve().parent.parent / "README.md"
# Reference section heading -> the dataclasses whose fields it documents.
SECTIONS: dict[str, tuple[type, ...]] = {
    "Top level": (c.Config,),
    "`clusters[]`": (c.ClusterConfig,),
    "`models[]`": (c.ModelConfig, c.LatencyAwareConfig),
    "`classes.<name>`": (c.ClassConfig, c.SloConfig, c.Weights),
    "`stats`": (c.StatsConfig,),
    "`health`": (c.HealthConfig,),
    "`admission`": (c.AdmissionConfig,),
    "`listen`": (c.ListenConfig, ListenTlsConfig),
    "`limits`": (c.LimitsConfig,),
    "`envoy` (used by `tailroute envoy-config`)": (c.EnvoyConfig, SidecarTlsConfig),
    "`timing`": (c.TimingConfig,),
    "`fleet`": (c.FleetConfig,),
    "`routing`": (c.RoutingConfig,),
    "`workers` (`serve --workers N`)": (WorkersConfig,),
}
_INTERNAL = {"source"}  # set by the loader, not a YAML field


def _skip(cls: type, f: dataclasses.Field[object]) -> bool:
    if f.name.startswith("_") or f.name in _INTERNAL:
        return True
    if cls is c.Config and dataclasses.is_dataclass(f.default):
        return True  # a section (stats, health, ...): it has its own heading
    return cls is c.ClassConfig and f.name == "name"  # the mapping key, not a field


def _blocks() -> dict[str, str]:
    parts = re.split(r"^### (.+)$", DOC.read_text(), flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


@pytest.mark.parametrize("heading", sorted(SECTIONS))
def test_every_config_field_is_in_the_reference(heading: str) -> None:
    block = _blocks().get(heading)
    assert block is not None, f"README.md lacks the '### {heading}' section"
    documented = re.findall(r"^\| `([^`]+)` \|", block, flags=re.M)
    for cls in SECTIONS[heading]:
        for f in dataclasses.fields(cls):
            if _skip(cls, f):
                continue
            assert any(re.search(rf"(^|\.){f.name}($|\.)", d) for d in documented), (
                f"config field {cls.__name__}.{f.name} missing from README.md "
                f"section '{heading}'")


def test_every_hint_is_in_the_hints_section() -> None:
    """The ``hints`` section's keys are not dataclass fields (sidecar.core.hints)."""
    block = _blocks()["`hints`"]
    documented = dict(re.findall(r"^\| `([^`]+)` \| `([^`]+)` \|", block, flags=re.M))
    assert documented == dict.fromkeys(HINT_HEADERS, "client")
    assert all(f"`{h}" in block for h in HINT_HEADERS.values())


def test_every_metric_is_documented() -> None:
    text = DOC.read_text()
    missing = [m for m in (*METRIC_NAMES, *NATIVE_METRIC_NAMES) if f"`{m}`" not in text]
    assert not missing, f"metrics missing from README.md: {missing}"


# Labels whose values come from the config or the traffic (clusters, slices, classes,
# models, addresses) or are bucket bounds: no closed set the README could list.
_OPEN_LABELS = {"cluster", "slice", "class", "le", "window_quantile", "error_type",
                "gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model",
                "gen_ai_token_type", "server_address", "server_port"}


def _metric_row(name: str) -> str:
    """The README's metrics-table row of ``name`` (a counter by its ``_total`` name)."""
    text = DOC.read_text()
    for candidate in (name, f"{name}_total"):
        m = re.search(rf"^\| `{candidate}` \|.*$", text, flags=re.M)
        if m:
            return m.group(0)
    raise AssertionError(f"README.md has no metrics row for {name}")


def test_every_exported_label_value_is_in_its_metric_row() -> None:
    """A label value the sidecar exports (the access-log kinds are exported at 0 from
    the start) is one an operator may alert on: its metric's row must name it.
    ``kind="elsewhere"`` and ``acked="true"``/``"false"`` were exported but not named."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from sidecar.ops.metrics import build_registry
    from sidecar.ops.native_metrics import NativeCollector
    from sidecar.shell.app import App
    from sidecar.shell.native import NativeRouting
    from tests.conftest import base_config_dict

    # Native mode: its collector too (the same App serves both paths in hybrid mode).
    clusters = [dict(k, models=["m"]) for k in base_config_dict()["clusters"]]
    app = App.create(c.parse_config(base_config_dict(clusters=clusters,
                                                     routing={"mode": "native"}), "t.yaml"),
                     seed=1)
    registry = build_registry(lambda: app.router, lambda: 1.0, app.shell_counters).registry
    native = NativeRouting(lambda: app.config, lambda: app.router)
    native.publish(0.0, force=True)
    registry.register(NativeCollector(native))
    missing = sorted({
        (f.name, k, v)
        for f in text_string_to_metric_families(generate_latest(registry).decode())
        for s in f.samples for k, v in s.labels.items()
        if k not in _OPEN_LABELS and f"`{v}`" not in _metric_row(f.name)})
    assert not missing, f"label values missing from README.md's metrics table: {missing}"


_SIDECAR = DOC.parent / "sidecar"
# How the shell names what it counts in tailroute_errors_total: app.errors["kind"],
# a shell counter "error:kind", a body refusal's reason (counted under its name).
_ERROR_KIND = re.compile(
    r"""errors\[\s*"([a-z_]+)"\s*\]|"error:([a-z_]+)"|BodyRefusal\(\s*"([a-z_]+)\"""")


def test_every_error_kind_counted_is_in_the_errors_row() -> None:
    """Each ``tailroute_errors_total`` kind the code counts is named in the README's row
    (``close_exception``, ``forward_dropped``, ``body_too_complex`` and
    ``explain_limited`` were not, and it named an "abandoned requests" kind no code
    counts)."""
    kinds = {k for path in (_SIDECAR / "shell", _SIDECAR / "ops", _SIDECAR / "core")
             for f in path.glob("*.py")
             for m in _ERROR_KIND.finditer(f.read_text()) for k in m.groups() if k}
    kinds |= {k for m in _ERROR_KIND.finditer((_SIDECAR / "serve.py").read_text())
              for k in m.groups() if k}
    assert {"handler_exception", "snapshot_write", "tls_reload_invalid",
            "body_too_complex"} <= kinds  # the scan finds each way of counting
    row = _metric_row("tailroute_errors_total")
    missing = sorted(k for k in kinds if f"`{k}`" not in row)
    assert not missing, f"error kinds missing from README.md's tailroute_errors_total: {missing}"
    assert "`unexpected_<message>_in_<phase>`" in row  # the one kind built from parts


_MIB = re.compile(r"(\d+) MiB")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _literal(cell: str) -> object:
    """The value a default cell states, or ``_INTERPRETED`` when it states a rule in
    words; a trailing remark in parentheses is not part of the value."""
    value = re.sub(r" \(.*\)$", "", cell.strip())
    if value == "required" or value.startswith("required with"):
        return _REQUIRED
    if re.fullmatch(r"(none|null)(;.*)?", value):
        return None
    if value in ("true", "false"):
        return value == "true"
    if (m := _MIB.fullmatch(value)) is not None:
        return int(m.group(1)) * 1024 * 1024
    if _NUMBER.fullmatch(value):
        return float(value.replace(",", ""))
    if (m := re.fullmatch(r"`([^`]*)`", value)) is not None:
        return {'""': "", "[]": (), "{}": {}}.get(m.group(1), m.group(1))
    return _INTERPRETED


_REQUIRED, _INTERPRETED = object(), object()
_MINIMAL: dict[str, object] = {
    "clusters": [{"name": "a", "address": "127.0.0.1:9001", "models": ["m"]},
                 {"name": "b", "address": "127.0.0.1:9002"}],  # b: every optional field out
    "models": [{"name": "m", "candidates": ["a"]}],
}
# Optional sub-sections given with their required fields only, so the rest default.
_OPTIONAL = {"fleet": {"url": "redis://127.0.0.1:6379/0"},
             "listen": {"tls": {"cert_file": "c", "key_file": "k"}},
             "envoy": {"sidecar_tls": {"ca_file": "ca"}}}
# Section heading -> where its fields live in the parsed config.
_SECTION_OF: dict[str, Any] = {
    "Top level": lambda cfg: cfg, "`clusters[]`": lambda cfg: cfg.clusters[1],
    "`models[]`": lambda cfg: cfg.models[0],
    "`classes.<name>`": lambda cfg: c.parse_config(  # a class given without settings
        {**_MINIMAL, "classes": {"x": {}}}, "t.yaml").classes[0],
    "`stats`": lambda cfg: cfg.stats, "`health`": lambda cfg: cfg.health,
    "`admission`": lambda cfg: cfg.admission, "`listen`": lambda cfg: cfg.listen,
    "`limits`": lambda cfg: cfg.limits,
    "`envoy` (used by `tailroute envoy-config`)": lambda cfg: cfg.envoy,
    "`timing`": lambda cfg: cfg.timing, "`fleet`": lambda cfg: cfg.fleet,
    "`routing`": lambda cfg: cfg.routing,
    "`workers` (`serve --workers N`)": lambda cfg: cfg.workers,
}
# Defaults the README states as a rule in words: what that rule gives for _MINIMAL.
_RULES: dict[tuple[str, str], Any] = {
    ("Top level", "classes"): lambda cfg: [k.name for k in c.DEFAULT_CLASSES],
    ("Top level", "default_cluster"): lambda cfg: cfg.clusters[0].name,
    ("Top level", "default_class"): lambda cfg: cfg.classes[0].name,
    ("Top level", "workers"): lambda cfg: WorkersConfig(),
    ("Top level", "hints"): lambda cfg: HintsConfig(),
    ("`models[]`", "compat"): lambda cfg: "tailroute",  # the top-level compat's default
    ("`envoy` (used by `tailroute envoy-config`)", "sidecar_max_requests"):
        lambda cfg: None,  # derived when the bootstrap is rendered
    ("`envoy` (used by `tailroute envoy-config`)", "usage_sample"):
        lambda cfg: None,  # by routing mode when the bootstrap is rendered
    ("`envoy` (used by `tailroute envoy-config`)", "sidecar_tls.key_file"):
        lambda cfg: None,
    ("`fleet`", "stats_ttl_s"): lambda cfg: cfg.stats.subwindow_s * cfg.stats.subwindows,
}
# Fields the README documents that the parsed config does not keep under that name.
_NOT_KEPT = {("Top level", "algorithm"),  # copied into every model without its own
             ("Top level", "compat")}  # likewise


def _field(obj: Any, path: str) -> Any:
    for part in path.replace("algorithm.type", "algorithm").replace(
            "algorithm.latency_aware", "latency_aware").split("."):
        if obj is None:
            return None  # an optional sub-section left out: its fields are absent too
        obj = getattr(obj, part)
    return obj


_TABLE_ROW = re.compile(r"^\| `([^`]+)` \| ([^|]*) \|", flags=re.M)
_ADMISSION_DOC = DOC.parent / "docs" / "admission.md"


def _default_rows() -> list[tuple[str, str, str]]:
    rows = [(heading, f, cell) for heading in _SECTION_OF
            for f, cell in _TABLE_ROW.findall(_blocks()[heading].split("\n## ")[0])]
    # docs/admission.md repeats the admission section's table.
    section = _ADMISSION_DOC.read_text().split("\n## Configuration\n")[1].split("\n## ")[0]
    return rows + [("`admission`", f, cell) for f, cell in _TABLE_ROW.findall(section)]


@pytest.mark.parametrize(("heading", "name", "cell"), _default_rows())
def test_the_reference_states_the_code_defaults(heading: str, name: str, cell: str) -> None:
    """Every default in the README's configuration reference is what a config that
    leaves the field out gets (with optional sections present for their own fields)."""
    if (heading, name) in _NOT_KEPT:
        return
    bare = c.parse_config(_MINIMAL, "t.yaml")
    full = c.parse_config({**_MINIMAL, **_OPTIONAL}, "t.yaml")
    stated = _literal(cell)
    if stated is _REQUIRED:
        return
    # "none" of an optional sub-section's field means the section is absent.
    actual = _field(_SECTION_OF[heading](bare if stated is None else full), name)
    if stated is _INTERPRETED:
        rule = _RULES.get((heading, name))
        assert rule is not None, (
            f"README.md '{heading}' {name}: default {cell!r} is a rule in words; add "
            "what it gives to _RULES")
        stated = rule(full)
        if isinstance(stated, list):
            actual = [k.name for k in actual]
    assert actual == stated, f"README.md '{heading}' {name}: states {cell!r}, code has {actual!r}"


@pytest.mark.parametrize("klass", c.DEFAULT_CLASSES, ids=lambda k: k.name)
def test_the_default_classes_are_stated_as_the_code_has_them(klass: c.ClassConfig) -> None:
    """The sentence on the classes used when ``classes`` is absent names each one's SLO,
    timeout, priority and every weight that differs from the class defaults (it left
    out agentic's cost 0.1 and quality 0.2)."""
    text = re.sub(r"\s+", " ", _blocks()["`classes.<name>`"])
    m = re.search(rf"`{klass.name}` \(([^)]*)\)", text)
    assert m is not None, f"README.md does not describe the default class {klass.name}"
    said, slo = m.group(1), klass.slo

    def says(pattern: str) -> bool:
        return re.search(pattern, said) is not None

    def num(x: float) -> str:
        return rf"{x:g}(\.0)?\b"

    assert says(rf"(?i){slo.metric} p{num(slo.percentile)}"), said
    assert says(rf"≤ ({num(slo.budget_ms)} ms|{num(slo.budget_ms / 1000)} s)"), said
    assert says(rf"timeout {num(slo.timeout_ms / 1000)} s"), said
    assert says(rf"priority {klass.priority}\b"), said
    assert ("not latency sensitive" in said) != klass.latency_sensitive, said
    for f in dataclasses.fields(c.Weights):
        value = getattr(klass.weights, f.name)
        if value != f.default:
            assert says(rf"{f.name} {num(value)}"), f"{klass.name}: weights.{f.name} {value}"


_OPERATIONS = DOC.parent / "docs" / "operations.md"


def _yaml_block_after(path: Path, marker: str) -> Any:
    """The first fenced YAML block after ``marker`` in ``path``, parsed."""
    import textwrap

    import yaml

    text = path.read_text()
    start = text.index(marker)
    body = text[text.index("```yaml\n", start) + 8:]
    return yaml.safe_load(textwrap.dedent(body[:body.index("```")]))


def _rendered_hcm() -> Any:
    import yaml

    boot = yaml.safe_load((DOC.parent / "envoy" / "envoy.yaml").read_text())
    return boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"]


@pytest.mark.parametrize(("path", "marker"), [
    (DOC, "The parts your Envoy needs, in\nthis order"),
    (_OPERATIONS, "HTTP filters before `envoy.filters.http.router`**, in this order"),
])
def test_the_filters_an_operator_copies_are_the_rendered_ones(path: Path, marker: str) -> None:
    """The filter lists shown for adding tailroute to an existing Envoy name the
    rendered bootstrap's filters, in its order (docs/operations.md's left out
    ``tailroute.strip_client_hints``: copied as shown, every provider would see the
    callers' class, priority and tenant claims)."""
    shown = [f["name"] for f in _yaml_block_after(path, marker)]
    rendered = [f["name"] for f in _rendered_hcm()["http_filters"]]
    assert shown == [n for n in rendered if n != "envoy.filters.http.router"]


def test_the_routes_an_operator_copies_are_the_rendered_ones() -> None:
    """docs/operations.md's example routes match and route as the rendered ones of the
    same name (its stream route was shown with the unary route's 30 s timeout)."""
    shown = _yaml_block_after(_OPERATIONS, "3. **Routes**")["routes"]
    rendered = {r["name"]: r for r in _rendered_hcm()["route_config"]["virtual_hosts"][0][
        "routes"]}
    for route in shown:
        want = rendered[route["name"]]
        assert (route["match"], route["route"]) == (want["match"], want["route"]), route["name"]
        assert route.get("typed_per_filter_config") == want.get("typed_per_filter_config")
    # Both kinds of decided route and the default route are shown.
    assert {"unary" in r["name"] for r in shown} == {True, False}
    assert shown[-1]["name"] == "tailroute_default"


def test_the_sidecar_cluster_an_operator_copies_is_the_rendered_one() -> None:
    """docs/operations.md's sidecar cluster is envoy/envoy.yaml's (it was shown without
    the HTTP/2 keepalive and the health check, which a copy then lacked)."""
    import yaml

    shown = _yaml_block_after(_OPERATIONS, "1. **A cluster for the sidecar**")[0]
    boot = yaml.safe_load((DOC.parent / "envoy" / "envoy.yaml").read_text())
    rendered = next(k for k in boot["static_resources"]["clusters"]
                    if k["name"] == "tailroute_sidecar")
    assert shown == rendered


def test_the_tls_row_says_what_the_rendered_cluster_does() -> None:
    """`clusters[].tls` renders an upstream TLS context (the README said it rendered none,
    docs/operations.md that it did); whether Envoy verifies the provider's certificate
    is what an operator of a provider reached over the internet must know (it does,
    against `tls_ca_file`, unless `tls_verify: false`)."""
    from sidecar.shell.bootstrap_native import render_for_mode

    data = {**_MINIMAL, "clusters": [{"name": "a", "address": "api.provider.invalid:443",
                                      "models": ["m"], "tls": True}]}
    boot = render_for_mode(c.parse_config(data, "t.yaml"), grpc_target="127.0.0.1:50051")
    cluster = next(k for k in boot["static_resources"]["clusters"] if k["name"] == "a")
    context = cluster["transport_socket"]["typed_config"]
    verified = "validation_context" in context.get("common_tls_context", {})
    row = next(r for r in _TABLE_ROW.finditer(_blocks()["`clusters[]`"]) if r.group(1) == "tls")
    text = row.string[row.start():row.string.index("\n", row.start())]
    assert context["sni"] == "api.provider.invalid" and "SNI" in text
    assert ("does not verify" in text) != verified, text
    assert verified and "tls_ca_file" in text, text
    ca = context["common_tls_context"]["validation_context"]["trusted_ca"]["filename"]
    assert ca in _OPERATIONS.read_text(), "docs/operations.md names another default CA file"
