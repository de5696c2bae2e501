"""A client that closes at ``[DONE]`` still times its route's first token (real Envoy).

The upstream streams as OpenAI does without ``stream_options.include_usage``: a
role-only chunk, tokens, a finish chunk and ``data: [DONE]``, then ends its body 20 ms
later (the terminating chunk is a separate write). The OpenAI SDK's synchronous stream
closes the connection at ``[DONE]``, so Envoy logs the client's reset before the
upstream's end: without usage the entry of a complete answer is a ``cancel``
(``timing.ask_usage`` and Envoy's ``[DONE]`` mark, ``timing.done_mark``, are off
here). Its first body byte came all the same, so its TTFT is a measurement: each such
cancel within the class budget is a TTFT sample of the route. Before, every one of them
was dropped and the route had no TTFT samples at all.

Two ways the first token is known: the observing filter timed it (every stream of a
route's first ``token_sample_min``), or the first body byte plus the route's offset
from the access log alone (sampling off).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sidecar.devtools.harness import Stack
from tests.openai_like import (
    ChunkedStream,
    delta,
    one_route_stack,
    route_latency,
    sdk_streams,
    wait_outcomes,
)

pytestmark = pytest.mark.envoy

N = 6


class _EndsAfterDone(ChunkedStream):
    """Streams an answer without usage and ends the body END_GAP_S after [DONE]."""

    def do_POST(self) -> None:
        self.read_json()
        self.stream([delta({"role": "assistant", "content": ""}),
                     *(delta({"content": f"t{i} "}) for i in range(5)), delta({}, "stop"),
                     b"data: [DONE]\n\n"])


# Envoy's [DONE] mark off (timing.done_mark): with it these answers are ``ok``
# (tests/test_integration_done_mark.py); without it, as on a request outside the usage
# sample, they stay cancels, and their first token is what this file is about.
TIMINGS = {
    "sampled": {"done_mark": False},  # the route's first streams all timed at their first token
    "log_only": {"token_sample_min": 0, "token_sample_share": 0.0, "done_mark": False},
}


@pytest.fixture(scope="module", params=sorted(TIMINGS))
def stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    with one_route_stack(_EndsAfterDone, TIMINGS[request.param]) as st:
        yield st


def test_answers_logged_as_cancels_give_ttft_samples(stack: Stack) -> None:
    assert sdk_streams(stack, N) == [5] * N
    seen = wait_outcomes(stack, N)
    # What this test is about: Envoy logged (some of) the complete answers as cancels.
    assert seen.get("outcome:cancel", 0) >= 1 and sum(seen.values()) == N, seen
    latency = route_latency(stack)
    # Every answer's first token is a sample, the cancels' too; their end is unknown.
    assert latency["ttft"]["samples"] == N, latency
    assert latency["e2e"]["samples"] == seen.get("outcome:ok", 0), latency
