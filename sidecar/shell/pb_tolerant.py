"""Decode Envoy's gRPC messages when a string field is not UTF-8.

HTTP allows header bytes 0x80-0xFF in a value (``obs-text``) and Envoy forwards them
as they came: the one-message path carries the ``x-tailroute-*`` headers and
``x-request-id`` as request attributes (``google.protobuf.Value.string_value``), the
access log carries ``request_id``, ``user_agent``, ``authority`` and paths as proto3
``string`` fields. Envoy's C++ protobuf does not check those bytes when it writes a
message; Python's (upb) refuses to read a proto3 string that is not UTF-8. One client
header such as ``x-tailroute-tenant: caf\\xe9`` therefore made the whole message
unreadable: gRPC logged a traceback and ended the stream, so the ext_proc request
failed open past admission, and an access-log batch -- other clients' entries with
it -- was lost.

:func:`tolerant` wraps a message class's ``FromString``: the fast path is unchanged;
only a message that fails to decode is walked with its descriptor, every ``string``
field that is not UTF-8 is re-encoded from Latin-1 (byte for byte, as the rich path
already reads ``raw_value`` header bytes), and the repaired bytes are decoded. The
sidecar then judges the value as it judges any other (a ``x-tailroute-*`` value
outside its character set is ignored). Each repaired message calls ``on_repair``
(``tailroute_errors_total{kind="not_utf8"}``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from sidecar.pb.envoy.service.accesslog.v3 import als_pb2
from sidecar.pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb

M = TypeVar("M", bound=Message)
_STRING, _MESSAGE = FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_MESSAGE


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(data) or shift > 63:
            raise DecodeError("truncated varint")
        b = data[i]
        value |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            return value, i
        shift += 7


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def repair_utf8(desc: Any, data: bytes) -> tuple[bytes, int]:
    """``data`` with every string field of the message descriptor ``desc`` (nested
    messages, map entries and ``Struct`` values included) that is not UTF-8 re-encoded
    from Latin-1; returns the bytes and how many fields were re-encoded. Other fields
    are copied unchanged."""
    out, fixed, i = bytearray(), 0, 0
    while i < len(data):
        start = i
        key, i = _varint(data, i)
        key_end, wire = i, key & 7
        if wire == 0:
            _, i = _varint(data, i)
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        elif wire == 2:
            length, body = _varint(data, i)
            i = body + length
            if i > len(data):
                raise DecodeError("truncated field")
            payload = data[body:i]
            field = desc.fields_by_number.get(key >> 3)
            if field is not None and field.type == _STRING:
                try:
                    payload.decode("utf-8")
                except UnicodeDecodeError:
                    payload, fixed = payload.decode("latin-1").encode("utf-8"), fixed + 1
            elif field is not None and field.type == _MESSAGE:
                payload, n = repair_utf8(field.message_type, payload)
                fixed += n
            out += data[start:key_end] + _encode_varint(len(payload)) + payload
            continue
        else:  # groups (3, 4) appear in no message Envoy sends
            raise DecodeError(f"unsupported wire type {wire}")
        if i > len(data):
            raise DecodeError("truncated field")
        out += data[start:i]
    return bytes(out), fixed


def tolerant(cls: type[M], on_repair: Callable[[], None]) -> Callable[[bytes], M]:
    """``cls.FromString`` that repairs non-UTF-8 string fields (module docstring); a
    message that is broken otherwise still raises its :class:`DecodeError`."""
    decode = cls.FromString

    def read(data: bytes) -> M:
        try:
            return decode(data)
        except DecodeError:
            try:
                repaired, fixed = repair_utf8(cls.DESCRIPTOR, data)
            except (DecodeError, RecursionError):
                fixed = 0
            if not fixed:
                raise
            message = decode(repaired)
            on_repair()
            return message

    return read


def _add(server: Any, service: str, method: str, rpc: Callable[..., Any], behaviour: Any,
         request: type[Message], response: type[Message],
         on_repair: Callable[[], None]) -> None:
    """What a generated ``add_<Service>Servicer_to_server`` does for one method, with
    :func:`tolerant` as its request deserializer."""
    handlers = {method: rpc(behaviour, request_deserializer=tolerant(request, on_repair),
                            response_serializer=response.SerializeToString)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    server.add_registered_method_handlers(service, handlers)


def add_extproc(servicer: Any, server: Any, on_repair: Callable[[], None]) -> None:
    """The generated ``add_ExternalProcessorServicer_to_server`` with :func:`tolerant`."""
    _add(server, "envoy.service.ext_proc.v3.ExternalProcessor", "Process",
         grpc.stream_stream_rpc_method_handler, servicer.Process,
         pb.ProcessingRequest, pb.ProcessingResponse, on_repair)


def add_access_log(servicer: Any, server: Any, on_repair: Callable[[], None]) -> None:
    """The generated ``add_AccessLogServiceServicer_to_server`` with :func:`tolerant`."""
    _add(server, "envoy.service.accesslog.v3.AccessLogService", "StreamAccessLogs",
         grpc.stream_unary_rpc_method_handler, servicer.StreamAccessLogs,
         als_pb2.StreamAccessLogsMessage, als_pb2.StreamAccessLogsResponse, on_repair)
