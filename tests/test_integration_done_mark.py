"""Envoy's ``[DONE]`` mark tells a complete answer from a user pressing stop (real Envoy).

The upstream streams as OpenAI does without ``stream_options.include_usage`` and ends
its body 20 ms after ``data: [DONE]`` (the terminating chunk a separate write). The
OpenAI SDK's synchronous stream closes the connection at ``[DONE]``, so Envoy logs the
client's reset before the upstream's end: without the mark (``timing.done_mark``,
sidecar.shell.bootstrap_done) such an entry has neither usage nor an end time and is a
``cancel``. With it, the entry carries the mark and is an ``ok``, in every SSE framing
(LF, CRLF, CR, ``data:[DONE]``, the sentinel split across two writes). A client that
leaves before ``[DONE]`` is still a ``cancel``, also after a content delta whose JSON
carries the text ``[DONE]`` (a ``data: [DONE]`` line inside a JSON string is not one).
That case also shows the mark streams: had the Lua filter held the body back, the
client would have had its first content only once the upstream ended, and Envoy would
have logged that end (an ``ok``).

The user message selects the upstream's framing (:data:`VARIANTS`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import openai
import pytest
from openai.types.chat import ChatCompletionChunk

from sidecar.devtools.harness import Stack
from tests.openai_like import (
    WRITE_GAP_S,
    ChunkedStream,
    delta,
    one_route_stack,
    outcomes,
    route_latency,
)
from tests.ops_stack import wait_for

pytestmark = pytest.mark.envoy

REST_S = 0.5  # an abandoned stream's remaining events come this much later

# variant -> (line end, the [DONE] event's writes, a delta content of its own or None)
VARIANTS: dict[str, tuple[bytes, tuple[bytes, ...], str | None]] = {
    "lf": (b"\n", (b"data: [DONE]\n\n",), None),
    "crlf": (b"\r\n", (b"data: [DONE]\r\n\r\n",), None),
    "cr": (b"\r", (b"data: [DONE]\r\r",), None),
    "no_space": (b"\n", (b"data:[DONE]\n\n",), None),
    "split": (b"\n", (b"data: [DO", b"NE]\n\n"), None),
    # A model that writes the sentinel: plain, and as a whole "line" within the JSON
    # string (escaped there, so never a line of the stream).
    "in_json": (b"\n", (b"data: [DONE]\n\n",), "[DONE]"),
    "in_json_line": (b"\n", (b"data: [DONE]\n\n",), "\ndata: [DONE]\n"),
}


class _Upstream(ChunkedStream):
    """Streams an answer without usage in the requested framing; ends END_GAP_S after
    [DONE]. A variant with a content of its own sends that delta first, then waits
    REST_S before the rest (the client leaves in between)."""

    def do_POST(self) -> None:
        body = self.read_json()
        eol, done, own = VARIANTS[body["messages"][0]["content"].split()[0]]
        first = [delta({"role": "assistant", "content": ""}, eol=eol)]
        if own is not None:
            first.append(delta({"content": own}, eol=eol))
        rest = [*(delta({"content": f"t{i} "}, eol=eol) for i in range(3)),
                delta({}, "stop", eol)]
        self.start("text/event-stream; charset=utf-8")
        try:
            for event in first:
                self.write_event(event)
            if own is not None:
                time.sleep(REST_S)
            for event in [*rest, *done]:
                self.write_event(event)
            self.end()
        except OSError:
            pass  # the client (through Envoy) left first


@pytest.fixture(scope="module", params=[True, False], ids=["marked", "unmarked"])
def stack(request: pytest.FixtureRequest) -> Iterator[tuple[Stack, bool]]:
    with one_route_stack(_Upstream, {"done_mark": request.param}, min_samples=1) as st:
        yield st, request.param


def _next_outcome(st: Stack, before: dict[str, int]) -> str:
    """The one outcome counted since ``before``."""
    def counted() -> dict[str, int] | None:
        now = outcomes(st)
        return now if sum(now.values()) > sum(before.values()) else None
    now = wait_for(counted, "the request's outcome")
    grew = [k for k, v in now.items() if v > before.get(k, 0)]
    assert len(grew) == 1 and sum(now.values()) == sum(before.values()) + 1, now
    return grew[0].removeprefix("outcome:")


def _stream(st: Stack, variant: str) -> openai.Stream[ChatCompletionChunk]:
    """A streamed request whose user message picks the upstream's framing."""
    client = openai.OpenAI(base_url=st.base_url, api_key="test", max_retries=0, timeout=30)
    return client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": variant}], stream=True)


@pytest.mark.parametrize("variant", ["lf", "crlf", "cr", "no_space", "split"])
def test_a_client_that_left_at_done_had_a_complete_answer(
        stack: tuple[Stack, bool], variant: str) -> None:
    st, marked = stack
    before = outcomes(st)
    stream = _stream(st, variant)
    assert "".join(ev.choices[0].delta.content or "" for ev in stream
                   if ev.choices) == "t0 t1 t2 "
    # Unmarked, Envoy logs the client's reset before the upstream's end: a cancel (what
    # the mark is for; the upstream's 20 ms gap makes it so here).
    assert _next_outcome(st, before) == ("ok" if marked else "cancel")
    if marked:  # timed until the mark: at least the upstream's writes before [DONE]
        e2e = route_latency(st)["e2e"]
        assert e2e["samples"] >= 1 and e2e["p50_ms"] >= 5 * WRITE_GAP_S * 1000 * 0.8, e2e


@pytest.mark.parametrize("variant", ["in_json", "in_json_line"])
def test_a_client_that_left_before_done_is_a_cancel(
        stack: tuple[Stack, bool], variant: str) -> None:
    st, _ = stack
    before = outcomes(st)
    stream = _stream(st, variant)
    seen = ""
    for ev in stream:
        seen += (ev.choices[0].delta.content or "") if ev.choices else ""
        if seen:
            break  # the user presses stop after the first content: before [DONE]
    stream.close()
    assert seen == VARIANTS[variant][2]
    assert _next_outcome(st, before) == "cancel"
