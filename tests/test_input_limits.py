"""Hostile input: checked before parsing, one documented answer and one counter each."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core import input_limits
from sidecar.core.config import Config, parse_config
from sidecar.core.input_limits import (
    check_body,
    grpc_receive_limit,
    nests_deeper_than,
    parse_status,
    screen_headers,
    structure_problem,
)
from sidecar.shell.app import App
from sidecar.shell.extproc import RouteStream
from sidecar.shell.observe import ObserveStream
from tests.conftest import base_config_dict
from tests.streamharness import (
    POST_CHAT,
    body_msg,
    body_only_msg,
    chat_request,
    headers_msg,
    metadata,
    observe_msg,
    routed_cluster,
)


def _depth(doc: Any) -> int:
    if isinstance(doc, list):
        return 1 + max((_depth(x) for x in doc), default=0)
    if isinstance(doc, dict):
        return 1 + max((_depth(x) for x in doc.values()), default=0)
    return 0


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='ab[]{}"\\ ', max_size=6),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(
        st.text(alphabet='k[{"\\', max_size=3), kids, max_size=3),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(_json, st.integers(0, 8))
def test_depth_check_is_exact_for_valid_json(doc: Any, limit: int) -> None:
    body = json.dumps(doc).encode()
    expected = _depth(doc) > limit
    assert nests_deeper_than(body, limit) == expected
    block = input_limits._BLOCK
    try:  # the same across the block boundaries of the scan
        input_limits._BLOCK = 3
        assert nests_deeper_than(body, limit) == expected
    finally:
        input_limits._BLOCK = block


def _containers(doc: Any) -> int:
    if isinstance(doc, list):
        return 1 + sum(_containers(x) for x in doc)
    if isinstance(doc, dict):
        return 1 + sum(_containers(x) for x in doc.values())
    return 0


@settings(max_examples=300, deadline=None)
@given(_json, st.integers(1, 12))
def test_container_count_is_exact_for_valid_json(doc: Any, cap: int) -> None:
    """Arrays and objects outside strings, counted as the parser would build them;
    the depth limit high enough never to answer first."""
    body = json.dumps(doc).encode()
    expected = "body_too_complex" if _containers(doc) > cap else None
    assert structure_problem(body, 1000, cap) == expected
    block = input_limits._BLOCK
    try:  # the same across the block boundaries of the scan
        input_limits._BLOCK = 3
        assert structure_problem(body, 1000, cap) == expected
    finally:
        input_limits._BLOCK = block


def test_brackets_inside_strings_do_not_count() -> None:
    body = json.dumps({"content": "[" * 5000 + '\\"{' * 100}).encode()
    assert not nests_deeper_than(body, 8)


@pytest.mark.parametrize(("raw", "status"), [
    ("200", 200), (" 503 ", 503), ("abc", None), ("", None), (None, None), ("2000", None),
    ("099", None), ("600", None), ("٢٠٠", None), ("-20", None), ("1e2", None),
])
def test_parse_status(raw: str | None, status: int | None) -> None:
    assert parse_status(raw) == status


def test_screen_headers_drops_only_read_headers_that_are_hostile() -> None:
    headers = {"x-tailroute-tenant": "t" * 300, "x-tailroute-class": "batch",
               "x-request-id": "a\x01b", "user-agent": "u" * 300, ":path": "/v1/chat/completions"}
    kept, dropped = screen_headers(headers, 256)
    assert sorted(dropped) == ["x-request-id", "x-tailroute-tenant"]
    assert kept == {"x-tailroute-class": "batch", "user-agent": "u" * 300,
                    ":path": "/v1/chat/completions"}


def test_grpc_limit_admits_every_body_envoy_may_buffer(config: Config) -> None:
    assert grpc_receive_limit(config) > config.envoy.route_buffer_bytes
    assert grpc_receive_limit(config) > config.limits.max_body_bytes


@pytest.mark.parametrize(("limits", "field"), [
    ({"max_json_depth": 5000}, "max_json_depth"),
    ({"max_json_containers": 10}, "max_json_containers"),
    ({"max_json_containers": 10**8}, "max_json_containers"),
])
def test_structure_limits_are_validated(limits: dict[str, int], field: str) -> None:
    with pytest.raises(ValueError, match=rf"limits\.{field}"):
        parse_config(base_config_dict(limits=limits), "t.yaml")


def test_check_body_answers(config: Config) -> None:
    too_big = b" " * (config.limits.max_body_bytes + 1)
    refused = check_body(too_big, config.limits)
    assert refused is not None and refused.reason == "body_too_large" and refused.status is None
    deep = check_body(b"[" * 3000 + b"]" * 3000, config.limits)
    assert deep is not None and deep.reason == "body_too_deep" and deep.status == 400
    many = check_body(b"[" + b"[]," * 100_000 + b"[]]", config.limits)
    assert many is not None and many.reason == "body_too_complex" and many.status == 400
    assert check_body(b"[" + b"[]," * 99_998 + b"[]]", config.limits) is None  # 100,000
    assert check_body(chat_request(), config.limits) is None


# ------------------------------------------------------------------ through the handler


@pytest.fixture
def app(config: Config) -> App:
    return App.create(config, seed=1)


@pytest.mark.parametrize("depth", [3000, 129])
def test_deep_json_gets_400_and_a_counter_not_an_exception(app: App, depth: int) -> None:
    body = b'{"model": "m", "messages": ' + b"[" * depth + b"]" * depth + b"}"
    s = RouteStream(app)
    s.on_message(headers_msg(POST_CHAT), 0.0)
    r = s.on_message(body_msg(body), 0.0)
    assert r is not None and r.WhichOneof("response") == "immediate_response"  # type: ignore[union-attr]
    ir = r.immediate_response  # type: ignore[union-attr]
    assert ir.status.code == 400
    assert "nests deeper than 128" in json.loads(ir.body)["error"]["message"]
    assert json.loads(ir.body)["error"]["code"] == "body_too_deep"
    assert app.errors["body_too_deep"] == 1 and not app.pending


def test_a_body_of_many_containers_gets_400_and_a_counter(app: App) -> None:
    """8 MiB of ``[],`` took 730 ms to parse on the loop every decision shares."""
    body = b'{"model": "m", "messages": [], "x": [' + b"[]," * 200_000 + b"[]]}"
    s = RouteStream(app)
    s.on_message(headers_msg(POST_CHAT), 0.0)
    r = s.on_message(body_msg(body), 0.0)
    assert r is not None and r.WhichOneof("response") == "immediate_response"  # type: ignore[union-attr]
    ir = r.immediate_response  # type: ignore[union-attr]
    error = json.loads(ir.body)["error"]
    assert ir.status.code == 400 and error["code"] == "body_too_complex"
    assert "more than 100000 JSON arrays and objects" in error["message"]
    assert app.errors["body_too_complex"] == 1 and not app.pending


_UTF16_DEEP = ('{"model": "m", "x": "\u2200", "messages": ' + "[" * 900 + "]" * 900 + "}"
               ).encode("utf-16-le")
# Depth 2; its text U+7B7B is the bytes 7B 7B ("{{") in UTF-16: the depth scan saw 400 levels.
_UTF16_TEXT = ('{"model": "m", "messages": [{"role": "user", "content": "\u2200'
               + "\u7b7b" * 200 + '"}]}').encode("utf-16-le")


@pytest.mark.parametrize("body", [_UTF16_DEEP, _UTF16_TEXT, b"\xff\xfe" + _UTF16_TEXT,
                                  chat_request().decode().encode("utf-32")])
@pytest.mark.parametrize("path", ["fast", "rich"])
def test_a_utf16_or_utf32_body_gets_the_not_utf8_400_on_both_paths(
        app: App, body: bytes, path: str) -> None:
    """The depth scan reads bytes as UTF-8; json.loads(bytes) read UTF-16/32, so a deep
    UTF-16 body reached the prompt walk and raised RecursionError out of the handler
    (fail-open), and ordinary UTF-16 text could be refused as too deep."""
    s = RouteStream(app)
    if path == "rich":
        s.on_message(headers_msg(POST_CHAT), 0.0)
        r = s.on_message(body_msg(body), 0.0)
    else:
        r = s.on_message(body_only_msg(body), 0.0)
    assert r is not None and r.WhichOneof("response") == "immediate_response"  # type: ignore[union-attr]
    error = json.loads(r.immediate_response.body)["error"]  # type: ignore[union-attr]
    assert r.immediate_response.status.code == 400  # type: ignore[union-attr]
    assert "not UTF-8" in error["message"] and error["code"] == "bad_request"
    assert dict(app.errors) == {"bad_request": 1} and not app.pending


def test_json_at_the_depth_limit_is_routed(app: App) -> None:
    inner = "[" * 126 + "]" * 126  # 1 (object) + 1 (messages list) + 126 = 128 levels
    body = ('{"model": "m", "messages": [' + inner + "]}").encode()
    s = RouteStream(app)
    s.on_message(headers_msg(POST_CHAT), 0.0)
    r = s.on_message(body_msg(body), 0.0)
    assert r is not None and routed_cluster(r) in {"a", "b", "c"}  # type: ignore[arg-type]


def test_oversize_tailroute_header_is_ignored_and_counted(app: App) -> None:
    s = RouteStream(app)
    s.on_message(headers_msg({**POST_CHAT, "x-tailroute-class": "batch" + " " * 300}), 0.0)
    s.on_message(body_msg(chat_request()), 0.0)
    assert s.info is not None and s.info.klass == app.config.default_class
    assert app.errors["header_ignored"] == 1


@pytest.mark.parametrize("status", ["abc", "", "99999", "2OO"])
def test_bad_response_status_is_counted_and_not_a_sample(app: App, status: str) -> None:
    s = RouteStream(app)
    s.on_message(headers_msg(POST_CHAT), 0.0)
    meta = metadata(s.on_message(body_msg(chat_request()), 0.0))  # type: ignore[arg-type]
    o = ObserveStream(app)
    o.on_message(observe_msg("response_headers", meta, {":status": status,
                                                        "content-type": "text/event-stream"}), 0.2)
    o.on_message(observe_msg("response_body", meta, body=b"data: [DONE]\n\n", eos=True), 0.3)
    s.close(0.4, cancelled=False)
    assert app.errors["bad_status"] == 1
    assert sum(v for (k, _), v in app.router.counters.items() if k == "outcome") == 0


def test_stream_closed_while_the_body_is_due_is_counted_as_fail_open(app: App) -> None:
    s = RouteStream(app)
    s.on_message(headers_msg(POST_CHAT), 0.0)
    s.close(0.1, cancelled=False)  # what gRPC does when the body message is over its limit
    assert app.shell_counters()["failopen:stream_ended_before_body"] == 1
    s2 = RouteStream(app)
    s2.on_message(headers_msg(POST_CHAT), 0.0)
    s2.close(0.1, cancelled=True)  # the client went away: not that
    assert app.errors["stream_ended_before_body"] == 1


def test_other_paths_are_not_depth_checked(app: App) -> None:
    s = RouteStream(app)
    s.on_message(headers_msg({**POST_CHAT, ":path": "/v1/embeddings"}), 0.0)
    r = s.on_message(body_msg(b"[" * 3000), 0.0)
    assert r is not None and routed_cluster(r) == "a"  # type: ignore[arg-type]


def test_one_message_path_is_checked_the_same(app: App) -> None:
    deep = b'{"model": "m", "messages": ' + b"[" * 3000 + b"]" * 3000 + b"}"
    r = RouteStream(app).on_message(body_only_msg(deep), 0.0)
    assert r is not None and r.WhichOneof("response") == "immediate_response"  # type: ignore[union-attr]
    r = RouteStream(app).on_message(
        body_only_msg(chat_request(), {"x-tailroute-class": "x" * 300}), 0.0)
    assert r is not None and routed_cluster(r) in {"a", "b", "c"}  # type: ignore[arg-type]
    assert app.errors["body_too_deep"] == 1 and app.errors["header_ignored"] == 1


@pytest.mark.parametrize("explain", [False, True])
def test_a_body_over_envoys_buffer_on_the_rich_path_is_no_fail_open(
        app: App, explain: bool) -> None:
    """Envoy answers 413 itself and closes the stream (after the local reply's headers
    when explain asked for them): nothing went upstream, so neither a fail-open nor an
    unexpected message (it used to count both, and TailrouteFailOpen fired)."""
    over = app.config.envoy.route_buffer_bytes + 1
    s = RouteStream(app)
    s.on_message(headers_msg({**POST_CHAT, "content-length": str(over),
                              **({"x-tailroute-explain": "1"} if explain else {})}), 0.0)
    if explain:
        r = s.on_message(headers_msg({":status": "413"}, response=True), 0.1)
        assert r is not None and r.WhichOneof("response") == "response_headers"  # type: ignore[union-attr]
    s.close(0.2, cancelled=False)
    assert not app.errors and not app.pending
    assert "failopen:stream_ended_before_body" not in app.shell_counters()


@pytest.mark.parametrize(("length", "fail_open"), [
    ("1000", False), ("0", False), ("", True), ("99" * 3000, True), ("1e9", True),
])
def test_only_a_body_of_unknown_length_counts_when_its_stream_ends_early(
        app: App, length: str, fail_open: bool) -> None:
    """A declared body within Envoy's buffer fits the sidecar's gRPC limit, so its stream
    ended early because Envoy gave up on the request: the client left mid-upload (seen
    on the real Envoy: tests/test_integration_hostile.py), no fail-open. It counted as
    one, and a client that cancelled its upload fired TailrouteFailOpen. Without a
    readable length (chunked) gRPC's refusal cannot be told apart: still counted."""
    s = RouteStream(app)
    s.on_message(headers_msg({**POST_CHAT, "content-length": length}), 0.0)
    s.close(0.1, cancelled=False)
    assert ("failopen:stream_ended_before_body" in app.shell_counters()) == fail_open
    assert not app.pending
