"""Generated artefacts stay in sync with their sources, and the Envoy config is valid."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.devtools.harness import envoy_binary
from sidecar.ops.config_file import load_config
from sidecar.shell.bootstrap import render_bootstrap, to_yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_CONFIG = ROOT / "deploy" / "local" / "tailroute.yaml"  # envoy/envoy.yaml renders it


def test_generated_protobuf_modules_are_fresh() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_proto.py"), "--check"],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr


def test_method_path_matches_envoy() -> None:
    from sidecar.pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb

    svc = pb.DESCRIPTOR.services_by_name["ExternalProcessor"]
    assert svc.full_name == "envoy.service.ext_proc.v3.ExternalProcessor"
    assert svc.methods_by_name["Process"].client_streaming
    req = pb.ProcessingRequest.DESCRIPTOR.fields_by_name
    assert (req["request_headers"].number, req["observability_mode"].number,
            req["protocol_config"].number) == (2, 10, 11)
    resp = pb.ProcessingResponse.DESCRIPTOR.fields_by_name
    assert (resp["immediate_response"].number, resp["dynamic_metadata"].number,
            resp["mode_override"].number) == (7, 8, 9)
    assert pb.CommonResponse.DESCRIPTOR.fields_by_name["clear_route_cache"].number == 5


def test_committed_envoy_yaml_matches_renderer() -> None:
    cfg = load_config(EXAMPLE_CONFIG)
    assert (ROOT / "envoy" / "envoy.yaml").read_text() == to_yaml(render_bootstrap(cfg)), (
        "envoy/envoy.yaml is stale: tailroute envoy-config --config "
        "deploy/local/tailroute.yaml -o envoy/envoy.yaml"
    )


@pytest.mark.parametrize("mode", ["observability", "streamed", "headers_only"])
@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_rendered_bootstrap_passes_envoy_validate(tmp_path: Path, mode: str,
                                                  transport: str) -> None:
    cfg = load_config(EXAMPLE_CONFIG)
    boot = render_bootstrap(
        cfg, unix_socket=str(tmp_path / "s.sock") if transport == "unix" else None,
        observe_mode=mode,  # type: ignore[arg-type]
    )
    path = tmp_path / "envoy.yaml"
    path.write_text(to_yaml(boot))
    r = subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(path)],
                       capture_output=True, text=True, check=False, timeout=60)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


def test_hostname_upstream_with_tls_renders_a_valid_dns_cluster(tmp_path: Path) -> None:
    from sidecar.core.config import parse_config
    from tests.conftest import base_config_dict

    data = base_config_dict()
    data["clusters"][0].update(address="api.provider.invalid:443", tls=True)
    boot = render_bootstrap(parse_config(data, "t.yaml"))
    cluster = next(c for c in boot["static_resources"]["clusters"] if c["name"] == "a")
    assert cluster["type"] == "STRICT_DNS"
    assert cluster["transport_socket"]["typed_config"]["sni"] == "api.provider.invalid"
    path = tmp_path / "envoy.yaml"
    path.write_text(to_yaml(boot))
    r = subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(path)],
                       capture_output=True, text=True, check=False, timeout=60)
    assert r.returncode == 0, r.stdout[-2000:]
