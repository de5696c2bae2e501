"""The SSE parser against the WHATWG standard, and the timer on top of it.

Table cases pin the standard's rules; hypothesis properties check that any
re-chunking of a stream yields the same events (against a line-by-line model of
the standard) and, fed to the timer, the same timings.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core.sse import SseEvent, SseParser, parse_all
from sidecar.core.timing import ResponseTimer, is_error_value
from sidecar.core.types import SliceKey

S = SliceKey("m", "interactive", "short", True)


@pytest.mark.parametrize(
    ("stream", "events"),
    [
        (b"data: a\n\n", [SseEvent("a")]),
        (b"data: a\r\n\r\n", [SseEvent("a")]),
        (b"data: a\r\r", [SseEvent("a")]),
        (b"data: a\r\n\rdata: b\n\r\n", [SseEvent("a"), SseEvent("b")]),  # mixed endings
        (b"data:a\n\n", [SseEvent("a")]),  # no space after the colon
        (b"data:  a\n\n", [SseEvent(" a")]),  # only one space is removed
        (b"data: a\ndata: b\n\n", [SseEvent("a\nb")]),  # multi-line data
        (b"data\n\n", [SseEvent("")]),  # a field without colon has an empty value
        (b"data:\n\n", [SseEvent("")]),
        (b"data:\ndata:\n\n", [SseEvent("\n")]),
        (b": keep-alive\n\n", []),  # comment only: no data, no event
        (b":\ndata: a\n: more\n\n", [SseEvent("a")]),
        (b"event: ping\n\n", []),  # no data line: nothing dispatched
        (b"event: delta\ndata: x\n\ndata: y\n\n",
         [SseEvent("x", "delta"), SseEvent("y")]),  # the type resets after dispatch
        (b"id: 7\ndata: x\n\ndata: y\n\n",
         [SseEvent("x", last_event_id="7"), SseEvent("y", last_event_id="7")]),  # id persists
        (b"id: 7\ndata: x\n\nid\ndata: y\n\n",
         [SseEvent("x", last_event_id="7"), SseEvent("y")]),  # an empty id resets it
        (b"id: a\x00b\ndata: x\n\n", [SseEvent("x")]),  # an id with NUL is ignored
        (b"retry: 1500\ndata: x\n\n", [SseEvent("x")]),
        (b"foo: bar\ndata: x\n\n", [SseEvent("x")]),  # unknown fields are ignored
        (b"\xef\xbb\xbfdata: a\n\n", [SseEvent("a")]),  # a leading BOM is skipped
        (b"data: a\n\n\xef\xbb\xbfdata: b\n\n", [SseEvent("a")]),  # only at the start
        (b"data: caf\xc3\xa9 \xff\n\n", [SseEvent("caf\u00e9 \ufffd")]),  # UTF-8, replaced
        (b"data: a\n\ndata: unterminated", [SseEvent("a")]),  # EOF mid-event: discarded
        (b"\n\n\r\n", []),
    ],
)
def test_standard_rules(stream: bytes, events: list[SseEvent]) -> None:
    assert parse_all(stream) == events
    # ... and one byte at a time, which cuts every CRLF in two.
    p = SseParser()
    got = [ev for i in range(len(stream)) for ev in p.feed(stream[i:i + 1])]
    p.end()
    assert got == events


def test_retry_sets_reconnection_time_only_for_digits() -> None:
    p = SseParser()
    p.feed(b"retry: 250\n\nretry: 1e3\n\nretry: -5\n\n")
    assert p.retry_ms == 250


def test_cr_at_chunk_end_and_lf_at_next_start_are_one_line_ending() -> None:
    p = SseParser()
    assert p.feed(b"data: a\r") == []
    assert p.feed(b"\n") == []  # the LF completes the CRLF, it is not a blank line
    assert p.feed(b"\r") == [SseEvent("a")]
    assert p.feed(b"\ndata: b\r\n\r\n") == [SseEvent("b")]


@pytest.mark.parametrize("cut", [1, 7, 16, 65, 200, 10_000])
def test_an_overlong_line_is_dropped_however_the_bytes_are_cut(cut: int) -> None:
    """One chunk or many: a line over ``max_line`` drops its event (it was kept when it
    arrived whole in one chunk, and dropped when cut across two)."""
    stream = b"data: " + b"x" * 100 + b"\n\ndata: next\n\n"
    p = SseParser(max_line=64)
    out = [ev for i in range(0, len(stream), cut) for ev in p.feed(stream[i:i + cut])]
    assert out == [SseEvent("next")] and p.dropped == 1


def test_overlong_line_and_event_are_dropped_and_parsing_resumes() -> None:
    p = SseParser(max_line=64, max_event=100)
    out = p.feed(b"data: " + b"x" * 50)
    out += p.feed(b"y" * 50)  # the line is now over max_line: dropped
    out += p.feed(b"z" * 10 + b"\n\ndata: ok\n\n")
    assert out == [SseEvent("ok")] and p.dropped == 1
    big = b"".join(b"data: " + b"q" * 40 + b"\n" for _ in range(4)) + b"\n"
    assert p.feed(big + b"data: fine\n\n") == [SseEvent("fine")] and p.dropped == 2


# ------------------------------------------------------------------ properties

EOLS = (b"\r\n", b"\n", b"\r")
_value = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"),
                 max_size=12)


@dataclass(frozen=True)
class Line:
    raw: bytes  # without its line ending


_field_line = st.one_of(
    _value.map(lambda v: Line(b"data:" + v.encode())),
    _value.map(lambda v: Line(b"data: " + v.encode())),
    _value.map(lambda v: Line(b"event: " + v.encode())),
    _value.map(lambda v: Line(b"id: " + v.encode())),
    st.just(Line(b"id: x\x00y")),
    st.integers(0, 10**6).map(lambda n: Line(b"retry: %d" % n)),
    _value.map(lambda v: Line(b":" + v.encode())),  # comment
    _value.filter(lambda v: ":" not in v and v != "").map(lambda v: Line(v.encode())),
    st.just(Line(b"data")),
)
# A stream: blocks of field lines, each followed by a blank line (dispatch).
_blocks = st.lists(st.lists(_field_line, max_size=5), max_size=6)


def _model(blocks: list[list[Line]]) -> list[SseEvent]:
    """The standard, line by line, with no chunking at all."""
    out, last_id = [], ""
    for block in blocks:
        data: list[str] | None = None
        kind = ""
        for line in block:
            if line.raw.startswith(b":"):
                continue
            name, sep, value = line.raw.partition(b":")
            if sep and value.startswith(b" "):
                value = value[1:]
            text = value.decode("utf-8", "replace")
            if name == b"data":
                data = [*(data or []), text]
            elif name == b"event":
                kind = text
            elif name == b"id" and b"\0" not in value:
                last_id = text
        if data is not None:
            out.append(SseEvent("\n".join(data), kind or "message", last_id))
    return out


def _serialise(blocks: list[list[Line]], eols: list[bytes]) -> bytes:
    out = bytearray()
    prev = b""
    for i, raw in enumerate(line.raw for block in blocks for line in [*block, Line(b"")]):
        eol = eols[i % len(eols)]
        if prev == b"\r" and not raw and eol == b"\n":
            eol = b"\r"  # CR then a bare LF would read as one CRLF ending, not a blank line
        out += raw + eol
        prev = eol
    return bytes(out)


def _rechunk(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


@settings(max_examples=300, deadline=None)
@given(_blocks, st.lists(st.sampled_from(EOLS), min_size=1, max_size=4),
       st.lists(st.integers(0, 10**6), max_size=40))
def test_any_rechunking_yields_the_events_of_the_standard(
    blocks: list[list[Line]], eols: list[bytes], cuts: list[int]
) -> None:
    stream = _serialise(blocks, eols)
    p = SseParser()
    got = [ev for piece in _rechunk(stream, cuts) for ev in p.feed(piece)]
    assert not p.end()  # every event was terminated
    assert got == _model(blocks)


def _chunk_event(obj: object, multiline: bool) -> str:
    text = json.dumps(obj, indent=1 if multiline else None)
    return "".join(f"data: {part}\n" for part in text.split("\n"))


_token = st.sampled_from(["a", " b", "\u00e9t\u00e9", "\n", "x" * 30])


@st.composite
def _openai_stream(draw: st.DrawFn) -> tuple[list[tuple[float, str]], dict[str, object]]:
    """(send time, event text) pairs of an OpenAI chat stream and the expected timings."""
    t = 0.0
    events: list[tuple[float, str]] = []
    first = last = None
    tokens = 0
    ml = st.booleans()
    if draw(st.booleans()):  # role-only first delta: not a token
        t += draw(st.floats(0.001, 0.5))
        events.append((t, _chunk_event({"choices": [{"index": 0, "delta": {"role": "assistant"}}]},
                                       draw(ml))))
    if draw(st.booleans()):  # empty content: not a token either
        t += draw(st.floats(0.001, 0.5))
        events.append((t, _chunk_event({"choices": [{"delta": {"content": ""}}]}, draw(ml))))
    for text in draw(st.lists(_token, max_size=8)):
        t += draw(st.floats(0.001, 0.5))
        if draw(st.booleans()):
            events.append((t, ": keep-alive\n"))
        events.append((t, _chunk_event({"choices": [{"index": 0, "delta": {"content": text}}]},
                                       draw(ml))))
        first = t if first is None else first
        last = t
        tokens += 1
    t += 0.001
    events.append((t, _chunk_event({"choices": [{"index": 0, "delta": {},
                                                 "finish_reason": "stop"}]}, draw(ml))))
    usage = draw(st.none() | st.integers(0, 50))
    if usage is not None:
        events.append((t, _chunk_event({"choices": [], "usage": {"completion_tokens": usage}},
                                       draw(ml))))
    events.append((t, "data: [DONE]\n"))
    n = usage if usage is not None else tokens
    expected = {"first": first, "last": last, "tokens": n}
    return events, expected


@settings(max_examples=200, deadline=None)
@given(_openai_stream(), st.sampled_from(EOLS), st.lists(st.integers(0, 10**6), max_size=30))
def test_any_rechunking_yields_the_same_timings(
    stream: tuple[list[tuple[float, str]], dict[str, object]], eol: bytes, cuts: list[int]
) -> None:
    events, expected = stream
    timer = ResponseTimer("a", S, t0=0.0, streaming=True)
    timer.on_headers(200, "text/event-stream", 0.0)
    # Bytes sent at one moment may arrive in any pieces; none arrives before it was sent.
    for sent_at, text in events:
        raw = (text + "\n").replace("\n", "\r\n" if eol == b"\r\n" else eol.decode()).encode()
        for piece in _rechunk(raw, cuts):
            timer.on_body(piece, sent_at)
    end = events[-1][0]
    timer.on_body(b"", end, end=True)
    obs = timer.observation(end)
    assert obs is not None and obs.outcome == "ok"
    first, last, tokens = expected["first"], expected["last"], expected["tokens"]
    assert timer.first_token_at == first and timer.last_token_at == last
    assert obs.output_tokens == (tokens or None)
    if first is None:
        assert obs.ttft_s is None and obs.tpot_s is None
    else:
        assert obs.ttft_s == first
        assert isinstance(tokens, int) and isinstance(last, float)
        assert obs.tpot_s == ((last - first) / (tokens - 1) if tokens >= 2 else None)


# ------------------------------------------------------------------ the timer's reading


def _timed(stream: bytes, chunk: int = 7) -> ResponseTimer:
    t = ResponseTimer("a", S, t0=0.0, streaming=True)
    t.on_headers(200, "text/event-stream", 0.0)
    for i in range(0, len(stream), chunk):
        t.on_body(stream[i:i + chunk], 1.0 + i)
    t.on_end(1.0 + len(stream))
    return t


def test_usage_only_chunk_with_empty_choices_is_read_not_counted() -> None:
    body = (b'data: {"choices":[{"delta":{"content":"a"}}]}\r\n\r\n'
            b'data: {"choices":[],"usage":{"completion_tokens":9}}\r\n\r\n'
            b"data: [DONE]\r\n\r\n")
    t = _timed(body)
    assert t.token_events == 1 and t.usage_tokens == 9


def test_responses_api_events_with_event_field() -> None:
    body = (b'event: response.created\ndata: {"type":"response.created","response":{}}\n\n'
            b'event: response.output_text.delta\n'
            b'data: {"type":"response.output_text.delta","delta":"hi"}\n\n'
            b'event: response.completed\ndata: {"type":"response.completed",'
            b'"response":{"usage":{"output_tokens":4}}}\n\n')
    t = _timed(body)
    assert t.token_events == 1 and t.usage_tokens == 4 and t.first_token_at is not None


@pytest.mark.parametrize("event", [
    b'event: error\ndata: {"message":"overloaded"}\n\n',
    # The type alone says it: plain-text, empty and non-object data were read as "ok".
    b"event: error\ndata: upstream overloaded\n\n",
    b"event: error\ndata:\n\n",
    b'event: error\ndata: ["overloaded"]\n\n',
    b"event:error\r\ndata: 503\r\n\r\n",
    b'data: {"error":{"message":"overloaded","type":"server_error"}}\n\n',
    # The definition Envoy's usage filter applies (sidecar.core.timing.ERROR_SELECTORS):
    b'data: {"object":"error","message":"oops","type":"InternalServerError"}\n\n',  # vLLM
    b'data: {"type":"error","message":"m","code":"server_error"}\n\n',  # Responses API
    b'data: {"type":"response.failed","response":{"error":{"message":"f"}}}\n\n',
    b'data: {"type":"error","error":{"type":"overloaded_error","message":""}}\n\n',
    # An error that is not an object with a message still is one.
    b'data: {"error":"upstream overloaded"}\n\n',
    b'data: {"error":{"code":500}}\n\n',
    b'data: {"type":"error","error":{"type":"overloaded_error"}}\n\n',  # Anthropic
    b'data: {"error":{"message":[]}}\n\n',
    b'data: {"error":{}}\n\n',
    b'data: {"error":503}\n\n',
    b'data: {"error":true}\n\n',
    b'data: {"type":"response.failed","response":{"error":{"code":"server_error"}}}\n\n',
])
def test_error_event_in_a_200_stream_is_an_error_outcome(event: bytes) -> None:
    t = _timed(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n' + event)
    obs = t.observation(100.0)
    assert obs is not None and obs.outcome == "error" and obs.ttft_s is None


@pytest.mark.parametrize("event", [
    # How a provider says "no error" in an event that always carries the field.
    b'data: {"error":null,"choices":[]}\n\n',
    b'data: {"error":"","choices":[]}\n\n',
    b'data: {"error":false,"choices":[]}\n\n',
    b'data: {"error":0,"choices":[]}\n\n',
    b'data: {"type":"response.completed","response":{"error":null}}\n\n',
    b'data: {"message":null}\n\n',
    b'data: {"message":""}\n\n',
    # Arrays: Envoy's JSON content parser never lifts one.
    b'data: {"error":["overloaded"]}\n\n',
    # A message below the top level is not an error field.
    b'data: {"choices":[{"delta":{"content":"b","message":"hi"}}]}\n\n',
    b'data: {"type":"response.failed","response":{}}\n\n',
])
def test_what_is_no_error_event(event: bytes) -> None:
    t = _timed(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n' + event)
    assert not t.stream_error


@pytest.mark.parametrize(("value", "error"), [
    (None, False), ("", False), (False, False), (0, False), (0.0, False), ([], False),
    (["x"], False), ("x", True), ("null", True), ({}, True), ({"code": 500}, True),
    (True, True), (500, True), (-1, True), (0.5, True),
])
def test_error_values(value: object, error: bool) -> None:
    assert is_error_value(value) is error


def test_tool_calls_and_refusals_are_tokens() -> None:
    body = (b'data: {"choices":[{"delta":{"tool_calls":[{"index":0}]}}]}\n\n'
            b'data: {"choices":[{"delta":{"refusal":"no"}}]}\n\n')
    assert _timed(body).token_events == 2
