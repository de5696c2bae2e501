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
