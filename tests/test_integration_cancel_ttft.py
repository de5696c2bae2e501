"""A client that closes at ``[DONE]`` still times its route's first token (real Envoy).

The upstream streams as OpenAI does without ``stream_options.include_usage``: a
role-only chunk, tokens, a finish chunk and ``data: [DONE]``, then ends its body 20 ms
later (the terminating chunk is a separate write). The OpenAI SDK's synchronous stream
closes the connection at ``[DONE]``, so Envoy logs the client's reset before the
upstream's end: without usage the entry of a complete answer is a ``cancel``
(``timing.ask_usage`` and Envoy's ``[DONE]`` mark, ``timing.done_mark``, are off
here). Its first body byte came all the same, so its TTFT is a measurement: each such
cancel within the class budget is a TTFT sample of the route. Before, every one of them
was dropped and the route had no TTFT samples at all.

Two ways the first token is known: the observing filter timed it (every stream of a
route's first ``token_sample_min``), or the first body byte plus the route's offset
from the access log alone (sampling off).
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


def _delta(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class _EndsAfterDone(BaseHTTPRequestHandler):
    """Streams an answer without usage and ends the body END_GAP_S after [DONE]."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        events = [_delta({"role": "assistant", "content": ""}),
                  *(_delta({"content": f"t{i} "}) for i in range(5)), _delta({}, "stop"),
                  b"data: [DONE]\n\n"]
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


# Envoy's [DONE] mark off (timing.done_mark): with it these answers are ``ok``
# (tests/test_integration_done_mark.py); without it, as on a request outside the usage
# sample, they stay cancels, and their first token is what this file is about.
TIMINGS = {
    "sampled": {"done_mark": False},  # the route's first streams all timed at their first token
    "log_only": {"token_sample_min": 0, "token_sample_share": 0.0, "done_mark": False},
}


@pytest.fixture(scope="module", params=sorted(TIMINGS))
def stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), _EndsAfterDone)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with Stack() as st:
            st.start_sidecar(st.write_config({
                "default_cluster": "up",
                "clusters": [{"name": "up", "address": f"127.0.0.1:{port}", "models": ["m"]}],
                "models": [{"name": "m", "candidates": ["up"]}],
                "stats": {"subwindow_s": 30, "subwindows": 2, "min_samples": 5},
                "timing": TIMINGS[request.param],
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


def test_answers_logged_as_cancels_give_ttft_samples(stack: Stack) -> None:
    client = openai.OpenAI(base_url=stack.base_url, api_key="test", max_retries=0, timeout=30)
    for _ in range(N):
        stream = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
            stream=True)
        assert sum(1 for ev in stream if ev.choices and ev.choices[0].delta.content) == 5
    deadline = time.monotonic() + 20
    while sum(_outcomes(stack).values()) < N:
        assert time.monotonic() < deadline, _outcomes(stack)
        time.sleep(0.05)
    seen = _outcomes(stack)
    # What this test is about: Envoy logged (some of) the complete answers as cancels.
    assert seen.get("outcome:cancel", 0) >= 1 and sum(seen.values()) == N, seen
    latency = next(r["latency"] for r in stack.sidecar_state()["routes"]
                   if r["cluster"] == "up" and r["slice"] == LABEL)
    # Every answer's first token is a sample, the cancels' too; their end is unknown.
    assert latency["ttft"]["samples"] == N, latency
    assert latency["e2e"]["samples"] == seen.get("outcome:ok", 0), latency
