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


def metadata(resp: pb.ProcessingResponse) -> dict[str, str]:
    """The ``tailroute`` dynamic metadata an answer writes (route, rid, slice)."""
    ns = resp.dynamic_metadata.fields.get("tailroute")
    if ns is None:
        return {}
    return {k: v.string_value for k, v in ns.struct_value.fields.items()}


def routed_cluster(resp: pb.ProcessingResponse) -> str:
    """The cluster the answer routes to (the first part of the route key)."""
    return metadata(resp)["route"].rsplit("|", 2)[0]


def body_only_msg(body: bytes, headers: dict[str, str] | None = None) -> pb.ProcessingRequest:
    """The one-message path: the body, with headers as ext_proc request attributes."""
    from sidecar.shell.envoy_contract import ATTRIBUTE_HEADERS, ATTRIBUTES_NS

    by_name = {v: k for k, v in ATTRIBUTE_HEADERS.items()}
    msg = pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True))
    attrs = msg.attributes[ATTRIBUTES_NS]
    for name, value in {":path": "/v1/chat/completions", **(headers or {})}.items():
        if name in by_name:
            attrs.fields[by_name[name]].string_value = value
    return msg


def observe_msg(kind: str, meta: dict[str, str], headers: dict[str, str] | None = None,
                body: bytes = b"", eos: bool = False) -> pb.ProcessingRequest:
    """A message of the observing filter, carrying the forwarded tailroute metadata."""
    msg = pb.ProcessingRequest(observability_mode=True)
    fields = msg.metadata_context.filter_metadata["tailroute"].fields
    for k, v in meta.items():
        fields[k].string_value = v
    if kind == "response_headers":
        hm = base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode())
                                         for k, v in (headers or {}).items()])
        msg.response_headers.CopyFrom(pb.HttpHeaders(headers=hm, end_of_stream=eos))
    else:
        msg.response_body.CopyFrom(pb.HttpBody(body=body, end_of_stream=eos))
    return msg


# ------------------------------------------------------------ handler interface
# The one place that knows how the shell opens a handler for a stream, so tests
# written against message kinds (the fuzzer) survive a rearrangement of handlers.


def open_stream(app: Any, first: pb.ProcessingRequest) -> Any:
    """The handler the gRPC server opens for a stream whose first message is ``first``:
    it answers ``on_message(msg, now)``, ``close(now, cancelled)`` and, after a
    :func:`is_hold` answer, ``resume(now)``."""
    from sidecar.shell.extproc import RouteStream
    from sidecar.shell.observe import ObserveStream

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
