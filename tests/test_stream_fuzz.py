"""A stateful fuzzer for the ext_proc stream handlers (hypothesis, in memory).

Random interleavings of many streams: messages of every kind in any order,
hostile headers and bodies of any size, response statuses and SSE of any
framing, admission holds and resumes, cancels and clean closes, clock jumps
and ticks. It speaks only message kinds and the handler interface of
:mod:`tests.streamharness` (``open_stream`` / ``on_message`` / ``resume`` /
``close``), so it outlives any rearrangement of the handlers.

Both routing paths (headers then body; the one-message body with headers as
request attributes) and observing streams carrying the forwarded metadata of
routed requests (intact, damaged or foreign) take part.

Checked on every step: no handler raises (the server would count a
``handler_exception`` and fail open), every routing answer is a well-formed
response of the kind Envoy expects (same kind or an immediate response), an
observing stream never answers, in-flight counts never go negative. At the end,
once every stream is closed and the clock has passed every deadline: nothing is
pending, nothing is in flight, nobody waits in the admission queue — no stream
leaks state.

Bounded for CI: ``FUZZ_EXAMPLES`` state machines of up to ``FUZZ_STEPS`` steps.
"""

from __future__ import annotations

import json
import os
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sidecar.core.config import parse_config
from sidecar.pb.envoy.config.core.v3 import base_pb2
from sidecar.pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from sidecar.shell.app import App
from tests.conftest import base_config_dict
from tests.streamharness import (
    answers_kind,
    body_only_msg,
    is_hold,
    metadata,
    observe_msg,
    open_stream,
    request_kind,
)

FUZZ_EXAMPLES = int(os.environ.get("TAILROUTE_FUZZ_EXAMPLES", "120"))
FUZZ_STEPS = int(os.environ.get("TAILROUTE_FUZZ_STEPS", "40"))
STATS = {"machines": 0, "steps": 0, "messages": 0, "routed": 0, "holds": 0, "immediate": 0}


def fuzz_config() -> Any:
    data = base_config_dict(
        limits={"max_body_bytes": 1024, "max_json_depth": 8, "max_header_value_bytes": 16},
        stats={"subwindow_s": 1.0, "subwindows": 3, "min_samples": 2, "observe_share": 0.5},
        admission={"queue_max": 2, "queue_wait_ms": 100},
    )
    data["models"][0]["candidates"] = ["a", "c"]  # c names the model differently: rewrites
    for c in data["clusters"]:
        c["max_concurrency"] = 1  # overload (queue, defer, shed) within a few streams
    return parse_config(data, "fuzz.yaml")


# ------------------------------------------------------------------ messages

_PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/models",
          "/v1/chat/completions?x=1", "/", "", "/v1/chat/completions/", "\x00"]
_HEADER_KEYS = [":method", ":path", "content-type", ":status", "x-tailroute-class",
                "x-tailroute-priority", "x-tailroute-tenant", "x-tailroute-deadline-ms",
                "x-tailroute-step", "x-tailroute-explain", "x-request-id",
                "x-envoy-attempt-count", "x-stainless-retry-count", "x-tailroute-rid",
                "X-TailRoute-Class", "x-other"]
_VALUES = st.one_of(
    st.sampled_from(["POST", "GET", "1", "0", "batch", "interactive", "optional", "critical",
                     "200", "503", "504", "429", "abc", "", "text/event-stream",
                     "application/json", "-5", "99999999999999", "1e3", "Ⅻ", "00000-1"]),
    st.sampled_from(_PATHS),
    st.text(max_size=40),
    st.integers(17, 3000).map(lambda n: "v" * n),  # over max_header_value_bytes
).map(lambda v: v.encode("utf-8", "surrogatepass"))
_headers = st.dictionaries(st.sampled_from(_HEADER_KEYS), _VALUES, max_size=8)

_json_doc = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids,
                                                              max_size=4),
    max_leaves=20,
)


def _chat(model: Any, stream: Any, **extra: Any) -> bytes:
    return json.dumps({"model": model, "stream": stream,
                       "messages": [{"role": "user", "content": "hi"}], **extra}).encode()


_request_bodies = st.one_of(
    st.builds(_chat, st.sampled_from(["m", "m", "unknown", "", None]), st.booleans()),
    st.builds(_chat, st.just("m"), st.sampled_from([True, "yes", 1, None]),
              max_tokens=st.sampled_from([1, 0, -1, "9", 10**9, True, None])),
    _json_doc.map(lambda d: json.dumps(d).encode()),
    st.integers(1, 40).map(lambda n: b'{"model": "m", "x": ' + b"[" * n + b"]" * n + b"}"),
    st.integers(2000, 4000).map(lambda n: b'{"model": "m", "p": "' + b"x" * n + b'"}'),
    st.binary(max_size=64),
    st.just(b""),
)
_EOL = st.sampled_from([b"\n", b"\r\n", b"\r"])
_sse_pieces = st.lists(st.one_of(
    st.builds(lambda t, e: b"data: " + json.dumps({"choices": [{"delta": {"content": t}}]})
              .encode() + e + e, st.text(max_size=4), _EOL),
    st.builds(lambda n, e: b'data: {"choices":[],"usage":{"completion_tokens":' + str(n)
              .encode() + b"}}" + e + e, st.integers(-3, 10**12), _EOL),
    st.just(b"data: [DONE]\n\n"), st.just(b": ping\r\n"), st.just(b"event: error\ndata: {}\n\n"),
    st.binary(max_size=32),
), max_size=4).map(b"".join)


