"""Hostile requests through the real Envoy: each gets its documented answer and counter.

(README, "Running it beside your Envoy": the answers table.)
"""

from __future__ import annotations

import http.client
import json
import socket
from typing import Any

import pytest

from sidecar.devtools.harness import Stack
from tests.ops_stack import MODEL, admin_get, ops_config, start_providers, wait_for

pytestmark = pytest.mark.envoy

MAX_BODY, ROUTE_BUFFER = 4096, 64 * 1024
LIMITS = {"max_body_bytes": MAX_BODY, "max_json_containers": 1000}


def _post(stack: Stack, body: bytes, headers: dict[str, str] | None = None
          ) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", stack.ports["envoy"], timeout=20)
    conn.request("POST", "/v1/chat/completions", body=body,
                 headers={"content-type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data


def _counter(stack: Stack, name: str, label: str) -> float:
    for line in admin_get(stack, "/metrics").splitlines():
        if line.startswith(f"{name}{{{label}}}"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _chat(**extra: Any) -> bytes:
    return json.dumps({"model": MODEL, "max_tokens": 2,
                       "messages": [{"role": "user", "content": "hi"}], **extra}).encode()


def test_hostile_requests_get_their_documented_answers() -> None:
    with Stack() as stack:
        ports = start_providers(stack)
        # The sidecar's own config says Envoy buffers at most ROUTE_BUFFER bytes...
        path = stack.write_config(ops_config(ports, limits=LIMITS,
                                             envoy={"route_buffer_bytes": ROUTE_BUFFER}))
        stack.start_sidecar(path)
        # ... but this Envoy is rendered to buffer 4 MiB (a hand-written config that
        # disagrees), so a 2 MiB body reaches gRPC over the sidecar's message limit.
        stack.write_config(ops_config(ports, limits=LIMITS,
                                      envoy={"route_buffer_bytes": 4 << 20}))
        stack.start_envoy()
        default = stack.config.default_cluster if stack.config else ""

        # Deep but under max_body_bytes (a larger body is not parsed: the size rule first).
        deep = b'{"model": "' + MODEL.encode() + b'", "messages": ' + b"[" * 1500 + b"]" * 1500
        status, _, body = _post(stack, deep + b"}")
        assert status == 400 and json.loads(body)["error"]["type"] == "invalid_request_error"
        assert "nests deeper than" in json.loads(body)["error"]["message"]
        assert _counter(stack, "tailroute_errors_total", 'kind="body_too_deep"') == 1

        # Many containers, each shallow: refused before the parser builds them.
        many = json.dumps({"model": MODEL, "messages": [], "x": [[]] * 1_200},
                          separators=(",", ":")).encode()  # 3.7 KiB: under MAX_BODY
        status, _, body = _post(stack, many)
        assert status == 400 and json.loads(body)["error"]["code"] == "body_too_complex"
        assert _counter(stack, "tailroute_errors_total", 'kind="body_too_complex"') == 1

        padded = _chat(padding="x" * (MAX_BODY * 4))
        status, headers, _ = _post(stack, padded)
        assert status == 200 and headers["x-fake-provider"] == default
        assert _counter(stack, "tailroute_fail_open_total", 'reason="body_too_large"') == 1

        status, headers, _ = _post(stack, _chat(padding="x" * (2 << 20)))
        assert status == 200 and headers["x-fake-provider"] == default
        assert _counter(stack, "tailroute_fail_open_total",
                        'reason="stream_ended_before_body"') == 1

        # The request above failed open in Envoy too (its access log counts it).
        wait_for(lambda: _counter(stack, "tailroute_fail_open_total", 'reason="envoy"') == 1,
                 "the fail-open's access-log entry")
        status, _, _ = _post(stack, _chat(padding="x" * (5 << 20)))
        assert status == 413  # over Envoy's own buffer: Envoy answers
        # Not a fail-open (nothing was served undecided): its own access-log kind.
        wait_for(lambda: _counter(stack, "tailroute_access_log_entries_total",
                                  'kind="unrouted"') == 1, "the 413's access-log entry")
        assert _counter(stack, "tailroute_fail_open_total", 'reason="envoy"') == 1

        # A POST without a body never reaches the one-message filter (it waits for a
        # body); its upstream answers for itself, and nothing failed open (Envoy logs
        # the body bytes it received: 0). It used to count as Envoy failing open.
        status, headers, _ = _post(stack, b"")
        assert status == 400 and headers["x-fake-provider"] == default
        wait_for(lambda: _counter(stack, "tailroute_access_log_entries_total",
                                  'kind="not_routed"') == 1, "the empty POST's entry")
        assert _counter(stack, "tailroute_access_log_entries_total", 'kind="fail_open"') == 1

        status, headers, _ = _post(stack, _chat(), {"x-tailroute-tenant": "t" * 5000,
                                                    "x-tailroute-explain": "1"})
        assert status == 200 and "x-tailroute-explain-result" in headers  # routed
        assert _counter(stack, "tailroute_errors_total", 'kind="header_ignored"') == 1
        assert _counter(stack, "tailroute_errors_total", 'kind="handler_exception"') == 0

        # Header bytes that are not UTF-8 (HTTP's obs-text; http.client sends str
        # headers as Latin-1): Envoy passes them on in proto3 strings, which used to
        # make the ext_proc message and the access-log batch unreadable (a traceback,
        # the request failed open past admission, the batch's entries lost).
        def settled() -> float | None:  # every decided request observed from its entry
            envoy = stack.sidecar_state()["envoy"]
            return None if envoy["pending"] else float(envoy["decided"])

        decided = wait_for(settled, "the earlier requests' entries")
        status, headers, _ = _post(stack, _chat(), {"x-tailroute-tenant": "caf\xe9",
                                                    "x-request-id": "r\xe9q-1"})
        assert status == 200
        assert wait_for(settled, "its entry") == decided + 1  # decided, and observed
        assert _counter(stack, "tailroute_fail_open_total", 'reason="envoy"') == 1
        assert _counter(stack, "tailroute_errors_total", 'kind="not_utf8"') == 2
        assert "DecodeError" not in stack.log("sidecar")

        # A client that leaves mid-upload on the rich path: Envoy gives up on the request
        # and ends the stream whose body was still due. Nothing was served undecided (the
        # access log: unrouted), so no fail-open; it counted as one, and every such client
        # fired TailrouteFailOpen. (Its declared length fits the gRPC limit: never refused.)
        def headers_seen() -> float:
            return _counter(stack, "tailroute_extproc_phase_seconds_count",
                            'phase="request_headers"')

        seen, body = headers_seen(), _chat()
        with socket.create_connection(("127.0.0.1", stack.ports["envoy"]), timeout=20) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\n"
                         b"content-type: application/json\r\nx-tailroute-deadline-ms: 9000\r\n"
                         b"content-length: %d\r\n\r\n" % len(body) + body[:10])
            wait_for(lambda: headers_seen() > seen, "the rich path's request headers")
        wait_for(lambda: _counter(stack, "tailroute_access_log_entries_total",
                                  'kind="unrouted"') == 2, "the abandoned request's entry")
        assert _counter(stack, "tailroute_fail_open_total",
                        'reason="stream_ended_before_body"') == 1
