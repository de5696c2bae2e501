"""The ext_proc stream handlers and the access-log feed, driven in memory (no gRPC, no Envoy)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from sidecar.core.config import parse_config
from sidecar.core.envoy_log import LogRecord
from sidecar.core.types import CandidateExplain, Decision, Explain, Observation, SliceKey
from sidecar.pb.envoy.data.accesslog.v3 import accesslog_pb2 as al
from sidecar.shell.access_log import record_from_entry
from sidecar.shell.app import LOG_GRACE_S, App
from sidecar.shell.envoy_contract import DEFAULT_ROUTE, ROUTE_HEADER
from sidecar.shell.explain_header import EXPLAIN_MAX_CHARS, explain_json
from sidecar.shell.extproc import RouteStream
from sidecar.shell.observe import ObserveStream
from sidecar.shell.outcomes import OutcomeFeed
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
    set_headers,
    sse,
    token,
)

SLICE = SliceKey("m", "interactive", "short", True)
SSE_HEADERS = {":status": "200", "content-type": "text/event-stream"}


def make_app(share: float = 0.0, min_samples: int = 0) -> App:
    """Percentiles from the first sample; no first-token sampling unless asked for."""
    data = base_config_dict(stats={"min_samples": 1},
                            timing={"token_sample_share": share, "token_sample_min": min_samples})
    return App.create(parse_config(data, "t.yaml"), seed=1)


@pytest.fixture
def app() -> App:
    return make_app()


def fast(app: App, body: bytes, headers: dict[str, str] | None = None,
         now: float = 0.0) -> tuple[RouteStream, object]:
    s = RouteStream(app)
    return s, s.on_message(body_only_msg(body, headers), now)


def rich(app: App, body: bytes, headers: dict[str, str] | None = None,
         now: float = 0.0) -> tuple[RouteStream, list[object]]:
    s = RouteStream(app)
    out = [s.on_message(headers_msg({**POST_CHAT, **(headers or {})}), now),
           s.on_message(body_msg(body), now)]
    return s, out


def entry(rid: str | None, status: int = 200, first_body_s: float | None = 0.1,
          end_s: float | None = 0.3, tokens: int | None = 5, flags: frozenset[str] = frozenset(),
          route: str | None = None, slice_label: str | None = None,
          details: str = "via_upstream", path: str = "/v1/chat/completions",
          upstream: str = "") -> LogRecord:
    return LogRecord(status=status, flags=flags, details=details, method="POST", path=path,
                     duration_s=0.35, upstream_tx_s=0.01, first_body_s=first_body_s,
                     end_s=end_s, tokens=tokens, rid=rid, route_key=route,
                     slice_label=slice_label, upstream_cluster=upstream)


def test_one_message_path_routes_by_metadata(app: App) -> None:
    s, resp = fast(app, chat_request(), {"x-tailroute-class": "batch"})
    assert resp.WhichOneof("response") == "request_body"  # type: ignore[attr-defined]
    meta = metadata(resp)  # type: ignore[arg-type]
    cluster, klass, sampled = meta["route"].split("|")
    assert cluster in {"a", "b", "c"} and klass == "batch" and sampled in {"n", "s"}
    assert meta["slice"] == "m|batch|short|stream" and meta["rid"] == s.rid
    common = resp.request_body.response  # type: ignore[attr-defined]
    # Envoy re-picks the route only after an answer with a header mutation.
    assert list(common.header_mutation.remove_headers) == [ROUTE_HEADER]
    # A stream gets no whole-answer timeout (its route's idle timeout bounds silences).
    assert not common.header_mutation.set_headers
    assert app.router.inflight(cluster) == 1 and s.rid in app.pending


def test_an_unstreamed_answer_takes_the_route_with_the_class_timeout(app: App) -> None:
    """Envoy drops a body response's header mutations on the one-message path, so an
    unstreamed answer's whole-answer timeout comes from its route: the metadata marks
    it (tailroute.unary), a stream's does not (its route bounds only its silences)."""
    _s, resp = fast(app, chat_request(stream=False), {"x-tailroute-class": "batch"})
    assert metadata(resp)["unary"] == "1"  # type: ignore[arg-type]
    _s, resp = fast(app, chat_request(), {"x-tailroute-class": "batch"})
    assert "unary" not in metadata(resp)  # type: ignore[arg-type]


def test_rich_path_sets_the_deadline_as_upstream_timeout(app: App) -> None:
    _s, (r1, r2) = rich(app, chat_request(), {"x-tailroute-deadline-ms": "750"})
    assert r1.WhichOneof("response") == "request_headers"  # type: ignore[attr-defined]
    assert set_headers(r2)["x-envoy-upstream-rq-timeout-ms"] == "750"  # type: ignore[arg-type]
    assert routed_cluster(r2) in {"a", "b", "c"}  # type: ignore[arg-type]


@pytest.mark.parametrize(("deadline", "bounded"), [("900000", True), (None, False)])
def test_a_stream_with_a_deadline_takes_the_route_its_deadline_caps(
    app: App, deadline: str | None, bounded: bool
) -> None:
    """A stream with a caller's deadline takes the route whose whole-answer timeout
    the header overrides (tailroute.unary), not the stream route whose safety net
    (20 class timeouts: 10 minutes for interactive) would cut a deadline of 15 minutes
    there; a stream without one keeps the stream route."""
    headers = {} if deadline is None else {"x-tailroute-deadline-ms": deadline}
    _s, (_r1, r2) = rich(app, chat_request(), headers)
    assert ("unary" in metadata(r2)) is bounded  # type: ignore[arg-type]
    timeout = set_headers(r2).get("x-envoy-upstream-rq-timeout-ms")  # type: ignore[arg-type]
    assert (timeout == deadline) if bounded else timeout is None


