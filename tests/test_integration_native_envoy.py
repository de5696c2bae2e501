"""Native mode's Envoy side on the real Envoy 1.40: slice routes and RTDS weights.

The RTDS service runs in this process (on its own event loop thread) so the
test can publish exact weights and drop the stream at will; the full sidecar
in native mode is exercised in tests/test_integration_native.py.
"""

from __future__ import annotations

import http.client
import json
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from sidecar.core.classify import api_for_path, classify, parse_body
from sidecar.core.types import SliceKey
from sidecar.core.weights import SliceWeights
from sidecar.devtools.bench_native import RtdsThread, split_weights, two_provider_native
from sidecar.devtools.harness import Stack, free_port, http_json
from sidecar.shell.bootstrap_filters import usage_share
from sidecar.shell.bootstrap_native import route_slices
from sidecar.shell.envoy_contract import TOKENS_KEY, USAGE_NS
from sidecar.shell.native_keys import runtime_key

pytestmark = pytest.mark.envoy


def _route_header(boot: dict[str, Any]) -> None:
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    vhost = hcm["typed_config"]["route_config"]["virtual_hosts"][0]
    vhost["response_headers_to_add"] = [{"header": {"key": "x-test-route",
                                                    "value": "%ROUTE_NAME%"}}]


def _usage_log(path: str) -> Any:
    """Also log each request's id and the token count Envoy lifted, to a file."""
    def edit(boot: dict[str, Any]) -> None:
        _route_header(boot)
        hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        hcm["typed_config"].setdefault("access_log", []).append({
            "name": "test.usage",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3"
                         ".FileAccessLog",
                "path": path,
                "log_format": {"text_format_source": {"inline_string": (
                    "%REQ(X-TEST-BATCH)% %REQ(X-REQUEST-ID)% "
                    f"%DYNAMIC_METADATA({USAGE_NS}:{TOKENS_KEY})%\n")}},
            },
        })
    return edit


@pytest.fixture(scope="module")
def native() -> Iterator[tuple[Stack, RtdsThread]]:
    with Stack() as st:
        two_provider_native(st)
        rtds = RtdsThread(free_port())
        try:
            st.start_envoy(sidecar_port=rtds.port,
                           edit=_usage_log(str(st.workdir / "usage.log")))
            yield st, rtds
        finally:
            rtds.close()


def _send(st: Stack, path: str, body: Any, headers: dict[str, str] | None = None,
          conn: http.client.HTTPConnection | None = None) -> tuple[int, str, str]:
    c = conn or http.client.HTTPConnection("127.0.0.1", st.ports["envoy"], timeout=10)
    raw = body if isinstance(body, str) else json.dumps(body)
    sent = {"content-type": "application/json", **(headers or {})}
    if sent["content-type"] == NO_TYPE:  # sent without the header
        del sent["content-type"]
    c.request("POST", path, raw, sent)
    r = c.getresponse()
    r.read()
    return r.status, r.getheader("x-test-route") or "", r.getheader("x-fake-provider") or ""


NO_TYPE = "(none)"
CASES: list[tuple[str, dict[str, str], dict[str, Any]]] = [
    ("/v1/chat/completions", {}, {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/chat/completions", {"x-tailroute-class": "batch"},
     {"model": "m", "stream": True, "max_tokens": 500, "messages": []}),
    ("/v1/chat/completions?debug=1", {"x-tailroute-class": "agentic"},
     {"model": "m", "max_completion_tokens": 2000, "max_tokens": 10}),
    ("/v1/completions", {"x-tailroute-class": "no-such-class"},
     {"model": "m", "prompt": "x" * 9000, "max_tokens": 100}),
    ("/v1/responses", {}, {"model": "m", "input": "x" * 70000, "max_output_tokens": 100}),
    ("/v1/chat/completions", {}, {"model": "m", "max_tokens": 1024, "stream": False}),
    # the default class's routes come first: named, empty, or naming no class
    ("/v1/chat/completions", {"x-tailroute-class": "interactive"},
     {"model": "m", "stream": True, "max_tokens": 10}),
    ("/v1/chat/completions", {"x-tailroute-class": ""}, {"model": "m", "max_tokens": 10}),
    ("/v1/chat/completions", {"x-tailroute-class": "batchy"}, {"model": "m", "max_tokens": 10}),
    ("/v1/chat/completions", {}, {"model": "m", "max_tokens": 1025, "stream": True}),
    # Content-Type is not checked, the body decides (README, "What is read from a
    # request"): no header, a media type in capitals (RFC 9110: case-insensitive), a
    # parameter spelled otherwise. They used to take the default route natively.
    ("/v1/chat/completions", {"content-type": NO_TYPE}, {"model": "m", "max_tokens": 10}),
    ("/v1/chat/completions", {"content-type": "Application/JSON"},
     {"model": "m", "max_tokens": 10}),
    ("/v1/chat/completions", {"content-type": "application/json; charset=\"utf-8\""},
     {"model": "m", "max_tokens": 10}),
]


@pytest.mark.parametrize(("path", "headers", "body"), CASES)
def test_envoy_slice_matches_the_classifier(
    native: tuple[Stack, RtdsThread], path: str, headers: dict[str, str], body: dict[str, Any]
) -> None:
    st, _ = native
    assert st.config is not None
    status, route, _ = _send(st, path, body, headers)
    assert status == 200
    api = api_for_path(path)
    info = classify(st.config, headers, parse_body(api, json.dumps(body).encode()), api)
    assert route_slices(st.config)[route] == info.slice


def _send_lines(st: Stack, lines: list[tuple[str, str]], model: str = "m") -> tuple[int, str]:
    """POST a chat request with header ``lines`` as written (a name may repeat)."""
    body = json.dumps({"model": model, "max_tokens": 10}).encode()
    c = http.client.HTTPConnection("127.0.0.1", st.ports["envoy"], timeout=10)
    c.putrequest("POST", "/v1/chat/completions")
    for name, value in [("content-type", "application/json"),
                        ("content-length", str(len(body))), *lines]:
        c.putheader(name, value)
    c.endheaders(body)
    r = c.getresponse()
    r.read()
    c.close()
    return r.status, r.getheader("x-test-route") or ""


@pytest.mark.parametrize("classes", [
    ["batch", "batch"], ["batch", "agentic"], ["interactive", "batch"], ["batch", ""],
    ["batch"],
])
def test_a_repeated_class_header_is_read_as_the_classifier_reads_it(
    native: tuple[Stack, RtdsThread], classes: list[str]
) -> None:
    """Several x-tailroute-class lines are one list to the classifier (the lines joined
    with ',', as Envoy joins them for ext_proc and the hybrid matcher): no class, the
    default one. Envoy's route header matcher took a slice route when any one line named
    its class (batch + batch: batch), so native mode disagreed with the sidecar."""
    st, _ = native
    assert st.config is not None
    status, route = _send_lines(st, [("x-tailroute-class", c) for c in classes])
    assert status == 200
    joined = {"x-tailroute-class": ",".join(classes)}
    info = classify(st.config, joined, parse_body("chat", b'{"model": "m", "max_tokens": 10}'),
                    "chat")
    assert route_slices(st.config)[route] == info.slice


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"model": "unknown"}),
    ("/v1/embeddings", {"model": "m", "input": "x"}),
    ("/v1/chat/completions", "not json"),
])
def test_unroutable_requests_take_the_default_route(
    native: tuple[Stack, RtdsThread], path: str, body: Any
) -> None:
    _, route, provider = _send(native[0], path, body)
    assert route == "tailroute_default" and provider == "a"


