"""grpc.health.v1 and the TLS listener, in process (a real grpc.aio server and client)."""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path
from typing import Any

import grpc
import pytest

from sidecar.core.config import ConfigError, parse_config
from sidecar.core.tls_config import ListenTlsConfig
from sidecar.pb.grpc.health.v1 import health_pb2 as hpb
from sidecar.pb.grpc.health.v1 import health_pb2_grpc as hpb_grpc
from sidecar.shell.bootstrap import SIDECAR_CLUSTER, render_bootstrap
from sidecar.shell.health import NOT_SERVING, SERVICE_UNKNOWN, SERVING, HealthService
from sidecar.shell.tls import CertificateWatcher, load_material
from tests.certs import Pki, make_pki
from tests.conftest import base_config_dict

EXT_PROC = "envoy.service.ext_proc.v3.ExternalProcessor"


async def _with_server(health: HealthService, creds: grpc.ServerCredentials | None = None
                       ) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    health.register(server)
    port = (server.add_secure_port("127.0.0.1:0", creds) if creds
            else server.add_insecure_port("127.0.0.1:0"))
    await server.start()
    return server, port


def test_check_follows_the_serving_state() -> None:
    async def run() -> list[Any]:
        health = HealthService()
        server, port = await _with_server(health)
        out: list[Any] = []
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = hpb_grpc.HealthStub(ch)
            out.append((await stub.Check(hpb.HealthCheckRequest())).status)
            health.set_serving(True)
            out.append((await stub.Check(hpb.HealthCheckRequest(service=EXT_PROC))).status)
            health.shutdown()
            health.set_serving(True)  # draining is final
            out.append((await stub.Check(hpb.HealthCheckRequest())).status)
            try:
                await stub.Check(hpb.HealthCheckRequest(service="no.such.Service"))
            except grpc.aio.AioRpcError as exc:
                out.append(exc.code())
        await server.stop(0)
        return out

    assert asyncio.run(run()) == [NOT_SERVING, SERVING, NOT_SERVING, grpc.StatusCode.NOT_FOUND]


def test_watch_sends_changes_and_ends_at_shutdown() -> None:
    async def run() -> tuple[list[int], list[int]]:
        health = HealthService()
        server, port = await _with_server(health)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = hpb_grpc.HealthStub(ch)
            watch = stub.Watch(hpb.HealthCheckRequest())
            unknown = stub.Watch(hpb.HealthCheckRequest(service="nope"))
            seen = [(await watch.read()).status]
            health.set_serving(True)
            seen.append((await watch.read()).status)
            health.shutdown()
            seen.append((await watch.read()).status)
            assert await watch.read() is grpc.aio.EOF  # the stream ends: no drain hold-up
            other = [r.status async for r in unknown]
        await server.stop(0)
        return seen, other

    seen, other = asyncio.run(run())
    assert seen == [NOT_SERVING, SERVING, NOT_SERVING]
    assert other == [SERVICE_UNKNOWN]


# ------------------------------------------------------------------ TLS


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _tls(pki: Pki, mutual: bool = True) -> ListenTlsConfig:
    return ListenTlsConfig(str(pki.server_cert), str(pki.server_key),
                           str(pki.ca) if mutual else None)


@pytest.mark.parametrize(("field", "damage", "message"), [
    ("cert_file", "missing", "listen.tls.cert_file: cannot read"),
    ("key_file", "not_pem", "listen.tls.key_file: {path} is not PEM"),
    ("key_file", "other_key", "listen.tls.key_file: {path} does not match listen.tls.cert_file"),
    ("client_ca_file", "garbage_pem", "listen.tls.client_ca_file: {path} holds no usable CA"),
    # read whole before: /dev/zero until memory ran out
    ("cert_file", "huge", "listen.tls.cert_file: {path} is larger than 16 MiB: refused"),
])
def test_bad_files_are_config_errors_naming_field_and_file(
    pki: Pki, tmp_path: Path, field: str, damage: str, message: str
) -> None:
    path = tmp_path / f"{field}.pem"
    if damage == "not_pem":
        path.write_text("hello")
    elif damage == "other_key":
        path.write_bytes(pki.client_key.read_bytes())
    elif damage == "garbage_pem":
        path.write_text("-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")
    elif damage == "huge":
        with path.open("wb") as f:
            f.write(pki.server_cert.read_bytes())
            f.truncate((16 << 20) + 1)  # the rest sparse
    cfg = {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key),
           "client_ca_file": str(pki.ca), field: str(path)}
    with pytest.raises(ConfigError) as err:
        load_material(ListenTlsConfig(**cfg), "t.yaml")
    assert str(err.value).startswith("t.yaml: ")
    assert message.format(path=path) in str(err.value)


@pytest.mark.parametrize(("listen_tls", "envoy_tls", "message"), [
    ({"cert_file": "c", "key_file": "k"}, None, "envoy.sidecar_tls: required when listen.tls"),
    (None, {"ca_file": "ca"}, "envoy.sidecar_tls: set, but listen.tls is not"),
    ({"cert_file": "c", "key_file": "k", "client_ca_file": "ca"}, {"ca_file": "ca"},
     "envoy.sidecar_tls: listen.tls.client_ca_file asks for mutual TLS"),
    ({"cert_file": "c"}, {"ca_file": "ca"}, "listen.tls.key_file: required field is missing"),
    ({"cert_file": "c", "key_file": "k"}, {"ca_file": "ca", "cert_file": "x"},
     "envoy.sidecar_tls: cert_file and key_file go together"),
    ({"cert_file": "c", "key_file": "k", "bogus": 1}, {"ca_file": "ca"},
     "listen.tls: unknown field(s): bogus"),
])
def test_tls_config_is_validated(listen_tls: Any, envoy_tls: Any, message: str) -> None:
    data = base_config_dict(listen={"tls": listen_tls}, envoy={"sidecar_tls": envoy_tls})
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config(data, "t.yaml")


