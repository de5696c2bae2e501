"""The fake provider's mid-stream failures: a 200 stream that sends some tokens, then an
error event in one of the shapes real servers use, then ends."""

from __future__ import annotations

import asyncio
import http.client
import json
from typing import Any

import pytest

from sidecar.core.timing import ResponseTimer
from sidecar.core.types import SliceKey
from sidecar.fake_provider.latency import (
    MIDSTREAM_ERROR_SHAPES,
    ConfigError,
    LatencyDist,
    Profile,
)
from sidecar.fake_provider.server import FakeProvider

FAST = Profile(ttft=LatencyDist(1.0), tpot=LatencyDist(1.0))
S = SliceKey("m", "interactive", "short", True)
PATHS = {
    "chat": "/v1/chat/completions",
    "completion": "/v1/completions",
    "response": "/v1/responses",
}


async def _streams(profile: Profile, kind: str, n: int) -> tuple[list[bytes], dict[str, Any]]:
    """``n`` streamed 6-token requests of ``kind``: their bodies and the provider's state."""
    body: dict[str, Any] = {
        "model": "m",
        "stream": True,
        "max_tokens": 6,
        "max_output_tokens": 6,
        "messages": [],
        "prompt": "p",
        "input": "i",
    }
    async with FakeProvider(profile=profile, seed=3) as p:
        conn = http.client.HTTPConnection("127.0.0.1", p.port, timeout=10)
        bodies = [await asyncio.to_thread(_post, conn, PATHS[kind], body) for _ in range(n)]
        conn.close()
        return bodies, p.snapshot()


def _post(conn: http.client.HTTPConnection, path: str, body: dict[str, Any]) -> bytes:
    conn.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200
    return r.read()  # the chunked body, decoded


def _timed(raw: bytes) -> ResponseTimer:
    t = ResponseTimer("a", S, 0.0, True)
    t.on_headers(200, "text/event-stream", 0.0)
    t.on_body(raw, 0.1, end=True)
    return t


@pytest.mark.parametrize("kind", sorted(PATHS))
@pytest.mark.parametrize("shape", MIDSTREAM_ERROR_SHAPES)
def test_a_failing_stream_sends_half_its_tokens_then_one_error_event(kind: str, shape: str) -> None:
    profile = Profile(
        ttft=FAST.ttft, tpot=FAST.tpot, midstream_error_rate=1.0, midstream_error_shape=shape
    )
    bodies, state = asyncio.run(_streams(profile, kind, 1))
    t = _timed(bodies[0])
    assert t.stream_error and t.token_events == 3 and t.usage_tokens is None
    assert b"[DONE]" not in bodies[0]
    # Every shape but the one without a message words the failure.
    assert (b"simulated mid-stream failure" in bodies[0]) is (shape != "error_code")
    assert state["counters"]["midstream_errors"] == 1
    assert state["counters"]["by_status"] == {"200": 1}


@pytest.mark.parametrize("kind", sorted(PATHS))
def test_complete_streams_carry_no_error_event(kind: str) -> None:
    """Responses events say ``"error": null`` (as OpenAI's do): not an error event."""
    bodies, state = asyncio.run(_streams(FAST, kind, 2))
    for raw in bodies:
        t = _timed(raw)
        assert not t.stream_error and t.usage_tokens == 6
    if kind == "response":
        assert b'"error": null' in bodies[0]
    assert state["counters"]["midstream_errors"] == 0


def test_the_rate_is_a_share_of_the_streams() -> None:
    profile = Profile(ttft=LatencyDist(0.0), tpot=LatencyDist(0.0), midstream_error_rate=0.5)
    bodies, state = asyncio.run(_streams(profile, "chat", 40))
    failed = sum(_timed(raw).stream_error for raw in bodies)
    assert failed == state["counters"]["midstream_errors"] and 8 <= failed <= 32


@pytest.mark.parametrize(
    "changes",
    [
        {"midstream_error_rate": 1.5},
        {"midstream_error_rate": -0.1},
        {"midstream_error_rate": True},
        {"midstream_error_shape": "gemini"},
    ],
)
def test_bad_midstream_settings_are_refused(changes: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        Profile().updated(changes)


def test_midstream_settings_round_trip_through_the_control_json() -> None:
    p = Profile().updated({"midstream_error_rate": 0.25, "midstream_error_shape": "vllm"})
    assert Profile().updated(p.to_json()) == p
