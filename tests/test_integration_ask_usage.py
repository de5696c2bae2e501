"""A client that never asks for usage and closes at ``[DONE]`` (real Envoy).

The upstream streams as OpenAI does: a role-only chunk, tokens, a finish chunk, the
usage chunk only when the request asked for it (``stream_options.include_usage``), then
``data: [DONE]``, and ends its body 20 ms later (a server finishing its work after the
last event). The OpenAI SDK's synchronous stream closes the connection at ``[DONE]``, so
Envoy logs the client's reset before the upstream's end. Without usage that entry has
neither a token count nor an end time: every such answer was a ``cancel`` (6 of 6 in a
scratch run, and with a 2 ms gap too) and the router learned nothing from it, or, past
the class budget, a timeout. With ``timing.ask_usage`` the routing answer asks for usage,
the usage event goes through before ``[DONE]``, and each answer is ``ok`` with its TTFT
and TPOT. The SDK reads the extra chunk (``choices: []``) without complaint.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sidecar.devtools.harness import Stack
from tests.openai_like import (
    ChunkedStream,
    chunk,
    delta,
    one_route_stack,
    route_latency,
    sdk_streams,
    wait_outcomes,
)

pytestmark = pytest.mark.envoy

N = 6


class _LikeOpenAI(ChunkedStream):
    asked: list[bool] = []  # per request: did it ask for usage

    def do_POST(self) -> None:
        req = self.read_json()
        asked = bool((req.get("stream_options") or {}).get("include_usage"))
        type(self).asked.append(asked)
        events = [delta({"role": "assistant", "content": ""}),
                  *(delta({"content": f"t{i} "}) for i in range(5)), delta({}, "stop")]
        if asked:
            events.append(chunk([], usage={"prompt_tokens": 3, "completion_tokens": 5,
                                           "total_tokens": 8}))
        self.stream([*events, b"data: [DONE]\n\n"])


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with one_route_stack(_LikeOpenAI, {"ask_usage": True}) as st:
        yield st


def test_the_sdk_closing_at_done_is_ok_when_usage_is_asked_for(stack: Stack) -> None:
    assert sdk_streams(stack, N) == [5] * N
    assert _LikeOpenAI.asked == [True] * N  # the client never asked; the sidecar did
    assert wait_outcomes(stack, N) == {"outcome:ok": N}
    latency: dict[str, Any] = route_latency(stack)
    assert latency["ttft"]["samples"] >= N and latency["tpot"]["samples"] >= N
