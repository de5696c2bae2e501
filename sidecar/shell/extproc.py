"""Per-stream ext_proc handlers with explicit per-request state.

One handler object per gRPC stream; ``on_message(msg, now)`` returns the
ProcessingResponse to send (or None in observability mode). No I/O here, so
unit tests drive these with in-memory message lists.

Routing stream (filter ``tailroute.route``), states and the messages each accepts::

    EXPECT_HEADERS --request_headers(eos)--> ROUTED        (GET / no body)
    EXPECT_HEADERS --request_headers-------> EXPECT_BODY
    EXPECT_BODY    --request_body(eos)-----> ROUTED
    EXPECT_BODY    --request_body(eos)-----> QUEUED        (admission "queue": Hold)
    QUEUED         --resume (server)-------> QUEUED | ROUTED
    ROUTED         --response_headers------> RESPONSE      (status recorded)
    RESPONSE       --response_body*--------> RESPONSE      (only in "streamed" mode)
    any            --unexpected message----> answered with an empty CONTINUE, counted

What the request gets (also the table in README.md, "Running it beside your Envoy"):

* valid OpenAI-style request: CONTINUE with ``x-tailroute-cluster`` set
  (OVERWRITE_IF_EXISTS_OR_ADD, raw_value) and ``clear_route_cache``; the
  ``model`` field is rewritten when the chosen cluster serves it under another name;
  ``x-envoy-upstream-rq-timeout-ms`` is the remaining budget (class timeout or
  the caller's deadline);
* not admitted (defer 429, shed/reject 503, skip 412) or held (queue): see
  :mod:`sidecar.shell.admission` and docs/admission.md;
* body that is not JSON / not an object / has mistyped fields on an LLM API
  path: 400 ImmediateResponse with an OpenAI-style error JSON (the request
  itself is invalid, every upstream would refuse it);
* GET, no body, non-LLM path, unknown model, body over ``limits.max_body_bytes``:
  CONTINUE to the default route (counted; the upstream answers for itself).
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from enum import Enum

from sidecar.core.classify import BadRequest, ParsedBody, api_for_path, classify, parse_body
from sidecar.core.input_limits import check_body, parse_status, screen_headers
from sidecar.core.timing import ResponseTimer
from sidecar.core.types import Decision, RequestInfo
from sidecar.pb.envoy.config.core.v3 import base_pb2
from sidecar.pb.envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2 as pm_pb2
from sidecar.pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from sidecar.shell.admission import Hold, admission_response, timeout_header
from sidecar.shell.app import App, Pending
from sidecar.shell.bootstrap import REQUEST_ID_HEADER, ROUTE_HEADER

log = logging.getLogger("tailroute.extproc")

_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
EXPLAIN_HEADER = "x-tailroute-explain-result"
_PM = pm_pb2.ProcessingMode
_EXPLAIN_MODE = _PM(
    request_header_mode=_PM.SEND,
    request_body_mode=_PM.BUFFERED,
    response_header_mode=_PM.SEND,
    response_body_mode=_PM.NONE,
    request_trailer_mode=_PM.SKIP,
    response_trailer_mode=_PM.SKIP,
)


class Phase(Enum):
    EXPECT_HEADERS = "expect_headers"
    EXPECT_BODY = "expect_body"
    QUEUED = "queued"  # held by an admission "queue" answer; the server re-asks (resume)
    ROUTED = "routed"
    RESPONSE = "response"


def header_map(hm: base_pb2.HeaderMap) -> dict[str, str]:
    """Lower-cased header dict; Envoy sends values in raw_value (bytes)."""
    out: dict[str, str] = {}
    for h in hm.headers:
        out[h.key.lower()] = h.raw_value.decode("latin-1") if h.raw_value else h.value
    return out


def _set(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode("latin-1", "replace")),
        append_action=_OVERWRITE,
    )


def _continue_headers() -> pb.ProcessingResponse:
    return pb.ProcessingResponse(request_headers=pb.HeadersResponse())


def continue_unchanged(kind: str | None) -> pb.ProcessingResponse:
    """The do-nothing answer matching a request message kind (unknown: response body)."""
    if kind == "request_headers":
        return _continue_headers()
    if kind == "request_body":
        return pb.ProcessingResponse(request_body=pb.BodyResponse())
    if kind == "response_headers":
        return pb.ProcessingResponse(response_headers=pb.HeadersResponse())
    if kind == "request_trailers":
        return pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
    if kind == "response_trailers":
        return pb.ProcessingResponse(response_trailers=pb.TrailersResponse())
    return pb.ProcessingResponse(response_body=pb.BodyResponse())


def immediate(status: int, message: str, kind: str, headers: dict[str, str] | None = None
              ) -> pb.ProcessingResponse:
    """An OpenAI-style JSON error answered by Envoy without calling any upstream."""
    body = json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()
    hdrs = {"content-type": "application/json", **(headers or {})}
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status={"code": status},
            headers=pb.HeaderMutation(set_headers=[_set(k, v) for k, v in hdrs.items()]),
            body=body,
            details=f"tailroute_{kind}",
        )
    )


class RouteStream:
    """Handles the routing filter's stream for one HTTP request."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.phase = Phase.EXPECT_HEADERS
        self.headers: dict[str, str] = {}
        self.rid: str | None = None
        self.info: RequestInfo | None = None
        self.decision: Decision | None = None
        self._parsed: ParsedBody | None = None
        self._is_body = False
        self._arrived = 0.0
        self._classified: RequestInfo | None = None  # as classified on arrival

    # -------------------------------------------------------------- dispatch

    def on_message(
        self, msg: pb.ProcessingRequest, now: float
    ) -> pb.ProcessingResponse | Hold | None:
        kind = msg.WhichOneof("request")
        if kind == "request_headers" and self.phase is Phase.EXPECT_HEADERS:
            return self._on_request_headers(msg.request_headers, now)
        if kind == "request_body" and self.phase is Phase.EXPECT_BODY:
            return self._on_request_body(msg.request_body, now)
        if kind == "response_headers" and self.phase in (Phase.ROUTED, Phase.EXPECT_BODY):
            return self._on_response_headers(msg.response_headers, now)
        if kind == "response_body":
            return self._on_response_body(msg.response_body, now)
        return self._unexpected(kind, now)

    def _unexpected(self, kind: str | None, now: float) -> pb.ProcessingResponse:
        """Out-of-order or unknown message: answer harmlessly, never crash the stream."""
        self.app.errors[f"unexpected_{kind}_in_{self.phase.value}"] += 1
        log.warning("unexpected %s in phase %s", kind, self.phase.value)
        return continue_unchanged(kind)

    # -------------------------------------------------------------- request

    def _on_request_headers(
        self, msg: pb.HttpHeaders, now: float
    ) -> pb.ProcessingResponse | Hold:
        self.headers, ignored = screen_headers(header_map(msg.headers),
                                               self.app.config.limits.max_header_value_bytes)
        if ignored:
            self.app.errors["header_ignored"] += 1
        if msg.end_of_stream:
            return self._route(None, now, is_body=False)
        self.phase = Phase.EXPECT_BODY
        if self.app.observe_mode == "observability" and self.headers.get(
            "x-tailroute-explain", ""
        ).strip() == "1":
            # Response headers are skipped in this mode; a debugging caller who asks
            # for the explain header gets them back for this one request.
            return pb.ProcessingResponse(
                request_headers=pb.HeadersResponse(), mode_override=_EXPLAIN_MODE
            )
        return _continue_headers()

    def _on_request_body(self, msg: pb.HttpBody, now: float) -> pb.ProcessingResponse | Hold:
        # BUFFERED mode: the whole body arrives in one message with end_of_stream set.
        return self._route(msg.body, now, is_body=True)

    def _route(
        self, body: bytes | None, now: float, is_body: bool
    ) -> pb.ProcessingResponse | Hold:
        app = self.app
        cfg = app.config
        api = api_for_path(self.headers.get(":path", "/"))
        parsed = None
        if body is not None and api != "other":
            refusal = check_body(body, cfg.limits)
            if refusal is not None:
                app.errors[refusal.reason] += 1
                if refusal.status is not None:
                    self.phase = Phase.ROUTED
                    return immediate(refusal.status, refusal.message, "invalid_request_error")
                body = None
            else:
                try:
                    parsed = parse_body(api, body)
                except BadRequest as exc:
                    app.errors["bad_request"] += 1
                    self.phase = Phase.ROUTED
                    return immediate(400, str(exc), "invalid_request_error")
        info = classify(cfg, self.headers, parsed, api)
        self.rid = app.new_rid()  # also the admission queue ticket
        self.info, self._parsed, self._is_body = info, parsed, is_body
        self._classified = info
        self._arrived = now
        return self._answer(app.router.decide(info, now, app.rng, ticket=self.rid), now)

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
        self.decision = decision
        if decision.admission == "queue":
            self.phase = Phase.QUEUED
            return Hold(app.router.queue_until(self.rid) or now)
        self.phase = Phase.ROUTED
        if decision.admission != "admit":
            return admission_response(decision, info)
        sets = [_set(ROUTE_HEADER, decision.cluster)]
        timeout = timeout_header(decision)
        if timeout is not None:
            sets.append(timeout)
        rid = self.rid
        observed = app.router.wants_observation(decision.cluster, info.slice, now, app.rng)
        if app.observe_mode == "observability" and observed:
            # The rid header both correlates the observing stream and switches the
            # observing filter on for this request (Envoy skips it without the header).
            sets.append(_set(REQUEST_ID_HEADER, rid))
        common = pb.CommonResponse(
            header_mutation=pb.HeaderMutation(set_headers=sets), clear_route_cache=True
        )
        if parsed is not None and decision.upstream_model:
            new_body = _rewrite_model(parsed, decision.upstream_model)
            common.body_mutation.body = new_body
            common.header_mutation.set_headers.append(_set("content-length", str(len(new_body))))
        timer = ResponseTimer(
            decision.cluster, info.slice, now, info.stream,
            is_retry=info.retry_attempt > 0 or decision.is_retry, is_probe=decision.is_probe,
        )
        app.register(Pending(rid, decision, timer, app.deadline_for(decision, now),
                             observed=observed))
        if is_body:
            return pb.ProcessingResponse(request_body=pb.BodyResponse(response=common))
        return pb.ProcessingResponse(request_headers=pb.HeadersResponse(response=common))

    # -------------------------------------------------------------- response

    def _on_response_headers(self, msg: pb.HttpHeaders, now: float) -> pb.ProcessingResponse:
        self.phase = Phase.RESPONSE
        headers = header_map(msg.headers)
        pending = self.app.pending.get(self.rid or "")
        if pending is not None and not pending.observer_attached:
            pending.timer.on_headers(response_status(self.app, headers),
                                     headers.get("content-type", ""), now)
            if msg.end_of_stream:
                pending.timer.on_end(now)
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

    def _on_response_body(self, msg: pb.HttpBody, now: float) -> pb.ProcessingResponse:
        pending = self.app.pending.get(self.rid or "")
        if pending is not None and not pending.observer_attached:
            pending.timer.on_body(msg.body, now, end=msg.end_of_stream)
        return pb.ProcessingResponse(response_body=pb.BodyResponse())

    def close(self, now: float, cancelled: bool) -> None:
        """The gRPC stream ended: Envoy closes it when the HTTP request is over."""
        if self.phase is Phase.QUEUED and self.rid is not None:
            self.app.router.withdraw(self.rid)  # client gone or Envoy gave up while held
            return
        if self.phase is Phase.EXPECT_BODY and not cancelled:
            # Closed cleanly with the body still due: gRPC refused the message (over
            # its limit, RESOURCE_EXHAUSTED) and Envoy fails open to the default route
            # (or Envoy gave up first: grpc.aio reports most cancels as a clean end).
            self.app.errors["stream_ended_before_body"] += 1
        pending = self.app.pending.get(self.rid or "")
        if pending is None:
            return
        timer = pending.timer
        if (not pending.observer_attached and timer.ended_at is None
                and timer.status is not None and not cancelled):
            # headers_only mode: no body seen; end-to-end is measured to the end of
            # the request (Envoy closes this stream then), documented as such.
            timer.on_end(now)
        self.app.route_closed(pending.rid, now, cancelled)