def _layer(st: Stack) -> dict[str, str]:
    rt = http_json(f"http://127.0.0.1:{st.ports['envoy_admin']}/runtime")
    return {k: v["final_value"] for k, v in rt["entries"].items() if k.startswith("tailroute.")}


def _weights(st: Stack, a: int, b: int) -> dict[SliceKey, SliceWeights]:
    assert st.config is not None
    return split_weights(st.config, {"a": a, "b": b})


def _split(st: Stack, n: int) -> Counter[str]:
    conn = http.client.HTTPConnection("127.0.0.1", st.ports["envoy"], timeout=10)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return Counter(f"{s}:{p}" for s, _, p in
                   (_send(st, "/v1/chat/completions", body, conn=conn) for _ in range(n)))


def test_published_weights_route_and_survive_a_dead_sidecar(
    native: tuple[Stack, RtdsThread],
) -> None:
    st, rtds = native
    rtds.publish(_weights(st, 10_000, 0))
    rtds.wait_acked(rtds.layer.version)
    assert _split(st, 30) == {"200:a": 30}
    s = SliceKey("m", "interactive", "short", False)
    assert _layer(st)[runtime_key(s, "b")] == "0"
    rtds.publish(_weights(st, 0, 10_000))
    rtds.wait_acked(rtds.layer.version)
    assert _split(st, 30) == {"200:b": 30}
    # The sidecar dies: the stream drops, Envoy keeps serving on the last weights.
    rtds.stop()
    assert _split(st, 30) == {"200:b": 30}
    assert _layer(st)[runtime_key(s, "a")] == "0"
    # It comes back with other weights: Envoy reconnects and applies them.
    rtds.publish(_weights(st, 10_000, 0))
    rtds.start()
    rtds.wait_acked(rtds.layer.version)
    assert _split(st, 30) == {"200:a": 30}


def test_usage_is_parsed_on_the_sampled_share(native: tuple[Stack, RtdsThread]) -> None:
    """Native mode parses a quarter of the streams for usage: exactly the requests
    whose Envoy-made x-request-id starts with 0-3; every other one logs no tokens."""
    st, _ = native
    assert st.config is not None and usage_share(st.config) == 0.25
    log = st.workdir / "usage.log"
    conn = http.client.HTTPConnection("127.0.0.1", st.ports["envoy"], timeout=10)
    body = {"model": "m", "stream": True, "max_tokens": 3,
            "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(80):
        status = _send(st, "/v1/chat/completions", body, {"x-test-batch": "usage"}, conn)[0]
        assert status == 200
    rows: list[list[str]] = []
    for _ in range(200):  # the file log is flushed by Envoy's own timer
        text = log.read_text() if log.exists() else ""
        rows = [line.split(" ")[1:] for line in text.splitlines() if line.startswith("usage ")]
        if len(rows) >= 80:
            break
        time.sleep(0.05)
    assert len(rows) == 80
    sampled = [rid[0] in "0123" for rid, _ in rows]
    counted = [tokens != "-" for _, tokens in rows]
    assert counted == sampled and any(sampled) and not all(sampled)
    assert {t for _, t in rows if t != "-"} == {"3"}
