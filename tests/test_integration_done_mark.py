"""Envoy's ``[DONE]`` mark tells a complete answer from a user pressing stop (real Envoy).

The upstream streams as OpenAI does without ``stream_options.include_usage`` and ends
its body 20 ms after ``data: [DONE]`` (the terminating chunk a separate write). The
OpenAI SDK's synchronous stream closes the connection at ``[DONE]``, so Envoy logs the
client's reset before the upstream's end: without the mark (``timing.done_mark``,
sidecar.shell.bootstrap_done) such an entry has neither usage nor an end time and is a
``cancel``. With it, the entry carries the mark and is an ``ok``, in every SSE framing
(LF, CRLF, CR, ``data:[DONE]``, the sentinel split across two writes). A client that
leaves before ``[DONE]`` is still a ``cancel``, also after a content delta whose JSON
carries the text ``[DONE]`` (a ``data: [DONE]`` line inside a JSON string is not one).
That case also shows the mark streams: had the Lua filter held the body back, the
client would have had its first content only once the upstream ended, and Envoy would
have logged that end (an ``ok``).

The user message selects the upstream's framing (:data:`VARIANTS`).
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

END_GAP_S = 0.02  # the upstream's end of the body after [DONE]
REST_S = 0.5  # an abandoned stream's remaining events come this much later
WRITE_GAP_S = 0.005  # after each write: five before [DONE] in an answer
LABEL = "m|interactive|short|stream"

# variant -> (line end, the [DONE] event's writes, a delta content of its own or None)
VARIANTS: dict[str, tuple[bytes, tuple[bytes, ...], str | None]] = {
    "lf": (b"\n", (b"data: [DONE]\n\n",), None),
    "crlf": (b"\r\n", (b"data: [DONE]\r\n\r\n",), None),
    "cr": (b"\r", (b"data: [DONE]\r\r",), None),
    "no_space": (b"\n", (b"data:[DONE]\n\n",), None),
    "split": (b"\n", (b"data: [DO", b"NE]\n\n"), None),
    # A model that writes the sentinel: plain, and as a whole "line" within the JSON
    # string (escaped there, so never a line of the stream).
    "in_json": (b"\n", (b"data: [DONE]\n\n",), "[DONE]"),
    "in_json_line": (b"\n", (b"data: [DONE]\n\n",), "\ndata: [DONE]\n"),
}


def _event(delta: dict[str, Any], eol: bytes, finish: str | None = None) -> bytes:
    body = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(body).encode() + eol + eol


class _Upstream(BaseHTTPRequestHandler):
    """Streams an answer without usage in the requested framing; ends END_GAP_S after
    [DONE]. A variant with a content of its own sends that delta first, then waits
    REST_S before the rest (the client leaves in between)."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
        eol, done, own = VARIANTS[body["messages"][0]["content"].split()[0]]
        first = [_event({"role": "assistant", "content": ""}, eol)]
        if own is not None:
            first.append(_event({"content": own}, eol))
        rest = [*(_event({"content": f"t{i} "}, eol) for i in range(3)),
                _event({}, eol, "stop")]
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        try:
            for event in first:
                self._write(event)
            if own is not None:
                time.sleep(REST_S)
            for event in [*rest, *done]:
                self._write(event)
            time.sleep(END_GAP_S)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            pass  # the client (through Envoy) left first

    def _write(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()
        time.sleep(WRITE_GAP_S)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module", params=[True, False], ids=["marked", "unmarked"])
def stack(request: pytest.FixtureRequest) -> Iterator[tuple[Stack, bool]]:
    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), _Upstream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with Stack() as st:
            st.start_sidecar(st.write_config({
                "default_cluster": "up",
                "clusters": [{"name": "up", "address": f"127.0.0.1:{port}", "models": ["m"]}],
                "models": [{"name": "m", "candidates": ["up"]}],
                "stats": {"subwindow_s": 30, "subwindows": 2, "min_samples": 1},
                "timing": {"done_mark": request.param},
            }))
            st.start_envoy()
            yield st, request.param
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _outcomes(st: Stack) -> dict[str, int]:
    return {k: int(v) for k, v in st.sidecar_state()["counters"].items()
            if k.startswith("outcome:")}


def _next_outcome(st: Stack, before: dict[str, int]) -> str:
    """The one outcome counted since ``before``."""
    deadline = time.monotonic() + 20
    while True:
        now = _outcomes(st)
        grew = [k for k, v in now.items() if v > before.get(k, 0)]
        if sum(now.values()) > sum(before.values()):
            assert len(grew) == 1 and sum(now.values()) == sum(before.values()) + 1, now
            return grew[0].removeprefix("outcome:")
        assert time.monotonic() < deadline, now
        time.sleep(0.05)


def _latency(st: Stack) -> dict[str, Any]:
    latency: dict[str, Any] = next(r["latency"] for r in st.sidecar_state()["routes"]
                                   if r["cluster"] == "up" and r["slice"] == LABEL)
    return latency


def _client(st: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=st.base_url, api_key="test", max_retries=0, timeout=30)


@pytest.mark.parametrize("variant", ["lf", "crlf", "cr", "no_space", "split"])
def test_a_client_that_left_at_done_had_a_complete_answer(
        stack: tuple[Stack, bool], variant: str) -> None:
    st, marked = stack
    before = _outcomes(st)
    stream = _client(st).chat.completions.create(
        model="m", messages=[{"role": "user", "content": variant}], stream=True)
    assert "".join(ev.choices[0].delta.content or "" for ev in stream
                   if ev.choices) == "t0 t1 t2 "
    # Unmarked, Envoy logs the client's reset before the upstream's end: a cancel (what
    # the mark is for; the upstream's 20 ms gap makes it so here).
    assert _next_outcome(st, before) == ("ok" if marked else "cancel")
    if marked:  # timed until the mark: at least the upstream's writes before [DONE]
        e2e = _latency(st)["e2e"]
        assert e2e["samples"] >= 1 and e2e["p50_ms"] >= 5 * WRITE_GAP_S * 1000 * 0.8, e2e


@pytest.mark.parametrize("variant", ["in_json", "in_json_line"])
def test_a_client_that_left_before_done_is_a_cancel(
        stack: tuple[Stack, bool], variant: str) -> None:
    st, _ = stack
    before = _outcomes(st)
    stream = _client(st).chat.completions.create(
        model="m", messages=[{"role": "user", "content": variant}], stream=True)
    seen = ""
    for ev in stream:
        seen += (ev.choices[0].delta.content or "") if ev.choices else ""
        if seen:
            break  # the user presses stop after the first content: before [DONE]
    stream.close()
    assert seen == VARIANTS[variant][2]
    assert _next_outcome(st, before) == "cancel"