def test_get_without_body_goes_to_default_route(app: App) -> None:
    s = RouteStream(app)
    r = s.on_message(headers_msg({":method": "GET", ":path": "/v1/models"}, eos=True), 0.0)
    assert r is not None and routed_cluster(r) == "a"  # type: ignore[arg-type]
    # Not an LLM API: the default route by design, not a fail-open (README).
    assert app.router.counters[("decision", "not_llm")] == 1
    assert not any(k.startswith("failopen:") for k in app.shell_counters())


@pytest.mark.parametrize("body", [
    b"{not json", b"[]", b'{"model": 1}', b'{"stream": "x"}',
    # Not JSON, though json.loads reads them; a model rewrite wrote them back as NaN and
    # Infinity (1e400 overflows a double), which no upstream's JSON parser accepts.
    b'{"model": "m", "temperature": NaN}', b'{"model": "m", "temperature": 1e400}'])
def test_malformed_body_gets_400(app: App, body: bytes) -> None:
    _, r = fast(app, body)
    assert r.WhichOneof("response") == "immediate_response"  # type: ignore[attr-defined]
    ir = r.immediate_response  # type: ignore[attr-defined]
    assert ir.status.code == 400
    # OpenAI's error object: its four fields, `code` a string (typed clients refuse an
    # integer), here the tailroute_errors_total kind.
    assert json.loads(ir.body)["error"] == {
        "message": json.loads(ir.body)["error"]["message"], "type": "invalid_request_error",
        "param": None, "code": "bad_request"}
    assert metadata(r)["rid"] and not app.pending  # type: ignore[arg-type]


def test_gzip_body_gets_the_400_that_names_the_compression(app: App) -> None:
    """Python's gzip writes a zero flag byte fourth: the UTF-16/32 screen (a zero among
    the first four bytes) used to answer first, "not UTF-8", which hides what to fix."""
    import gzip

    for route in (fast, rich):
        _, r = route(app, gzip.compress(chat_request()))
        answer = r[-1] if isinstance(r, list) else r
        ir = answer.immediate_response  # type: ignore[attr-defined]
        assert ir.status.code == 400
        error = json.loads(ir.body)["error"]
        assert "gzip-compressed" in error["message"] and error["code"] == "bad_request"


def test_unknown_model_continues_to_default_route(app: App) -> None:
    _, r = fast(app, chat_request(model="who-knows"))
    assert routed_cluster(r) == "a"  # type: ignore[arg-type]


def test_an_unknown_model_is_remembered_bounded(app: App) -> None:
    """64 requests with 4 MiB unknown model names held 256 MiB in the decision ring."""
    s, _ = fast(app, chat_request(model="z" * (1 << 20)))
    s.close(0.1, cancelled=False)
    recent = app.router.recent[-1]
    assert len(recent.request.model or "") == 257 and len(recent.decision.detail) == 257


def test_oversized_body_is_not_parsed_and_goes_default(app: App) -> None:
    big = b'{"model": "m", "x": "' + b"y" * (app.config.limits.max_body_bytes + 1) + b'"}'
    _, r = fast(app, big)
    assert routed_cluster(r) == "a"  # type: ignore[arg-type]
    assert app.errors["body_too_large"] == 1
    # One request, one fail-open reason (its decision also reads "unknown model").
    failopen = {k: v for k, v in app.shell_counters().items() if k.startswith("failopen:")}
    assert failopen == {"failopen:body_too_large": 1}


def _solo_c() -> App:
    data = base_config_dict(timing={"token_sample_min": 0, "token_sample_share": 0.0})
    data["models"][0]["candidates"] = ["c"]
    return App.create(parse_config(data, "t.yaml"), seed=1)


def test_model_rewritten_for_cluster_with_other_name_on_both_paths() -> None:
    app = _solo_c()
    _, r = fast(app, chat_request())
    common = r.request_body.response  # type: ignore[attr-defined]
    assert json.loads(common.body_mutation.body)["model"] == "m-upstream"
    _, (_, r2) = rich(app, chat_request(), {"x-tailroute-explain": "1"})
    common = r2.request_body.response  # type: ignore[attr-defined]
    assert json.loads(common.body_mutation.body)["model"] == "m-upstream"
    assert set_headers(r2)["content-length"] == str(len(common.body_mutation.body))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "msgs",
    [
        [headers_msg({"x": "y"}, response=True)],  # response headers first
        [body_msg(b"x", response=True)],
        [headers_msg(POST_CHAT), headers_msg(POST_CHAT)],  # headers twice
        [body_only_msg(chat_request()), body_msg(b"x")],  # body twice
    ],
)
def test_unexpected_order_never_raises(app: App, msgs: list[object]) -> None:
    s = RouteStream(app)
    for m in msgs:
        assert s.on_message(m, 0.0) is not None  # type: ignore[arg-type]
    s.close(1.0, cancelled=True)


