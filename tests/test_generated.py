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


@pytest.mark.parametrize("with_sidecar", [True, False])
@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_rendered_bootstrap_passes_envoy_validate(tmp_path: Path, with_sidecar: bool,
                                                  transport: str) -> None:
    cfg = load_config(EXAMPLE_CONFIG)
    boot = render_bootstrap(
        cfg, unix_socket=str(tmp_path / "s.sock") if transport == "unix" else None,
        with_sidecar=with_sidecar,
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


def test_access_log_service_matches_envoy() -> None:
    from sidecar.pb.envoy.data.accesslog.v3 import accesslog_pb2 as al
    from sidecar.pb.envoy.service.accesslog.v3 import als_pb2

    svc = als_pb2.DESCRIPTOR.services_by_name["AccessLogService"]
    assert svc.full_name == "envoy.service.accesslog.v3.AccessLogService"
    assert svc.methods_by_name["StreamAccessLogs"].client_streaming
    msg = als_pb2.StreamAccessLogsMessage.DESCRIPTOR.fields_by_name
    assert (msg["identifier"].number, msg["http_logs"].number, msg["tcp_logs"].number) == (1, 2, 3)
    common = al.AccessLogCommon.DESCRIPTOR.fields_by_name
    numbers = {name: common[name].number for name in (
        "start_time", "time_to_first_upstream_tx_byte", "time_to_first_upstream_rx_byte",
        "time_to_last_upstream_rx_byte", "upstream_cluster", "response_flags", "metadata",
        "route_name", "custom_tags", "duration", "stream_id", "access_log_type")}
    assert numbers == {"start_time": 5, "time_to_first_upstream_tx_byte": 7,
                       "time_to_first_upstream_rx_byte": 9, "time_to_last_upstream_rx_byte": 10,
                       "upstream_cluster": 15, "response_flags": 16, "metadata": 17,
                       "route_name": 19, "custom_tags": 22, "duration": 23, "stream_id": 26,
                       "access_log_type": 33}
    flags = al.ResponseFlags.DESCRIPTOR.fields_by_name
    assert (flags["upstream_request_timeout"].number,
            flags["downstream_connection_termination"].number,
            flags["downstream_remote_reset"].number) == (3, 15, 28)
    resp = al.HTTPResponseProperties.DESCRIPTOR.fields_by_name
    assert (resp["response_code"].number, resp["response_code_details"].number) == (1, 6)


def _subset(doc: object, rendered: object) -> bool:
    """Is every key/value the README shows present in the rendered config? ("..." = elided)"""
    if doc == "..." or doc == {"...": "..."}:
        return True
    if isinstance(doc, dict):
        return isinstance(rendered, dict) and all(
            k in rendered and _subset(v, rendered[k]) for k, v in doc.items())
    if isinstance(doc, list):
        return isinstance(rendered, list) and all(
            d == "..." or any(_subset(d, r) for r in rendered) for d in doc)
    return doc == rendered


def test_readme_filter_snippet_matches_the_renderer() -> None:
    import re

    import yaml

    text = (ROOT / "README.md").read_text()
    section = text.split("## Running it beside your Envoy", 1)[1]
    snippet = re.search(r"```yaml\n(.*?)```", section, flags=re.S)
    assert snippet is not None
    shown = yaml.safe_load(snippet.group(1))
    boot = render_bootstrap(load_config(ROOT / "deploy" / "local" / "tailroute.yaml"))
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    filters = hcm["typed_config"]["http_filters"]
    names = [f["name"] for f in filters]
    assert [f["name"] for f in shown] == names[:-1]  # all but the router, in order
    for doc, rendered in zip(shown, filters, strict=False):
        assert _subset(doc, rendered), doc["name"]