class ObserveStream:
    """Handles the observability-mode filter's stream: never answers, only times."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.rid: str | None = None

    def on_message(self, msg: pb.ProcessingRequest, now: float) -> None:
        kind = msg.WhichOneof("request")
        if kind == "request_headers":
            for h in msg.request_headers.headers.headers:
                if h.key == REQUEST_ID_HEADER:
                    rid = (h.raw_value or h.value.encode()).decode("latin-1")
                    p = self.app.pending.get(rid)
                    if p is not None:
                        p.observer_attached = True
                        self.rid = rid
                    break
            return
        p = self.app.pending.get(self.rid) if self.rid else None
        if p is None:
            return
        if kind == "response_headers":
            headers = header_map(msg.response_headers.headers)
            p.timer.on_headers(response_status(self.app, headers),
                               headers.get("content-type", ""), now)
            if msg.response_headers.end_of_stream:
                p.timer.on_end(now)
        elif kind == "response_body":
            p.timer.on_body(msg.response_body.body, now, end=msg.response_body.end_of_stream)
        elif kind == "response_trailers":
            p.timer.on_end(now)
        if p.timer.ended_at is not None:
            self.app.finalize(p.rid, now, cancelled=False)

    def close(self, now: float, cancelled: bool) -> None:
        """Envoy closes observability streams late (deferred close); the end of the
        body already finalized a complete response, so only a cut-off one is left."""
        p = self.app.pending.get(self.rid) if self.rid else None
        if p is not None and p.released:
            self.app.finalize(p.rid, now, cancelled=True)


def response_status(app: App, headers: dict[str, str]) -> int:
    """The response ``:status``; 0 (not evidence) and counted when it is not a valid status."""
    status = parse_status(headers.get(":status"))
    if status is None:
        app.errors["bad_status"] += 1
        return 0
    return status


def _rewrite_model(parsed: ParsedBody, model: str) -> bytes:
    """The request body with ``model`` replaced, from the document parsed at routing."""
    return json.dumps({**parsed.document, "model": model}, separators=(",", ":")).encode()


def explain_json(decision: Decision) -> str:
    """Compact one-line explain for the opt-in response header (bounded size)."""
    ex = decision.explain
    if ex is None:
        return json.dumps({"cluster": decision.cluster, "reason": decision.reason})
    out = {
        "cluster": decision.cluster,
        "reason": decision.reason,
        "slice": ex.slice,
        "candidates": [
            {"c": c.cluster, "state": c.state, "w": c.weight, "scores": c.scores,
             "drop": next((v for v in c.verdicts.values() if v != "pass"), None),
             "stats": c.stats_slice, "fallback": c.fell_back}
            for c in ex.candidates
        ],
        "notes": list(ex.notes),
    }
    return json.dumps(out, separators=(",", ":"))[:4000]