def test_a_decision_envoy_routed_elsewhere_is_not_evidence(app: App) -> None:
    """A bootstrap without the decision's route (not re-rendered after a new class,
    hand-written) sends it down another route: counted, warned, not a sample."""
    s, r = fast(app, chat_request(), now=10.0)
    cluster = routed_cluster(r)  # type: ignore[arg-type]
    other = next(c for c in ("a", "b", "c") if c != cluster)
    s.close(10.4, cancelled=False)
    OutcomeFeed(app)(entry(s.rid, upstream=other), 10.5)
    assert not app.pending and app.envoy["misrouted"] == 1
    assert app.router.counters[("outcome", "ok")] == 0
    assert app.router.stats.series(cluster, SLICE) is None
    assert app.router.stats.series(other, SLICE) is None
    assert app.envoy_view(10.5)["misrouted"] == 1
    # The same entry naming the decided cluster is the decision's evidence.
    s2, r2 = fast(app, chat_request(), now=11.0)
    s2.close(11.4, cancelled=False)
    OutcomeFeed(app)(entry(s2.rid, upstream=routed_cluster(r2)), 11.5)  # type: ignore[arg-type]
    assert app.envoy["misrouted"] == 1 and app.router.counters[("outcome", "ok")] == 1


@pytest.mark.parametrize("route_name", [DEFAULT_ROUTE, "tailroute/m.interactive.short/len", ""])
def test_a_decision_envoy_sent_down_the_default_route_is_misrouted_even_to_its_cluster(
    app: App, route_name: str,
) -> None:
    """A bootstrap rendered before the decision's class existed has no route for its
    key, so Envoy takes a route for undecided requests (the default route; hybrid: a
    slice route); when that reaches the decided cluster the upstream cluster agrees, and
    the request counted as routed (no class timeout, no sampling applied). Named by its
    route, it is misrouted now; an entry without a route name (a hand-written logger) is
    judged by its cluster alone."""
    s, r = fast(app, chat_request(), now=10.0)
    cluster, key = routed_cluster(r), metadata(r)["route"]  # type: ignore[arg-type]
    s.close(10.4, cancelled=False)
    rec = replace(entry(s.rid, upstream=cluster, route=key), route_name=route_name)
    OutcomeFeed(app)(rec, 10.5)
    assert app.envoy["misrouted"] == (1 if route_name else 0)
    assert app.router.counters[("outcome", "ok")] == (0 if route_name else 1)
    # The same on an entry another process's decision left here (orphan).
    OutcomeFeed(app)(replace(rec, rid="0123abcd-1"), 10.6)
    assert app.envoy["orphan"] == 1
    assert app.envoy["misrouted"] == (2 if route_name else 0)
    # The decision's own route is routed as decided.
    OutcomeFeed(app)(replace(rec, rid="0123abcd-2", route_name=f"tailroute|{key}"), 10.7)
    assert app.envoy["misrouted"] == (2 if route_name else 0)


def test_access_log_entry_becomes_the_observation(app: App) -> None:
    s, r = fast(app, chat_request(), now=10.0)
    cluster = routed_cluster(r)  # type: ignore[arg-type]
    s.close(10.4, cancelled=False)  # the request is over: no longer in flight
    assert app.router.inflight(cluster) == 0 and s.rid in app.pending
    OutcomeFeed(app)(entry(s.rid, first_body_s=0.2, end_s=0.5, tokens=4), 10.5)
    assert not app.pending and app.router.counters[("outcome", "ok")] == 1
    series = app.router.stats.series(cluster, SLICE)
    assert series is not None and series.count("ttft", 10.5) == 1
    assert series.quantile("ttft", 0.5, 10.5) == pytest.approx(0.2, rel=0.03)
    assert series.quantile("tpot", 0.5, 10.5) == pytest.approx(0.1, rel=0.03)
    assert series.quantile("e2e", 0.5, 10.5) == pytest.approx(0.5, rel=0.03)


def test_the_observation_carries_the_routes_load_when_sent(app: App) -> None:
    """The access-log observation of a routed request says how loaded its route was
    when it was released (the light-load book, sidecar.core.light_load, needs it)."""
    seen: list[Observation] = []
    app.on_observation = lambda obs, api: seen.append(obs)
    s, _ = fast(app, chat_request(), now=1.0)
    s.close(1.2, cancelled=False)
    OutcomeFeed(app)(entry(s.rid), 1.3)
    for c in app.config.clusters:  # three in flight on every route: sent under load
        for _ in range(3):
            app.router.started(c.name)
    s2, r2 = fast(app, chat_request(), now=2.0)
    s2.close(2.2, cancelled=False)
    OutcomeFeed(app)(entry(s2.rid), 2.3)
    limit = app.config.cluster(routed_cluster(r2)).max_concurrency  # type: ignore[arg-type]
    assert [o.sent_load for o in seen] == [0.0, pytest.approx(3 / limit)]


def test_entry_before_stream_close_releases_the_slot_once(app: App) -> None:
    s, r = fast(app, chat_request())
    cluster = routed_cluster(r)  # type: ignore[arg-type]
    app.router.started(cluster)  # another request in flight on the same cluster
    OutcomeFeed(app)(entry(s.rid), 0.4)
    s.close(0.5, cancelled=False)
    assert app.router.inflight(cluster) == 1


