"""The ext_proc stream handlers, driven in memory (no gRPC, no Envoy)."""

from __future__ import annotations

import json

import pytest

from sidecar.core.config import Config, parse_config
from sidecar.core.types import SliceKey
from sidecar.shell.app import App
from sidecar.shell.bootstrap import REQUEST_ID_HEADER, ROUTE_HEADER
from sidecar.shell.extproc import ObserveStream, RouteStream
from tests.conftest import base_config_dict
from tests.streamharness import (
    POST_CHAT,
    body_msg,
    chat_request,
    headers_msg,
    set_headers,
    sse,
    token,
)


@pytest.fixture
def app(config: Config) -> App:
    return App.create(config, seed=1)


def route(app: App, body: bytes, headers: dict[str, str] | None = None,
          now: float = 0.0) -> tuple[RouteStream, list[object]]:
    s = RouteStream(app)
    out = [s.on_message(headers_msg({**POST_CHAT, **(headers or {})}), now),
           s.on_message(body_msg(body), now)]
    return s, out


def test_post_is_routed_with_header_and_clear_route_cache(app: App) -> None:
    _s, (r1, r2) = route(app, chat_request())
    assert r1.WhichOneof("response") == "request_headers"  # type: ignore[attr-defined]
    assert r2.WhichOneof("response") == "request_body"  # type: ignore[attr-defined]
    hdrs = set_headers(r2)  # type: ignore[arg-type]
    assert hdrs[ROUTE_HEADER] in {"a", "b", "c"}
    assert REQUEST_ID_HEADER in hdrs
    assert r2.request_body.response.clear_route_cache  # type: ignore[attr-defined]
    opt = r2.request_body.response.header_mutation.set_headers[0]  # type: ignore[attr-defined]
    assert opt.append_action == opt.OVERWRITE_IF_EXISTS_OR_ADD
    assert app.router.inflight(hdrs[ROUTE_HEADER]) == 1


def test_get_without_body_goes_to_default_route(app: App) -> None:
    s = RouteStream(app)
    r = s.on_message(headers_msg({":method": "GET", ":path": "/v1/models"}, eos=True), 0.0)
    assert r is not None and set_headers(r)[ROUTE_HEADER] == "a"
    assert app.router.counters[("decision", "unknown_model")] == 1


@pytest.mark.parametrize("body", [b"{not json", b"[]", b'{"model": 1}', b'{"stream": "x"}'])
def test_malformed_body_gets_400(app: App, body: bytes) -> None:
    _, (_, r2) = route(app, body)
    assert r2.WhichOneof("response") == "immediate_response"  # type: ignore[attr-defined]
    ir = r2.immediate_response  # type: ignore[attr-defined]
    assert ir.status.code == 400
    assert json.loads(ir.body)["error"]["type"] == "invalid_request_error"
    assert not app.pending


def test_unknown_model_continues_to_default_route(app: App) -> None:
    _, (_, r2) = route(app, chat_request(model="who-knows"))
    assert set_headers(r2)[ROUTE_HEADER] == "a"  # type: ignore[arg-type]


def test_oversized_body_is_not_parsed_and_goes_default(app: App) -> None:
    big = b'{"model": "m", "x": "' + b"y" * (app.config.limits.max_body_bytes + 1) + b'"}'
    _, (_, r2) = route(app, big)
    assert set_headers(r2)[ROUTE_HEADER] == "a"  # type: ignore[arg-type]
    assert app.errors["body_too_large"] == 1


def test_model_rewritten_for_cluster_with_other_name() -> None:
    data = base_config_dict()
    data["models"][0]["candidates"] = ["c"]
    app = App.create(parse_config(data, "t.yaml"), seed=1)
    _, (_, r2) = route(app, chat_request())
    common = r2.request_body.response  # type: ignore[attr-defined]
    new = json.loads(common.body_mutation.body)
    assert new["model"] == "m-upstream"
    assert set_headers(r2)["content-length"] == str(len(common.body_mutation.body))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "msgs",
    [
        [body_msg(b"x")],  # body before headers
        [headers_msg({"x": "y"}, response=True)],  # response headers first
        [body_msg(b"x", response=True)],
        [headers_msg(POST_CHAT), headers_msg(POST_CHAT)],  # headers twice
    ],
)
def test_unexpected_order_never_raises(app: App, msgs: list[object]) -> None:
    s = RouteStream(app)
    for m in msgs:
        assert s.on_message(m, 0.0) is not None  # type: ignore[arg-type]
    s.close(1.0, cancelled=True)


def _observe(app: App, rid: str, events: list[tuple[float, object]]) -> ObserveStream:
    o = ObserveStream(app)
    o.on_message(headers_msg({**POST_CHAT, REQUEST_ID_HEADER: rid}, observe=True), 0.0)
    for now, m in events:
        assert o.on_message(m, now) is None  # type: ignore[arg-type]
    return o