def test_rendered_sidecar_cluster_has_health_checks_and_matching_tls(pki: Pki) -> None:
    data = base_config_dict(
        listen={"tls": {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key),
                        "client_ca_file": str(pki.ca)}},
        envoy={"sidecar_health_interval_s": 0.5,
               "sidecar_tls": {"ca_file": str(pki.ca), "server_name": "localhost",
                               "cert_file": str(pki.client_cert),
                               "key_file": str(pki.client_key)}})
    boot = render_bootstrap(parse_config(data, "t.yaml"))
    sidecar = next(c for c in boot["static_resources"]["clusters"] if c["name"] == SIDECAR_CLUSTER)
    (hc,) = sidecar["health_checks"]
    assert hc["grpc_health_check"] == {"service_name": ""} and hc["interval"] == "0.5s"
    tls = sidecar["transport_socket"]["typed_config"]
    assert tls["sni"] == "localhost"
    common = tls["common_tls_context"]
    assert common["alpn_protocols"] == ["h2"]
    assert common["validation_context"]["trusted_ca"] == {"filename": str(pki.ca)}
    assert common["tls_certificates"][0]["certificate_chain"] == {"filename": str(pki.client_cert)}
    # Over the Unix socket the sidecar is plaintext: no TLS there.
    unix = render_bootstrap(parse_config(data, "t.yaml"), unix_socket="/tmp/x.sock")
    sidecar = next(c for c in unix["static_resources"]["clusters"] if c["name"] == SIDECAR_CLUSTER)
    assert "transport_socket" not in sidecar


def _client_creds(pki: Pki, with_cert: bool) -> grpc.ChannelCredentials:
    if with_cert:
        return grpc.ssl_channel_credentials(pki.ca.read_bytes(), pki.client_key.read_bytes(),
                                            pki.client_cert.read_bytes())
    return grpc.ssl_channel_credentials(pki.ca.read_bytes())


async def _check(port: int, creds: grpc.ChannelCredentials) -> Any:
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", creds) as ch:
        try:
            return (await hpb_grpc.HealthStub(ch).Check(hpb.HealthCheckRequest(),
                                                         timeout=5)).status
        except grpc.aio.AioRpcError as exc:
            return exc.code()


def test_mutual_tls_refuses_a_client_without_certificate(pki: Pki) -> None:
    async def run() -> list[Any]:
        health = HealthService()
        health.set_serving(True)
        server, port = await _with_server(
            health, CertificateWatcher(_tls(pki), "t.yaml").credentials())
        out = [await _check(port, _client_creds(pki, True)),
               await _check(port, _client_creds(pki, False))]
        await server.stop(0)
        return out

    assert asyncio.run(run()) == [SERVING, grpc.StatusCode.UNAVAILABLE]


def test_changed_certificates_serve_from_the_next_handshake(pki: Pki, tmp_path: Path) -> None:
    live = tmp_path / "live"
    live.mkdir()
    for p in (pki.server_cert, pki.server_key, pki.ca):
        shutil.copy(p, live / p.name)
    cfg = ListenTlsConfig(str(live / "server.crt"), str(live / "server.key"), str(live / "ca.crt"))
    new = make_pki(tmp_path / "new", ca_name="rotated CA")

    async def run() -> list[Any]:
        watcher = CertificateWatcher(cfg, "t.yaml", check_every_s=0.0)
        health = HealthService()
        health.set_serving(True)
        server, port = await _with_server(health, watcher.credentials())
        out = [await _check(port, _client_creds(pki, True))]
        (live / "server.key").write_text("broken")  # an invalid set is refused...
        watcher.fetch()
        out.append(await _check(port, _client_creds(pki, True)))  # ... the old one serves
        for p in (new.server_cert, new.server_key, new.ca):
            shutil.copy(p, live / p.name)
        watcher.fetch()  # seen once; gRPC's fetch at the next handshake sees it settled
        out.append(await _check(port, _client_creds(new, True)))
        out.append(await _check(port, _client_creds(pki, True)))  # the old CA is gone
        out.append(dict(watcher.counts))
        await server.stop(0)
        return out

    got = asyncio.run(run())
    assert got[:4] == [SERVING, SERVING, SERVING, grpc.StatusCode.UNAVAILABLE]
    assert got[4] == {"invalid": 1, "ok": 1}


@pytest.mark.parametrize(("every", "keepalive"), [
    (None, {"interval": "10s", "timeout": "5s"}),
    (1, {"interval": "1s", "timeout": "0.5s"}),
    (30, {"interval": "30s", "timeout": "5s"}),
    (0, None),
])
def test_rendered_sidecar_cluster_pings_its_connection(every: float | None,
                                                       keepalive: dict[str, str] | None) -> None:
    envoy = {} if every is None else {"sidecar_keepalive_s": every}
    boot = render_bootstrap(parse_config(base_config_dict(envoy=envoy), "t.yaml"))
    sidecar = next(c for c in boot["static_resources"]["clusters"] if c["name"] == SIDECAR_CLUSTER)
    opts = sidecar["typed_extension_protocol_options"][
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    assert opts["explicit_http_config"]["http2_protocol_options"].get(
        "connection_keepalive") == keepalive


def test_keepalive_interval_below_a_second_is_refused() -> None:
    with pytest.raises(ConfigError, match=re.escape("envoy.sidecar_keepalive_s: must be 0")):
        parse_config(base_config_dict(envoy={"sidecar_keepalive_s": 0.2}), "t.yaml")