@st.composite
def messages(draw: st.DrawFn) -> pb.ProcessingRequest:
    kind = draw(st.sampled_from(["request_headers", "request_body", "response_headers",
                                 "response_body", "request_trailers", "response_trailers",
                                 "none"]))
    observe = draw(st.booleans()) if draw(st.integers(0, 4)) == 0 else False
    eos = draw(st.booleans())
    if kind in ("request_headers", "response_headers"):
        hdrs = draw(_headers)
        hm = base_pb2.HeaderMap(headers=[
            base_pb2.HeaderValue(key=k, raw_value=v) if draw(st.booleans())
            else base_pb2.HeaderValue(key=k, value=v.decode("latin-1")) for k, v in hdrs.items()])
        h = pb.HttpHeaders(headers=hm, end_of_stream=eos)
        return pb.ProcessingRequest(observability_mode=observe, **{kind: h})
    if kind == "request_body":
        return pb.ProcessingRequest(observability_mode=observe, request_body=pb.HttpBody(
            body=draw(_request_bodies), end_of_stream=eos))
    if kind == "response_body":
        return pb.ProcessingRequest(observability_mode=observe, response_body=pb.HttpBody(
            body=draw(_sse_pieces), end_of_stream=eos))
    if kind in ("request_trailers", "response_trailers"):
        return pb.ProcessingRequest(observability_mode=observe, **{kind: pb.HttpTrailers()})
    return pb.ProcessingRequest(observability_mode=observe)


def _valid_start(draw: st.DrawFn) -> pb.ProcessingRequest:
    """A plausible first message of a routing stream (so deep states are reached often)."""
    hdrs = {**draw(_headers), ":method": b"POST",
            ":path": draw(st.sampled_from(_PATHS[:3])).encode()}
    hm = base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v)
                                     for k, v in hdrs.items()])
    return pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=hm))


# ------------------------------------------------------------------ the machine


class Stream:
    def __init__(self, handler: Any, observe: bool) -> None:
        self.handler = handler
        self.observe = observe
        self.held_for: str | None = None  # request kind awaiting the hold's answer
        self.done = False  # an observing stream asked to be closed


