"""Simulated OpenAI-compatible LLM server for tests, the demo and benchmarks.

A deliberately small HTTP/1.1 server on asyncio streams (keep-alive,
Content-Length or chunked request bodies, chunked SSE responses) that answers
``/v1/chat/completions``, ``/v1/completions`` and ``/v1/responses`` with fake
tokens paced by a per-provider latency :class:`Profile` (TTFT, TPOT, stalls,
errors, outages). The profile can be changed at run time via ``POST /control``
or a startup schedule, so tests can make one upstream slow and watch routing.

The control API (``POST /control``, its fields and what they do) is
:mod:`sidecar.fake_provider.control`.

``GET /control`` returns the settings and counters; ``GET /control/requests`` the
last requests as received, with the provider's own write times (``first_byte_ms``,
``first_token_ms`` from arrival: ground truth for timing tests); ``GET /healthz``
is always 200.
Every response carries ``x-fake-provider: <name>``.

The connection layer lives in :mod:`sidecar.fake_provider.connection`, the run-time
profile and its control in :mod:`sidecar.fake_provider.control`, the reply
shapes in :mod:`sidecar.fake_provider.reply`, the timed writing of a streamed
reply in :mod:`sidecar.fake_provider.streaming`, the latency profile in
:mod:`sidecar.fake_provider.latency` and the command line in
:mod:`sidecar.fake_provider.cli`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import zlib
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from typing import Any

from .cli import build_arg_parser, main
from .connection import MAX_BODY, ClientGone, Conn, HttpError, Request, response_head
from .control import ProfileControl
from .framing import SSE_EOLS, SSE_SPLITS
from .latency import ConfigError, Profile, ScheduleEntry
from .reply import Reply, error_body, prompt_tokens
from .streaming import stream_reply

__all__ = ["MAX_BODY", "FakeProvider", "Profile", "build_arg_parser", "main"]

_ENDPOINTS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completion",
    "/v1/responses": "response",
}
_log = logging.getLogger(__name__)
#: How often a held request looks whether it was released (and its client is still there).
HOLD_POLL_S = 0.02


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
        sse_eol: str = "lf",
        sse_split: str = "none",
    ) -> None:
        if sse_eol not in SSE_EOLS or sse_split not in SSE_SPLITS:
            raise ConfigError(f"sse_eol must be one of {', '.join(SSE_EOLS)} and sse_split one "
                              f"of {', '.join(SSE_SPLITS)}; got {sse_eol!r}, {sse_split!r}")
        self.sse_eol, self.sse_split = sse_eol, sse_split
        if max_tokens < 1 or default_tokens < 1:
            raise ConfigError("max_tokens and default_tokens must be >= 1")
        if not name.isprintable() or not name.isascii():
            raise ConfigError(f"name must be printable ASCII (it is sent as a header): {name!r}")
        self.name = name
        self.max_tokens, self.default_tokens = max_tokens, min(default_tokens, max_tokens)
        self._rng = random.Random(zlib.crc32(name.encode()) if seed is None else seed)
        self.control = ProfileControl(profile or Profile())
        self._schedule = sorted(schedule, key=lambda e: e.at_s)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._status: Counter[int] = Counter()
        self._requests = self._dropped = self._disconnects = self._active = self._seq = 0
        self._midstream = 0  # streams failed mid-way
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
        return self.control.base

    @property
    def streaming_profile(self) -> Profile:
        """Effective profile for streaming requests."""
        return self.control.stream

    def apply_control(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """Apply a control payload (as for ``POST /control``); return :meth:`snapshot`.

        Raises ConfigError (nothing applied) if the payload is invalid.
        """
        self.control.apply(payload)
        return self.snapshot()

    def snapshot(self) -> dict[str, Any]:
        """Current settings and counters, as served by ``GET /control``."""
        return {
            "name": self.name,
            **self.control.to_json(),
            "max_tokens": self.max_tokens,
            "default_tokens": self.default_tokens,
            "held": self.control.held,
            "counters": {
                "requests_total": self._requests,
                "by_status": {str(k): v for k, v in sorted(self._status.items())},
                "dropped_connections": self._dropped,
                "client_disconnects": self._disconnects,
                "active_requests": self._active,
                "midstream_errors": self._midstream,
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
        conn = Conn(reader, writer)
        try:
            keep_alive = True
            while keep_alive:
                try:
                    req = await conn.read_request()
                except HttpError as exc:
                    await self._send_json(conn, exc.status, error_body(str(exc)), keep_alive=False)
                    return
                keep_alive = await self._dispatch(conn, req)
        except ClientGone:
            pass
        except Exception:  # a bug must cost one connection, not the server
            _log.exception("fake-provider %s: connection handler failed", self.name)
        finally:
            await conn.close()

    async def _send_json(self, conn: Conn, status: int, obj: object, keep_alive: bool,
                         extra: Sequence[tuple[str, str]] = ()) -> bool:
        body = json.dumps(obj).encode()
        hdrs = [("content-type", "application/json"), ("content-length", str(len(body))),
                *extra]
        await conn.write(response_head(status, self.name, hdrs, keep_alive) + body)
        return keep_alive

    async def _answer(self, conn: Conn, status: int, obj: object, keep_alive: bool,
                      extra: Sequence[tuple[str, str]] = ()) -> bool:
        self._status[status] += 1
        return await self._send_json(conn, status, obj, keep_alive, extra)

    async def _dispatch(self, conn: Conn, req: Request) -> bool:
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
                    return await self._send_json(conn, 400, error_body(str(exc)), keep)
            return await self._send_json(conn, 200, self.snapshot(), keep)
        if req.path == "/healthz" and req.method == "GET":
            return await self._send_json(conn, 200, {"status": "ok", "name": self.name}, keep)
        if kind is not None or req.path in ("/control", "/healthz"):
            return await self._send_json(conn, 405, error_body(f"{req.method} not allowed"), keep)
        return await self._send_json(conn, 404, error_body(f"unknown path {req.path}"), keep)

    def _n_tokens(self, body: Mapping[str, Any]) -> int:
        for key in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
            value = body.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return min(value, self.max_tokens)
        return self.default_tokens

    async def _complete(self, conn: Conn, req: Request, kind: str) -> bool:
        # Deadlines are absolute from arrival so write overhead never accumulates as drift.
        t0 = asyncio.get_running_loop().time()
        keep = req.keep_alive
        self._requests += 1
        try:
            body = json.loads(req.body)
        except (ValueError, RecursionError):  # deeply nested JSON: refused like any bad body
            body = None
        if not isinstance(body, dict):
            return await self._answer(conn, 400, error_body("body is not a JSON object"), keep)
        stream = body.get("stream") is True
        record: dict[str, Any] = {
            "path": req.path, "model": body.get("model"), "stream": stream,
            "request_id": req.headers.get("x-request-id"),
            "headers": {k: v for k, v in req.headers.items() if k.startswith("x-")},
            "sent_sha256": None, "sent_len": 0,
            # Ground truth for timing tests: ms from the request's arrival to the write
            # of the first body byte, the first content token and the last event
            # (streamed only).
            "first_byte_ms": None, "first_token_ms": None, "last_token_ms": None,
            "midstream_error": False,
        }
        self.recent.append(record)
        start = t0  # the latency profile runs from arrival, or from release of a hold
        if self.control.held:
            while self.control.held:  # polled, so a client hanging up meanwhile is noticed
                await conn.sleep_until(asyncio.get_running_loop().time() + HOLD_POLL_S)
            start = asyncio.get_running_loop().time()
        prof = self.control.stream if stream else self.control.base
        if prof.outage:
            if prof.outage_mode == "close":
                self._dropped += 1
                return False  # caller closes the connection without a response
            outage = error_body("simulated outage", "server_error")
            return await self._answer(conn, 503, outage, keep)
        if prof.error_rate > 0 and self._rng.random() < prof.error_rate:
            code = prof.error_status
            etype = "rate_limit_error" if code == 429 else "error" if code < 500 else "server_error"
            msg = f"simulated upstream error from {self.name}"
            waits = [(k, v) for k, v in (("retry-after", prof.retry_after),
                                         ("retry-after-ms", prof.retry_after_ms))
                     if v is not None]
            return await self._answer(conn, code, error_body(msg, etype), keep, waits)
        n = self._n_tokens(body)
        self._seq += 1
        reply = Reply(kind, str(body.get("model") or "fake-model"), prompt_tokens(body), n,
                       f"{self.name}-{self._seq}")
        # One TPOT per request (not per token): routers see per-request TPOT, and
        # averaging per-token draws would wash the configured tail out.
        first = start + prof.ttft.sample_ms(self._rng) / 1000
        tpot, stall = prof.tpot.sample_ms(self._rng) / 1000, prof.stall_ms / 1000
        due = [first] + [first + stall + i * tpot for i in range(1, n)]
        self._active += 1
        try:
            if not stream:
                await conn.sleep_until(due[-1])
                return await self._answer(conn, 200, reply.full(), req.keep_alive)
            self._status[200] += 1
            fail = None
            if prof.midstream_error_rate > 0 and self._rng.random() < prof.midstream_error_rate:
                self._midstream += 1
                record["midstream_error"] = True
                fail = (n // 2, reply.error_event(prof.midstream_error_shape, self.name))
            await stream_reply(conn, reply, due, record, t0=t0, name=self.name,
                               keep_alive=req.keep_alive, role_first=prof.role_first,
                               sse_eol=self.sse_eol, sse_split=self.sse_split,
                               end_delay_s=prof.end_delay_ms / 1000, fail=fail,
                               waiting_comment_s=prof.waiting_comment_ms / 1000)
            return req.keep_alive
        except ClientGone:
            self._disconnects += 1
            raise
        finally:
            self._active -= 1


if __name__ == "__main__":
    raise SystemExit(main())
