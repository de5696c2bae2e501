"""Through the real Envoy: the health check of the sidecar cluster and TLS/mTLS listeners.

Readiness waits are bounded polls (they only bound a broken run), not timing asserts.
"""

from __future__ import annotations

import json
import signal
import threading
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest

from sidecar.devtools.harness import Stack
from sidecar.shell.bootstrap import SIDECAR_CLUSTER
from tests.certs import make_pki
from tests.ops_stack import MODEL, drive, ops_config, start_providers, wait_for

pytestmark = pytest.mark.envoy


def sidecar_host_health(stack: Stack) -> dict[str, Any]:
    """The health status Envoy holds for the sidecar host (admin /clusters)."""
    url = f"http://127.0.0.1:{stack.ports['envoy_admin']}/clusters?format=json"
    with urllib.request.urlopen(url, timeout=5) as r:
        data = json.loads(r.read())
    for c in data["cluster_statuses"]:
        if c["name"] == SIDECAR_CLUSTER:
            return dict(c["host_statuses"][0]["health_status"])
    raise AssertionError("no sidecar cluster in Envoy")


def _healthy(stack: Stack) -> bool:
    h = sidecar_host_health(stack)
    return not h.get("failed_active_health_check") and h.get("eds_health_status") == "HEALTHY"


def test_health_check_turns_unhealthy_while_the_sidecar_drains() -> None:
    with Stack() as stack:
        ports = start_providers(stack)
        path = stack.write_config(ops_config(ports, envoy={"sidecar_health_interval_s": 0.5}))
        stack.start_sidecar(path)
        stack.start_envoy()
        wait_for(lambda: _healthy(stack), "Envoy to see the sidecar healthy")
        for name in ports:  # ~3 s of tokens: still streaming while the sidecar drains
            stack.control(name, {"tpot_ms": 400})
        served: list[list[str]] = []
        client = threading.Thread(target=lambda: served.append(drive(stack, 1)))
        client.start()
        proc = stack.procs["sidecar"]
        try:
            wait_for(lambda: any(c["inflight"] for c in stack.sidecar_state()["clusters"].values()),
                     "the request to be in flight")
            proc.send_signal(signal.SIGTERM)
            wait_for(lambda: sidecar_host_health(stack).get("failed_active_health_check"),
                     "Envoy to mark the draining sidecar unhealthy")
            still_draining = proc.poll() is None
        finally:
            client.join(timeout=30)
        assert still_draining, "the host turned unhealthy only after the sidecar had exited"
        assert served and served[0] == [served[0][0]]  # the in-flight request completed
        assert proc.wait(timeout=30) == 0


def _client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url, api_key="t", max_retries=0, timeout=20)


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mtls"])
def test_tls_listener_serves_through_envoy(tmp_path: Path, mutual: bool) -> None:
    pki = make_pki(tmp_path / "pki")
    listen_tls: dict[str, str] = {"cert_file": str(pki.server_cert),
                                  "key_file": str(pki.server_key)}
    envoy_tls: dict[str, str] = {"ca_file": str(pki.ca), "server_name": "localhost"}
    if mutual:
        listen_tls["client_ca_file"] = str(pki.ca)
        envoy_tls |= {"cert_file": str(pki.client_cert), "key_file": str(pki.client_key)}
    with Stack() as stack:
        ports = start_providers(stack)
        path = stack.write_config(ops_config(
            ports, listen={"tls": listen_tls},
            envoy={"sidecar_tls": envoy_tls, "sidecar_health_interval_s": 0.5}))
        stack.start_sidecar(path)
        stack.start_envoy()
        wait_for(lambda: _healthy(stack), "the health check over TLS to pass")
        client = _client(stack)
        for _ in range(4):
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                extra_headers={"x-tailroute-explain": "1"})
            # The explain header exists only if the sidecar decided (no fail-open).
            decided = json.loads(raw.headers["x-tailroute-explain-result"])["cluster"]
            assert raw.headers["x-fake-provider"] == decided
        assert sorted(drive(stack, 4)) and stack.sidecar_state()["routes"]
