"""In-memory ext_proc stream harness: drive the handlers with protobuf messages."""

from __future__ import annotations

import json
from typing import Any

from sidecar.pb.envoy.config.core.v3 import base_pb2
from sidecar.pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb


def headers_msg(headers: dict[str, str], eos: bool = False, response: bool = False,
                observe: bool = False) -> pb.ProcessingRequest:
    hm = base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
    )
    h = pb.HttpHeaders(headers=hm, end_of_stream=eos)
    if response:
        return pb.ProcessingRequest(response_headers=h, observability_mode=observe)
    return pb.ProcessingRequest(request_headers=h, observability_mode=observe)


def body_msg(body: bytes, eos: bool = True, response: bool = False,
             observe: bool = False) -> pb.ProcessingRequest:
    b = pb.HttpBody(body=body, end_of_stream=eos)
    if response:
        return pb.ProcessingRequest(response_body=b, observability_mode=observe)
    return pb.ProcessingRequest(request_body=b, observability_mode=observe)


def chat_request(model: str = "m", stream: bool = True, **extra: object) -> bytes:
    return json.dumps({"model": model, "stream": stream,
                       "messages": [{"role": "user", "content": "hi"}], **extra}).encode()


POST_CHAT = {":method": "POST", ":path": "/v1/chat/completions",
             "content-type": "application/json"}


def set_headers(resp: pb.ProcessingResponse) -> dict[str, str]:
    kind = resp.WhichOneof("response")
    assert kind is not None
    common = getattr(resp, kind).response
    return {h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers}


def sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def token(text: str) -> bytes:
    return sse({"choices": [{"index": 0, "delta": {"content": text}}]})


# ------------------------------------------------------------ handler interface
# The one place that knows how the shell opens a handler for a stream, so tests
# written against message kinds (the fuzzer) survive a rearrangement of handlers.


def open_stream(app: Any, first: pb.ProcessingRequest) -> Any:
    """The handler the gRPC server opens for a stream whose first message is ``first``:
    it answers ``on_message(msg, now)``, ``close(now, cancelled)`` and, after a
    :func:`is_hold` answer, ``resume(now)``."""
    from sidecar.shell.extproc import ObserveStream, RouteStream

    return ObserveStream(app) if first.observability_mode else RouteStream(app)


def is_hold(answer: object) -> bool:
    """The handler holds the request (admission queue): re-ask with ``resume``."""
    from sidecar.shell.admission import Hold

    return isinstance(answer, Hold)


def request_kind(msg: pb.ProcessingRequest) -> str | None:
    return msg.WhichOneof("request")


def answers_kind(request: str | None, response: pb.ProcessingResponse) -> bool:
    """Envoy's rule: a message is answered by the same kind or an immediate response."""
    kind = response.WhichOneof("response")
    return request is None or kind in (request, "immediate_response")
