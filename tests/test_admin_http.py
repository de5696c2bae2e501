"""The admin server speaks enough HTTP for probes and operators: HTTP/1.0 closes,
a refused method closes (its body is not a next request), query values mean what
they say."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import Callable
from http import HTTPStatus

import pytest
from prometheus_client import CollectorRegistry

from sidecar.core.config import parse_config
from sidecar.ops.admin import AdminServer
from sidecar.ops.log_throttle import LogThrottle, install, uninstall
from sidecar.shell.app import App
from tests.conftest import base_config_dict


async def _exchange(port: int, raw: bytes) -> tuple[bytes, bool]:
    """Send ``raw``; the response bytes read until the server closes or 2 s of quiet
    (which says the connection was kept open)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    out = b""
    closed = False
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), 2.0):
            out += chunk
        closed = True
    except TimeoutError:
        pass
    writer.close()
    return out, closed


def _run(requests: list[bytes]) -> list[tuple[bytes, bool]]:
    return _serve(requests)[0]


def _serve(requests: list[bytes],
           setup: Callable[[AdminServer], None] = lambda a: None,
           ) -> tuple[list[tuple[bytes, bool]], AdminServer]:
    """The answers to ``requests`` (one connection each) and the server that gave them."""
    async def main() -> tuple[list[tuple[bytes, bool]], AdminServer]:
        app = App.create(parse_config(base_config_dict(), "t.yaml"), seed=1)
        admin = AdminServer(app, CollectorRegistry(), ready=lambda: True)
        setup(admin)
        port = await admin.start("127.0.0.1:0")
        try:
            return [await _exchange(port, r) for r in requests], admin
        finally:
            await admin.stop()

    return asyncio.run(main())


