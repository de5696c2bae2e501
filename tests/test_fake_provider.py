"""Tests for the simulated OpenAI-compatible provider (sidecar.fake_provider.server)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import openai
import pytest

from sidecar.fake_provider.latency import (
    ConfigError,
    LatencyDist,
    Profile,
    parse_schedule,
)
from sidecar.fake_provider.server import MAX_BODY, FakeProvider, main

REPO = Path(__file__).resolve().parents[1]
FAST = Profile(ttft=LatencyDist(1.0), tpot=LatencyDist(1.0))
MSGS: list[Any] = [{"role": "user", "content": "hello there, fake model"}]


def async_test(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test body with asyncio.run (pytest-asyncio is not installed)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))

    return wrapper


@contextlib.asynccontextmanager
async def serving(**kwargs: Any) -> AsyncIterator[tuple[FakeProvider, openai.AsyncOpenAI]]:
    kwargs.setdefault("profile", FAST)
    async with FakeProvider(**kwargs) as provider:
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{provider.port}/v1", api_key="x", max_retries=0
        )
        try:
            yield provider, client
        finally:
            await client.close()


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """Read one Content-Length-framed HTTP response."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    headers = {}
    for line in head[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(head[0].split()[1]), headers, body


async def http(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
    """One request on a fresh connection; returns (status, parsed JSON body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        data = body or b""
        writer.write(
            f"{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {len(data)}\r\n\r\n".encode()
            + data
        )
        status, headers, raw = await read_response(reader)
        assert headers["content-type"] == "application/json"
        return status, json.loads(raw)
    finally:
        writer.close()


async def control(port: int, payload: dict[str, Any]) -> dict[str, Any]:
    status, body = await http(port, "POST", "/control", json.dumps(payload).encode())
    assert status == 200, body
    assert isinstance(body, dict)
    return body


async def eventually(cond: Callable[[], bool], limit_s: float = 5.0) -> None:
    """Poll until cond() holds (the limit only guards against hanging, it is not a check)."""
    deadline = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() >= deadline:  # a hang guard, not a speed check
            pytest.fail("condition never became true")
        await asyncio.sleep(0.01)


# --------------------------------------------------------------------------- latency model


def test_latency_dist_parse_forms() -> None:
    assert LatencyDist.parse(50) == LatencyDist(50.0)
    assert LatencyDist.parse("50") == LatencyDist(50.0)
    assert LatencyDist.parse("50:80") == LatencyDist(50.0, 80.0)
    assert LatencyDist.parse({"median": 50, "p99": 80}) == LatencyDist(50.0, 80.0)
    assert LatencyDist.parse({"fixed": 7}) == LatencyDist(7.0)
    for bad in ("x", "80:50", {"p99": 5}, {"median": 1, "bogus": 2}, True, -1, None):
        with pytest.raises(ConfigError):
            LatencyDist.parse(bad)


def test_lognormal_matches_median_and_p99() -> None:
    dist = LatencyDist(50.0, 200.0)
    assert dist.sigma == pytest.approx(0.5960, abs=1e-3)  # ln(4) / 2.326
    rng = random.Random(1)
    samples = sorted(dist.sample_ms(rng) for _ in range(40_000))
    assert samples[len(samples) // 2] == pytest.approx(50.0, rel=0.05)
    assert samples[int(len(samples) * 0.99)] == pytest.approx(200.0, rel=0.15)
    assert LatencyDist(30.0).sample_ms(rng) == 30.0


def test_profile_updates_and_validation() -> None:
    prof = Profile().updated({"ttft_ms": {"median": 10, "p99": 20}, "error_rate": 0.5})
    assert prof.ttft == LatencyDist(10.0, 20.0)
    assert prof.error_rate == 0.5
    assert Profile().updated(prof.to_json()) == prof  # to_json round-trips
    for bad in ({"error_rate": 2}, {"nope": 1}, {"outage": 1}, {"error_status": 200},
                {"stall_ms": -1}, {"outage_mode": "explode"}, {"waiting_comment_ms": -5}):
        with pytest.raises(ConfigError):
            Profile().updated(bad)


def test_parse_schedule_from_file(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps([{"at_s": 2, "set": {"outage": True}},
                                {"at_s": 1, "set": {"error_rate": 0.1}}]))
    entries = parse_schedule(f"@{path}")
    assert [e.at_s for e in entries] == [1.0, 2.0]
    with pytest.raises(ConfigError):
        parse_schedule('[{"at_s": 1, "set": {"bogus": 1}}]')


# --------------------------------------------------------------------------- OpenAI API


@async_test
async def test_chat_non_streaming() -> None:
    async with serving(name="alpha") as (provider, client):
        raw = await client.chat.completions.with_raw_response.create(
            model="my-model", messages=MSGS, max_tokens=5
        )
        assert raw.headers["x-fake-provider"] == "alpha"
        resp = raw.parse()
        assert resp.model == "my-model"
        assert resp.choices[0].finish_reason == "stop"
        assert resp.choices[0].message.content is not None
        assert len(resp.choices[0].message.content.split()) == 5
        assert resp.usage is not None
        assert resp.usage.completion_tokens == 5
        assert resp.usage.total_tokens == resp.usage.prompt_tokens + 5
        # default token count, max_completion_tokens, and the max_tokens cap
        resp = await client.chat.completions.create(model="m", messages=MSGS)
        assert resp.usage is not None and resp.usage.completion_tokens == 16
        resp = await client.chat.completions.create(
            model="m", messages=MSGS, max_completion_tokens=3
        )
        assert resp.usage is not None and resp.usage.completion_tokens == 3
        resp = await client.chat.completions.create(model="m", messages=MSGS, max_tokens=10_000)
        assert resp.usage is not None and resp.usage.completion_tokens == 64
        assert provider.status_counts == {200: 4}
        assert provider.requests_total == 4


@async_test
async def test_chat_streaming_tokens_usage_and_ttft() -> None:
    profile = Profile(ttft=LatencyDist(200.0), tpot=LatencyDist(2.0))
    async with serving(name="beta", profile=profile) as (_, client):
        start = time.monotonic()
        stream = await client.chat.completions.create(
            model="stream-model", messages=MSGS, max_tokens=7, stream=True,
            stream_options={"include_usage": True},
        )
        first_token_at: float | None = None
        contents: list[str] = []
        chunks = [chunk async for chunk in stream]
        for chunk in chunks:
            if chunk.choices and chunk.choices[0].delta.content:
                first_token_at = first_token_at or time.monotonic() - start
                contents.append(chunk.choices[0].delta.content)
        assert first_token_at is not None and first_token_at >= 0.15
        assert len(contents) == 7
        assert all(c.model == "stream-model" for c in chunks)
        assert chunks[-2].choices[0].finish_reason == "stop"
        usage_chunk = chunks[-1]
        assert usage_chunk.choices == []
        assert usage_chunk.usage is not None and usage_chunk.usage.completion_tokens == 7


@async_test
async def test_stall_pauses_after_first_token() -> None:
    profile = Profile(ttft=LatencyDist(0.0), tpot=LatencyDist(0.0), stall_ms=200.0)
    async with serving(profile=profile) as (_, client):
        stream = await client.chat.completions.create(
            model="m", messages=MSGS, max_tokens=3, stream=True
        )
        stamps = []
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                stamps.append(time.monotonic())
        assert len(stamps) == 3
        assert stamps[1] - stamps[0] >= 0.15


@async_test
async def test_waiting_comments_go_out_before_the_first_token_only() -> None:
    """``waiting_comment_ms``: an SSE comment that often while the request waits, as a
    gateway keeping an idle connection open does; none once the tokens flow."""
    profile = Profile(ttft=LatencyDist(250.0), tpot=LatencyDist(60.0), waiting_comment_ms=100.0)
    async with serving(profile=profile) as (provider, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", provider.port)
        body = json.dumps({"model": "m", "messages": MSGS, "max_tokens": 3,
                           "stream": True}).encode()
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)
        raw = await reader.read(1 << 20)
        while not raw.endswith(b"0\r\n\r\n"):
            raw += await reader.read(1 << 20)
        writer.close()
    text = raw.split(b"\r\n\r\n", 1)[1]
    first_token = text.index(b"data: ")
    assert text[:first_token].count(b": keep-alive") == 2  # at 100 and 200 ms of 250
    assert b": keep-alive" not in text[first_token:]


@async_test
async def test_completions_and_responses_endpoints() -> None:
    async with serving(name="gamma") as (_, client):
        comp = await client.completions.create(model="c-model", prompt="abc", max_tokens=4)
        assert comp.model == "c-model" and comp.usage is not None
        assert comp.usage.completion_tokens == 4
        pieces = [c.choices[0].text async for c in await client.completions.create(
            model="c", prompt="abc", max_tokens=4, stream=True) if c.choices]
        assert len([p for p in pieces if p]) == 4
        resp = await client.responses.create(model="r-model", input="hi", max_output_tokens=3)
        assert resp.model == "r-model" and len(resp.output_text.split()) == 3
        assert resp.usage is not None and resp.usage.output_tokens == 3
        deltas = [e.delta async for e in await client.responses.create(
            model="r", input="hi", max_output_tokens=3, stream=True)
            if e.type == "response.output_text.delta"]
        assert len(deltas) == 3


# --------------------------------------------------------------------------- control


@async_test
async def test_control_error_rate_and_counters() -> None:
    async with serving(name="delta") as (provider, client):
        state = await control(provider.port, {"error_rate": 1.0})
        assert state["base"]["error_rate"] == 1.0
        with pytest.raises(openai.APIStatusError) as info:
            await client.chat.completions.create(model="m", messages=MSGS)
        assert info.value.status_code == 500
        assert info.value.response.headers["x-fake-provider"] == "delta"
        await control(provider.port, {"error_rate": 0.0, "error_status": 503})
        await client.chat.completions.create(model="m", messages=MSGS)
        status, state = await http(provider.port, "GET", "/control")
        assert status == 200
        assert state["counters"]["by_status"] == {"200": 1, "500": 1}
        assert state["counters"]["requests_total"] == 2
        # an invalid payload is rejected as a whole
        status, err = await http(provider.port, "POST", "/control",
                                 b'{"error_rate": 0.5, "bogus": 1}')
        assert status == 400 and err["error"]["type"] == "invalid_request_error"
        assert provider.base_profile.error_rate == 0.0


@async_test
async def test_streaming_only_override() -> None:
    async with serving() as (provider, client):
        await control(provider.port, {"streaming_only": True, "error_rate": 1.0})
        ok = await client.chat.completions.create(model="m", messages=MSGS, max_tokens=2)
        assert ok.usage is not None and ok.usage.completion_tokens == 2
        with pytest.raises(openai.APIStatusError):
            await client.chat.completions.create(model="m", messages=MSGS, stream=True)
        assert provider.streaming_profile.error_rate == 1.0
        assert provider.base_profile.error_rate == 0.0
        # base changes still show through where the override is silent
        state = await control(provider.port, {"stall_ms": 1.0})
        assert state["streaming_override"]["stall_ms"] == 1.0
        state = await control(provider.port, {"clear_streaming_override": True})
        assert state["streaming_override"] is None
        stream = await client.chat.completions.create(
            model="m", messages=MSGS, max_tokens=2, stream=True
        )
        assert len([c async for c in stream]) == 4  # 2 tokens, finish, usage


@async_test
async def test_outage_modes_and_recovery() -> None:
    async with serving() as (provider, client):
        await control(provider.port, {"outage": True})
        with pytest.raises(openai.APIConnectionError):
            await client.chat.completions.create(model="m", messages=MSGS)
        assert provider.dropped_connections == 1
        assert (await http(provider.port, "GET", "/healthz"))[0] == 200
        await control(provider.port, {"outage_mode": "503"})
        with pytest.raises(openai.APIStatusError) as info:
            await client.chat.completions.create(model="m", messages=MSGS, stream=True)
        assert info.value.status_code == 503
        await control(provider.port, {"outage": False})
        await client.chat.completions.create(model="m", messages=MSGS)
        await control(provider.port, {"streaming_only": True, "outage": True})
        await client.chat.completions.create(model="m", messages=MSGS)
        with pytest.raises(openai.APIStatusError):  # outage_mode "503" inherited from base
            await client.chat.completions.create(model="m", messages=MSGS, stream=True)
        # reset goes back to the startup profile
        state = await control(provider.port, {"reset": True})
        assert state["streaming_override"] is None and state["base"]["outage"] is False


@async_test
async def test_hold_keeps_requests_waiting_until_released_and_survives_other_changes() -> None:
    async with serving() as (provider, client):
        state = await control(provider.port, {"hold": True})
        assert state["held"] is True
        calls = [asyncio.create_task(client.chat.completions.create(model="m", messages=MSGS))
                 for _ in range(3)]
        await eventually(lambda: provider.requests_total == 3)
        # Other changes leave the hold as it is; held requests have not started.
        state = await control(provider.port, {"error_rate": 0.0})
        assert state["held"] is True and not any(c.done() for c in calls)
        assert provider.active_requests == 0
        with pytest.raises(ConfigError, match="hold must be a boolean"):
            provider.apply_control({"hold": "no"})
        await control(provider.port, {"hold": False})
        assert all([(await c).choices for c in calls])
        # reset releases too
        await control(provider.port, {"hold": True})
        held = asyncio.create_task(client.chat.completions.create(model="m", messages=MSGS))
        await eventually(lambda: provider.requests_total == 4)
        assert (await control(provider.port, {"reset": True}))["held"] is False
        assert (await held).choices


@pytest.mark.parametrize("payload", [{"reset": True, "ttft_ms": "fast"},
                                     {"reset": True, "hold": "no"}])
def test_an_invalid_reset_changes_nothing(payload: dict[str, object]) -> None:
    """A refused payload is not applied at all: a reset in it does not release the hold
    or restore the startup profile first."""
    provider = FakeProvider("p", Profile(ttft=LatencyDist(5.0, 5.0)))
    provider.apply_control({"hold": True, "error_rate": 0.5})
    before = provider.snapshot()
    with pytest.raises(ConfigError):
        provider.apply_control(payload)
    assert provider.snapshot() == before and before["held"] is True


@async_test
async def test_schedule_applies_relative_to_start() -> None:
    schedule = parse_schedule('[{"at_s": 0.05, "set": {"error_rate": 1.0}}]')
    async with serving(schedule=schedule) as (provider, _):
        await eventually(lambda: provider.base_profile.error_rate == 1.0)


# --------------------------------------------------------------------------- HTTP layer


@async_test
async def test_bad_json_unknown_path_and_method() -> None:
    async with serving(name="eps") as (provider, _):
        status, body = await http(provider.port, "POST", "/v1/chat/completions", b"{not json")
        assert status == 400
        assert body["error"]["type"] == "invalid_request_error"
        assert (await http(provider.port, "GET", "/nope"))[0] == 404
        assert (await http(provider.port, "GET", "/v1/chat/completions"))[0] == 405
        assert provider.status_counts == {400: 1}
        big = json.dumps({"model": "big", "messages": [{"role": "user", "content": "x" * 2**21}],
                          "max_tokens": 1}).encode()
        status, body = await http(provider.port, "POST", "/v1/chat/completions", big)
        assert status == 200 and body["usage"]["prompt_tokens"] == 2**19
        reader, writer = await asyncio.open_connection("127.0.0.1", provider.port)
        try:  # over the 16 MiB limit: refused from the header alone
            writer.write(b"POST /v1/completions HTTP/1.1\r\ncontent-length: %d\r\n\r\n"
                         % (MAX_BODY + 1))
            assert (await read_response(reader))[0] == 413
        finally:
            writer.close()


@async_test
async def test_keep_alive_and_chunked_request_body() -> None:
    async with serving(name="zeta") as (provider, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", provider.port)
        try:
            payload = json.dumps({"model": "k", "messages": MSGS, "max_tokens": 2}).encode()
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                         b"content-length: %d\r\n\r\n%s" % (len(payload), payload))
            status, headers, body = await read_response(reader)
            assert status == 200 and headers["x-fake-provider"] == "zeta"
            assert headers["connection"] == "keep-alive"
            half = len(payload) // 2
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                         b"transfer-encoding: chunked\r\n\r\n"
                         b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n"
                         % (half, payload[:half], len(payload) - half, payload[half:]))
            status, _, body = await read_response(reader)  # same connection
            assert status == 200 and json.loads(body)["model"] == "k"
        finally:
            writer.close()


@async_test
async def test_client_disconnect_mid_stream_is_harmless() -> None:
    profile = Profile(ttft=LatencyDist(0.0), tpot=LatencyDist(50.0))
    async with serving(profile=profile) as (provider, client):
        reader, writer = await asyncio.open_connection("127.0.0.1", provider.port)
        payload = json.dumps({"model": "m", "messages": MSGS, "stream": True, "max_tokens": 60})
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n"
                     b"\r\n%s" % (len(payload), payload.encode()))
        head = await reader.readuntil(b"\r\n\r\n")
        assert b"transfer-encoding: chunked" in head and b"text/event-stream" in head
        assert (await reader.readuntil(b"\n\n")).split(b"\r\n", 1)[1].startswith(b"data: {")
        writer.close()
        await eventually(lambda: provider.client_disconnects == 1)
        assert provider.active_requests == 0
        ok = await client.chat.completions.create(model="m", messages=MSGS, max_tokens=1)
        assert ok.choices[0].message.content
    stray = asyncio.all_tasks() - {asyncio.current_task()}
    assert not stray, stray


# --------------------------------------------------------------------------- CLI


def test_main_rejects_bad_flags() -> None:
    with pytest.raises(SystemExit) as info:
        main(["--ttft-ms", "fast"])
    assert info.value.code == 2


def test_main_ready_file_and_sigterm(tmp_path: Path) -> None:
    ready = tmp_path / "port"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    code = "import sys; from sidecar.fake_provider.server import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "--name", "cli", "--ttft-ms", "1", "--tpot-ms", "1:2",
         "--ready-file", str(ready), "--schedule", '[{"at_s": 0, "set": {"stall_ms": 3}}]'],
        env=env, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 10
        while not ready.exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            if time.monotonic() >= deadline:  # a hang guard, not a speed check
                pytest.fail("provider never became ready")
            time.sleep(0.02)
        port = int(ready.read_text())
        status, state = asyncio.run(http(port, "GET", "/control"))
        assert status == 200 and state["name"] == "cli"
        assert state["base"]["tpot_ms"] == {"median": 1.0, "p99": 2.0}
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, err
        assert b"fake-provider cli on 127.0.0.1:" in err
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()  # reaps the child and closes the stderr pipe


@async_test
async def test_role_first_option_opens_with_a_role_only_event_and_reports_its_writes() -> None:
    profile = Profile(ttft=LatencyDist(30.0), tpot=LatencyDist(1.0), role_first=True)
    async with serving(profile=profile) as (provider, client):
        stream = await client.chat.completions.create(
            model="m", messages=MSGS, max_tokens=3, stream=True)
        chunks = [c async for c in stream]
    first = chunks[0].choices[0].delta
    assert first.role == "assistant" and not first.content
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    record = provider.recent[-1]
    # The role-only event went out at once; the first token one (30 ms) TTFT later.
    assert record["first_byte_ms"] < record["first_token_ms"]
    assert record["first_token_ms"] >= 30.0
    assert Profile().role_first is False  # the default is unchanged
