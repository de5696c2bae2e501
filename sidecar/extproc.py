"""Per-stream ext_proc handlers with explicit per-request state.

One handler object per gRPC stream; ``on_message(msg, now)`` returns the
ProcessingResponse to send (or None in observability mode). No I/O here, so
unit tests drive these with in-memory message lists.

Routing stream (filter ``tailroute.route``), states and the messages each accepts::

    EXPECT_HEADERS --request_headers(eos)--> ROUTED        (GET / no body)
    EXPECT_HEADERS --request_headers-------> EXPECT_BODY
    EXPECT_BODY    --request_body(eos)-----> ROUTED
    ROUTED         --response_headers------> RESPONSE      (status recorded)
    RESPONSE       --response_body*--------> RESPONSE      (only in "streamed" mode)
    any            --unexpected message----> answered with an empty CONTINUE, counted

What the request gets (documented in docs/ext-proc.md):

* valid OpenAI-style request: CONTINUE with ``x-tailroute-cluster`` set
  (OVERWRITE_IF_EXISTS_OR_ADD, raw_value) and ``clear_route_cache``; the
  ``model`` field is rewritten when the chosen cluster serves it under another name;
* body that is not JSON / not an object / has mistyped fields on an LLM API
  path: 400 ImmediateResponse with an OpenAI-style error JSON (the request
  itself is invalid, every upstream would refuse it);
* GET, no body, non-LLM path, unknown model, body over ``limits.max_body_bytes``:
  CONTINUE to the default route (counted; the upstream answers for itself).
"""

from __future__ import annotations

import json
import logging
from enum import Enum
from typing import Any

from sidecar.app import App, Pending
from sidecar.core.classify import BadRequest, api_for_path, classify, parse_body
from sidecar.core.timing import ResponseTimer
from sidecar.core.types import Decision, RequestInfo
from sidecar.envoy_config import REQUEST_ID_HEADER, ROUTE_HEADER
from sidecar.pb.envoy.config.core.v3 import base_pb2
from sidecar.pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb

log = logging.getLogger("tailroute.extproc")

_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
EXPLAIN_HEADER = "x-tailroute-explain-result"


class Phase(Enum):
    EXPECT_HEADERS = "expect_headers"
    EXPECT_BODY = "expect_body"
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

    # -------------------------------------------------------------- dispatch

    def on_message(self, msg: pb.ProcessingRequest, now: float) -> pb.ProcessingResponse | None:
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

    # -------------------------------------------------------------- request

    def _on_request_headers(self, msg: pb.HttpHeaders, now: float) -> pb.ProcessingResponse:
        self.headers = header_map(msg.headers)
        if msg.end_of_stream:
            return self._route(None, now, is_body=False)
        self.phase = Phase.EXPECT_BODY
        return _continue_headers()

    def _on_request_body(self, msg: pb.HttpBody, now: float) -> pb.ProcessingResponse:
        # BUFFERED mode: the whole body arrives in one message with end_of_stream set.
        return self._route(msg.body, now, is_body=True)

    def _route(self, body: bytes | None, now: float, is_body: bool) -> pb.ProcessingResponse:
        app = self.app
        cfg = app.config
        api = api_for_path(self.headers.get(":path", "/"))
        parsed = None
        if body is not None and api != "other":
            if len(body) > cfg.limits.max_body_bytes:
                app.errors["body_too_large"] += 1
                body = None
            else:
                try:
                    parsed = parse_body(api, body)
                except BadRequest as exc:
                    app.errors["bad_request"] += 1
                    self.phase = Phase.ROUTED
                    return immediate(400, str(exc), "invalid_request_error")
        info = classify(cfg, self.headers, parsed, api)
        decision = app.router.decide(info, now, app.rng)
        self.info, self.decision = info, decision
        self.phase = Phase.ROUTED
        sets = [_set(ROUTE_HEADER, decision.cluster)]
        rid = app.new_rid()
        self.rid = rid
        if app.observe_mode == "observability":
            sets.append(_set(REQUEST_ID_HEADER, rid))
        common = pb.CommonResponse(
            header_mutation=pb.HeaderMutation(set_headers=sets), clear_route_cache=True
        )
        if parsed is not None and decision.upstream_model and body is not None:
            new_body = _rewrite_model(body, decision.upstream_model)
            if new_body is not None:
                common.body_mutation.body = new_body
                common.header_mutation.set_headers.append(
                    _set("content-length", str(len(new_body)))
                )
        timer = ResponseTimer(
            decision.cluster, info.slice, now, info.stream,
            is_retry=info.retry_attempt > 0, is_probe=decision.is_probe,
        )
        app.register(Pending(rid, info, decision, timer, app.deadline_for(decision, now)))
        if is_body:
            return pb.ProcessingResponse(request_body=pb.BodyResponse(response=common))
        return pb.ProcessingResponse(request_headers=pb.HeadersResponse(response=common))

    # -------------------------------------------------------------- response

    def _on_response_headers(self, msg: pb.HttpHeaders, now: float) -> pb.ProcessingResponse:
        self.phase = Phase.RESPONSE
        headers = header_map(msg.headers)
        pending = self.app.pending.get(self.rid or "")
        if pending is not None and not pending.observer_attached:
            status = int(headers.get(":status", "0") or 0)
            pending.timer.on_headers(status, headers.get("content-type", ""), now)
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
        """The gRPC stream ended. Without an observer, this stream owns the observation."""
        pending = self.app.pending.get(self.rid or "")
        if pending is None or pending.observer_attached:
            return
        if pending.timer.ended_at is None and pending.timer.status is not None and not cancelled:
            # headers_only mode: the stream ends after response headers; end-to-end is
            # time to headers, which for SSE is not the generation time (documented).
            pending.timer.on_end(now)
        self.app.finalize(pending.rid, now, cancelled=cancelled or pending.timer.status is None)


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
            p.timer.on_headers(int(headers.get(":status", "0") or 0),
                               headers.get("content-type", ""), now)
            if msg.response_headers.end_of_stream:
                p.timer.on_end(now)
        elif kind == "response_body":
            p.timer.on_body(msg.response_body.body, now, end=msg.response_body.end_of_stream)
        elif kind == "response_trailers":
            p.timer.on_end(now)

    def close(self, now: float, cancelled: bool) -> None:
        p = self.app.pending.get(self.rid) if self.rid else None
        if p is None:
            return
        self.app.finalize(p.rid, now, cancelled=cancelled or p.timer.ended_at is None)


def _rewrite_model(body: bytes, model: str) -> bytes | None:
    try:
        data: Any = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    data["model"] = model
    return json.dumps(data, separators=(",", ":")).encode()


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
