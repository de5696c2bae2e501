"""An upstream that streams as OpenAI does, for real-Envoy tests of how a stream ends.

Chat Completions chunks as OpenAI frames them, written one chunk per HTTP/1.1 chunk,
and a one-route stack in front of it. The tests that use it are about the end of a
stream: the OpenAI SDK's synchronous stream closes the connection at ``data: [DONE]``,
and a provider that ends its body a little later (:data:`END_GAP_S`) makes Envoy log
the client's reset first (tests/test_integration_ask_usage.py, _cancel_ttft.py,
_done_mark.py).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import openai

from sidecar.devtools.harness import Stack, free_port
from tests.ops_stack import wait_for

END_GAP_S = 0.02  # the upstream's end of the body after [DONE]
WRITE_GAP_S = 0.005  # after each write
LABEL = "m|interactive|short|stream"  # the slice the tests' requests fall in


def chunk(choices: list[dict[str, Any]], eol: bytes = b"\n", **more: Any) -> bytes:
    """One ``chat.completion.chunk`` event, ended by a blank line of ``eol``."""
    body = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": choices, **more}
    return b"data: " + json.dumps(body).encode() + eol + eol


def delta(d: dict[str, Any], finish: str | None = None, eol: bytes = b"\n") -> bytes:
    """A chunk of one choice carrying ``d``."""
    return chunk([{"index": 0, "delta": d, "finish_reason": finish}], eol)


class ChunkedStream(BaseHTTPRequestHandler):
    """The writing half: an SSE response, one event per HTTP/1.1 chunk, the body ended
    :data:`END_GAP_S` after the last event. Subclasses build the events in ``do_POST``."""

    protocol_version = "HTTP/1.1"

    def read_json(self) -> dict[str, Any]:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        doc: dict[str, Any] = json.loads(raw)
        return doc

    def start(self, content_type: str = "text/event-stream") -> None:
        self.send_response(200)
        self.send_header("content-type", content_type)
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

    def write_event(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()
        time.sleep(WRITE_GAP_S)

    def end(self) -> None:
        time.sleep(END_GAP_S)  # a server finishing its work after the last event
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def stream(self, events: list[bytes]) -> None:
        """Write ``events``, then end; a client (through Envoy) that left is no error."""
        self.start()
        with contextlib.suppress(OSError):
            for event in events:
                self.write_event(event)
            self.end()

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[int]:
    """``handler`` served on a free 127.0.0.1 port in a thread; yields the port."""
    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def one_route_config(port: int, **more: Any) -> dict[str, Any]:
    """A config routing model ``m`` to the one cluster ``up`` at ``port``."""
    return {"default_cluster": "up",
            "clusters": [{"name": "up", "address": f"127.0.0.1:{port}", "models": ["m"]}],
            "models": [{"name": "m", "candidates": ["up"]}], **more}


@contextlib.contextmanager
def one_route_stack(handler: type[BaseHTTPRequestHandler], timing: dict[str, Any],
                    min_samples: int = 5) -> Iterator[Stack]:
    """Envoy and the sidecar routing model ``m`` to ``handler`` served on a free port."""
    with serve(handler) as port, Stack() as st:
        st.start_sidecar(st.write_config(one_route_config(
            port, stats={"subwindow_s": 30, "subwindows": 2, "min_samples": min_samples},
            timing=timing)))
        st.start_envoy()
        yield st


def outcomes(st: Stack) -> dict[str, int]:
    """The sidecar's outcome counters, ``outcome:<name>`` -> count."""
    return {k: int(v) for k, v in st.sidecar_state()["counters"].items()
            if k.startswith("outcome:")}


def wait_outcomes(st: Stack, n: int) -> dict[str, int]:
    """The outcome counters once ``n`` outcomes are counted (:func:`wait_for`)."""
    def counted() -> dict[str, int] | None:
        seen = outcomes(st)
        return seen if sum(seen.values()) >= n else None
    return wait_for(counted, f"{n} outcomes")


def route_latency(st: Stack) -> dict[str, Any]:
    """The ``latency`` view of route ``up`` on :data:`LABEL` in /state."""
    latency: dict[str, Any] = next(r["latency"] for r in st.sidecar_state()["routes"]
                                   if r["cluster"] == "up" and r["slice"] == LABEL)
    return latency


def sdk_streams(st: Stack, n: int) -> list[int]:
    """Stream ``n`` answers with the OpenAI SDK as most callers do (no usage asked for,
    read to ``[DONE]``, where the SDK closes the connection); each one's content deltas."""
    client = openai.OpenAI(base_url=st.base_url, api_key="test", max_retries=0, timeout=30)
    counts = []
    for _ in range(n):
        stream = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
            stream=True)
        counts.append(sum(1 for ev in stream if ev.choices and ev.choices[0].delta.content))
    return counts
