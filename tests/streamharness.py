"""In-memory ext_proc stream harness: drive the handlers with protobuf messages."""

from __future__ import annotations

import json

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
