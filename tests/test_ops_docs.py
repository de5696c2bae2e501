"""The README's configuration reference and metrics list stay complete: every config
field and every exported metric is documented (a new one without a line fails here)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from sidecar.core import config as c
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
    ``kind="elsewhere"`` was exported but missing from the row."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from sidecar.ops.metrics import build_registry
    from sidecar.shell.app import App
    from tests.conftest import base_config_dict

    app = App.create(c.parse_config(base_config_dict(), "t.yaml"), seed=1)
    registry = build_registry(lambda: app.router, lambda: 1.0, app.shell_counters).registry
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
