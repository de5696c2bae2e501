"""Ground truth against the timer: any legal framing, any chunking, the same timings.

A *logical* stream is drawn first: OpenAI chat, legacy completions or Responses
API events, each with the time the provider sent it and whether it carries
generated output. It is then rendered in a random legal SSE framing (WHATWG HTML,
"Interpreting an event stream"): LF, CR or CRLF chosen per line, an optional
BOM, ``data:`` with or without its space, JSON split over several ``data:``
lines, comments before and between events and between the lines of one,
``event:``/``id:``/``retry:``/unknown fields and colon-less field lines,
blocks that dispatch nothing, an empty ``data:`` event, and sometimes a final
token event without its blank line (discarded at the end of the stream, as the
standard says). The bytes are cut at random positions (inside ``data:``, inside
a multi-byte UTF-8 character, between CR and LF) into chunks that arrive in
order, each no earlier than its last byte was sent.

Truth: an event happens when the chunk holding the first byte of the line end
of its blank line arrives (a CR alone completes a line; the standard does not
wait for an LF). The timer must report exactly that arrival for the first and
last token, the number of token events and the usage count, and an observing
stream the first-token offset from the first body byte.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.core.timing import ResponseTimer
from sidecar.core.types import SliceKey
from sidecar.shell.observe import ObserveStream
from tests.streamharness import chat_request, metadata, observe_msg
from tests.test_extproc import fast, make_app

S = SliceKey("m", "interactive", "short", True)
EOLS = (b"\n", b"\r", b"\r\n")
_TEXT = st.sampled_from(["a", " b", "\u00e9t\u00e9", "\u65e5\u672c", "\U0001f642", "\n", "x" * 40])


@dataclass(frozen=True)
class Logical:
    """One event as the provider means it: its payload, send time and meaning."""

    payload: str  # the data, possibly several lines (JSON), or "" for an empty data:
    at: int  # send time, ms
    token: bool  # carries generated output
    kind: str = ""  # an SSE event type to send, if any


def _chat(delta: dict[str, object], **more: object) -> str:
    return json.dumps(
        {
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
            **more,
        },
        ensure_ascii=False,
    )


def _usage_and_done(usage: int | None, step: Callable[[], int]) -> list[Logical]:
    """How chat and completions streams end: a usage-only chunk if asked for, [DONE]."""
    out: list[Logical] = []
    if usage is not None:
        body = json.dumps({"choices": [], "usage": {"completion_tokens": usage}})
        out.append(Logical(body, step(), False))
    out.append(Logical("[DONE]", step(), False))
    return out


def _chat_token(draw: st.DrawFn) -> str:
    text = draw(_TEXT)
    delta: dict[str, object] = draw(
        st.sampled_from(
            [
                {"content": text},
                {"reasoning_content": text},
                {"refusal": text},
                {"tool_calls": [{"index": 0, "function": {"arguments": text}}]},
            ]
        )
    )
    return _chat(delta)


@st.composite
def logical_streams(draw: st.DrawFn) -> tuple[list[Logical], int | None]:
    """A provider's events in order, and the usage count it reports (if any)."""
    api = draw(st.sampled_from(["chat", "completions", "responses"]))
    t = 0
    out: list[Logical] = []

    def step() -> int:
        nonlocal t
        t += draw(st.integers(0, 40))
        return t

    usage = draw(st.none() | st.integers(0, 60))
    texts = st.lists(_TEXT, max_size=6)
    if api == "chat":
        if draw(st.booleans()):
            out.append(
                Logical(_chat({"role": "assistant", "content": "", "refusal": None}), step(), False)
            )
        for _ in range(draw(st.integers(0, 6))):
            out.append(Logical(_chat_token(draw), step(), True))
        finish = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        out.append(Logical(json.dumps(finish), step(), False))
        out.extend(_usage_and_done(usage, step))
    elif api == "completions":
        for text in draw(texts):
            out.append(
                Logical(
                    json.dumps({"choices": [{"index": 0, "text": text}]}, ensure_ascii=False),
                    step(),
                    True,
                )
            )
        out.append(
            Logical(
                json.dumps({"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]}),
                step(),
                False,
            )
        )
        out.extend(_usage_and_done(usage, step))
    else:

        def resp(kind: str, token: bool, **fields: object) -> Logical:
            typed = draw(st.booleans())  # the SSE event type is optional here
            return Logical(
                json.dumps({"type": kind, **fields}, ensure_ascii=False),
                step(),
                token,
                kind if typed else "",
            )

        out.append(resp("response.created", False, response={"status": "in_progress"}))
        for text in draw(texts):
            kind = draw(
                st.sampled_from(
                    [
                        "response.output_text.delta",
                        "response.function_call_arguments.delta",
                        "response.reasoning_summary_text.delta",
                    ]
                )
            )
            out.append(resp(kind, True, delta=text))
        out.append(resp("response.output_text.done", False, text="all"))
        done = {"usage": {"output_tokens": usage}} if usage is not None else {}
        out.append(resp("response.completed", False, response=done))
    return out, usage


@dataclass
class Rendered:
    raw: bytearray
    sent: list[int]  # per byte: when it was sent
    dispatch: list[tuple[int, Logical]]  # index of the dispatching byte, event


def _render(draw: st.DrawFn, events: list[Logical], tail: Logical | None) -> Rendered:
    out = Rendered(bytearray(), [], [])
    eol_pool = draw(st.lists(st.sampled_from(EOLS), min_size=1, max_size=3))
    prev_eol = b""

    def line(text: bytes, at: int) -> int:
        """Append one line; returns the index of its line end's first byte."""
        nonlocal prev_eol
        eol = draw(st.sampled_from(eol_pool))
        if not text and prev_eol == b"\r" and eol == b"\n":
            eol = b"\r\n"  # CR then a bare LF would be one line end, not a blank line
        out.raw += text
        at_eol = len(out.raw)
        out.raw += eol
        out.sent.extend([at] * (len(text) + len(eol)))
        prev_eol = eol
        return at_eol

    def noise(at: int) -> None:
        for _ in range(draw(st.integers(0, 2))):
            line(
                draw(
                    st.sampled_from(
                        [b": keep-alive", b":", b"retry: 3000", b"id: 7", b"foo: bar", b"x", b"id"]
                    )
                ),
                at,
            )

    if draw(st.booleans()):
        out.raw += b"\xef\xbb\xbf"
        out.sent.extend([0] * 3)
    for ev in [*events, *([tail] if tail else [])]:
        # Blocks that dispatch nothing: comments only, blank lines, a type without data.
        for _ in range(draw(st.integers(0, 1))):
            filler = draw(st.sampled_from([[b": ping"], [b""], [b"event: ping"], [b"id: 3"]]))
            for text in filler:
                line(text, ev.at)
            if filler != [b""]:
                line(b"", ev.at)
        noise(ev.at)
        if ev.kind:
            line(b"event: " + ev.kind.encode(), ev.at)
        payload = ev.payload
        if draw(st.booleans()) and payload.startswith("{"):
            payload = json.dumps(json.loads(payload), indent=1, ensure_ascii=False)
        for part in payload.split("\n"):
            prefix = draw(st.sampled_from([b"data:", b"data: "]))
            line(prefix + part.encode(), ev.at)
            noise(ev.at)
        if ev is tail:
            break  # no blank line: the standard discards it
        out.dispatch.append((line(b"", ev.at), ev))
    return out


@st.composite
def wire(draw: st.DrawFn) -> tuple[list[tuple[int, bytes]], list[tuple[int, Logical]], int | None]:
    """(arrival ms, chunk) pairs, (arrival ms, event) per dispatched event, usage."""
    events, usage = draw(logical_streams())
    tail = None
    if draw(st.booleans()):
        tail = Logical(_chat({"content": "cut"}), events[-1].at, True)
    if draw(st.booleans()):  # an empty data: event is an event, just not JSON
        events.insert(draw(st.integers(0, len(events))), Logical("", 0, False))
        events = [
            ev if ev.payload else Logical("", events[max(i - 1, 0)].at, False)
            for i, ev in enumerate(events)
        ]
    r = _render(draw, events, tail)
    n = len(r.raw)
    cuts = draw(st.lists(st.integers(1, max(n - 1, 1)), max_size=40))
    points = sorted({c for c in cuts if 0 < c < n} | {0, n})
    chunks: list[tuple[int, bytes]] = []
    arrival = 0
    owner: list[int] = []  # per byte: its chunk's arrival
    for a, b in itertools.pairwise(points):
        arrival = max(arrival, r.sent[b - 1]) + draw(st.integers(0, 3))
        chunks.append((arrival, bytes(r.raw[a:b])))
        owner.extend([arrival] * (b - a))
    return chunks, [(owner[i], ev) for i, ev in r.dispatch], usage


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(wire())
def test_timer_matches_the_ground_truth(
    case: tuple[list[tuple[int, bytes]], list[tuple[int, Logical]], int | None],
) -> None:
    chunks, dispatched, usage = case
    t0 = -5.0
    timer = ResponseTimer("a", S, t0=t0, streaming=True)
    timer.on_headers(200, "text/event-stream; charset=utf-8", t0)
    for at, piece in chunks:
        timer.on_body(piece, float(at))
    end = float(chunks[-1][0]) if chunks else 0.0
    timer.on_body(b"", end, end=True)
    tokens = [at for at, ev in dispatched if ev.token]
    assert timer.token_events == len(tokens)
    assert timer.first_token_at == (float(tokens[0]) if tokens else None)
    assert timer.last_token_at == (float(tokens[-1]) if tokens else None)
    assert timer.usage_tokens == usage
    assert not timer.stream_error
    obs = timer.observation(end)
    assert obs is not None and obs.outcome == "ok" and obs.e2e_s == end - t0
    count = usage if usage is not None else len(tokens)
    assert obs.output_tokens == (count or None)
    if tokens:
        assert obs.ttft_s == tokens[0] - t0
        if count >= 2:
            assert obs.tpot_s == (tokens[-1] - tokens[0]) / (count - 1)
    else:
        assert obs.ttft_s is None and obs.tpot_s is None


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(wire())
def test_observer_offset_matches_the_ground_truth(
    case: tuple[list[tuple[int, bytes]], list[tuple[int, Logical]], int | None],
) -> None:
    """The production path: the observing stream, closed at the first token, reports
    first token - first body byte."""
    chunks, dispatched, _ = case
    app = make_app(share=1.0, min_samples=1)
    _, r = fast(app, chat_request(), now=0.0)
    meta = metadata(r)  # type: ignore[arg-type]
    o = ObserveStream(app)
    headers = {":status": "200", "content-type": "text/event-stream"}
    closed = o.on_message(observe_msg("response_headers", meta, headers), 0.0)
    for i, (at, piece) in enumerate(chunks):
        if closed:
            break
        eos = i == len(chunks) - 1
        closed = o.on_message(observe_msg("response_body", meta, body=piece, eos=eos), float(at))
    tokens = [at for at, ev in dispatched if ev.token]
    assert o.timer is not None and o.timer.first_token_at == (float(tokens[0]) if tokens else None)
    want = "timed" if tokens else "no_token"
    assert closed and app.first_token_samples == {want: 1}
    if tokens:
        first_body = next(float(at) for at, piece in chunks if piece)
        cluster = meta["route"].rsplit("|", 2)[0]
        assert app.offsets.offset(cluster, S) == tokens[0] - first_body
