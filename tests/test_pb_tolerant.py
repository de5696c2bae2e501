"""Envoy's messages with header bytes that are not UTF-8 (sidecar.shell.pb_tolerant).

Envoy passes a header's obs-text bytes (0x80-0xFF, allowed by HTTP) on in proto3
``string`` fields, which Python's protobuf refuses to read: one client header made a
whole ext_proc message or access-log batch unreadable (the real-Envoy case is in
tests/test_integration_hostile.py).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from google.protobuf.message import DecodeError, Message
from hypothesis import given
from hypothesis import strategies as st

from sidecar.pb.envoy.service.accesslog.v3 import als_pb2
from sidecar.pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from sidecar.shell.pb_tolerant import repair_utf8, tolerant
from sidecar.shell.request_headers import attribute_headers

MARK = b"@@MARK@@"  # a UTF-8 placeholder of the bad value's length, swapped in after


def _with_bytes(msg: Message, raw: bytes) -> bytes:
    """``msg`` serialised with the placeholder's bytes replaced by ``raw`` (same length:
    protobuf would never write them itself)."""
    assert len(raw) == len(MARK)
    data = msg.SerializeToString()
    assert data.count(MARK) == 1
    return data.replace(MARK, raw)


def _route_request(tenant: str) -> pb.ProcessingRequest:
    m = pb.ProcessingRequest()
    fields = m.attributes["envoy.filters.http.ext_proc"].fields
    fields["request.headers['x-tailroute-tenant']"].string_value = tenant
    fields["request.path"].string_value = "/v1/chat/completions"
    m.request_body.body = b'{"model": "m", "note": "\xff binary stays as sent"}'
    m.request_body.end_of_stream = True
    return m


def _decoder() -> tuple[list[int], Callable[[bytes], pb.ProcessingRequest]]:
    repairs: list[int] = []
    return repairs, tolerant(pb.ProcessingRequest, lambda: repairs.append(1))


@pytest.mark.parametrize("raw, read", [
    (b"caf\xe9-t-1", "café-t-1"),   # Latin-1 é, as a client's editor typed it
    (b"\xff\xfe\x80abcde", "ÿþ\x80abcde"),
])
def test_a_header_value_that_is_not_utf8_is_read_as_latin1(raw: bytes, read: str) -> None:
    data = _with_bytes(_route_request(MARK.decode()), raw)
    with pytest.raises(DecodeError):
        pb.ProcessingRequest.FromString(data)  # what the generated handler did
    repairs, decode = _decoder()
    msg = decode(data)
    assert attribute_headers(msg)["x-tailroute-tenant"] == read
    assert msg.request_body.body == _route_request("").request_body.body  # bytes untouched
    assert msg.request_body.end_of_stream and repairs == [1]


def test_a_valid_message_takes_the_plain_path() -> None:
    repairs, decode = _decoder()
    msg = decode(_route_request("café").SerializeToString())
    assert attribute_headers(msg)["x-tailroute-tenant"] == "café" and repairs == []


@pytest.mark.parametrize("data", [b"\x0a\xff", b"\x0a\x05ab", b"\xff\xff\xff"])
def test_a_message_broken_otherwise_still_fails_to_decode(data: bytes) -> None:
    repairs, decode = _decoder()
    with pytest.raises(DecodeError):
        decode(data)
    assert repairs == []


def test_one_bad_request_id_no_longer_costs_the_whole_access_log_batch() -> None:
    batch = als_pb2.StreamAccessLogsMessage()
    batch.identifier.node.id = "envoy-1"
    for i, rid in enumerate(["rid-0", MARK.decode(), "rid-2"]):
        e = batch.http_logs.log_entry.add()
        e.request.request_id = rid
        e.request.path = f"/v1/chat/completions?{i}"
        e.response.response_code.value = 200
    data = _with_bytes(batch, b"r\xe9q-id-1")
    repairs: list[int] = []
    msg = tolerant(als_pb2.StreamAccessLogsMessage, lambda: repairs.append(1))(data)
    ids = [e.request.request_id for e in msg.http_logs.log_entry]
    assert ids == ["rid-0", "réq-id-1", "rid-2"] and repairs == [1]
    assert msg.identifier.node.id == "envoy-1"


@given(st.lists(st.binary(max_size=12), min_size=1, max_size=4))
def test_repair_changes_only_the_strings_that_are_not_utf8(values: list[bytes]) -> None:
    """Every string comes back as its UTF-8 reading, or else its Latin-1 one; the
    repaired message re-encodes to exactly what a sender of those strings writes."""
    entries = [(f"k{i}", v) for i, v in enumerate(values)]
    data = bytearray()
    for k, v in entries:  # a Struct field entry by hand: key, then Value{string_value}
        value = b"\x1a" + _len(v) + v
        entry = b"\x0a" + _len(k.encode()) + k.encode() + b"\x12" + _len(value) + value
        data += b"\x0a" + _len(entry) + entry
    struct = bytes(data)
    attr = b"\x0a\x01a" + b"\x12" + _len(struct) + struct
    wire = b"\x4a" + _len(attr) + attr  # ProcessingRequest.attributes = 9
    repaired, fixed = repair_utf8(pb.ProcessingRequest.DESCRIPTOR, wire)
    got = pb.ProcessingRequest.FromString(repaired).attributes["a"].fields
    expect = {k: _read(v) for k, v in entries}
    assert {k: got[k].string_value for k in expect} == expect
    assert fixed == sum(not _utf8(v) for v in values)
    assert repair_utf8(pb.ProcessingRequest.DESCRIPTOR, repaired) == (repaired, 0)


def _len(b: bytes) -> bytes:
    assert len(b) < 128
    return bytes([len(b)])


def _utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _read(b: bytes) -> str:
    return b.decode("utf-8") if _utf8(b) else b.decode("latin-1")