class ExtProcFuzz(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.app = App.create(fuzz_config(), seed=0)
        self.now = 1000.0
        self.streams: list[Stream] = []
        self.metas: list[dict[str, str]] = []  # tailroute metadata of routing answers
        STATS["machines"] += 1

    @initialize()
    def start(self) -> None:
        self.app.tick(self.now)

    def _answer(self, s: Stream, kind: str | None, resp: Any) -> None:
        STATS["steps"] += 1
        if is_hold(resp):
            assert not s.observe, "an observing stream never holds"
            STATS["holds"] += 1
            s.held_for = kind
            return
        if s.observe:
            # Observability mode: Envoy expects no answer; the handler only says
            # whether the server should close the stream now.
            assert isinstance(resp, bool), resp
            s.done = s.done or resp
            return
        assert isinstance(resp, pb.ProcessingResponse), resp
        resp.SerializeToString()  # well-formed on the wire
        assert answers_kind(kind, resp), (kind, resp.WhichOneof("response"))
        if resp.WhichOneof("response") == "immediate_response":
            STATS["immediate"] += 1
        meta = metadata(resp)
        if "rid" in meta:
            self.metas.append(meta)
        STATS["routed"] += "route" in meta

    def _send(self, s: Stream, msg: pb.ProcessingRequest) -> None:
        STATS["messages"] += 1
        self._answer(s, request_kind(msg), s.handler.on_message(msg, self.now))

    @rule(data=st.data(), plausible=st.booleans())
    def open_routing_stream(self, data: st.DataObject, plausible: bool) -> None:
        first = data.draw(st.composite(_valid_start)()) if plausible else data.draw(messages())
        s = Stream(open_stream(self.app, first), first.observability_mode)
        self.streams.append(s)
        self._send(s, first)

    @precondition(lambda self: bool(self.metas))
    @rule(data=st.data(), kind=st.sampled_from(["response_headers", "response_body"]),
          status=st.sampled_from(["200", "200", "503", "abc", ""]), body=_sse_pieces,
          eos=st.booleans())
    def open_observing_stream(self, data: st.DataObject, kind: str, status: str, body: bytes,
                              eos: bool) -> None:
        """The observing filter's stream of a routed request (forwarded metadata)."""
        meta = dict(data.draw(st.sampled_from(self.metas)))
        if data.draw(st.booleans()):  # damaged or foreign metadata
            meta[data.draw(st.sampled_from(["rid", "route", "slice"]))] = data.draw(
                st.text(max_size=12))
        first = observe_msg(kind, meta, {":status": status, "content-type": "text/event-stream"},
                            body=body, eos=eos)
        s = Stream(open_stream(self.app, first), True)
        self.streams.append(s)
        self._send(s, first)

    @precondition(lambda self: any(s.held_for is None for s in self.streams))
    @rule(data=st.data(), plausible=st.booleans())
    def send_one_message_request(self, data: st.DataObject, plausible: bool) -> None:
        """The one-message path: the body with headers as request attributes."""
        body = _chat("m", data.draw(st.booleans())) if plausible else data.draw(_request_bodies)
        headers = {k: v.decode("utf-8", "replace") for k, v in data.draw(_headers).items()}
        s = Stream(open_stream(self.app, body_only_msg(body, headers)), False)
        self.streams.append(s)
        self._send(s, body_only_msg(body, headers))

    @precondition(lambda self: any(s.held_for is None for s in self.streams))
    @rule(data=st.data())
    def send(self, data: st.DataObject) -> None:
        s = data.draw(st.sampled_from([s for s in self.streams if s.held_for is None]))
        if s.observe and self.metas:
            meta = data.draw(st.sampled_from(self.metas))
            kind = data.draw(st.sampled_from(["response_headers", "response_body"]))
            self._send(s, observe_msg(kind, meta, {":status": "200"},
                                      body=data.draw(_sse_pieces), eos=data.draw(st.booleans())))
        else:
            self._send(s, data.draw(messages()))

    @precondition(lambda self: any(s.held_for is None and not s.observe for s in self.streams))
    @rule(data=st.data(), stream=st.booleans(), model=st.sampled_from(["m", "m", "other"]))
    def send_valid_body(self, data: st.DataObject, stream: bool, model: str) -> None:
        """The likely next message of a routing stream: reaches decisions and holds often."""
        s = data.draw(st.sampled_from([s for s in self.streams
                                       if s.held_for is None and not s.observe]))
        self._send(s, pb.ProcessingRequest(request_body=pb.HttpBody(
            body=_chat(model, stream), end_of_stream=True)))

    @precondition(lambda self: any(s.held_for is None for s in self.streams))
    @rule(data=st.data(), status=st.sampled_from([b"200", b"200", b"503", b"504", b"abc", b""]),
          body=_sse_pieces, eos=st.booleans())
    def send_response(self, data: st.DataObject, status: bytes, body: bytes, eos: bool) -> None:
        """Response headers then a body piece, as Envoy sends them once upstream answers."""
        s = data.draw(st.sampled_from([s for s in self.streams if s.held_for is None]))
        hm = base_pb2.HeaderMap(headers=[
            base_pb2.HeaderValue(key=":status", raw_value=status),
            base_pb2.HeaderValue(key="content-type", raw_value=b"text/event-stream")])
        self._send(s, pb.ProcessingRequest(observability_mode=s.observe,
                                           response_headers=pb.HttpHeaders(headers=hm)))
        if s.held_for is None:
            self._send(s, pb.ProcessingRequest(observability_mode=s.observe,
                                               response_body=pb.HttpBody(body=body,
                                                                         end_of_stream=eos)))

    @precondition(lambda self: any(s.held_for is not None for s in self.streams))
    @rule(data=st.data())
    def resume_held(self, data: st.DataObject) -> None:
        s = data.draw(st.sampled_from([s for s in self.streams if s.held_for is not None]))
        kind, s.held_for = s.held_for, None
        self._answer(s, kind, s.handler.resume(self.now))

    @precondition(lambda self: bool(self.streams))
    @rule(data=st.data(), cancelled=st.booleans())
    def close(self, data: st.DataObject, cancelled: bool) -> None:
        s = data.draw(st.sampled_from(self.streams))
        self.streams.remove(s)
        s.handler.close(self.now, cancelled=cancelled)

    @rule(dt=st.sampled_from([0.0, 0.001, 0.05, 0.3, 1.0, 5.0, 70.0, 400.0]))
    def advance(self, dt: float) -> None:
        self.now += dt
        self.app.tick(self.now)

    @invariant()
    def inflight_never_negative(self) -> None:
        for c in self.app.config.cluster_names:
            assert self.app.router.inflight(c) >= 0

    def teardown(self) -> None:
        for s in self.streams:
            s.handler.close(self.now, cancelled=True)
        self.streams.clear()
        far = self.now + 1_000.0  # past every request deadline and grace
        self.app.tick(far)
        assert not self.app.pending, f"{len(self.app.pending)} requests leaked"
        assert all(self.app.router.inflight(c) == 0 for c in self.app.config.cluster_names)
        assert not self.app.router.admission.queue.live(far)
        assert self.app.errors["handler_exception"] == 0


ExtProcFuzz.TestCase.settings = settings(
    max_examples=FUZZ_EXAMPLES, stateful_step_count=FUZZ_STEPS, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestExtProcFuzz = ExtProcFuzz.TestCase


def test_zz_report_fuzz_counts() -> None:
    """Not a check: prints what the fuzzer exercised (run with -s to see it)."""
    print(f"\nstream fuzzer: {STATS}")