@pytest.mark.parametrize(("flags", "status", "tokens", "outcome"), [
    # Left mid-answer (no usage event yet), or before any answer.
    (frozenset({"downstream_connection_termination"}), 200, None, "cancel"),
    (frozenset({"downstream_remote_reset"}), 0, None, "cancel"),
    # Left after the usage event, as the OpenAI SDK does at [DONE]: complete.
    (frozenset({"downstream_connection_termination"}), 200, 5, "ok"),
    (frozenset({"upstream_request_timeout"}), 504, 5, "timeout"),
    (frozenset({"upstream_connection_failure"}), 503, 5, "error"),
    (frozenset(), 500, 5, "error"),
    (frozenset(), 200, 5, "ok"),
])
def test_outcome_comes_from_status_and_response_flags(
    app: App, flags: frozenset[str], status: int, tokens: int | None, outcome: str
) -> None:
    s, _ = fast(app, chat_request())
    s.close(0.1, cancelled=False)
    OutcomeFeed(app)(entry(s.rid, status=status, flags=flags, end_s=None, tokens=tokens), 0.2)
    assert app.router.counters[("outcome", outcome)] == 1


def _sampled_app() -> App:
    return make_app(share=1.0, min_samples=1)


def _observe(app: App, meta: dict[str, str], events: list[tuple[float, object]]) -> list[bool]:
    o = ObserveStream(app)
    return [o.on_message(m, now) for now, m in events]  # type: ignore[arg-type]