@pytest.mark.parametrize(
    ("raw", "status", "closes"),
    [
        (b"GET /healthz HTTP/1.0\r\n\r\n", b"200", True),  # HAProxy httpchk
        (b"GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", b"200", False),
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", b"200", False),
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", b"200", True),
        # The body of a refused POST must not be read as a second request.
        (b"POST /state HTTP/1.1\r\nHost: x\r\nContent-Length: 31\r\n\r\n"
         b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", b"405", True),
    ],
)
def test_connection_handling(raw: bytes, status: bytes, closes: bool) -> None:
    ((out, closed),) = _run([raw])
    assert out.startswith(b"HTTP/1.1 " + status)
    assert out.count(b"HTTP/1.1 ") == 1  # one response, nothing smuggled
    assert closed == closes


@pytest.mark.parametrize(
    ("raw", "status", "header"),
    [
        (b"GET /healthz HTTP/1.1\r\n\r\n", 200, b""),
        (b"GET /nope HTTP/1.1\r\n\r\n", 404, b""),
        (b"GET /explain?limit=0 HTTP/1.1\r\n\r\n", 400, b""),
        # RFC 9110 15.5.6: a 405 must say which methods the target supports.
        (b"DELETE /state HTTP/1.1\r\n\r\n", 405, b"allow: GET, HEAD\r\n"),
        (b"POST / HTTP/1.0\r\n\r\n", 405, b"allow: GET, HEAD\r\n"),
    ],
)
def test_status_line_has_the_standard_reason_phrase(raw: bytes, status: int,
                                                     header: bytes) -> None:
    ((out, _),) = _run([raw])
    head = out.split(b"\r\n\r\n", 1)[0] + b"\r\n"
    assert head.startswith(f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n".encode())
    assert header in head


def _body(out: bytes) -> object:
    return json.loads(out.split(b"\r\n\r\n", 1)[1])


@pytest.mark.parametrize(
    ("query", "status"),
    [("limit=0", b"400"), ("limit=-1", b"400"), ("limit=x", b"400"), ("limit=1", b"200"),
     ("limit=1000", b"200"), ("", b"200")],
)
def test_explain_limit(query: str, status: bytes) -> None:
    raw = f"GET /explain?{query} HTTP/1.1\r\nConnection: close\r\n\r\n".encode()
    ((out, _),) = _run([raw])
    assert out.startswith(b"HTTP/1.1 " + status)


@pytest.mark.parametrize(("query", "has"), [("history=1", True), ("history=true", True),
                                           ("history=0", False), ("history=false", False),
                                           ("", False)])
def test_state_history_flag(query: str, has: bool) -> None:
    raw = f"GET /state?{query} HTTP/1.1\r\nConnection: close\r\n\r\n".encode()
    ((out, _),) = _run([raw])
    body = _body(out)
    assert isinstance(body, dict) and ("history" in body) == has


# A target the URL parser refuses once raised out of the connection handler: no answer,
# and asyncio's traceback in the log per request. Every malformed request is a 400 (or
# its own 4xx), counted as admin_bad_request and logged in one throttled line.
@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GET //[ HTTP/1.1\r\nHost: x\r\n\r\n", b"400 Bad Request"),
        (b"GET http://[/healthz HTTP/1.1\r\nHost: x\r\n\r\n", b"400 Bad Request"),
        (b"GET /healthz\r\n\r\n", b"400 Bad Request"),  # HTTP/0.9
        (b"\r\n\r\n", b"400 Bad Request"),
    ],
)
def test_malformed_request_is_a_counted_400(
    raw: bytes, status: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        ((out, closed),), admin = _serve([raw])
    assert out.startswith(b"HTTP/1.1 " + status + b"\r\n") and closed
    assert admin.app.errors["admin_bad_request"] == 1
    assert [r.name for r in caplog.records] == ["tailroute.admin"]
    assert "\n" not in caplog.records[0].getMessage()


def test_refused_requests_log_through_the_throttle(caplog: pytest.LogCaptureFixture) -> None:
    throttle = install(["tailroute.admin"], LogThrottle(burst=3, every_s=60.0))
    try:
        with caplog.at_level(logging.WARNING):
            answers, admin = _serve([b"GET //[ HTTP/1.1\r\n\r\n"] * 20)
    finally:
        uninstall(throttle, ["tailroute.admin"])
    assert all(out.startswith(b"HTTP/1.1 400 ") for out, _ in answers)
    assert admin.app.errors["admin_bad_request"] == 20
    assert [r.name for r in caplog.records] == ["tailroute.admin"] * 3


def test_nothing_raises_out_of_the_connection_handler(caplog: pytest.LogCaptureFixture) -> None:
    def broken(admin: AdminServer) -> None:
        def fail(head: bytes) -> tuple[int, str, bytes, str, bool]:
            raise RuntimeError("a bug")
        admin._answer = fail  # type: ignore[method-assign]

    with caplog.at_level(logging.WARNING):
        ((out, closed),), admin = _serve([b"GET /healthz HTTP/1.1\r\n\r\n"], broken)
    assert out.startswith(b"HTTP/1.1 500 Internal Server Error\r\n") and closed
    assert admin.app.errors["admin_exception"] == 1
    (line,) = caplog.records  # one line, on a serving logger; asyncio says nothing
    assert line.name == "tailroute.admin" and line.exc_info is None


# A head past the reader's 64 KiB limit was closed without a word.
@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GET /state?" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", 414),
        (b"GET /" + b"a" * 70_000, 414),  # no end of the request line in sight
        (b"GET /healthz HTTP/1.1\r\nx-big: " + b"a" * 70_000 + b"\r\n\r\n", 431),
        (b"GET /healthz HTTP/1.1\r\n" + b"x-a: b\r\n" * 10_000 + b"\r\n", 431),
    ],
)
def test_head_over_the_limit_is_answered(
    raw: bytes, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        ((out, closed),), admin = _serve([raw])
    assert out.startswith(f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n".encode())
    assert b"connection: close" in out and closed
    assert admin.app.errors["admin_bad_request"] == 1
    (line,) = caplog.records
    assert line.name == "tailroute.admin" and len(line.getMessage()) < 200


def test_client_that_never_reads_is_dropped_after_the_idle_timeout() -> None:
    """Pipelined requests for the status page, answers never read: the server's buffers
    fill and its drain() waited forever, holding the connection (and every answer)."""
    requests = 3000  # ~33 MB of answers: far more than the kernel's buffers hold

    async def main() -> tuple[bool, int]:
        app = App.create(parse_config(base_config_dict(), "t.yaml"), seed=1)
        admin = AdminServer(app, CollectorRegistry(), ready=lambda: True)
        admin.idle_timeout_s = 0.3
        port = await admin.start("127.0.0.1:0")
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock)
        got, closed = 0, False
        try:
            writer.write(b"GET / HTTP/1.1\r\n\r\n" * requests)
            await asyncio.sleep(1.5)  # not reading, 5 idle timeouts long
            with contextlib.suppress(TimeoutError):  # 2 s of quiet: still open
                try:
                    while chunk := await asyncio.wait_for(reader.read(1 << 20), 2.0):
                        got += chunk.count(b"HTTP/1.1 200 OK")
                except ConnectionResetError:
                    pass
                closed = True
            return closed, got
        finally:
            writer.close()
            await admin.stop()

    closed, got = asyncio.run(main())
    # Dropped mid-way: the client never gets the rest (a reset, or the end of what
    # the kernel held), where a server still waiting would have sent all of them.
    assert closed and got < requests // 2, got
