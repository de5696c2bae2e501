"""Writing one streamed completion on its token schedule: :func:`stream_reply`.

The reply's SSE events go out as HTTP chunks at their due times (absolute loop
times, so write overhead never accumulates as drift). With the default framing
(``lf`` line ends, no splitting) every event is its own chunk, flushed; any
other framing re-frames each token's events and lets
:func:`~sidecar.fake_provider.framing.plan_writes` decide where the writes cut.

While writing, the request's record gets the provider's ground truth for timing
tests: ``first_byte_ms``, ``first_token_ms`` and ``last_token_ms`` (ms from arrival
to the write of the first body byte, of the first content token and of the last
event), ``sent_len`` and, once the
body is complete, ``sent_sha256`` (byte-identity checks of what the proxy
forwarded).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from typing import Any

from .connection import Conn, chunk, response_head
from .framing import plan_writes, reframe
from .reply import Reply

_STREAM_HEADERS = [("content-type", "text/event-stream"), ("cache-control", "no-cache"),
                   ("transfer-encoding", "chunked")]


class _Wire:
    """One streamed body's writes, and what they put in the request's record."""

    def __init__(self, conn: Conn, record: dict[str, Any], t0: float) -> None:
        self.conn, self.record, self.t0 = conn, record, t0
        self.digest = hashlib.sha256()
        self.loop = asyncio.get_running_loop()

    def since_arrival_ms(self) -> float:
        return (self.loop.time() - self.t0) * 1000.0

    def first_token(self) -> None:
        """The first content token is being written (the first body byte, too, unless
        a role-only event went before it)."""
        self.record["first_token_ms"] = self.since_arrival_ms()
        if self.record["first_byte_ms"] is None:
            self.record["first_byte_ms"] = self.record["first_token_ms"]

    async def send(self, data: bytes) -> None:
        await self.conn.write(chunk(data))
        self.digest.update(data)
        self.record["sent_len"] += len(data)


async def stream_reply(conn: Conn, reply: Reply, due: Sequence[float], record: dict[str, Any],
                       *, t0: float, name: str, keep_alive: bool, role_first: bool,
                       sse_eol: str, sse_split: str, end_delay_s: float = 0.0,
                       fail: tuple[int, bytes] | None = None,
                       waiting_comment_s: float = 0.0) -> None:
    """Write the response head, then token ``i``'s events at ``due[i]`` and the tail
    events with the last token, then the terminating chunk.

    ``t0`` is the request's arrival (loop time); ``role_first`` opens a chat stream
    with a role-only event, written at once; ``end_delay_s`` holds the terminating
    chunk back after the last event. ``fail = (k, event)`` fails the stream mid-way:
    only the first ``k`` tokens, then ``event`` (an error event) instead of the tail.
    ``waiting_comment_s`` > 0 writes an SSE comment that often until the first token.
    """
    await conn.write(response_head(200, name, _STREAM_HEADERS, keep_alive))
    wire = _Wire(conn, record, t0)
    n = len(due) if fail is None else min(max(fail[0], 1), len(due))
    tail = reply.tail_events() if fail is None else [fail[1]]
    if role_first and reply.kind == "chat":
        event = reframe(reply.role_event(), sse_eol)
        record["first_byte_ms"] = wire.since_arrival_ms()
        await wire.send(event)
    if waiting_comment_s > 0:
        comment = reframe(b": keep-alive\n\n", sse_eol)
        at = t0 + waiting_comment_s
        while at < due[0]:
            await conn.sleep_until(at)
            if record["first_byte_ms"] is None:
                record["first_byte_ms"] = wire.since_arrival_ms()
            await wire.send(comment)
            at += waiting_comment_s
    if sse_eol == "lf" and sse_split == "none":
        for i in range(n):
            await conn.sleep_until(due[i])
            if i == 0:
                wire.first_token()
            for event in reply.token_events(i):
                await wire.send(event)  # one chunk per event, flushed
        for event in tail:
            await wire.send(event)
    else:  # another legal framing (sidecar.fake_provider.framing)
        blobs = [(due[i], b"".join(reply.token_events(i))) for i in range(n)]
        blobs.append((due[n - 1], b"".join(tail)))
        framed = [(t, reframe(b, sse_eol)) for t, b in blobs]
        for j, (t, data) in enumerate(plan_writes(framed, sse_split)):
            await conn.sleep_until(t)
            if j == 0:
                wire.first_token()
            await wire.send(data)
    record["last_token_ms"] = wire.since_arrival_ms()  # the last event was just written
    if end_delay_s > 0:
        await conn.sleep_until(wire.loop.time() + end_delay_s)
    await conn.write(b"0\r\n\r\n")
    record["sent_sha256"] = wire.digest.hexdigest()
