"""Through the real Envoy: the usage filter keeps an event that arrives in several reads.

Envoy's ``sse_to_metadata`` filter buffers an event until its blank line, and by
default drops one that grows past 8 KiB while it waits. A Responses API
``response.completed`` carries the whole answer with its usage, and a TLS record is at
most 16 KiB, so every answer of more than a few thousand tokens lost its token count
(no TPOT), and a long error event its error (the stream counted ok). The rendered
filter sets ``max_event_size`` to the sidecar's own parser limit. A scripted upstream
writes each case in the reads given; a file access log prints what the filter lifted.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from sidecar.devtools.harness import Stack, free_port
from sidecar.shell import bootstrap_filters as bf
from sidecar.shell.envoy_contract import STREAM_ERROR_KEY, TOKENS_KEY, USAGE_NS

pytestmark = pytest.mark.envoy


def _json(o: Any) -> str:
    return json.dumps(o, separators=(",", ":"))


def _event(kind: str, **data: Any) -> bytes:
    return f"event: {kind}\ndata: {_json({'type': kind, **data})}\n\n".encode()


_TEXT = "lorem ipsum " * 1700  # ~20 KB of output in the final event
_DONE = _event("response.completed", response={
    "id": "resp_1", "object": "response", "status": "completed", "error": None,
    "output": [{"type": "message", "role": "assistant",
                "content": [{"type": "output_text", "text": _TEXT}]}],
    "usage": {"input_tokens": 5, "output_tokens": 2000, "total_tokens": 2005}})
_DELTA = _event("response.output_text.delta", delta="lorem")
_ERROR = f"data: {_json({'error': {'message': 'Traceback ' * 900, 'type': 'x'}})}\n\n".encode()
_TOKEN = f"data: {_json({'choices': [{'index': 0, 'delta': {'content': 'a'}}]})}\n\n".encode()

# name -> the reads the upstream writes, and what the access log must carry
CASES: dict[str, tuple[list[bytes], dict[str, Any]]] = {
    "20 KB response.completed in 16 KiB reads":
        ([_DELTA, _DONE[:16384], _DONE[16384:]], {TOKENS_KEY: 2000}),
    "20 KB response.completed in 9000-byte reads":
        ([_DELTA, *(_DONE[i:i + 9000] for i in range(0, len(_DONE), 9000))], {TOKENS_KEY: 2000}),
    "9 KB error event in 2 reads": ([_TOKEN, _ERROR[:8500], _ERROR[8500:]],
                                    {STREAM_ERROR_KEY: True}),
}
NAMES = list(CASES)


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            length = next((int(v) for k, _, v in (ln.partition(":") for ln in lines[1:])
                           if k.strip().lower() == "content-length"), 0)
            await reader.readexactly(length)
            reads = CASES[NAMES[int(lines[0].split()[1].rsplit("/", 1)[1])]][0]
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         b"transfer-encoding: chunked\r\n\r\n")
            for chunk in reads:  # one chunk, one write, a pause: Envoy reads them apart
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                await writer.drain()
                await asyncio.sleep(0.02)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


@pytest.fixture
def upstream() -> Iterator[int]:
    """The scripted upstream on a free port, in its own thread and loop (stopped after)."""
    port, ready, loop = free_port(), threading.Event(), asyncio.new_event_loop()

    async def main() -> None:
        server = await asyncio.start_server(_handle, "127.0.0.1", port)
        ready.set()
        async with server:
            await server.serve_forever()

    def run() -> None:
        try:
            loop.run_until_complete(main())
        except asyncio.CancelledError:  # stopped below
            pass
        finally:
            loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield port
    finally:
        loop.call_soon_threadsafe(lambda: [t.cancel() for t in asyncio.all_tasks(loop)])
        thread.join(10)


_FORMAT = f"%REQ(:PATH)% %DYNAMIC_METADATA({USAGE_NS})%\n"


def test_an_event_that_arrives_in_several_reads_keeps_its_usage_and_its_error(
    upstream: int
) -> None:
    with Stack() as stack:
        stack.write_config({
            "default_cluster": "up",
            "clusters": [{"name": "up", "address": f"127.0.0.1:{upstream}", "models": ["m"]}],
            "models": [{"name": "m", "candidates": ["up"]}]})
        log_path = stack.workdir / "usage.log"

        def edit(boot: dict[str, Any]) -> None:
            hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
            config = hcm["typed_config"]
            config["http_filters"] = [*bf.usage_filters(1.0), *config["http_filters"]]
            config.setdefault("access_log", []).append({"name": "usage", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3."
                         "FileAccessLog",
                "path": str(log_path),
                "log_format": {"text_format_source": {"inline_string": _FORMAT}}}})

        listen = stack.start_envoy(with_sidecar=False, edit=edit)
        for i in range(len(NAMES)):
            conn = http.client.HTTPConnection("127.0.0.1", listen, timeout=20)
            conn.request("POST", f"/v1/responses/{i}", b'{"model":"m","stream":true}',
                         {"content-type": "application/json"})
            response = conn.getresponse()
            assert response.status == 200
            response.read()
            conn.close()
        stack.stop_envoy()  # flushes the file access log
        lines = log_path.read_text().splitlines()
    assert len(lines) == len(NAMES), lines
    for line in lines:
        path, _, meta = line.partition(" ")
        name = NAMES[int(path.rsplit("/", 1)[1])]
        lifted = json.loads(meta) if meta != "-" else {}
        for key, want in CASES[name][1].items():
            got = lifted.get(key)
            assert (got == want if key == TOKENS_KEY else got is not None), (name, lifted)
