"""Admin HTTP server (binds 127.0.0.1 by default): health, readiness, metrics, state.

Endpoints::

    GET /healthz   200 while the process runs
    GET /readyz    200 only when config is loaded and the gRPC server serves, else 503
    GET /metrics   Prometheus text format, or OpenMetrics when the scraper asks for it
                   (then with # UNIT lines)
    GET /state     JSON: per cluster x slice percentiles, samples, state, weight, transitions
    GET /explain   JSON: the most recent decisions with their reasons (?limit=N)
    GET /          HTML status page (routes, states, latency over time as charts)

A deliberately small GET-only HTTP/1.1 server on asyncio streams: the admin
port must not pull a web framework into the sidecar.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from http import HTTPStatus
from importlib import resources
from typing import Any
from urllib.parse import SplitResult, parse_qs, urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from sidecar.core.fields import shown
from sidecar.core.hostport import split_hostport
from sidecar.ops.cooperative import encode_off_loop, json_steps, run_steps_async
from sidecar.ops.metrics import RouterCollector
from sidecar.ops.state import busiest_steps, explain_recent, state_json_async
from sidecar.shell.app import App

log = logging.getLogger("tailroute.admin")
HISTORY_POINTS = 300  # status-page chart samples kept
HISTORY_ROUTES = 32  # routes per sample: the busiest ones
HEAD_LIMIT = 2**16  # a request head's bytes (asyncio's stream limit): past it, 414 or 431
WRITE_PIECE = 1 << 20  # bytes of an answer written at once
IDLE_TIMEOUT_S = 30.0  # a connection with no request, or not reading its answer, is closed
Answer = tuple[int, str, bytes]
Handler = Callable[[dict[str, list[str]]], Answer]
View = Callable[[dict[str, list[str]], str], Awaitable[Answer]]  # (query, accept)


class AdminServer:
    """Serves the admin endpoints for one :class:`App`."""

    def __init__(self, app: App, registry: CollectorRegistry,
                 ready: Callable[[], bool], router_metrics: RouterCollector | None = None
                 ) -> None:
        self.app = app
        self.registry = registry
        # The registry's collector of per-route families, gathered a slice at a time
        # before each scrape (sidecar.ops.cooperative); None: collected in one go.
        self.router_metrics = router_metrics
        self.ready = ready
        self._server: asyncio.Server | None = None
        self.idle_timeout_s = IDLE_TIMEOUT_S
        # More /state sections from other parts of the shell (name -> view at ``now``).
        self.extra_state: dict[str, Callable[[float], Any]] = {}
        # Latency over time for the status page's charts: bounded ring of samples.
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY_POINTS)
        self.routes: dict[str, Handler] = {
            "/healthz": lambda q: (200, "text/plain", b"ok\n"),
            "/readyz": self._readyz,
            "/explain": self._explain,
            "/": self._page,
        }
        # Views over every route, built a slice of routes at a time so the event loop
        # keeps serving the ext_proc streams meanwhile (sidecar.ops.cooperative).
        self.views: dict[str, View] = {"/metrics": self._metrics, "/state": self._state}

    async def start(self, addr: str) -> int:
        host, port = split_hostport(addr, port_zero=True)  # IPv6: without its brackets
        self._server = await asyncio.start_server(self._conn, host, port, limit=HEAD_LIMIT)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _readyz(self, q: dict[str, list[str]]) -> tuple[int, str, bytes]:
        ok = self.ready()
        return (200 if ok else 503), "text/plain", b"ready\n" if ok else b"not ready\n"

    async def sample(self) -> None:
        """Record one point of per-route p50/p95 (ms) for the charts; call periodically.
        Bounded: 300 points x every slice of every cluster could reach tens of MB, so
        only the busiest routes, and only theirs are computed."""
        point: dict[str, Any] = {"t": self._now(), "routes": {}}
        busiest = await run_steps_async(busiest_steps(self.app.router, self._now, HISTORY_ROUTES))
        for r in busiest:
            key = f"{r['cluster']} {r['slice']}"
            metric = "ttft" if r["latency"]["ttft"]["samples"] else "e2e"
            point["routes"][key] = {"p50": r["latency"][metric]["p50_ms"],
                                    "p95": r["latency"][metric]["p95_ms"],
                                    "metric": metric, "state": r["state"]}
        self.history.append(point)

    async def _state(self, q: dict[str, list[str]], accept: str = "") -> Answer:
        data = await state_json_async(self.app.router, self._now)
        now = self._now()
        data["envoy"] = self.app.envoy_view(now)
        for name, view in self.extra_state.items():
            data[name] = view(now)
        if q.get("history", ["0"])[-1].lower() not in ("0", "false", "no", ""):
            data["history"] = list(self.history)
        body = await run_steps_async(json_steps(data, ("routes", "history")))
        return 200, "application/json", body

    def _explain(self, q: dict[str, list[str]]) -> tuple[int, str, bytes]:
        try:
            limit = int(q.get("limit", ["20"])[0])
        except ValueError:
            limit = 0
        if limit < 1:
            return 400, "application/json", b'{"error": "limit must be an integer >= 1"}'
        limit = min(limit, 64)  # the recent-decision ring holds 64
        return 200, "application/json", json.dumps(explain_recent(self.app.router, limit)).encode()

    async def _metrics(self, q: dict[str, list[str]], accept: str = "") -> Answer:
        """The registry's families, gathered on the loop (the per-route ones a slice at a
        time), then encoded in a worker thread from that fixed list."""
        encode, content_type = choose_encoder(accept)
        rm = self.router_metrics
        try:
            if rm is not None:
                await rm.prepare()
            families = list(self.registry.collect())  # consumes what prepare() gathered
        finally:
            if rm is not None:
                rm.discard()
        fixed = CollectorRegistry()
        fixed.register(_Fixed(families))
        return 200, content_type, await encode_off_loop(lambda: encode(fixed))

    def _page(self, q: dict[str, list[str]]) -> tuple[int, str, bytes]:
        html = resources.files("sidecar.ops").joinpath("static/status.html").read_bytes()
        return 200, "text/html; charset=utf-8", html

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answering = False  # a request read and its answer not yet written
        try:
            while True:
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"),
                                                  self.idle_timeout_s)
                except asyncio.LimitOverrunError:
                    await self._send(writer, *await self._too_large(reader), keep=False)
                    return
                except (asyncio.IncompleteReadError, TimeoutError):
                    return
                answering = True
                status, ctype, body, extra, keep = await self._answer(head)
                answering = False
                if not await self._send(writer, status, ctype, body, extra, keep) or not keep:
                    return
        except ConnectionError:
            return
        except Exception as exc:  # no request may raise out of the server
            # One line (throttled on a serving logger), never asyncio's traceback per request.
            self.app.errors["admin_exception"] += 1
            log.error("admin connection failed (%s): %r",
                      "answered 500" if answering else "closed", exc)
            if answering:
                with contextlib.suppress(Exception):
                    await self._send(writer, 500, "text/plain", b"internal error\n", keep=False)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, head: bytes) -> tuple[int, str, bytes, str, bool]:
        """Status, content type, body, extra header lines and keep-alive for one request head
        (the body left out for HEAD)."""
        first = head.split(b"\r\n", 1)[0].decode("latin-1")
        line = first.split()
        # HTTP/1.1 keeps the connection unless told otherwise; HTTP/1.0 closes
        # it unless asked to keep it (HAProxy's httpchk speaks 1.0).
        conn = _header(head, b"connection").lower()
        keep = (conn != "close" if len(line) == 3 and line[2] == "HTTP/1.1"
                else conn == "keep-alive")
        extra = ""
        if len(line) != 3:
            status, ctype, body = self._refuse(400, "request line", first)
            keep = False
        elif line[0] not in ("GET", "HEAD"):
            status, ctype, body = 405, "text/plain", b"method not allowed\n"
            extra = "allow: GET, HEAD\r\n"  # RFC 9110 15.5.6: a 405 says what is allowed
            keep = False  # a body may follow, which is not a next request
        elif (target := _target(line[1])) is None:  # "//[": an unclosed IPv6 host
            status, ctype, body = self._refuse(400, "request target", line[1])
            keep = False
        else:
            status, ctype, body = await self._dispatch(target, _header(head, b"accept"))
        # A HEAD answer says the length of the body it leaves out.
        return status, ctype, body if line[:1] != ["HEAD"] else b"", extra, keep

    async def _too_large(self, reader: asyncio.StreamReader) -> tuple[int, str, bytes]:
        """The answer to a head past the reader's limit: 414 if the request line alone
        does not end within it (the target is all of it that can be long), else 431."""
        seen = await reader.read(HEAD_LIMIT)  # what the reader holds, up to the limit
        if b"\r\n" in seen:
            return self._refuse(431, "header fields too large", seen.split(b"\r\n", 1)[0])
        return self._refuse(414, "URI too long", seen)

    def _refuse(self, status: int, why: str, line: str | bytes) -> tuple[int, str, bytes]:
        """A malformed request: counted, one throttled line, a short plain-text answer."""
        self.app.errors["admin_bad_request"] += 1
        log.warning("admin request refused with %d (%s): %s", status, why, shown(line))
        return status, "text/plain", f"{HTTPStatus(status).phrase.lower()}\n".encode()

    async def _send(self, writer: asyncio.StreamWriter, status: int, ctype: str, body: bytes,
                    extra: str = "", keep: bool = True) -> bool:
        """Write one response; False if the client did not take it within the idle timeout
        (then the connection is dropped: closing would wait on the unread bytes)."""
        hdr = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
               f"content-type: {ctype}\r\ncontent-length: {len(body)}\r\n"
               f"cache-control: no-store\r\n{extra}"
               f"connection: {'keep-alive' if keep else 'close'}\r\n\r\n")
        # A large body (a scrape of thousands of routes is megabytes) goes in pieces: one
        # write copies it whole into the transport's buffer, tens of ms on the loop.
        pieces = [hdr.encode(), *(body[i:i + WRITE_PIECE]
                                  for i in range(0, len(body), WRITE_PIECE))]
        try:
            for piece in pieces:
                writer.write(piece)
                await asyncio.wait_for(writer.drain(), self.idle_timeout_s)
        except TimeoutError:
            writer.transport.abort()
            return False
        return True

    async def _dispatch(self, parts: SplitResult, accept: str = "") -> Answer:
        view, handler = self.views.get(parts.path), self.routes.get(parts.path)
        try:
            if view is not None:  # accept: /metrics is content-negotiated
                return await view(parse_qs(parts.query), accept)
            if handler is None:
                return 404, "text/plain", b"not found\n"
            return handler(parse_qs(parts.query))
        except Exception:
            self.app.errors["admin_exception"] += 1
            log.exception("admin handler %s failed", parts.path)
            return 500, "text/plain", b"internal error\n"


def _target(raw: str) -> SplitResult | None:
    """The request target split, or None if the URL parser refuses it."""
    try:
        return urlsplit(raw)
    except ValueError:
        return None


def _header(head: bytes, name: bytes) -> str:
    """One request header's value ('' if absent); ``name`` in lower case."""
    for raw in head.split(b"\r\n")[1:]:
        key, sep, value = raw.partition(b":")
        if sep and key.strip().lower() == name:
            return value.strip().decode("latin-1")
    return ""


class _Fixed(Collector):
    """Families gathered already: what a scrape encodes off the loop."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)
