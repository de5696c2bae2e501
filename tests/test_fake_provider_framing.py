"""The fake provider's other SSE framings: same events, same completion times."""

from __future__ import annotations

import asyncio
import http.client
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core.sse import SseParser, parse_all
from sidecar.fake_provider.framing import SSE_EOLS, SSE_SPLITS, plan_writes, reframe
from sidecar.fake_provider.latency import ConfigError
from sidecar.fake_provider.server import FakeProvider
from tests.test_fake_provider import FAST, async_test

_event = st.lists(st.text("ab{}\": ", min_size=1, max_size=8), min_size=1, max_size=3).map(
    lambda lines: "".join(f"data: {x}\n" for x in lines).encode() + b"\n")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(_event, min_size=1, max_size=3), min_size=1, max_size=6),
       st.sampled_from(sorted(SSE_EOLS)), st.sampled_from(SSE_SPLITS))
def test_every_event_completes_in_the_write_of_its_time(
    groups: list[list[bytes]], eol: str, split: str
) -> None:
    blobs = [(float(i), reframe(b"".join(g), eol)) for i, g in enumerate(groups)]
    writes = plan_writes(blobs, split)
    assert b"".join(w for _, w in writes) == b"".join(b for _, b in blobs)
    parser = SseParser()
    got = [(t, ev) for t, w in writes for ev in parser.feed(w)]
    want = [(t, ev) for t, b in blobs for ev in parse_all(b)]
    assert got == want


@pytest.mark.parametrize(("eol", "split"), [("crlf", "none"), ("cr", "mid-line"),
                                            ("crlf", "mid-eol"), ("lf", "mid-line")])
@async_test
async def test_framed_stream_parses_to_the_default_events(eol: str, split: str) -> None:
    async def events(**kw: str) -> tuple[bytes, list[str]]:
        async with FakeProvider(profile=FAST, seed=1, **kw) as p:
            conn = http.client.HTTPConnection("127.0.0.1", p.port, timeout=10)
            body = {"model": "m", "stream": True, "max_tokens": 5,
                    "messages": [{"role": "user", "content": "hi"}]}
            def fetch() -> bytes:
                conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                             headers={"content-type": "application/json"})
                return conn.getresponse().read()

            raw = await asyncio.to_thread(fetch)
            conn.close()
        texts = []
        for ev in parse_all(raw):
            if ev.data != "[DONE]":
                obj = json.loads(ev.data)
                obj.pop("created", None)
                obj.pop("id", None)
                texts.append(json.dumps(obj))
            else:
                texts.append(ev.data)
        return raw, texts

    raw, framed = await events(sse_eol=eol, sse_split=split)
    _, plain = await events()
    assert framed == plain and len(plain) == 8  # 5 tokens, finish, usage, [DONE]
    if eol != "lf":
        assert b"\n\n" not in raw and SSE_EOLS[eol] * 2 in raw


def test_unknown_framing_is_refused() -> None:
    with pytest.raises(ConfigError, match="sse_eol"):
        FakeProvider(sse_eol="crcr")
