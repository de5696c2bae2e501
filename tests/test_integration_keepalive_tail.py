"""Through the real Envoy: keep-alive comments sent while a request waits make the
route blind, so they do not hide its TTFT tail.

A provider that writes ``: keep-alive`` every 0.5 s while a request waits opens exactly
its slow streams early. The access log's first body byte is then the first comment, not
the first token, for the slow streams only: the median first-token offset of the
sampled streams stays 0, and an unsampled request's TTFT (first body byte + that
median) was capped at 0.5 s -- a route's p95 read 0.5 s where the provider took 3 s
(an audit's finding). Two early openings among the offsets read make the route blind
(:mod:`sidecar.core.ttft_offset`): its TTFT then comes from sampled streams only, each
timed at its first token.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import openai
import pytest

from sidecar.devtools.harness import Stack, http_json

pytestmark = pytest.mark.envoy

# Lognormal TTFT, median 100 ms, p99 8 s: about a fifth of the streams wait past 0.5 s,
# and the p95 is about 2 s.
TTFT, COMMENT_MS, REQUESTS, CONCURRENCY = "100:8000", 500, 300, 16


async def _streams(base_url: str) -> None:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="t", max_retries=0, timeout=60)
    sem = asyncio.Semaphore(CONCURRENCY)

    async def one() -> None:
        async with sem:
            stream = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                stream=True, stream_options={"include_usage": True})
            async for _ in stream:
                pass

    try:
        await asyncio.gather(*(one() for _ in range(REQUESTS)))
    finally:
        await client.close()


def test_keepalive_comments_while_waiting_make_the_route_blind() -> None:
    with Stack() as stack:
        port = stack.start_provider("up", TTFT, "5", seed=7)
        stack.control("up", {"waiting_comment_ms": COMMENT_MS})
        config: dict[str, Any] = {
            "default_cluster": "up",
            "clusters": [{"name": "up", "address": f"127.0.0.1:{port}", "models": ["m"]}],
            "models": [{"name": "m", "candidates": ["up"]}],
            # A quarter of the streams timed at their first token from the start, so a
            # few hundred requests show the early openings (5 % would need thousands).
            "timing": {"token_sample_share": 0.25},
        }
        stack.start_sidecar(stack.write_config(config))
        stack.start_envoy()
        asyncio.run(_streams(stack.base_url))
        deadline = time.monotonic() + 15  # the observing streams end asynchronously
        while True:
            offsets = stack.sidecar_state()["envoy"]["first_token_offsets"].get("up", {})
            if offsets.get("blind") or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        written = http_json(f"http://127.0.0.1:{port}/control/requests")
    early = [r for r in written if r["first_token_ms"] is not None
             and r["first_byte_ms"] < r["first_token_ms"] - 1.0]  # a comment went first
    print("offsets", offsets, "streams opened by a comment", len(early), "of", len(written))
    assert len(early) > 0.05 * len(written)  # the scenario: the slow streams open early
    # The median offset stays 0 (most streams open with their first token), which the
    # median rule read as a route whose first body byte is its first token.
    assert offsets["median_offset_ms"] == 0.0 and offsets["early"] >= 2, offsets
    assert offsets["blind"], offsets
