"""A provider's cluster with ``tls: true``: Envoy verifies the provider's certificate.

It rendered an UpstreamTlsContext with SNI and no validation context, so anyone on
the path could pose as the provider (and read the API keys it is sent).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.core.config import ClusterConfig, ConfigError, parse_config
from sidecar.core.tls_config import SYSTEM_CA_FILE
from sidecar.ops.envoy_drift import envoy_drift
from sidecar.shell.bootstrap import provider_tls, render_bootstrap, unverified_providers
from tests.conftest import base_config_dict

_UPSTREAM_TLS = ("type.googleapis.com/envoy.extensions.transport_sockets.tls.v3"
                 ".UpstreamTlsContext")


def _parsed(**cluster: Any) -> ClusterConfig:
    data = base_config_dict()
    data["clusters"][0].update(cluster)
    return parse_config(data, "t.yaml").clusters[0]


def _verified(sni: str | None, ca: str, san_type: str, san: str) -> dict[str, Any]:
    return {"name": "envoy.transport_sockets.tls", "typed_config": {
        "@type": _UPSTREAM_TLS, **({} if sni is None else {"sni": sni}),
        "common_tls_context": {"validation_context": {
            "trusted_ca": {"filename": ca},
            "match_typed_subject_alt_names": [{"san_type": san_type,
                                               "matcher": {"exact": san}}]}}}}


@pytest.mark.parametrize(("cluster", "want"), [
    pytest.param({"address": "api.openai.com:443"},
                 _verified("api.openai.com", SYSTEM_CA_FILE, "DNS", "api.openai.com"),
                 id="dns-host-system-ca"),
    pytest.param({"address": "10.0.0.7:8443"},
                 _verified(None, SYSTEM_CA_FILE, "IP_ADDRESS", "10.0.0.7"),
                 id="ipv4-host"),
    # no SNI for an IP literal (RFC 6066); Envoy prints an IP SAN compressed to compare it
    pytest.param({"address": "[2001:DB8:0:0::1]:443"},
                 _verified(None, SYSTEM_CA_FILE, "IP_ADDRESS", "2001:db8::1"),
                 id="ipv6-host"),
    pytest.param({"address": "llm.internal:443", "tls_ca_file": "/etc/pki/corp-ca.pem"},
                 _verified("llm.internal", "/etc/pki/corp-ca.pem", "DNS", "llm.internal"),
                 id="custom-ca"),
    pytest.param({"address": "llm.internal:443", "tls_verify": True},
                 _verified("llm.internal", SYSTEM_CA_FILE, "DNS", "llm.internal"),
                 id="verify-said-explicitly"),
    pytest.param({"address": "llm.internal:443", "tls_verify": False},
                 {"name": "envoy.transport_sockets.tls",
                  "typed_config": {"@type": _UPSTREAM_TLS, "sni": "llm.internal"}},
                 id="verify-off"),
])
def test_a_tls_cluster_verifies_the_provider_unless_told_not_to(
        cluster: dict[str, Any], want: dict[str, Any]) -> None:
    data = base_config_dict()
    data["clusters"][0].update(tls=True, **cluster)
    rendered = render_bootstrap(parse_config(data, "t.yaml"))
    got = next(c for c in rendered["static_resources"]["clusters"] if c["name"] == "a")
    assert got["transport_socket"] == want


def test_a_plaintext_cluster_has_no_transport_socket() -> None:
    assert provider_tls(_parsed()) is None
    rendered = render_bootstrap(parse_config(base_config_dict(), "t.yaml"))
    assert all("transport_socket" not in c for c in rendered["static_resources"]["clusters"]
               if c["name"] != "tailroute_sidecar")


@pytest.mark.parametrize(("cluster", "problems"), [
    ({"tls_verify": False}, [".tls_verify: applies only with tls: true"]),
    ({"tls_ca_file": "/ca.pem"}, [".tls_ca_file: applies only with tls: true"]),
    ({"tls": False, "tls_verify": True, "tls_ca_file": "/ca.pem"},
     [".tls_verify: applies only with tls: true", ".tls_ca_file: applies only with tls: true"]),
    ({"tls": True, "tls_verify": False, "tls_ca_file": "/ca.pem"},
     [".tls_ca_file: unused with tls_verify: false"]),
    ({"tls": True, "tls_ca_file": ""}, [".tls_ca_file: must be a non-empty path"]),
    ({"tls": True, "tls_ca_file": 7}, [".tls_ca_file: must be a string, got 7"]),
    ({"tls": True, "tls_verify": "no"}, [".tls_verify: must be true or false"]),
    ({"tls": True, "tls_verfy": False},
     [": unknown field(s): tls_verfy (did you mean tls_verify?)"]),
])
def test_tls_settings_that_do_nothing_or_are_malformed_are_refused(
        cluster: dict[str, Any], problems: list[str]) -> None:
    data = base_config_dict()
    data["clusters"][1].update(cluster)
    with pytest.raises(ConfigError) as err:
        parse_config(data, "t.yaml")
    assert len(err.value.problems) == len(problems), err.value.problems
    for got, want in zip(err.value.problems, problems, strict=True):
        assert got.startswith(f"t.yaml: clusters[1]{want}"), got


def test_the_defaults_verify_against_the_system_bundle() -> None:
    c = _parsed(tls=True)
    assert (c.tls_verify, c.tls_ca_file) == (True, "/etc/ssl/certs/ca-certificates.crt")


def test_only_clusters_with_verification_off_are_warned_about() -> None:
    data = base_config_dict()
    data["clusters"][0].update(tls=True)
    data["clusters"][2].update(tls=True, tls_verify=False)
    warnings = unverified_providers(parse_config(data, "t.yaml"))
    assert len(warnings) == 1 and warnings[0].startswith("t.yaml: clusters[2] (c): tls_verify")
    assert "does not verify" in warnings[0]


@pytest.mark.parametrize("command", [["check-config"], ["envoy-config", "-o", "-"]])
@pytest.mark.parametrize("verify", [True, False])
def test_check_config_and_envoy_config_warn_on_stderr_about_an_unverified_provider(
        tmp_path: Path, command: list[str], verify: bool) -> None:
    data = base_config_dict()
    data["clusters"][1].update(address="api.provider.invalid:443", tls=True, tls_verify=verify)
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(data))
    out = subprocess.run([sys.executable, "-m", "sidecar.cli", *command, "--config", str(path)],
                         capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 0, out.stderr
    warned = [ln for ln in out.stderr.splitlines() if ln.startswith("warning: ")]
    if verify:
        assert warned == []
    else:
        assert warned == [f"warning: {path}: clusters[1] (b): tls_verify: false: Envoy does "
                          "not verify the provider's certificate (anyone on the path can pose "
                          "as it)"]


@pytest.mark.parametrize("edit", [
    {"tls_verify": False}, {"tls_ca_file": "/other-ca.pem"}, {"tls": False},
], ids=["verify-off", "other-ca", "tls-off"])
def test_a_reload_that_changes_a_providers_tls_warns_envoy_keeps_the_old_context(
        edit: dict[str, Any]) -> None:
    """As for an address: every decision stays routable, so the reload applies and says
    Envoy keeps its rendered transport socket until it is re-rendered and restarted."""
    old_data = base_config_dict()
    old_data["clusters"][1].update(address="api.provider.invalid:443", tls=True)
    new_data = base_config_dict()
    new_data["clusters"][1].update(address="api.provider.invalid:443", tls=True)
    new_data["clusters"][1].update(edit)
    blocking, advisory = envoy_drift(parse_config(old_data, "t.yaml"),
                                     parse_config(new_data, "t.yaml"))
    assert blocking == []
    assert advisory == ["clusters changed (address, TLS or circuit breaker): b"]
