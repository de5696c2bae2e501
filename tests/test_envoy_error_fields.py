"""Both paths agree on which event reports an error (real Envoy 1.40).

The sampled timer (``sidecar.core.timing``) reads the events in Python; the access-log
path reads what Envoy's ``sse_to_metadata`` filter, with the rules tailroute renders
(``bootstrap_filters.usage_filters``), lifted into the entry's metadata, judged by
``access_log.stream_error``. Each stream below goes through a real Envoy to a scripted
upstream; a file access log prints the lifted metadata, which is judged as the sidecar
judges an entry's, and compared with the timer's verdict on the same bytes.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from google.protobuf import json_format, struct_pb2

from sidecar.core.timing import ResponseTimer
from sidecar.core.types import SliceKey
from sidecar.devtools.harness import Stack
from sidecar.shell import bootstrap_filters as bf
from sidecar.shell.access_log import stream_error
from sidecar.shell.envoy_contract import USAGE_NS
from tests.openai_like import one_route_config, serve

pytestmark = pytest.mark.envoy

TOKEN = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'


def _data(*objs: Any) -> bytes:
    return b"".join(b"data: " + json.dumps(o).encode() + b"\n\n" for o in objs)


# name -> (the events after one token, an error on the timer, an error on Envoy's path)
CASES: dict[str, tuple[bytes, bool, bool]] = {
    "openai": (_data({"error": {"message": "m", "type": "server_error"}}), True, True),
    "plain string": (_data({"error": "upstream overloaded"}), True, True),
    "object without message": (_data({"error": {"code": 500}}), True, True),
    "empty object": (_data({"error": {}}), True, True),
    "object with a null message": (_data({"error": {"message": None}}), True, True),
    "number": (_data({"error": 500}), True, True),
    "true": (_data({"error": True}), True, True),
    "anthropic": (b'event: error\n' + _data(
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        True, True),
    "anthropic without message": (_data({"type": "error", "error": {"type": "api_error"}}),
                                  True, True),
    "vllm": (_data({"object": "error", "message": "oops", "code": 500}), True, True),
    "responses error": (_data({"type": "error", "code": "server_error", "message": "m"}),
                        True, True),
    "response.failed": (_data({"type": "response.failed", "response": {
        "error": {"code": "server_error", "message": "f"}}}), True, True),
    "response.failed without message": (_data({"type": "response.failed", "response": {
        "error": {"code": "server_error"}}}), True, True),
    "an empty error on every event, then a real one": (
        _data({"error": "", "choices": []}, {"error": "boom"}), True, True),
    # Not errors.
    "null": (_data({"error": None, "choices": []}), False, False),
    "empty string": (_data({"error": "", "choices": []}), False, False),
    "false": (_data({"error": False, "choices": []}), False, False),
    "zero": (_data({"error": 0, "choices": []}), False, False),
    "array": (_data({"error": ["x"]}), False, False),
    "null message": (_data({"message": None}), False, False),
    "empty message": (_data({"message": ""}), False, False),
    "message inside a delta": (
        _data({"choices": [{"index": 0, "delta": {"content": "b", "message": "hi"}}]}),
        False, False),
    "responses completed": (_data({"type": "response.completed", "response": {
        "error": None, "usage": {"output_tokens": 3}}}), False, False),
    "chat usage and [DONE]": (
        _data({"choices": [], "usage": {"completion_tokens": 1}}) + b"data: [DONE]\n\n",
        False, False),
    # Where the paths part (docs/response-timing.md, "Errors inside a 200 stream"):
    # Envoy keeps the last value of a field, and sees neither the event type nor
    # data that is not JSON.
    "an error, then an empty error": (_data({"error": "boom"}, {"error": ""}), True, False),
    "event: error with plain-text data": (b"event: error\ndata: overloaded\n\n", True, False),
}


class _Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        name = self.path.rsplit("/", 1)[-1]
        body = TOKEN + CASES[_NAMES[int(name)]][0]
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


_NAMES = list(CASES)


def _envoy_edit(log_path: str) -> Any:
    """Envoy alone, plus tailroute's usage filter and a file log of its metadata."""
    def edit(boot: dict[str, Any]) -> None:
        hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        cfg = hcm["typed_config"]
        cfg["http_filters"] = [*bf.usage_filters(1.0), *cfg["http_filters"]]
        cfg.setdefault("access_log", []).append({
            "name": "test.usage",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3"
                         ".FileAccessLog",
                "path": log_path,
                "log_format": {"text_format_source": {
                    "inline_string": f"%REQ(:PATH)% %DYNAMIC_METADATA({USAGE_NS})%\n"}},
            },
        })
    return edit


def _lifted(line: str) -> dict[str, Any]:
    """The entry's filter metadata as the access-log reader gets it."""
    raw = line.split(" ", 1)[1]
    if raw == "-":
        return {}
    struct = struct_pb2.Struct()
    json_format.ParseDict(json.loads(raw), struct)
    return {USAGE_NS: struct}


@pytest.fixture(scope="module")
def verdicts() -> Iterator[dict[str, bool]]:
    """Each case through the real Envoy: Envoy's path's verdict per case name."""
    with serve(_Upstream) as port, Stack() as st:
        st.write_config(one_route_config(port))
        log_path = st.workdir / "usage.log"
        listen = st.start_envoy(with_sidecar=False, edit=_envoy_edit(str(log_path)))
        for i in range(len(_NAMES)):
            conn = http.client.HTTPConnection("127.0.0.1", listen, timeout=10)
            conn.request("POST", f"/v1/chat/completions/{i}", b"{}",
                         {"content-type": "application/json"})
            r = conn.getresponse()
            r.read()
            conn.close()
            assert r.status == 200
        st.stop_envoy()  # flushes the file log
        lines = log_path.read_text().splitlines()
    assert len(lines) == len(_NAMES)
    out = {}
    for line in lines:
        name = _NAMES[int(line.split(" ", 1)[0].rsplit("/", 1)[-1])]
        out[name] = bool(stream_error(_lifted(line)))
    yield out


def _timer_says(events: bytes) -> bool:
    t = ResponseTimer("up", SliceKey("m", "interactive", "s", True), 0.0, True)
    t.on_headers(200, "text/event-stream", 0.0)
    t.on_body(TOKEN + events, 1.0, end=True)
    return t.stream_error


@pytest.mark.parametrize("name", _NAMES)
def test_the_timer_and_envoys_rules_judge_each_event_as_documented(
        name: str, verdicts: dict[str, bool]) -> None:
    events, on_timer, on_envoy = CASES[name]
    assert _timer_says(events) is on_timer
    assert verdicts[name] is on_envoy

