"""Simulated OpenAI-compatible LLM server for tests, the demo and benchmarks.

A deliberately small HTTP/1.1 server on asyncio streams (keep-alive,
Content-Length or chunked request bodies, chunked SSE responses) that answers
``/v1/chat/completions``, ``/v1/completions`` and ``/v1/responses`` with fake
tokens paced by a per-provider latency :class:`Profile` (TTFT, TPOT, stalls,
errors, outages). The profile can be changed at run time via ``POST /control``
or a startup schedule, so tests can make one upstream slow and watch routing.

Control JSON (every field optional; an invalid payload is rejected whole)::

    {"ttft_ms": {"median": 50, "p99": 80} | {"fixed": 50} | 50 | "50:80",
     "tpot_ms": <same forms>, "error_rate": 0.0, "error_status": 500,
     "stall_ms": 0, "outage": false, "outage_mode": "close" | "503",
     "streaming_only": false,            # fields above go to the streaming override
     "clear_streaming_override": false,  # drop the override first
     "reset": false}                     # back to the startup profile first

``GET /control`` returns the settings and counters; ``GET /healthz`` is always 200.
Every response carries ``x-fake-provider: <name>``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import logging
import os
import random
import signal
import sys
import time
import zlib
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

from .fake_provider_latency import (
    ConfigError,
    Profile,
    ScheduleEntry,
    parse_schedule,
    split_control,
)

__all__ = ["MAX_BODY", "FakeProvider", "Profile", "build_arg_parser", "main"]

MAX_BODY = 16 * 1024 * 1024
_MAX_HEAD = 64 * 1024
_READ_SIZE = 64 * 1024
_ENDPOINTS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completion",
    "/v1/responses": "response",
}
_WORDS = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit")
_log = logging.getLogger(__name__)


class _ClientGone(Exception):
    """The peer hung up; abandon the request (nobody is left to answer)."""


class _HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class _Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool


def _error(message: str, type_: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": None}}


def _head(status: int, name: str, headers: Sequence[tuple[str, str]], keep_alive: bool) -> bytes:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:  # e.g. 529, which real providers do send
        phrase = "Error"
    lines = [f"HTTP/1.1 {status} {phrase}", f"x-fake-provider: {name}",
             f"connection: {'keep-alive' if keep_alive else 'close'}"]
    lines += [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _sse(obj: Mapping[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _piece(i: int) -> str:
    word = _WORDS[i % len(_WORDS)]
    return word if i == 0 else " " + word


def _text_of(obj: object) -> str:
    if isinstance(obj, str):
        return obj
    if isinstance(obj, list):
        return " ".join(_text_of(x) for x in obj)
    if isinstance(obj, dict):
        return _text_of(obj.get("content", obj.get("text", "")))
    return ""


def _prompt_tokens(body: Mapping[str, Any]) -> int:
    # ~4 characters per token: real tokenisation is irrelevant for latency tests.
    source = body.get("messages", body.get("prompt", body.get("input", "")))
    return max(1, len(_text_of(source)) // 4)


class _Reply:
    """Endpoint-shaped JSON for one simulated generation of ``n`` tokens."""

    def __init__(self, kind: str, model: str, prompt_tokens: int, n: int, rid: str) -> None:
        self.kind, self.model, self.prompt_tokens, self.n = kind, model, prompt_tokens, n
        self.created = int(time.time())
        self.id = {"chat": "chatcmpl-", "completion": "cmpl-", "response": "resp_"}[kind] + rid
        self._seq = 0  # Responses-API sequence_number

    def usage(self) -> dict[str, int]:
        p, n = self.prompt_tokens, self.n
        if self.kind == "response":
            return {"input_tokens": p, "output_tokens": n, "total_tokens": p + n}
        return {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n}

    def _envelope(self, obj: str, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": "fp_fake", "choices": choices, **extra}

    def _response(self, status: str, text: str | None) -> dict[str, Any]:
        output = [] if text is None else [{
            "type": "message", "id": f"msg_{self.id}", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}]
        usage = None if text is None else self.usage()
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "model": self.model, "output": output, "usage": usage}

    def full(self) -> dict[str, Any]:
        """The non-streaming response body."""
        text = "".join(_piece(i) for i in range(self.n))
        if self.kind == "chat":
            msg = {"role": "assistant", "content": text, "refusal": None}
            choice = {"index": 0, "message": msg, "logprobs": None, "finish_reason": "stop"}
            return self._envelope("chat.completion", [choice], usage=self.usage())
        if self.kind == "completion":
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "stop"}
            return self._envelope("text_completion", [choice], usage=self.usage())
        return self._response("completed", text)

    def _delta(self, i: int | None) -> dict[str, Any]:
        """Streaming chunk carrying token ``i``, or the finish chunk when ``i`` is None."""
        finish = "stop" if i is None else None
        if self.kind == "chat":
            delta: dict[str, str] = {"role": "assistant"} if i == 0 else {}
            if i is not None:
                delta["content"] = _piece(i)
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return self._envelope("chat.completion.chunk", [choice])
        text = "" if i is None else _piece(i)
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return self._envelope("text_completion", [choice])

    def _event(self, type_: str, **fields: Any) -> bytes:
        payload = {"type": type_, "sequence_number": self._seq, **fields}
        self._seq += 1
        return f"event: {type_}\ndata: {json.dumps(payload)}\n\n".encode()

    def token_events(self, i: int) -> list[bytes]:
        """SSE events carrying token ``i``."""
        if self.kind != "response":
            return [_sse(self._delta(i))]
        # response.created goes out with the first token rather than at once so
        # that "first body byte" still means "first token" for TTFT measurement.
        events = []
        if i == 0:
            created = self._response("in_progress", None)
            events.append(self._event("response.created", response=created))
        events.append(self._event("response.output_text.delta", item_id=f"msg_{self.id}",
                                  output_index=0, content_index=0, delta=_piece(i), logprobs=[]))
        return events

    def tail_events(self) -> list[bytes]:
        """SSE events after the last token: finish, usage and the terminator."""
        if self.kind == "response":
            return [self._event("response.completed", response=self.full())]
        finish = self._delta(None)
        usage = self._envelope(finish["object"], [], usage=self.usage())
        return [_sse(finish), _sse(usage), b"data: [DONE]\n\n"]


class _Conn:
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
            raise _ClientGone
        await asyncio.wait({self._pending_read()})

    async def sleep_until(self, deadline: float) -> None:
        """Sleep until loop time ``deadline``; raise _ClientGone if the peer hangs up.

        EOF counts as hanging up: HTTP clients do not half-close while waiting.
        """
        loop = asyncio.get_running_loop()
        while True:
            if self.eof:
                raise _ClientGone
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
                raise _HttpError(431, "request head too large")
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
                raise _HttpError(400, "bad chunk size") from None
            if size == 0:
                while await self._read_until(b"\r\n", _MAX_HEAD) != b"\r\n":
                    pass  # trailers are ignored
                return bytes(body)
            if len(body) + size > MAX_BODY:
                raise _HttpError(413, "request body too large")
            body += await self._read_exact(size)
            if await self._read_exact(2) != b"\r\n":
                raise _HttpError(400, "bad chunk terminator")

    async def read_request(self) -> _Request:
        """Read one request (head and body); raise _ClientGone at end of stream."""
        head = (await self._read_until(b"\r\n\r\n", _MAX_HEAD)).decode("latin-1")
        lines = head.lstrip("\r\n").split("\r\n")
        parts = lines[0].split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _HttpError(400, "malformed request line")
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in filter(None, lines[1:]):
            name, sep, value = line.partition(":")
            if not sep:
                raise _HttpError(400, "malformed header line")
            headers[name.strip().lower()] = value.strip()
        conn = headers.get("connection", "").lower()
        keep_alive = "keep-alive" in conn if version == "HTTP/1.0" else "close" not in conn
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        try:
            length = 0 if chunked else int(headers.get("content-length", "0"))
        except ValueError:
            raise _HttpError(400, "bad content-length") from None
        if not 0 <= length <= MAX_BODY:
            raise _HttpError(413, "request body too large")
        if headers.get("expect", "").lower() == "100-continue":
            await self.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = await self._read_chunked() if chunked else await self._read_exact(length)
        return _Request(method, target.split("?", 1)[0], headers, body, keep_alive)

    async def write(self, data: bytes) -> None:
        """Write and flush ``data``; raise _ClientGone if the peer is gone."""
        if self._writer.is_closing():
            raise _ClientGone
        self._writer.write(data)
        try:
            await self._writer.drain()
        except OSError as exc:
            raise _ClientGone from exc

    async def close(self) -> None:
        """Close the socket and the background read."""
        if self._pending is not None:
            self._pending.cancel()
            await asyncio.wait({self._pending})  # so stop() leaves no stray task behind
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()


class FakeProvider:
    """A simulated OpenAI-compatible upstream with a run-time adjustable latency profile.

    ``profile`` is the base profile; ``seed`` seeds the latency/error RNG (default:
    derived from ``name`` so that several providers are not correlated);
    ``max_tokens`` caps requested output tokens; ``default_tokens`` is used when
    the request names none; ``schedule`` entries are applied relative to start().
    Usable as ``async with FakeProvider(...) as p:`` (binds 127.0.0.1, port 0).
    """

    def __init__(
        self,
        name: str = "fake",
        profile: Profile | None = None,
        *,
        seed: int | None = None,
        max_tokens: int = 64,
        default_tokens: int = 16,
        schedule: Sequence[ScheduleEntry] = (),
    ) -> None:
        if max_tokens < 1 or default_tokens < 1:
            raise ConfigError("max_tokens and default_tokens must be >= 1")
        if not name.isprintable() or not name.isascii():
            raise ConfigError(f"name must be printable ASCII (it is sent as a header): {name!r}")
        self.name = name
        self.max_tokens, self.default_tokens = max_tokens, min(default_tokens, max_tokens)
        self._rng = random.Random(zlib.crc32(name.encode()) if seed is None else seed)
        self._initial = self._base = profile or Profile()
        # Streaming override = base + these fields, so later base changes still
        # show through wherever the override does not speak.
        self._stream_fields: dict[str, Any] = {}
        self._stream = self._base
        self._schedule = sorted(schedule, key=lambda e: e.at_s)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._status: Counter[int] = Counter()
        self._requests = self._dropped = self._disconnects = self._active = self._seq = 0
        # What the last requests looked like on the wire, for tests that must check
        # what the proxy forwarded (headers, rewritten model) and byte-identity of SSE.
        self.recent: deque[dict[str, Any]] = deque(maxlen=64)
        self._port = 0
        self._started_at = 0.0

    async def __aenter__(self) -> FakeProvider:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        """Bound port (0 before start())."""
        return self._port

    @property
    def requests_total(self) -> int:
        """Requests received on the completion endpoints (any outcome)."""
        return self._requests

    @property
    def status_counts(self) -> dict[int, int]:
        """Completion-endpoint responses sent, by HTTP status."""
        return dict(self._status)

    @property
    def dropped_connections(self) -> int:
        """Requests answered by closing the connection (outage_mode "close")."""
        return self._dropped

    @property
    def client_disconnects(self) -> int:
        """Requests abandoned because the client went away before the end."""
        return self._disconnects

    @property
    def active_requests(self) -> int:
        """Completion requests currently being generated."""
        return self._active

    @property
    def base_profile(self) -> Profile:
        """Profile for non-streaming requests (and streaming ones without override)."""
        return self._base

    @property
    def streaming_profile(self) -> Profile:
        """Effective profile for streaming requests."""
        return self._stream

    def apply_control(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """Apply a control payload (as for ``POST /control``); return :meth:`snapshot`.

        Raises ConfigError (nothing applied) if the payload is invalid.
        """
        flags, changes = split_control(payload)
        base, fields = self._base, self._stream_fields
        if flags["reset"]:
            base, fields = self._initial, {}
        if flags["clear_streaming_override"]:
            fields = {}
        if flags["streaming_only"]:
            fields = {**fields, **changes}
        else:
            base = base.updated(changes)
        stream = base.updated(fields)  # also validates before anything is committed
        self._base, self._stream_fields, self._stream = base, fields, stream
        return self.snapshot()

    def snapshot(self) -> dict[str, Any]:
        """Current settings and counters, as served by ``GET /control``."""
        return {
            "name": self.name,
            "base": self._base.to_json(),
            "streaming_override": self.streaming_profile.to_json() if self._stream_fields else None,
            "streaming_override_fields": sorted(self._stream_fields),
            "max_tokens": self.max_tokens,
            "default_tokens": self.default_tokens,
            "counters": {
                "requests_total": self._requests,
                "by_status": {str(k): v for k, v in sorted(self._status.items())},
                "dropped_connections": self._dropped,
                "client_disconnects": self._disconnects,
                "active_requests": self._active,
            },
        }

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Start listening; return the bound port (useful with ``port=0``)."""
        if self._server is not None:
            raise RuntimeError("FakeProvider already started")
        # Large backlog: benchmarks open hundreds of connections at once.
        self._server = await asyncio.start_server(self._accept, host, port, backlog=1024)
        self._port = int(self._server.sockets[0].getsockname()[1])
        self._started_at = asyncio.get_running_loop().time()
        if self._schedule:
            self._track(asyncio.create_task(self._run_schedule()))
        return self._port

    async def stop(self) -> None:
        """Stop listening and cancel every connection and schedule task."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()

    def _track(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_schedule(self) -> None:
        loop = asyncio.get_running_loop()
        for entry in self._schedule:
            await asyncio.sleep(max(0.0, self._started_at + entry.at_s - loop.time()))
            try:
                self.apply_control(entry.changes)
            except ConfigError:
                _log.exception("fake-provider %s: bad schedule entry %r", self.name, entry)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # A plain callback that creates and tracks the task itself, so stop() can
        # cancel even handlers that have not run yet (and Python 3.11's
        # StreamReaderProtocol never sees, and mis-logs, a cancelled handler).
        if self._server is None:  # accepted while stopping
            writer.close()
            return
        task = asyncio.create_task(self._on_connect(reader, writer))
        task.add_done_callback(lambda _: writer.close())  # also if cancelled before starting
        self._track(task)

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Conn(reader, writer)
        try:
            keep_alive = True
            while keep_alive:
                try:
                    req = await conn.read_request()
                except _HttpError as exc:
                    await self._send_json(conn, exc.status, _error(str(exc)), keep_alive=False)
                    return
                keep_alive = await self._dispatch(conn, req)
        except _ClientGone:
            pass
        except Exception:  # a bug must cost one connection, not the server
            _log.exception("fake-provider %s: connection handler failed", self.name)
        finally:
            await conn.close()

    async def _send_json(self, conn: _Conn, status: int, obj: object, keep_alive: bool) -> bool:
        body = json.dumps(obj).encode()
        hdrs = [("content-type", "application/json"), ("content-length", str(len(body)))]
        await conn.write(_head(status, self.name, hdrs, keep_alive) + body)
        return keep_alive

    async def _answer(self, conn: _Conn, status: int, obj: object, keep_alive: bool) -> bool:
        self._status[status] += 1
        return await self._send_json(conn, status, obj, keep_alive)

    async def _dispatch(self, conn: _Conn, req: _Request) -> bool:
        kind, keep = _ENDPOINTS.get(req.path), req.keep_alive
        if kind is not None and req.method == "POST":
            return await self._complete(conn, req, kind)
        if req.path == "/control/requests" and req.method == "GET":
            return await self._send_json(conn, 200, list(self.recent), keep)
        if req.path == "/control" and req.method in ("GET", "POST"):
            if req.method == "POST":
                try:
                    payload = json.loads(req.body or b"{}")
                    if not isinstance(payload, dict):
                        raise ConfigError("control body must be a JSON object")
                    self.apply_control(payload)
                except ValueError as exc:  # JSONDecodeError and ConfigError
                    return await self._send_json(conn, 400, _error(str(exc)), keep)
            return await self._send_json(conn, 200, self.snapshot(), keep)
        if req.path == "/healthz" and req.method == "GET":
            return await self._send_json(conn, 200, {"status": "ok", "name": self.name}, keep)
        if kind is not None or req.path in ("/control", "/healthz"):
            return await self._send_json(conn, 405, _error(f"{req.method} not allowed"), keep)
        return await self._send_json(conn, 404, _error(f"unknown path {req.path}"), keep)

    def _n_tokens(self, body: Mapping[str, Any]) -> int:
        for key in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
            value = body.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return min(value, self.max_tokens)
        return self.default_tokens

    async def _complete(self, conn: _Conn, req: _Request, kind: str) -> bool:
        # Deadlines are absolute from arrival so write overhead never accumulates as drift.
        t0 = asyncio.get_running_loop().time()
        keep = req.keep_alive
        self._requests += 1
        try:
            body = json.loads(req.body)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return await self._answer(conn, 400, _error("body is not a JSON object"), keep)
        stream = body.get("stream") is True
        record: dict[str, Any] = {
            "path": req.path, "model": body.get("model"), "stream": stream,
            "request_id": req.headers.get("x-request-id"),
            "headers": {k: v for k, v in req.headers.items() if k.startswith("x-")},
            "sent_sha256": None, "sent_len": 0,
        }
        self.recent.append(record)
        prof = self.streaming_profile if stream else self._base
        if prof.outage:
            if prof.outage_mode == "close":
                self._dropped += 1
                return False  # caller closes the connection without a response
            return await self._answer(conn, 503, _error("simulated outage", "server_error"), keep)
        if prof.error_rate > 0 and self._rng.random() < prof.error_rate:
            code = prof.error_status
            etype = "rate_limit_error" if code == 429 else "error" if code < 500 else "server_error"
            msg = f"simulated upstream error from {self.name}"
            return await self._answer(conn, code, _error(msg, etype), keep)
        n = self._n_tokens(body)
        self._seq += 1
        reply = _Reply(kind, str(body.get("model") or "fake-model"), _prompt_tokens(body), n,
                       f"{self.name}-{self._seq}")
        # One TPOT per request (not per token): routers see per-request TPOT, and
        # averaging per-token draws would wash the configured tail out.
        first = t0 + prof.ttft.sample_ms(self._rng) / 1000
        tpot, stall = prof.tpot.sample_ms(self._rng) / 1000, prof.stall_ms / 1000
        due = [first] + [first + stall + i * tpot for i in range(1, n)]
        self._active += 1
        try:
            if not stream:
                await conn.sleep_until(due[-1])
                return await self._answer(conn, 200, reply.full(), req.keep_alive)
            self._status[200] += 1
            hdrs = [("content-type", "text/event-stream"), ("cache-control", "no-cache"),
                    ("transfer-encoding", "chunked")]
            await conn.write(_head(200, self.name, hdrs, req.keep_alive))
            sent = hashlib.sha256()
            for i in range(n):
                await conn.sleep_until(due[i])
                for event in reply.token_events(i):
                    await conn.write(_chunk(event))  # one chunk per event, flushed
                    sent.update(event)
                    record["sent_len"] += len(event)
            for event in reply.tail_events():
                await conn.write(_chunk(event))
                sent.update(event)
                record["sent_len"] += len(event)
            await conn.write(b"0\r\n\r\n")
            record["sent_sha256"] = sent.hexdigest()
            return req.keep_alive
        except _ClientGone:
            self._disconnects += 1
            raise
        finally:
            self._active -= 1


def build_arg_parser() -> argparse.ArgumentParser:
    """Argument parser for ``tailroute fake-provider``."""
    p = argparse.ArgumentParser(prog="tailroute fake-provider",
                                description="Simulated OpenAI-compatible LLM upstream.")
    p.add_argument("--name", default="fake", help="reported in the x-fake-provider header")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port (see --ready-file)")
    p.add_argument("--ttft-ms", metavar="MEDIAN[:P99]", help="time to first token (fixed w/o P99)")
    p.add_argument("--tpot-ms", metavar="MEDIAN[:P99]", help="time per output token")
    p.add_argument("--error-rate", type=float, help="fraction of requests answered with 500")
    p.add_argument("--stall-ms", type=float, help="pause after the first token")
    p.add_argument("--seed", type=int, help="RNG seed (default: derived from --name)")
    p.add_argument("--max-tokens", type=int, default=64, help="cap on output tokens")
    p.add_argument("--default-tokens", type=int, default=16, help="tokens if request sets none")
    p.add_argument("--schedule", metavar="JSON|@FILE", help='[{"at_s": 5, "set": {...}}, ...]')
    p.add_argument("--ready-file", type=Path, help="write the bound port here once listening")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run a fake provider until SIGTERM/SIGINT; return the exit status."""
    parser = build_arg_parser()
    args = parser.parse_args(argv)
    settings = {"ttft_ms": args.ttft_ms, "tpot_ms": args.tpot_ms, "error_rate": args.error_rate,
                "stall_ms": args.stall_ms}
    try:
        profile = Profile().updated({k: v for k, v in settings.items() if v is not None})
        schedule = parse_schedule(args.schedule) if args.schedule else []
        provider = FakeProvider(args.name, profile, seed=args.seed, max_tokens=args.max_tokens,
                                default_tokens=args.default_tokens, schedule=schedule)
    except ConfigError as exc:
        parser.error(str(exc))
    return asyncio.run(_serve(provider, args.host, args.port, args.ready_file))


async def _serve(provider: FakeProvider, host: str, port: int, ready_file: Path | None) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        bound = await provider.start(host, port)
        if ready_file is not None:
            # Write-then-rename so a polling parent never reads a half-written port.
            tmp = ready_file.with_name(ready_file.name + ".tmp")
            tmp.write_text(f"{bound}\n")
            os.replace(tmp, ready_file)
        print(f"fake-provider {provider.name} on {host}:{bound}", file=sys.stderr, flush=True)
        await stop.wait()
    finally:
        await provider.stop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
