"""Native and hybrid bootstraps: valid for Envoy 1.40, and config mistakes named."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from sidecar.core.config import Config, ConfigError, parse_config
from sidecar.devtools.harness import envoy_binary
from sidecar.shell.bootstrap import to_yaml
from sidecar.shell.bootstrap_native import render_for_mode, render_native_bootstrap


def _data(**routing: Any) -> dict[str, Any]:
    return {
        "clusters": [
            {"name": "a", "address": "127.0.0.1:9001", "models": ["m", "m2"], "region": "eu"},
            {"name": "b", "address": "127.0.0.1:9002", "models": ["m"], "region": "us"},
        ],
        "models": [{"name": "m", "candidates": ["a", "b"]},
                   {"name": "m2", "candidates": ["a"], "regions": ["us"]}],
        "routing": routing,
    }


def _cfg(**routing: Any) -> Config:
    return parse_config(_data(**routing), "t.yaml")


def _hcm(boot: dict[str, Any]) -> dict[str, Any]:
    tc: dict[str, Any] = (
        boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"])
    return tc


@pytest.mark.parametrize("routing", [
    {"mode": "native"},
    {"mode": "hybrid"},
    {"mode": "hybrid", "per_request_classes": ["batch"]},
    {"mode": "hybrid", "per_request_classes": ["interactive"]},  # the default class
    {"mode": "hybrid", "per_request_classes": ["interactive", "agentic", "batch"]},
])
def test_rendered_native_bootstrap_passes_envoy_validate(
    tmp_path: Path, routing: dict[str, Any]
) -> None:
    path = tmp_path / "envoy.yaml"
    path.write_text(to_yaml(render_native_bootstrap(_cfg(**routing))))
    r = subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(path)],
                       capture_output=True, text=True, check=False, timeout=60)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


def test_slice_routes_never_render_all_zero_and_respect_region_policy() -> None:
    routes = _hcm(render_native_bootstrap(_cfg(mode="native")))["route_config"][
        "virtual_hosts"][0]["routes"]
    sliced = [r for r in routes if "weighted_clusters" in r["route"]]
    assert len(sliced) == 1 * 3 * 2 * 5  # m only: m2's one candidate is outside its regions
    for r in sliced:
        clusters = r["route"]["weighted_clusters"]["clusters"]
        assert [c["name"] for c in clusters] == ["a", "b"]
        assert all(c["weight"] > 0 for c in clusters)
    assert routes[-1]["name"] == "tailroute_default"


def test_native_has_no_ext_proc_and_hybrid_skips_it_for_native_requests() -> None:
    native = [f["name"] for f in _hcm(render_native_bootstrap(_cfg(mode="native")))[
        "http_filters"]]
    assert "tailroute.route" not in native
    assert "envoy.filters.http.json_to_metadata" in native
    hybrid = _hcm(render_native_bootstrap(_cfg(mode="hybrid")))["http_filters"]
    route = next(f for f in hybrid if f["name"] == "tailroute.route")
    assert route["typed_config"]["@type"].endswith("ExtensionWithMatcher")


def test_extproc_mode_and_envoy_alone_render_the_ext_proc_bootstrap() -> None:
    assert "layered_runtime" not in render_for_mode(_cfg())
    alone = render_for_mode(_cfg(mode="native"), with_sidecar=False)
    assert "layered_runtime" not in alone


@pytest.mark.parametrize(("change", "message"), [
    ({"routing": {"mode": "native"}, "rename": True},
     "t.yaml: routing.mode: native routing cannot rewrite the request body"),
    ({"routing": {"mode": "hybrid", "per_request_classes": ["nope"]}},
     "t.yaml: routing.per_request_classes: unknown class 'nope'"),
    ({"routing": {"mode": "sideways"}}, "t.yaml: routing.mode: must be one of"),
    ({"routing": {"mode": "native", "publish_interval_s": 11}},
     "t.yaml: routing.publish_interval_s: must be <= 10.0"),
    ({"routing": {"mode": "native", "weights": 1}}, "t.yaml: routing: unknown field(s): weights"),
])
def test_routing_config_errors_name_the_field(change: dict[str, Any], message: str) -> None:
    data = _data()
    data["routing"] = change["routing"]
    if change.get("rename"):
        data["clusters"][1]["models"] = {"m": "m-upstream"}
    with pytest.raises(ConfigError) as exc:
        parse_config(data, "t.yaml")
    assert str(exc.value).startswith(message), str(exc.value)
