"""A grpc.aio work-around every long-lived stream handler here shares (grpc/grpc#43360).

grpc.aio ends a handler's request iterator both at the peer's half-close and,
most of the time, when the peer *cancels* the stream (RST_STREAM). A handler
that then returns at once makes the server send a status on a call that is
already dead; that batch fails and its operations are never freed: native
memory lost per cancelled stream (measured here, grpcio 1.85: ~140 B per
ext_proc stream, ~450 B per access-log stream, which returns a response
message too). Waiting a moment before returning lets the cancellation reach the
handler's task first, and gRPC then sends nothing. Envoy cancels most ext_proc
streams and every access-log stream it ends (it never half-closes those), so
both handlers call :func:`settle` after their last message. Nothing waits on a
settling handler: its accounting is done before.

Remove once grpcio frees the operations of a failed send (the issue above).
"""

from __future__ import annotations

import asyncio

CANCEL_SETTLE_S = 0.01


async def settle() -> None:
    """Give a peer cancellation time to reach this handler before it returns."""
    await asyncio.sleep(CANCEL_SETTLE_S)
