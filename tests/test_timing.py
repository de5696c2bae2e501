from __future__ import annotations

import json

import pytest

from sidecar.core.buckets import Buckets
from sidecar.core.subwindow import latency_indices
from sidecar.core.timing import ResponseTimer, outcome_for_status
from sidecar.core.types import SliceKey

S = SliceKey("m", "interactive", "short", True)


def sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def chunk(text: str) -> bytes:
    return sse({"choices": [{"index": 0, "delta": {"content": text}}]})


def test_streaming_ttft_tpot_with_usage() -> None:
    t = ResponseTimer("a", S, t0=10.0, streaming=True)
    t.on_headers(200, "text/event-stream; charset=utf-8", 10.01)
    t.on_body(sse({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}), 10.02)
    t.on_body(chunk("hel"), 10.25)  # first token at +250 ms
    for i in range(1, 5):
        t.on_body(chunk("x"), 10.25 + 0.01 * i)
    t.on_body(sse({"choices": [], "usage": {"completion_tokens": 5}}), 10.3)
    t.on_body(b"data: [DONE]\n\n", 10.31, end=True)
    obs = t.observation(10.31)
    assert obs is not None and obs.outcome == "ok"
    assert obs.ttft_s == pytest.approx(0.25)
    assert obs.tpot_s == pytest.approx(0.04 / 4)
    assert obs.e2e_s == pytest.approx(0.31)
    assert obs.output_tokens == 5


def test_events_split_across_chunks_and_counted_without_usage() -> None:
    t = ResponseTimer("a", S, t0=0.0, streaming=True)
    t.on_headers(200, "text/event-stream", 0.0)
    raw = chunk("a") + chunk("b") + chunk("c")
    first = len(chunk("a"))
    t.on_body(raw[:7], 0.1)  # partial event: no token yet
    t.on_body(raw[7 : first + 5], 0.2)  # completes the first event
    t.on_body(raw[first + 5 :], 0.4, end=True)
    obs = t.observation(0.4)
    assert obs is not None and obs.output_tokens == 3 and obs.ttft_s == pytest.approx(0.2)


def test_non_streaming_gives_e2e_only() -> None:
    t = ResponseTimer("a", S, t0=1.0, streaming=False)
    t.on_headers(200, "application/json", 1.5)
    t.on_body(json.dumps({"usage": {"completion_tokens": 7}}).encode(), 2.0, end=True)
    obs = t.observation(2.0)
    assert obs is not None and obs.ttft_s is None and obs.tpot_s is None
    assert obs.e2e_s == pytest.approx(1.0) and obs.output_tokens == 7


@pytest.mark.parametrize(
    ("status", "outcome"),
    [(200, "ok"), (201, "ok"), (500, "error"), (503, "error"), (429, "error"),
     (504, "timeout"), (408, "timeout"), (400, None), (404, None)],
)
def test_outcome_for_status(status: int, outcome: str | None) -> None:
    assert outcome_for_status(status) == outcome


def test_error_is_not_a_latency_sample() -> None:
    t = ResponseTimer("a", S, t0=0.0, streaming=True)
    t.on_headers(503, "application/json", 0.1)
    t.on_body(b'{"error": {}}', 0.1, end=True)
    obs = t.observation(0.1)
    assert obs is not None and obs.outcome == "error" and obs.ttft_s is None
    assert obs.e2e_s == 0.1  # how long it took: dates the error (the fast path's runs)
    assert latency_indices(obs, Buckets(0.02)) is None  # never a latency sample


def test_cancel_mid_stream() -> None:
    t = ResponseTimer("a", S, t0=0.0, streaming=True)
    t.on_headers(200, "text/event-stream", 0.1)
    t.on_body(chunk("a"), 0.2)
    obs = t.observation(0.3, cancelled=True)
    # Censored: the latencies are what was seen before the client left.
    assert obs is not None and obs.outcome == "cancel" and obs.censored
    assert obs.ttft_s == pytest.approx(0.2) and obs.e2e_s == pytest.approx(0.3)
    assert obs.tpot_s is None


def test_no_response_at_all_is_cancel_or_timeout() -> None:
    t = ResponseTimer("a", S, t0=0.0, streaming=True)
    obs_c = t.observation(1.0, cancelled=True)
    obs_t = t.observation(1.0, cancelled=False)
    assert obs_c is not None and obs_c.outcome == "cancel"
    assert obs_t is not None and obs_t.outcome == "timeout"


def test_a_stream_cut_by_an_error_event_is_not_dated() -> None:
    """Only an error status is dated by its duration: a stream the provider broke off
    after its headers (an error event behind a 200) is dated when seen."""
    t = ResponseTimer("a", S, t0=0.0, streaming=True)
    t.on_headers(200, "text/event-stream", 0.1)
    t.on_body(b'data: {"error": {"message": "overloaded"}}\n\n', 4.0, end=True)
    obs = t.observation(4.0)
    assert obs is not None and obs.outcome == "error" and obs.e2e_s is None


@pytest.mark.parametrize("streaming", [True, False])
def test_json_nested_past_the_stack_is_read_as_not_json(streaming: bool) -> None:
    """A hostile upstream's event (or reply) nested 100,000 deep: no exception, the
    rest of the stream still counts."""
    deep = b"[" * 100_000 + b"]" * 100_000
    t = ResponseTimer("a", S, t0=0.0, streaming=streaming)
    if streaming:
        t.on_headers(200, "text/event-stream", 0.0)
        t.on_body(chunk("a") + b"data: " + deep + b"\n\n", 0.1)
        t.on_body(chunk("b") + b"data: [DONE]\n\n", 0.3, end=True)
    else:
        t.on_headers(200, "application/json", 0.0)
        t.on_body(deep, 0.3, end=True)
    obs = t.observation(0.3)
    assert obs is not None and obs.outcome == "ok" and obs.e2e_s == pytest.approx(0.3)
    assert obs.output_tokens == (2 if streaming else None)
