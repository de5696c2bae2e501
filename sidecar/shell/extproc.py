"""The routing ext_proc stream's handler, with explicit per-request state (the sampled
observing stream is :mod:`sidecar.shell.observe`).

One handler object per gRPC stream; ``on_message(msg, now)`` returns the
ProcessingResponse to send. No I/O here, so unit tests drive these with
in-memory message lists.

Two routing paths, chosen per request by Envoy (see
:mod:`sidecar.shell.bootstrap_filters`), one handler::

    START       --request_body(eos)----------> ROUTED     one-message path (tailroute.route):
                                                          headers came as request attributes
    START       --request_headers(eos)-------> ROUTED     rich path, GET / no body
    START       --request_headers------------> EXPECT_BODY  rich path (tailroute.route_rich)
    EXPECT_BODY --request_body(eos)----------> ROUTED
    EXPECT_BODY/START --body-----------------> QUEUED     (admission "queue": Hold)
    QUEUED      --resume (server)------------> QUEUED | ROUTED
    ROUTED      --response_headers-----------> RESPONSE   rich path with explain only
    any         --unexpected message---------> answered with an empty CONTINUE, counted

Which path has which feature (also in README.md, "Running it beside your Envoy"):

=================================  ==============  ==========================
feature                            one message     rich (deadline / explain)
=================================  ==============  ==========================
routing, class/priority/tenant/    yes             yes
step/fanout headers, model rewrite
class timeout (route)              yes             yes
deadline -> upstream timeout       --              yes (header)
admission answers (429/503/412),   yes             yes
queueing, 400 for bad bodies
``x-tailroute-explain-result``     --              yes
=================================  ==============  ==========================

What the request gets on either path:

* valid OpenAI-style request: CONTINUE with dynamic metadata
  ``tailroute.route`` (selects the Envoy route: cluster, class timeout, sampled
  or not; with ``tailroute.unary`` for an unstreamed answer, whose route's timeout
  is the class timeout, and for a stream with a caller's deadline, which the
  timeout header caps; any other stream's route bounds only its silences and, as
  a safety net, its length),
  ``tailroute.rid`` and ``tailroute.slice`` (match the access-log entry); the
  ``model`` field is rewritten when the chosen cluster serves it under another
  name; on the rich path ``x-envoy-upstream-rq-timeout-ms`` is the remaining
  budget (none for a stream without a deadline);
* not admitted (defer 429, shed/reject 503, skip 412) or held (queue): see
  :mod:`sidecar.shell.admission` and docs/admission.md;
* body that is not JSON / not an object / has mistyped fields on an LLM API
  path: 400 ImmediateResponse with an OpenAI-style error JSON;
* no body (or an empty one), non-LLM path, unknown model, body over ``limits.max_body_bytes``:
  CONTINUE to the default route (the upstream answers for itself); counted as a
  fail-open (``unknown_model``, ``body_too_large``) on an LLM path with a body, as
  decision reason ``not_llm`` otherwise.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from enum import Enum

from google.protobuf import struct_pb2

from sidecar.core.classify import BadRequest, ParsedBody, api_for_path, classify, parse_body
from sidecar.core.hints import apply_hints
from sidecar.core.input_limits import check_body, screen_headers
from sidecar.core.types import Decision, RequestInfo
from sidecar.pb.envoy.config.core.v3 import base_pb2
from sidecar.pb.envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2 as pm_pb2
from sidecar.pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from sidecar.shell import envoy_contract as ec
from sidecar.shell.admission import Hold, admission_response, timeout_header
from sidecar.shell.app import App, Pending
from sidecar.shell.explain_header import EXPLAIN_HEADER, explain_json
from sidecar.shell.request_headers import attribute_headers, request_header_map
from sidecar.shell.upstream_body import upstream_body

log = logging.getLogger("tailroute.extproc")

_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
EXPLAIN_ASK = "x-tailroute-explain"
_PM = pm_pb2.ProcessingMode
_EXPLAIN_MODE = _PM(
    request_header_mode=_PM.SEND,
    request_body_mode=_PM.BUFFERED,
    response_header_mode=_PM.SEND,
    response_body_mode=_PM.NONE,
    request_trailer_mode=_PM.SKIP,
    response_trailer_mode=_PM.SKIP,
)
# Envoy clears the route cache after a body answer only if that answer changes a
# header (an empty mutation does not count), and on the one-message path drops header
# changes there (the headers have gone on already): removing a header that never
# reaches the upstream anyway satisfies the first and harms nothing, on either path.


class Phase(Enum):
    START = "start"
    EXPECT_BODY = "expect_body"
    QUEUED = "queued"  # held by an admission "queue" answer; the server re-asks (resume)
    ROUTED = "routed"
    RESPONSE = "response"


def _set(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode("latin-1", "replace")),
        append_action=_OVERWRITE,
    )


def continue_unchanged(kind: str | None) -> pb.ProcessingResponse:
    """The do-nothing answer matching a request message kind (unknown: response body)."""
    if kind == "request_headers":
        return pb.ProcessingResponse(request_headers=pb.HeadersResponse())
    if kind == "request_body":
        return pb.ProcessingResponse(request_body=pb.BodyResponse())
    if kind == "response_headers":
        return pb.ProcessingResponse(response_headers=pb.HeadersResponse())
    if kind == "request_trailers":
        return pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
    if kind == "response_trailers":
        return pb.ProcessingResponse(response_trailers=pb.TrailersResponse())
    return pb.ProcessingResponse(response_body=pb.BodyResponse())


def immediate(status: int, message: str, kind: str, code: str,
              headers: dict[str, str] | None = None) -> pb.ProcessingResponse:
    """An OpenAI-style JSON error answered by Envoy without calling any upstream: the
    four fields OpenAI's error object always has, ``code`` a string (or null) as there
    (a typed client, e.g. one whose ``code`` is ``Option<String>``, fails to read an
    integer and reports a decoding error instead of the message)."""
    body = json.dumps({"error": {"message": message, "type": kind, "param": None,
                                 "code": code}}).encode()
    hdrs = {"content-type": "application/json", **(headers or {})}
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status={"code": status},
            headers=pb.HeaderMutation(set_headers=[_set(k, v) for k, v in hdrs.items()]),
            body=body,
            details=f"tailroute_{kind}",
        )
    )


def _write_metadata(out: struct_pb2.Struct, rid: str, route: str | None,
                    slice_label: str | None, unary: bool = False) -> None:
    """``{tailroute: {rid, route, slice[, unary]}}``: route selection and access-log
    correlation."""
    fields = out.fields[ec.METADATA_NS].struct_value.fields
    fields[ec.RID_KEY].string_value = rid
    if route is not None:
        fields[ec.ROUTE_KEY].string_value = route
    if slice_label is not None:
        fields[ec.SLICE_KEY].string_value = slice_label
    if unary:
        fields[ec.UNARY_KEY].string_value = "1"


class RouteStream:
    """Handles one HTTP request's routing stream, on either path."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.phase = Phase.START
        self.headers: dict[str, str] = {}
        self.rid: str | None = None
        self.info: RequestInfo | None = None
        self.decision: Decision | None = None
        self.rich = False  # request headers were sent (tailroute.route_rich)
        self._parsed: ParsedBody | None = None
        self._is_body = False
        self._arrived = 0.0
        self._classified: RequestInfo | None = None  # as classified on arrival

    # -------------------------------------------------------------- dispatch

    def on_message(
        self, msg: pb.ProcessingRequest, now: float
    ) -> pb.ProcessingResponse | Hold | None:
        kind = msg.WhichOneof("request")
        phase = self.phase
        if kind == "request_body" and phase is Phase.START:
            self.headers = self._screened(attribute_headers(msg))
            return self._route(msg.request_body.body, now, is_body=True)
        if kind == "request_headers" and phase is Phase.START:
            return self._on_request_headers(msg.request_headers, now)
        if kind == "request_body" and phase is Phase.EXPECT_BODY:
            return self._route(msg.request_body.body, now, is_body=True)
        if kind == "response_headers" and phase is Phase.ROUTED and self.rich:
            return self._on_response_headers()
        if kind == "response_headers" and phase is Phase.EXPECT_BODY and self.rich:
            # Explain asked for response headers; they came before the body: Envoy
            # answered itself (413 over its buffer), sent nothing upstream: no fail-open.
            self.phase = Phase.RESPONSE
            return continue_unchanged(kind)
        return self._unexpected(kind)

    def _screened(self, headers: dict[str, str]) -> dict[str, str]:
        """The caller's hints the config does not believe are dropped, trusted headers
        read in their place (``hints:``, sidecar.core.hints); then hostile values of the
        headers the sidecar reads are dropped. Each counted once per request."""
        config = self.app.config
        believed, untrusted = apply_hints(config.hints, headers)
        if untrusted:
            self.app.errors["hint_ignored"] += 1
        kept, dropped = screen_headers(believed, config.limits.max_header_value_bytes)
        if dropped:
            self.app.errors["header_ignored"] += 1
        return kept

    def _unexpected(self, kind: str | None) -> pb.ProcessingResponse:
        """Out-of-order or unknown message: answer harmlessly, never crash the stream."""
        self.app.errors[f"unexpected_{kind}_in_{self.phase.value}"] += 1
        log.warning("unexpected %s in phase %s", kind, self.phase.value)
        return continue_unchanged(kind)

    # -------------------------------------------------------------- request

    def _on_request_headers(
        self, msg: pb.HttpHeaders, now: float
    ) -> pb.ProcessingResponse | Hold:
        self.rich = True
        self.headers = self._screened(
            request_header_map(msg.headers, self.app.config.hints.trusted_names))
        explain = self.headers.get(EXPLAIN_ASK, "").strip() == "1"
        if explain and not self.app.explain_budget.take(now):
            # Over the explain bound (sidecar.shell.explain_limit): routed as usual,
            # without the explain header.
            self.app.errors["explain_limited"] += 1
            self.headers.pop(EXPLAIN_ASK)
            explain = False
        if msg.end_of_stream:
            return self._route(None, now, is_body=False)
        self.phase = Phase.EXPECT_BODY
        if explain:
            # Response headers are skipped by default; a debugging caller who asks
            # for the explain header gets them back for this one request.
            return pb.ProcessingResponse(
                request_headers=pb.HeadersResponse(), mode_override=_EXPLAIN_MODE
            )
        return pb.ProcessingResponse(request_headers=pb.HeadersResponse())

    def _route(
        self, body: bytes | None, now: float, is_body: bool
    ) -> pb.ProcessingResponse | Hold:
        app = self.app
        cfg = app.config
        # No body at all (GET /v1/chat/completions lists stored completions): not an
        # inference request, whatever the path. Nor an empty one: a chunked POST with
        # no bytes is the request a content-length: 0 one is, and that one Envoy never
        # sends the one-message filter (it waits for a body): the default route
        # answers both, where the chunked one alone got the sidecar's 400.
        api = api_for_path(self.headers.get(":path", "/")) if body else "other"
        parsed = None
        self.rid = app.new_rid()  # also the admission queue ticket
        if body is not None and api != "other":
            refusal = check_body(body, cfg.limits)
            if refusal is not None:
                app.errors[refusal.reason] += 1
                if refusal.status is not None:
                    return self._refuse(refusal.status, refusal.message, refusal.reason)
                body = None
            else:
                try:
                    parsed = parse_body(api, body)
                except BadRequest as exc:
                    app.errors["bad_request"] += 1
                    return self._refuse(400, str(exc), "bad_request")
        info = classify(cfg, self.headers, parsed, api)
        self.info, self._parsed, self._is_body = info, parsed, is_body
        self._classified = info
        self._arrived = now
        return self._answer(app.router.decide(info, now, app.rng, ticket=self.rid), now)

    def _refuse(self, status: int, message: str, code: str) -> pb.ProcessingResponse:
        """A request tailroute answers itself (bad or oversize body): no route, but the
        rid in the metadata, so its access-log entry is recognised as not evidence.
        ``code`` is the ``tailroute_errors_total`` kind it is counted as."""
        assert self.rid is not None
        self.phase = Phase.ROUTED
        resp = immediate(status, message, "invalid_request_error", code)
        _write_metadata(resp.dynamic_metadata, self.rid, None, None)
        return resp

    def resume(self, now: float) -> pb.ProcessingResponse | Hold:
        """Re-ask the core for a request held in the admission queue.

        The caller's deadline shrinks by the time spent waiting; the class
        timeout does not (Envoy starts it when the request is forwarded).
        """
        assert self._classified is not None and self.rid is not None
        info = self._classified
        if info.deadline_ms is not None:
            waited_ms = (now - self._arrived) * 1000.0
            info = replace(info, deadline_ms=max(info.deadline_ms - waited_ms, 0.0))
        self.info = info
        return self._answer(self.app.router.decide(info, now, self.app.rng, ticket=self.rid), now)

    def _answer(self, decision: Decision, now: float) -> pb.ProcessingResponse | Hold:
        """Turn a decision into Envoy's answer (sidecar.shell.admission has the table)."""
        app = self.app
        info, parsed, is_body = self.info, self._parsed, self._is_body
        assert info is not None and self.rid is not None
        rid = self.rid
        self.decision = decision
        if decision.admission == "queue":
            self.phase = Phase.QUEUED
            return Hold(app.router.queue_until(rid) or now)
        self.phase = Phase.ROUTED
        label = info.slice.label()
        if decision.admission != "admit":
            resp = admission_response(decision, info, app.rng.random())
            _write_metadata(resp.dynamic_metadata, rid, None, label)
            return resp
        cluster = decision.cluster
        sampled = info.stream and app.offsets.wants_sample(cluster, info.slice, app.rng)
        resp = pb.ProcessingResponse()
        # Built in place (no sub-message copies): this is the per-request hot path.
        common = (resp.request_body if is_body else resp.request_headers).response
        common.clear_route_cache = True
        bounded = not info.stream  # the whole answer has a timeout (ec.UNARY_KEY)
        # Envoy re-picks the route only after an answer that changes a header (an empty
        # mutation is not enough): on the rich path a stream without a deadline has no
        # header to set, and Envoy kept the default route it had picked before.
        common.header_mutation.remove_headers.append(ec.ROUTE_HEADER)
        if self.rich:
            timeout = timeout_header(decision)
            if timeout is not None:
                common.header_mutation.set_headers.append(timeout)
                bounded = True  # a stream's deadline: its cap, not the safety net
        new_body = upstream_body(parsed, info.api, decision.upstream_model,
                                 app.config.timing.ask_usage)
        if new_body is not None:
            common.body_mutation.body = new_body
            if self.rich:
                common.header_mutation.set_headers.append(
                    _set("content-length", str(len(new_body))))
        _write_metadata(resp.dynamic_metadata, rid, ec.route_key(cluster, info.klass, sampled),
                        label, unary=bounded)
        app.register(Pending(
            rid, decision, info.slice, info.stream, app.deadline_for(decision, info.stream, now),
            is_retry=info.retry_attempt > 0,
            # A non-LLM request's outcome says nothing about the cluster's LLM routes.
            observed=decision.reason != "not_llm"
            and app.router.wants_observation(cluster, info.slice, now, app.rng),
            sampled=sampled, api=info.api,
        ), now)
        return resp

    # -------------------------------------------------------------- response

    def _on_response_headers(self) -> pb.ProcessingResponse:
        """Rich path with explain: say where the request went and why."""
        self.phase = Phase.RESPONSE
        sets = []
        if self.decision is not None:
            sets.append(_set("x-tailroute-route", self.decision.cluster))
            if self.info is not None and self.info.explain and self.decision.explain:
                sets.append(_set(EXPLAIN_HEADER, explain_json(self.decision)))
        return pb.ProcessingResponse(
            response_headers=pb.HeadersResponse(
                response=pb.CommonResponse(header_mutation=pb.HeaderMutation(set_headers=sets))
            )
        )

    def close(self, now: float, cancelled: bool) -> None:
        """The gRPC stream ended: Envoy closes it when the HTTP request is over."""
        if self.phase is Phase.QUEUED and self.rid is not None:
            self.app.router.withdraw(self.rid)  # client gone or Envoy gave up while held
            return
        if self.phase is Phase.EXPECT_BODY and not cancelled and self._declared() is None:
            # Closed cleanly with the body still due: gRPC refused the message (over
            # its limit, RESOURCE_EXHAUSTED) and Envoy fails open to the default route
            # (or Envoy gave up first: grpc.aio reports most cancels as a clean end).
            self.app.errors["stream_ended_before_body"] += 1
        if self.rid is not None:
            self.app.route_closed(self.rid, now)


    def _declared(self) -> int | None:
        """The body length the request declared (``content-length``), None if unknown.

        A declared body is never refused by gRPC: one within Envoy's buffer fits the
        sidecar's message limit (``grpc_receive_limit``: the buffer + 1 MiB), and Envoy
        answers a larger one 413 itself. So its stream ended because Envoy gave up on
        the request -- its client went away mid-upload, or that 413 -- and nothing was
        served undecided (the access log counts it ``unrouted``). Counted as a fail-open,
        each such client fired TailrouteFailOpen. A chunked body has no length: its early
        end is still counted (the refusal cannot be told from a departure there)."""
        raw = self.headers.get("content-length", "")
        return int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 19 else None
