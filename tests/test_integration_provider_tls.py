"""Through the real Envoy: a provider reached over TLS must prove who it is.

A small HTTPS server on the loopback stands in for the provider; Envoy (the bootstrap
without the sidecar: every request takes the default route to that cluster) reaches
it with the transport socket the renderer makes for ``tls: true``.
"""

from __future__ import annotations

import http.server
import socket
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from sidecar.devtools.harness import Stack
from tests.certs import Pki, make_pki

pytestmark = pytest.mark.envoy


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"hello from the provider\n"
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet test output


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


@contextmanager
def _https_provider(pki: Pki, *hosts: str) -> Iterator[int]:
    """An HTTPS server presenting ``pki``'s server certificate on each of ``hosts``, all
    on one port (a host name may resolve to either loopback); that port."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki.server_cert, pki.server_key)
    servers: list[_Server] = []
    running: list[tuple[_Server, threading.Thread]] = []
    port = 0
    try:
        for host in hosts:
            server = (_Server6 if ":" in host else _Server)((host, port), _Hello)
            servers.append(server)
            port = int(server.server_address[1])
            server.socket = ctx.wrap_socket(server.socket, server_side=True)
            thread = threading.Thread(target=server.serve_forever,
                                      kwargs={"poll_interval": 0.05})
            thread.start()
            running.append((server, thread))
        yield port
    finally:
        for server, thread in running:  # shutdown() waits for a serve_forever that runs
            server.shutdown()
            thread.join(timeout=10)
        for server in servers:
            server.server_close()


def _get(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=20) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _ssl_failures(admin: int) -> dict[str, int]:
    """Envoy's counters of the provider cluster's failed certificate checks."""
    url = f"http://127.0.0.1:{admin}/stats?filter=^cluster\\.p\\.ssl\\.fail_verify"
    with urllib.request.urlopen(url, timeout=5) as r:
        lines = r.read().decode().splitlines()
    return {k.rsplit(".", 1)[1]: int(v) for k, v in (ln.split(": ") for ln in lines)
            if int(v)}


def _through_envoy(served: Pki, host: str, name: str | None = None,
                   **tls: Any) -> tuple[int, str, dict[str, int]]:
    """``(status, body, failed certificate checks)`` of one request to the provider on
    ``host`` (a comma-separated list), which the cluster's address calls ``name``
    (default: ``host``)."""
    with _https_provider(served, *host.split(",")) as port, Stack() as stack:
        name = name or host
        addr = f"[{name}]:{port}" if ":" in name else f"{name}:{port}"
        stack.write_config({
            "default_cluster": "p",
            "clusters": [{"name": "p", "address": addr, "models": ["m"], "tls": True, **tls}],
            "models": [{"name": "m", "candidates": ["p"]}],
        })
        status, body = _get(stack.start_envoy(with_sidecar=False))
        return status, body, _ssl_failures(stack.ports["envoy_admin"])


@pytest.mark.parametrize(("case", "failure"), [
    ("right-ca", None),
    # tls: true alone: the system bundle does not know the test CA (Envoy let it through)
    ("default-ca", "fail_verify_error"),
    ("unknown-ca", "fail_verify_error"),
    ("cert-for-another-name", "fail_verify_san"),
    ("unknown-ca-verify-off", None),
])
def test_envoy_reaches_the_provider_only_when_its_certificate_checks_out(
        tmp_path: Path, case: str, failure: str | None) -> None:
    pki = make_pki(tmp_path / "pki")  # names localhost and 127.0.0.1
    stranger = make_pki(tmp_path / "stranger", ca_name="someone else's CA")
    elsewhere = make_pki(tmp_path / "elsewhere", server_name="other.test", ips=())
    served, tls = {
        "right-ca": (pki, {"tls_ca_file": str(pki.ca)}),
        "default-ca": (pki, {}),
        "unknown-ca": (pki, {"tls_ca_file": str(stranger.ca)}),
        # signed by the trusted CA, but for another name than the cluster's host
        "cert-for-another-name": (elsewhere, {"tls_ca_file": str(elsewhere.ca)}),
        "unknown-ca-verify-off": (pki, {"tls_verify": False}),
    }[case]
    status, body, failures = _through_envoy(served, "127.0.0.1", **tls)
    if failure is None:
        assert (status, body, failures) == (200, "hello from the provider\n", {})
    else:
        assert status == 503 and "upstream connect error" in body, (status, body)
        assert set(failures) == {failure}, failures


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback")
@pytest.mark.parametrize(("names", "ok"), [(("::1",), True), (("::2",), False)])
def test_an_ipv6_provider_is_matched_by_its_ip_address(
        tmp_path: Path, names: tuple[str, ...], ok: bool) -> None:
    """The IP SAN Envoy compares is the compressed form the renderer writes."""
    pki = make_pki(tmp_path / "pki", server_name="not-the-host.test", ips=names)
    status, _, failures = _through_envoy(pki, "::1", tls_ca_file=str(pki.ca))
    assert (status, set(failures)) == ((200, set()) if ok else (503, {"fail_verify_san"}))


@pytest.mark.parametrize(("server_name", "ips", "ok"), [
    ("localhost", (), True),
    # the certificate names the right IP address, but the cluster's host is a DNS name
    ("other.test", ("127.0.0.1", "::1"), False),
])
def test_a_provider_named_by_host_name_is_matched_by_its_dns_name(
        tmp_path: Path, server_name: str, ips: tuple[str, ...], ok: bool) -> None:
    pki = make_pki(tmp_path / "pki", server_name=server_name, ips=ips)
    # Envoy may resolve localhost to either loopback: the provider answers on both
    both = "127.0.0.1,::1" if _ipv6_loopback() else "127.0.0.1"
    status, _, failures = _through_envoy(pki, both, name="localhost",
                                         tls_ca_file=str(pki.ca))
    assert (status, set(failures)) == ((200, set()) if ok else (503, {"fail_verify_san"}))
