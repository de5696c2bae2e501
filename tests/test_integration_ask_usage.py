"""A client that never asks for usage and closes at ``[DONE]`` (real Envoy).

The upstream streams as OpenAI does: a role-only chunk, tokens, a finish chunk, the
usage chunk only when the request asked for it (``stream_options.include_usage``), then
``data: [DONE]``, and ends its body 20 ms later (a server finishing its work after the
last event). The OpenAI SDK's synchronous stream closes the connection at ``[DONE]``, so
Envoy logs the client's reset before the upstream's end. Without usage that entry has
neither a token count nor an end time: every such answer was a ``cancel`` (6 of 6 in a
scratch run, and with a 2 ms gap too) and the router learned nothing from it, or, past
the class budget, a timeout. With ``timing.ask_usage`` the routing answer asks for usage,
the usage event goes through before ``[DONE]``, and each answer is ``ok`` with its TTFT
and TPOT. The SDK reads the extra chunk (``choices: []``) without complaint.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import openai
import pytest

from sidecar.devtools.harness import Stack, free_port

pytestmark = pytest.mark.envoy

N = 6
END_GAP_S = 0.02
LABEL = "m|interactive|short|stream"


def _chunk(choices: list[dict[str, Any]], **more: Any) -> bytes:
    body = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": choices, **more}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _delta(delta: dict[str, Any], finish: str | None = None) -> bytes:
    return _chunk([{"index": 0, "delta": delta, "finish_reason": finish}])


class _LikeOpenAI(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    asked: list[bool] = []  # per request: did it ask for usage

    def do_POST(self) -> None:
        req = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
        asked = bool((req.get("stream_options") or {}).get("include_usage"))
        type(self).asked.append(asked)
        events = [_delta({"role": "assistant", "content": ""}),
                  *(_delta({"content": f"t{i} "}) for i in range(5)), _delta({}, "stop")]
        if asked:
            events.append(_chunk([], usage={"prompt_tokens": 3, "completion_tokens": 5,
                                             "total_tokens": 8}))
        events.append(b"data: [DONE]\n\n")
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        try:
            for event in events:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
                time.sleep(0.005)
            time.sleep(END_GAP_S)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            pass  # the client (through Envoy) left first

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), _LikeOpenAI)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with Stack() as st:
            st.start_sidecar(st.write_config({
                "default_cluster": "up",
                "clusters": [{"name": "up", "address": f"127.0.0.1:{port}", "models": ["m"]}],
                "models": [{"name": "m", "candidates": ["up"]}],
                "stats": {"subwindow_s": 30, "subwindows": 2, "min_samples": 5},
                "timing": {"ask_usage": True},
            }))
            st.start_envoy()
            yield st
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _outcomes(st: Stack) -> dict[str, int]:
    return {k: int(v) for k, v in st.sidecar_state()["counters"].items()
            if k.startswith("outcome:")}


def test_the_sdk_closing_at_done_is_ok_when_usage_is_asked_for(stack: Stack) -> None:
    client = openai.OpenAI(base_url=stack.base_url, api_key="test", max_retries=0, timeout=30)
    for _ in range(N):
        stream = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
            stream=True)
        assert sum(1 for ev in stream if ev.choices and ev.choices[0].delta.content) == 5
    assert _LikeOpenAI.asked == [True] * N  # the client never asked; the sidecar did
    deadline = time.monotonic() + 20
    while sum(_outcomes(stack).values()) < N:
        assert time.monotonic() < deadline, _outcomes(stack)
        time.sleep(0.05)
    assert _outcomes(stack) == {"outcome:ok": N}
    latency = next(r["latency"] for r in stack.sidecar_state()["routes"]
                   if r["cluster"] == "up" and r["slice"] == LABEL)
    assert latency["ttft"]["samples"] >= N and latency["tpot"]["samples"] >= N