def test_observer_times_stream_and_feeds_stats(app: App) -> None:
    s, (_, r2) = route(app, chat_request(), now=10.0)
    hdrs = set_headers(r2)  # type: ignore[arg-type]
    cluster, rid = hdrs[ROUTE_HEADER], hdrs[REQUEST_ID_HEADER]
    o = _observe(app, rid, [
        (10.05, headers_msg({":status": "200", "content-type": "text/event-stream"},
                            response=True, observe=True)),
        (10.2, body_msg(token("a"), eos=False, response=True, observe=True)),
        (10.22, body_msg(token("b"), eos=False, response=True, observe=True)),
        (10.24, body_msg(token("c") + sse({"choices": [], "usage": {"completion_tokens": 3}})
                         + b"data: [DONE]\n\n", eos=True, response=True, observe=True)),
    ])
    # The end of the body finalizes the observation (Envoy closes observability
    # streams only after a deferred-close delay).
    assert rid not in app.pending
    assert app.router.inflight(cluster) == 0
    assert app.router.counters[("outcome", "ok")] == 1
    s.close(10.3, cancelled=False)
    o.close(15.3, cancelled=False)
    assert app.router.counters[("outcome", "ok")] == 1
    series = app.router.stats.series(cluster, SliceKey("m", "interactive", "short", True))
    assert series is not None and series.count("ttft", 10.3) == 1


def test_route_close_before_observer_end_waits_a_grace() -> None:
    """The two gRPC streams are unordered: the end may arrive after the route closes."""
    app = App.create(parse_config(base_config_dict(), "t.yaml"), seed=1)
    s, (_, r2) = route(app, chat_request(), now=0.0)
    rid = set_headers(r2)[REQUEST_ID_HEADER]  # type: ignore[arg-type]
    o = _observe(app, rid, [
        (0.1, headers_msg({":status": "200", "content-type": "text/event-stream"},
                          response=True, observe=True)),
    ])
    s.close(0.5, cancelled=False)
    assert rid in app.pending and app.pending[rid].released
    o.on_message(body_msg(token("a") + b"data: [DONE]\n\n", eos=True, response=True,
                          observe=True), 0.6)
    assert app.router.counters[("outcome", "ok")] == 1 and not app.pending


def test_observer_that_never_ends_is_cancel_after_grace(app: App) -> None:
    s, (_, r2) = route(app, chat_request(), now=0.0)
    rid = set_headers(r2)[REQUEST_ID_HEADER]  # type: ignore[arg-type]
    _observe(app, rid, [(0.1, headers_msg({":status": "200"}, response=True, observe=True))])
    s.close(0.5, cancelled=True)
    app.tick(1.0)
    assert rid in app.pending
    app.tick(3.0)
    # No token after 3 s (over the 1 s interactive budget): a client-side timeout.
    assert not app.pending and app.router.counters[("outcome", "timeout")] == 1


def test_client_cancel_mid_stream_counts_cancel(app: App) -> None:
    s, (_, r2) = route(app, chat_request(), now=0.0)
    rid = set_headers(r2)[REQUEST_ID_HEADER]  # type: ignore[arg-type]
    o = _observe(app, rid, [
        (0.1, headers_msg({":status": "200", "content-type": "text/event-stream"},
                          response=True, observe=True)),
        (0.2, body_msg(token("a"), eos=False, response=True, observe=True)),
    ])
    s.close(0.3, cancelled=True)
    o.close(0.3, cancelled=True)
    assert app.router.counters[("outcome", "cancel")] == 1
    assert not app.pending


def test_upstream_timeout_504_counts_timeout(app: App) -> None:
    s, (_, r2) = route(app, chat_request(), now=0.0)
    rid = set_headers(r2)[REQUEST_ID_HEADER]  # type: ignore[arg-type]
    o = _observe(app, rid, [
        (5.0, headers_msg({":status": "504", "content-type": "text/plain"}, response=True,
                          observe=True)),
        (5.0, body_msg(b"upstream request timeout", eos=True, response=True, observe=True)),
    ])
    o.close(5.0, cancelled=False)
    s.close(5.0, cancelled=False)
    assert app.router.counters[("outcome", "timeout")] == 1


@pytest.mark.parametrize(("closed_at", "outcome"), [(0.5, "cancel"), (5.0, "timeout")])
def test_sidecar_stream_closed_by_envoy_before_response(
    app: App, closed_at: float, outcome: str
) -> None:
    """Given up before the 1 s interactive budget: a cancel, no evidence. After it:
    the caller waited longer than the SLO allows, a client-side timeout."""
    s, _ = route(app, chat_request())
    s.close(closed_at, cancelled=True)
    assert not app.pending and app.router.counters[("outcome", outcome)] == 1


def test_explain_header_on_request(app: App) -> None:
    s, _ = route(app, chat_request(), headers={"x-tailroute-explain": "1"})
    r = s.on_message(headers_msg({":status": "200"}, response=True), 0.1)
    assert r is not None
    ex = json.loads(set_headers(r)["x-tailroute-explain-result"])
    assert {c["c"] for c in ex["candidates"]} == {"a", "b", "c"}
    assert ex["slice"] == "m|interactive|short|stream"
