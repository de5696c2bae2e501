"""The fake provider's HTTP/1.1 connection layer on asyncio streams.

Keep-alive, Content-Length or chunked request bodies (Envoy re-chunks bodies
it has mutated), ``Expect: 100-continue``, and a background read that doubles
as a disconnect detector while a response is being "generated".
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from http import HTTPStatus

MAX_BODY = 16 * 1024 * 1024
_MAX_HEAD = 64 * 1024
_READ_SIZE = 64 * 1024


class ClientGone(Exception):
    """The peer hung up; abandon the request (nobody is left to answer)."""


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool


def response_head(
    status: int, name: str, headers: Sequence[tuple[str, str]], keep_alive: bool
) -> bytes:
    """Status line and headers of a response (every one names the provider)."""
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:  # e.g. 529, which real providers do send
        phrase = "Error"
    lines = [f"HTTP/1.1 {status} {phrase}", f"x-fake-provider: {name}",
             f"connection: {'keep-alive' if keep_alive else 'close'}"]
    lines += [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def chunk(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked response body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


class Conn:
    """One client connection with our own read buffer.

    Owning the buffer lets a single background read double as a disconnect
    detector while a response is being "generated" (StreamReader cannot peek),
    without losing bytes of a pipelined next request.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._buf = bytearray()
        self.eof = False
        self._pending: asyncio.Task[None] | None = None

    async def _read_some(self) -> None:
        try:
            data = await self._reader.read(_READ_SIZE)
        except OSError:  # reset, timeout...: all mean the peer is gone
            data = b""
        if data:
            self._buf += data
        else:
            self.eof = True

    def _pending_read(self) -> asyncio.Task[None]:
        if self._pending is None or self._pending.done():
            self._pending = asyncio.create_task(self._read_some())
        return self._pending

    async def _more(self) -> None:
        if self.eof:
            raise ClientGone
        await asyncio.wait({self._pending_read()})

    async def sleep_until(self, deadline: float) -> None:
        """Sleep until loop time ``deadline``; raise ClientGone if the peer hangs up.

        EOF counts as hanging up: HTTP clients do not half-close while waiting.
        """
        loop = asyncio.get_running_loop()
        while True:
            if self.eof:
                raise ClientGone
            delay = deadline - loop.time()
            if delay <= 0:
                return
            if len(self._buf) > MAX_BODY + _MAX_HEAD:  # pipelining peer: stop reading ahead
                await asyncio.sleep(delay)
                return
            await asyncio.wait({self._pending_read()}, timeout=delay)

    async def _read_until(self, sep: bytes, limit: int) -> bytes:
        start = 0
        while (idx := self._buf.find(sep, start)) < 0:
            if len(self._buf) > limit:
                raise HttpError(431, "request head too large")
            start = max(0, len(self._buf) - len(sep) + 1)
            await self._more()
        out = bytes(self._buf[: idx + len(sep)])
        del self._buf[: idx + len(sep)]
        return out

    async def _read_exact(self, n: int) -> bytes:
        while len(self._buf) < n:
            await self._more()
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    async def _read_chunked(self) -> bytes:
        # Envoy re-chunks request bodies it has mutated (ext_proc), so support it.
        body = bytearray()
        while True:
            line = await self._read_until(b"\r\n", 4096)
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise HttpError(400, "bad chunk size") from None
            if size == 0:
                while await self._read_until(b"\r\n", _MAX_HEAD) != b"\r\n":
                    pass  # trailers are ignored
                return bytes(body)
            if len(body) + size > MAX_BODY:
                raise HttpError(413, "request body too large")
            body += await self._read_exact(size)
            if await self._read_exact(2) != b"\r\n":
                raise HttpError(400, "bad chunk terminator")

    async def read_request(self) -> Request:
        """Read one request (head and body); raise ClientGone at end of stream."""
        head = (await self._read_until(b"\r\n\r\n", _MAX_HEAD)).decode("latin-1")
        lines = head.lstrip("\r\n").split("\r\n")
        parts = lines[0].split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise HttpError(400, "malformed request line")
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in filter(None, lines[1:]):
            name, sep, value = line.partition(":")
            if not sep:
                raise HttpError(400, "malformed header line")
            headers[name.strip().lower()] = value.strip()
        conn = headers.get("connection", "").lower()
        keep_alive = "keep-alive" in conn if version == "HTTP/1.0" else "close" not in conn
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        try:
            length = 0 if chunked else int(headers.get("content-length", "0"))
        except ValueError:
            raise HttpError(400, "bad content-length") from None
        if not 0 <= length <= MAX_BODY:
            raise HttpError(413, "request body too large")
        if headers.get("expect", "").lower() == "100-continue":
            await self.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = await self._read_chunked() if chunked else await self._read_exact(length)
        return Request(method, target.split("?", 1)[0], headers, body, keep_alive)

    async def write(self, data: bytes) -> None:
        """Write and flush ``data``; raise ClientGone if the peer is gone."""
        if self._writer.is_closing():
            raise ClientGone
        self._writer.write(data)
        try:
            await self._writer.drain()
        except OSError as exc:
            raise ClientGone from exc

    async def close(self) -> None:
        """Close the socket and the background read."""
        if self._pending is not None:
            self._pending.cancel()
            await asyncio.wait({self._pending})  # so stop() leaves no stray task behind
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()