def test_sampled_request_gets_its_exact_first_token_time() -> None:
    app = _sampled_app()
    s, r = fast(app, chat_request(), now=0.0)
    meta = metadata(r)  # type: ignore[arg-type]
    assert meta["route"].endswith("|s")
    role_only = sse({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
    stops = _observe(app, meta, [
        (0.01, observe_msg("response_headers", meta, SSE_HEADERS)),
        (0.02, observe_msg("response_body", meta, body=role_only)),
        (0.07, observe_msg("response_body", meta, body=token("a"))),
    ])
    assert stops == [False, False, True]  # the stream is closed at the first token
    s.close(0.3, cancelled=False)
    # Envoy saw the first body byte (the role-only event) 20 ms after t0.
    OutcomeFeed(app)(entry(s.rid, first_body_s=0.02, end_s=0.3, tokens=6), 0.4)
    cluster = routed_cluster(r)  # type: ignore[arg-type]
    series = app.router.stats.series(cluster, SLICE)
    assert series is not None
    assert series.quantile("ttft", 0.5, 0.4) == pytest.approx(0.07, rel=0.03)
    assert app.offsets.offset(cluster, SLICE) == pytest.approx(0.05)


def test_entry_waits_for_a_sampled_observer_then_uses_its_offset() -> None:
    app = _sampled_app()
    s, r = fast(app, chat_request(), now=0.0)
    meta = metadata(r)  # type: ignore[arg-type]
    s.close(0.3, cancelled=False)
    OutcomeFeed(app)(entry(s.rid, first_body_s=0.02), 0.35)
    assert s.rid in app.pending  # held: the first-token time may still come
    _observe(app, meta, [
        (0.36, observe_msg("response_headers", meta, SSE_HEADERS)),
        (0.37, observe_msg("response_body", meta, body=token("a"))),
    ])
    assert not app.pending and app.router.counters[("outcome", "ok")] == 1


def test_settle_all_observes_entries_and_counts_the_rest_lost() -> None:
    """At shutdown: a sampled request whose entry came but whose first-token time did
    not is observed from the entry alone; one still streaming is counted lost. Both
    leave ``pending`` and their in-flight slots."""
    app = _sampled_app()
    done, r = fast(app, chat_request(), now=0.0)
    done.close(0.3, cancelled=False)
    OutcomeFeed(app)(entry(done.rid, first_body_s=0.02), 0.35)
    assert done.rid in app.pending  # held for the observer
    fast(app, chat_request(), now=0.1)  # still streaming: no entry
    assert app.settle_all(0.4) == (1, 1)
    assert not app.pending and app.router.counters[("outcome", "ok")] == 1
    assert app.envoy["lost"] == 1
    assert all(app.router.inflight(c) == 0 for c in ("a", "b", "c"))
    series = app.router.stats.series(routed_cluster(r), SLICE)  # type: ignore[arg-type]
    assert series is not None and series.count("e2e", 0.4) == 1
    assert app.settle_all(0.5) == (0, 0)


def _known_offsets(offset_s: float) -> App:
    app = _sampled_app()
    for c in ("a", "b", "c"):
        app.offsets.add(c, SLICE, offset_s)
    app.offsets.reconfigure(share=0.0, min_samples=1, blind_share=0.0)
    return app


def test_small_offset_corrects_unsampled_requests_of_the_route() -> None:
    app = _known_offsets(0.001)  # e.g. a preamble event just before the first token
    s, r = fast(app, chat_request())
    assert metadata(r)["route"].endswith("|n")  # type: ignore[arg-type]
    s.close(0.3, cancelled=False)
    OutcomeFeed(app)(entry(s.rid, first_body_s=0.02), 0.4)
    series = app.router.stats.series(routed_cluster(r), SLICE)  # type: ignore[arg-type]
    assert series is not None
    assert series.quantile("ttft", 0.5, 0.4) == pytest.approx(0.021, rel=0.03)


def test_blind_route_takes_ttft_from_sampled_requests_only() -> None:
    """A role-only event first: the first body byte says nothing about the token, and a
    median offset would flatten the tail; unsampled requests give e2e and TPOT only."""
    app = _known_offsets(0.05)
    assert app.offsets.blind("a", SLICE)
    s, r = fast(app, chat_request())
    s.close(0.3, cancelled=False)
    OutcomeFeed(app)(entry(s.rid, first_body_s=0.02, end_s=0.3, tokens=6), 0.4)
    series = app.router.stats.series(routed_cluster(r), SLICE)  # type: ignore[arg-type]
    assert series is not None
    assert series.count("ttft", 0.4) == 0 and series.count("e2e", 0.4) == 1
    assert series.quantile("tpot", 0.5, 0.4) == pytest.approx((0.3 - 0.07) / 5, rel=0.03)


def _left_after(app: App, body: bytes, headers: dict[str, str] = SSE_HEADERS,
                left_at: float = 8.0, broken: bool = False) -> Observation:
    """A sampled stream whose observer reads ``body`` (at 20 ms) until the client leaves
    at ``left_at`` (Envoy then ends the observing stream too); its entry says so.
    ``broken``: the observer raised after reading ``body`` (the server closes it)."""
    s, r = fast(app, chat_request(), now=0.0)
    meta = metadata(r)  # type: ignore[arg-type]
    o = ObserveStream(app)
    o.on_message(observe_msg("response_headers", meta, headers), 0.01)
    o.on_message(observe_msg("response_body", meta, body=body), 0.02)
    if broken:
        o.broken = True  # as the server marks it
        o.close(0.03, cancelled=False)
    else:
        o.close(left_at, cancelled=True)
    s.close(left_at, cancelled=False)
    seen: list[Observation] = []
    app.on_observation = lambda obs, api: seen.append(obs)
    OutcomeFeed(app)(LogRecord(
        status=200, flags=frozenset({"downstream_remote_reset"}), details="via_upstream",
        method="POST", path="/v1/chat/completions", duration_s=left_at + 0.01,
        upstream_tx_s=0.01, first_body_s=0.02, end_s=None, tokens=None, rid=s.rid),
        left_at + 0.1)
    assert len(seen) == 1
    return seen[0]


def test_a_client_that_left_a_sampled_stream_without_a_token_waited_that_long() -> None:
    """The observer read a role-only event and a keep-alive comment, then the client left
    at 8 s without a token (1 s TTFT budget). Its TTFT is at least the 8 s it waited (a
    censored lower bound), so it is a client-side timeout, not a user pressing stop: the
    first body byte says nothing about a token this very stream never carried. Before,
    the first body byte plus the route's offset (20 ms) made it a cancel, dropped."""
    app = _sampled_app()
    role = sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    obs = _left_after(app, role + b": keep-alive\n\n")
    assert obs.outcome == "cancel" and obs.censored
    assert obs.ttft_s == pytest.approx(8.0) and obs.e2e_s == pytest.approx(8.0)
    assert app.router.counters[("outcome", "timeout")] == 1
    # A token read in time: the client's leaving says nothing about the route.
    app = _sampled_app()
    obs = _left_after(app, role + token("a"))
    assert obs.ttft_s == pytest.approx(0.02)
    assert app.router.counters[("outcome", "cancel")] == 1
    # Unread (compressed): nothing is known about tokens, the entry's reading stands.
    app = _sampled_app()
    obs = _left_after(app, b"\x1f\x8b", {**SSE_HEADERS, "content-encoding": "gzip"})
    assert obs.ttft_s == pytest.approx(0.02)
    assert app.router.counters[("outcome", "cancel")] == 1
    # Read in part (the observer raised, then was closed): the same.
    app = _sampled_app()
    obs = _left_after(app, role, broken=True)
    assert obs.ttft_s == pytest.approx(0.02)
    assert app.router.counters[("outcome", "cancel")] == 1


def test_a_complete_sampled_stream_without_a_token_has_no_first_token_time() -> None:
    """A 200 stream read to its end with only a role-only event (an empty or filtered
    answer): nothing to date a first token by, as the in-process timer says too. Before,
    its first body byte plus the route's offset was a 20 ms TTFT sample."""
    app = _sampled_app()
    s, r = fast(app, chat_request(), now=0.0)
    meta = metadata(r)  # type: ignore[arg-type]
    role = sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    _observe(app, meta, [
        (0.01, observe_msg("response_headers", meta, SSE_HEADERS)),
        (0.02, observe_msg("response_body", meta, body=role)),
        (0.5, observe_msg("response_body", meta, body=b"data: [DONE]\n\n", eos=True)),
    ])
    s.close(0.5, cancelled=False)
    seen: list[Observation] = []
    app.on_observation = lambda obs, api: seen.append(obs)
    OutcomeFeed(app)(LogRecord(
        status=200, flags=frozenset(), details="via_upstream", method="POST",
        path="/v1/chat/completions", duration_s=0.51, upstream_tx_s=0.01, first_body_s=0.02,
        end_s=0.5, tokens=None, rid=s.rid), 0.6)
    assert len(seen) == 1 and seen[0].outcome == "ok"
    assert seen[0].ttft_s is None and seen[0].tpot_s is None
    assert seen[0].e2e_s == pytest.approx(0.5)


def _outcomes(app: App) -> int:
    return sum(v for (k, _), v in app.router.counters.items() if k == "outcome")


def test_missing_entry_is_swept_and_counted_lost_once(app: App) -> None:
    """No entry within the grace: ``lost`` (no outcome); the entry arriving after all is
    ``late`` and not observed, so the request is still counted exactly once."""
    s, _ = fast(app, chat_request())
    s.close(1.0, cancelled=False)
    app.tick(1.0 + LOG_GRACE_S - 1)
    assert s.rid in app.pending
    assert app.envoy_view(LOG_GRACE_S)["access_log"] == "silent"
    app.tick(1.0 + LOG_GRACE_S + 1)
    assert not app.pending and app.envoy["lost"] == 1 and _outcomes(app) == 0
    assert app.shell_counters()["outcome:lost"] == 1
    OutcomeFeed(app)(entry(s.rid, route="a|interactive|n", slice_label=SLICE.label()),
                     2.0 + LOG_GRACE_S)
    assert app.envoy["late"] == 1 and app.envoy["orphan"] == 0 and _outcomes(app) == 0


def test_finished_requests_waiting_for_entries_are_bounded(app: App) -> None:
    """The access log is down: finished requests pile up at the request rate; past the
    cap the oldest are given up at once (lost), the in-flight slots all released."""
    app.waiting.cap = 8
    streams = []
    for i in range(20):
        s, _ = fast(app, chat_request())
        s.close(0.1 * i, cancelled=False)
        streams.append(s)
    assert len(app.pending) == 8 and len(app.waiting) == 8 and app.envoy["lost"] == 12
    assert all(app.router.inflight(c) == 0 for c in app.config.cluster_names)
    assert app.envoy_view(2.0)["oldest_wait_s"] == pytest.approx(2.0 - 1.2)
    feed = OutcomeFeed(app)
    for s in streams:  # the log comes back and delivers everything
        feed(entry(s.rid, route="a|interactive|n", slice_label=SLICE.label()), 3.0)
    assert app.envoy["late"] == 12 and _outcomes(app) == 8 and not app.pending
    assert app.envoy_view(3.0)["oldest_wait_s"] == 0.0


def test_access_log_status_says_whether_entries_flow(app: App) -> None:
    assert app.envoy_view(0.0)["access_log"] == "no_stream"  # nothing sent yet
    app.envoy["log_streams_open"] = 1
    s, _ = fast(app, chat_request())
    s.close(1.0, cancelled=False)
    assert app.envoy_view(1.5)["access_log"] == "ok"
    assert app.envoy_view(1.0 + app.silent_after_s() + 0.1)["access_log"] == "silent"
    feed = OutcomeFeed(app)
    feed(entry(None), 7.0)  # entries flow again (this one's is still missing)
    assert app.envoy_view(7.5)["access_log"] == "ok"
    assert app.envoy_view(7.0 + app.silent_after_s() + 0.1)["access_log"] == "silent"
    feed(entry(s.rid), 13.0)
    assert app.envoy_view(20.0)["access_log"] == "ok"


def test_entries_tailroute_never_decided_are_counted_as_envoy_fail_open(app: App) -> None:
    feed = OutcomeFeed(app)
    feed(entry(None, upstream="a"), 0.0)
    feed(LogRecord(status=200, method="GET", path="/healthz"), 0.0)
    assert app.envoy["fail_open"] == 1 and app.envoy["not_routed"] == 1
    assert app.shell_counters()["failopen:envoy"] == 1


def test_a_post_without_a_body_envoy_never_asked_about_is_no_fail_open(app: App) -> None:
    """The one-message path's filter waits for a body: an empty POST never reaches the
    sidecar, which would have answered ``not_llm`` (the rich path does). It used to count
    as Envoy failing open, toward the TailrouteEnvoyFailOpen page."""
    e = al.HTTPAccessLogEntry()
    e.common_properties.upstream_cluster = "a"
    e.request.request_method = 3  # POST
    e.request.path = "/v1/chat/completions"
    e.request.request_body_bytes = 0
    e.response.response_code.value = 400
    OutcomeFeed(app)(record_from_entry(e), 0.0)
    assert app.envoy["not_routed"] == 1 and app.envoy["fail_open"] == 0
    assert "failopen:envoy" not in app.shell_counters()
    e.request.request_body_bytes = 120  # the same request with its body: a fail-open
    OutcomeFeed(app)(record_from_entry(e), 0.0)
    assert app.envoy["fail_open"] == 1


@pytest.mark.parametrize(
    ("rec", "kind"),
    [
        # Over Envoy's buffer limit: Envoy answers 413 before any route is taken.
        (entry(None, status=413, details="request_payload_too_large", first_body_s=None,
               end_s=None, tokens=None, upstream=""), "unrouted"),
        # The client went away mid-upload: no response, no upstream.
        (entry(None, status=0, flags=frozenset({"downstream_connection_termination"}),
               details="downstream_remote_disconnect", first_body_s=None, end_s=None,
               tokens=None, upstream=""), "unrouted"),
        # Sent to the default cluster without a decision: a fail-open, even if it failed.
        (entry(None, status=503, flags=frozenset({"upstream_connection_failure"}),
               first_body_s=None, end_s=None, tokens=None, upstream="a"), "fail_open"),
    ],
)
def test_an_undecided_llm_request_is_a_fail_open_only_if_envoy_routed_it(
        app: App, rec: LogRecord, kind: str) -> None:
    """The TailrouteEnvoyFailOpen page counts requests served without a decision; one
    Envoy answered itself (a client's oversize body, a client gone) is not one."""
    OutcomeFeed(app)(rec, 0.0)
    assert app.envoy[kind] == 1 and sum(app.envoy[k] for k in ("fail_open", "unrouted")) == 1
    assert app.envoy_view(0.0)[kind] == 1
    assert ("failopen:envoy" in app.shell_counters()) == (kind == "fail_open")


def test_orphan_entry_is_observed_from_its_own_metadata(app: App) -> None:
    """Another process decided it (or this one restarted): the entry still says enough."""
    OutcomeFeed(app)(entry("other-1", route="b|interactive|n", slice_label=SLICE.label()), 0.0)
    assert app.envoy["orphan"] == 1 and app.router.counters[("outcome", "ok")] == 1
    assert app.router.stats.series("b", SLICE) is not None


@pytest.mark.parametrize("upstream", ["a", "c"])
def test_an_orphan_entry_envoy_routed_elsewhere_is_counted_not_evidence(
    upstream: str,
) -> None:
    """Another process decided b (workers, replicas, or this one before a restart), and
    Envoy's bootstrap, lacking that route, sent the request to ``upstream``: misrouted,
    as for a request decided here, and its timing is about neither cluster. Read as b's,
    it put a's (or c's) latencies and errors into b's statistics, uncounted."""
    app = make_app()
    data = base_config_dict(stats={"min_samples": 1}, fleet={"url": "redis://127.0.0.1:1/0"})
    fleet_app = App.create(parse_config(data, "t.yaml"), seed=1)
    for a in (app, fleet_app):
        rec = entry("0123abcd-7", route="b|interactive|n", slice_label=SLICE.label(),
                    upstream=upstream)
        OutcomeFeed(a)(rec, 0.0)
        assert a.envoy["orphan"] == 1 and a.envoy["misrouted"] == 1
        assert a.envoy_view(0.0)["misrouted"] == 1
        assert not a.router.counters[("outcome", "ok")]
        assert a.router.stats.series("b", SLICE) is None
        assert a.router.stats.series(upstream, SLICE) is None
    # The decider still hears that the entry came (it stops waiting: ``elsewhere``).
    assert fleet_app.forwards.take() == {"0123abcd": ["0123abcd-7"]}
    # The entry naming b itself is still b's evidence.
    OutcomeFeed(app)(entry("0123abcd-8", route="b|interactive|n", slice_label=SLICE.label(),
                           upstream="b"), 0.0)
    assert app.envoy["misrouted"] == 1 and app.router.counters[("outcome", "ok")] == 1


def test_admission_answer_entries_are_not_route_evidence(app: App) -> None:
    OutcomeFeed(app)(entry("x-1", status=429, details="tailroute_defer_overload"), 0.0)
    assert app.envoy["decided"] == 1 and not app.router.counters


@pytest.mark.parametrize("headers", [{"x-tailroute-explain": "1"},
                                     {"x-tailroute-deadline-ms": "750"}])
def test_the_rich_paths_answer_always_changes_a_header(
    app: App, headers: dict[str, str]
) -> None:
    """Envoy re-picks the route after a body answer only when it changes a header: a
    stream without a deadline (explain alone) has no header to set, and went to the
    default route (tests/test_integration_envoy.py, test_routing_is_honoured)."""
    _s, (_r1, r2) = rich(app, chat_request(), headers)
    common = r2.request_body.response  # type: ignore[attr-defined]
    assert common.clear_route_cache
    assert list(common.header_mutation.remove_headers) == [ROUTE_HEADER]


def test_explain_header_on_the_rich_path(app: App) -> None:
    s, (r1, _) = rich(app, chat_request(), headers={"x-tailroute-explain": "1"})
    assert r1.mode_override.response_header_mode == r1.mode_override.SEND  # type: ignore[attr-defined]
    r = s.on_message(headers_msg({":status": "200"}, response=True), 0.1)
    assert r is not None
    ex = json.loads(set_headers(r)["x-tailroute-explain-result"])  # type: ignore[arg-type]
    assert {c["c"] for c in ex["candidates"]} == {"a", "b", "c"}
    assert ex["slice"] == "m|interactive|short|stream"


def test_the_explain_header_with_many_candidates_is_whole_json() -> None:
    """It was cut at 4000 characters mid-JSON: with 20 candidates it did not parse."""
    names = [f"provider-{i:02d}-us-east" for i in range(20)]
    app = App.create(parse_config(base_config_dict(
        default_cluster=names[0],
        clusters=[{"name": n, "address": f"127.0.0.1:{9000 + i}", "models": ["m"]}
                  for i, n in enumerate(names)],
        models=[{"name": "m", "candidates": names}]), "t.yaml"), seed=1)
    s, _ = rich(app, chat_request(), headers={"x-tailroute-explain": "1"})
    r = s.on_message(headers_msg({":status": "200"}, response=True), 0.1)
    raw = set_headers(r)["x-tailroute-explain-result"]  # type: ignore[arg-type]
    assert len(raw) <= EXPLAIN_MAX_CHARS
    ex = json.loads(raw)
    assert len(ex["candidates"]) + ex["candidates_omitted"] == 20
    assert [c["c"] for c in ex["candidates"]] == names[:len(ex["candidates"])]


def _explained(candidates: int, notes: int, note_chars: int = 10) -> Decision:
    return Decision("a", "scored", explain=Explain(
        "m|interactive|short|stream",
        tuple(CandidateExplain(f"cluster-{i}", {"f": "pass"}, {"latency": 0.5})
              for i in range(candidates)),
        "weighted", tuple(f"{i}" + "n" * note_chars for i in range(notes))))


@pytest.mark.parametrize(
    ("candidates", "notes", "cap", "kept", "kept_notes"),
    [(3, 2, 4000, 3, 2),  # fits: no *_omitted keys
     (200, 2, 4000, None, None),  # candidates fill the header
     (3, 0, 250, 1, 0),  # room for one candidate
     (0, 500, 4000, 0, None),
     (1, 1, 0, 0, 0)],  # a cap below the head's length: the head and no more
)
def test_explain_json_is_whole_json_within_its_cap(
        candidates: int, notes: int, cap: int, kept: int | None, kept_notes: int | None
        ) -> None:
    text = explain_json(_explained(candidates, notes), cap)
    ex = json.loads(text)
    assert (ex["cluster"], ex["slice"]) == ("a", "m|interactive|short|stream")
    assert len(text) <= cap or cap == 0
    assert len(ex["candidates"]) + ex.get("candidates_omitted", 0) == candidates
    assert len(ex["notes"]) + ex.get("notes_omitted", 0) == notes
    if kept is not None:
        assert len(ex["candidates"]) == kept
    if kept_notes is not None:
        assert len(ex["notes"]) == kept_notes
    assert ("candidates_omitted" in ex) == (len(ex["candidates"]) < candidates)
    assert explain_json(Decision("a", "not_llm")) == '{"cluster":"a","reason":"not_llm"}'


def _counts(app: App, now: float) -> tuple[int, int]:
    """(misses, outcomes) in every live book at ``now``."""
    app.router.live.advance(now)
    books = list(app.router.live.books.values())
    for b in books:
        b.forget(now)
    return sum(b.k for b in books), sum(b.m for b in books)


def test_a_timed_stream_without_its_first_token_at_the_budget_is_a_miss_then() -> None:
    """Live misses in the shell (sidecar.core.live_misses): a sampled stream still
    without its first token when the 1 s TTFT budget passes is a miss at once; one whose
    observer saw the token in time waits for its entry, which says hit."""
    app = _sampled_app()
    for _ in range(2):
        fast(app, chat_request(), now=0.0)  # no token, no close: still waiting
    on_time, r = fast(app, chat_request(), now=0.0)
    meta = metadata(r)  # type: ignore[arg-type]
    _observe(app, meta, [(0.2, observe_msg("response_headers", meta, SSE_HEADERS)),
                         (0.3, observe_msg("response_body", meta, body=token("a")))])
    on_time.close(0.5, cancelled=False)
    OutcomeFeed(app)(entry(on_time.rid, first_body_s=0.3), 0.6)
    assert _counts(app, 0.99) == (0, 1)  # the hit, with its entry
    assert _counts(app, 1.0) == (2, 3)  # both late streams, at the budget


def test_an_untimed_stream_counts_with_its_entry_only(app: App) -> None:
    streams = [fast(app, chat_request(), now=0.0) for _ in range(3)]
    for s, _ in streams:
        s.close(5.0, cancelled=False)
    assert _counts(app, 5.0) == (0, 0)  # its first token may well have come in time
    for s, _ in streams:
        OutcomeFeed(app)(entry(s.rid, first_body_s=3.0, end_s=5.0), 5.1)
    assert _counts(app, 5.1) == (3, 3)


def test_a_lost_or_unreadable_request_resolves_nothing() -> None:
    app = _sampled_app()
    _, r = fast(app, chat_request(), now=0.0)
    meta = metadata(r)  # type: ignore[arg-type]
    gz = {**SSE_HEADERS, "content-encoding": "gzip"}
    _observe(app, meta, [(0.2, observe_msg("response_headers", meta, gz))])  # no token read
    lost, _ = fast(app, chat_request(), now=0.0)
    app.give_up(lost.rid, 0.5)
    assert _counts(app, 2.0) == (0, 0)


@pytest.mark.parametrize(("route_name", "counted"), [(DEFAULT_ROUTE, (0, 0)), ("", (0, 1))])
def test_a_request_down_the_default_route_is_no_live_hit_of_its_decided_route(
        route_name: str, counted: tuple[int, int]) -> None:
    """Misrouted by route (Envoy's default route to the decided cluster) is about
    neither route for the live-miss books either, as misrouted by cluster is: its
    token in time is no hit of the route it did not take."""
    app = _sampled_app()
    s, r = fast(app, chat_request(), now=0.0)
    meta = metadata(r)  # type: ignore[arg-type]
    _observe(app, meta, [(0.2, observe_msg("response_headers", meta, SSE_HEADERS)),
                         (0.3, observe_msg("response_body", meta, body=token("a")))])
    s.close(0.5, cancelled=False)
    rec = entry(s.rid, first_body_s=0.3, upstream=routed_cluster(r),  # type: ignore[arg-type]
                route=meta["route"])
    OutcomeFeed(app)(replace(rec, route_name=route_name), 0.6)
    assert _counts(app, 0.99) == counted
