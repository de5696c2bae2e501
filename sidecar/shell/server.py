"""The grpc.aio server: ext_proc streams and Envoy's access-log streams.

Each ext_proc stream's first message says which filter opened it: the
observing filter sets ``observability_mode``; everything else is a routing
stream (one message on the common path, headers first on the rich path). The
access-log service (:mod:`sidecar.shell.access_log`) shares the server. The
loop's clock (``loop.time()``) is the only time source, handed to the core.

Handlers answer synchronously (the fast path). The one exception is an
admission ``queue`` answer: the handler returns a :class:`Hold` and this
server awaits, without blocking other streams, until the hold's deadline or
until a stream closes or the in-flight total drops (:class:`CapacitySignal`),
then calls ``handler.resume(now)``, which asks the core again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import grpc
from prometheus_client import Histogram

from sidecar.core.input_limits import grpc_receive_limit
from sidecar.pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from sidecar.pb.envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from sidecar.shell.access_log import AccessLogService, Sink
from sidecar.shell.admission import CapacitySignal, Hold
from sidecar.shell.app import App
from sidecar.shell.extproc import RouteStream, continue_unchanged
from sidecar.shell.grpc_settle import settle
from sidecar.shell.native import NativeRouting
from sidecar.shell.native_log import NativeFeed
from sidecar.shell.observe import ObserveStream
from sidecar.shell.outcomes import OutcomeFeed
from sidecar.shell.pb_tolerant import add_access_log, add_extproc
from sidecar.shell.rtds import add_to_server as add_rtds

log = logging.getLogger("tailroute.server")
# HTTP/2 keepalive: a peer that vanished without closing (crash, partition) is found
# within ~time + timeout and its streams are released instead of held for ever. Envoy
# pings too (envoy.sidecar_keepalive_s, sidecar.shell.sidecar_cluster); gRPC's default
# policy would count its pings on an idle connection (more often than every 5 min, and
# Envoy's access-log stream sends no data back until it ends) as strikes and close the
# connection with a GOAWAY after two: Envoy's pings are permitted instead.
KEEPALIVE_OPTIONS = [
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 1_000),
    ("grpc.http2.max_ping_strikes", 0),
]
_EOF: object = grpc.aio.EOF  # type: ignore[attr-defined]  # (missing from grpc-stubs)
# serve --workers: connection age (gRPC adds +-10 % jitter) and drain grace, in ms.
REUSEPORT_OPTIONS = (("grpc.max_connection_age_ms", 5_000),
                     ("grpc.max_connection_age_grace_ms", 120_000))
# gRPC core's backlog of calls that reached the server before it asked for them (the
# event loop busy): from the first figure waiting it refuses new calls at random
# (RESOURCE_EXHAUSTED; Envoy fails them open), more often as the backlog grows, and
# every one from the second. That is the sidecar's overload shedder; kept at gRPC's
# defaults, written out so they are visible and in one place. Raising them (8 x
# the circuit breaker) removed the few refusals seen at 1,024 clients but at 2,048
# turned early refusals into ~2.6x as many 500 ms message timeouts
# (docs/response-timing.md, "Load safety").
BACKLOG_OPTIONS = (("grpc.server.max_pending_requests", 1_000),
                   ("grpc.server.max_pending_requests_hard_limit", 3_000))


class ExtProcService(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """envoy.service.ext_proc.v3.ExternalProcessor/Process."""

    def __init__(self, app: App, phase_hist: Histogram | None = None) -> None:
        self.app = app
        self.active_streams = 0
        self.access_log: AccessLogService | None = None  # set by start_grpc
        # Shutting down: new routing streams are refused (Envoy fails open); observing
        # streams are still served, since they time requests already routed.
        self.draining = False
        self._phase = phase_hist
        self._phase_by_kind: dict[str, Any] = {}  # histogram children, looked up once
        self.capacity = CapacitySignal(self._queue_order)

    def _observe_phase(self, kind: str, seconds: float) -> None:
        child = self._phase_by_kind.get(kind)
        if child is None:
            assert self._phase is not None
            child = self._phase_by_kind[kind] = self._phase.labels(kind)
        child.observe(seconds)

    def _queue_order(self, ticket: str) -> tuple[int, int] | None:
        """A held request's place in the core's admission queue (None: not in it)."""
        waiter = self.app.router.admission.queue.get(ticket)
        return None if waiter is None else waiter.order()

    def _load(self) -> int:
        router = self.app.router
        return sum(router.inflight(c) for c in self.app.config.cluster_names)

    async def _hold(
        self, handler: RouteStream, hold: Hold, msg: pb.ProcessingRequest
    ) -> pb.ProcessingResponse:
        """Wait out admission ``queue`` answers until the core admits or refuses."""
        loop = asyncio.get_running_loop()
        resp: pb.ProcessingResponse | Hold = hold
        assert handler.rid is not None  # held: it has its ticket
        while isinstance(resp, Hold):
            await self.capacity.wait(handler.rid, resp.until - loop.time())
            try:
                resp = handler.resume(loop.time())
            except Exception:
                log.exception("handler error while queued; answering CONTINUE")
                self.app.errors["handler_exception"] += 1
                self.app.router.withdraw(handler.rid)
                self.capacity.notify()
                return _safe_continue(msg)
        self.capacity.notify()  # it left the queue: the next waiter's turn (CapacitySignal)
        return resp

    async def Process(self, request_iterator: Any, context: Any) -> None:
        """One ext_proc stream, through gRPC's reader/writer calls.

        A coroutine rather than an async generator: grpc.aio then skips the two
        async-generator layers (its request iterator and our response generator)
        around every message, which measured ~10 % of the sidecar's CPU per routed
        request (docs/response-timing.md). ``request_iterator`` is left unused.
        """
        loop = asyncio.get_running_loop()
        handler: RouteStream | ObserveStream | None = None
        cancelled = True
        first: Any = None
        if self.draining:
            # An observing stream opens when its response starts, which for a request
            # routed just before SIGTERM is during the drain: refusing it would leave
            # that request without its first-token time (kept, then observed from the
            # entry alone). Only a routing stream is refused, after its first message.
            first = await context.read()
            if first is _EOF or not first.observability_mode:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "tailroute is shutting down")
        self.active_streams += 1
        try:
            while True:
                if first is not None:
                    msg, first = first, None
                else:
                    msg = await context.read()
                if msg is _EOF:
                    break
                now = loop.time()
                if handler is None:
                    handler = ObserveStream(self.app) if msg.observability_mode else RouteStream(
                        self.app
                    )
                if isinstance(handler, ObserveStream):
                    try:
                        stop = handler.on_message(msg, now)
                    except Exception:
                        log.exception("observer error; closing its stream")
                        self.app.errors["handler_exception"] += 1
                        handler.broken = True
                        stop = True
                    if stop:
                        break  # closing the stream tells Envoy no more messages are needed
                    continue
                resp = self._answer(handler, msg, now)
                if isinstance(resp, Hold):
                    resp = await self._hold(handler, resp, msg)
                elif self.capacity.waiting:
                    self.capacity.observe_load(self._load())
                if resp is not None:
                    await context.write(resp)
            cancelled = False
        finally:
            self.active_streams -= 1
            if handler is not None:
                try:
                    handler.close(loop.time(), cancelled=cancelled)
                except Exception:
                    log.exception("error closing stream handler")
                    self.app.errors["close_exception"] += 1
                self.capacity.notify()  # a slot or a queue place may have freed
            elif not cancelled:
                # Ended cleanly before its first message: gRPC refused that message
                # (over its limit, RESOURCE_EXHAUSTED; on the one-message path it is the
                # body) and Envoy fails open to the default route.
                self.app.errors["stream_ended_before_body"] += 1
        # Returning at once after a peer cancel leaks native memory in grpc.aio
        # (sidecar.shell.grpc_settle); the handler is already closed.
        await settle()

    def _answer(self, handler: RouteStream, msg: pb.ProcessingRequest, now: float
                ) -> pb.ProcessingResponse | Hold | None:
        """The routing handler's answer; a handler bug answers CONTINUE, never kills the
        stream. The phase histogram (when metrics are on) times the handler alone."""
        phase = self._phase
        t0 = time.perf_counter() if phase is not None else 0.0
        try:
            resp = handler.on_message(msg, now)
        except Exception:
            log.exception("handler error; answering CONTINUE")
            self.app.errors["handler_exception"] += 1
            resp = _safe_continue(msg)
        if phase is not None:
            self._observe_phase(msg.WhichOneof("request") or "unknown", time.perf_counter() - t0)
        return resp


def _safe_continue(msg: pb.ProcessingRequest) -> pb.ProcessingResponse:
    return continue_unchanged(msg.WhichOneof("request"))


async def start_grpc(
    app: App, tcp: str | None, unix: str | None, phase_hist: Histogram | None = None,
    register: Callable[[grpc.aio.Server], None] | None = None,
    tcp_credentials: grpc.ServerCredentials | None = None,
    reuse_port: bool = False,
    native: NativeRouting | None = None,
) -> tuple[grpc.aio.Server, ExtProcService, int | None]:
    """Start the gRPC server on a TCP address (``host:port``, port 0 = any) and/or a Unix socket.

    Serves ext_proc and the access-log service (``service.access_log``);
    ``register`` adds further services (the health service), ``tcp_credentials``
    makes the TCP listener TLS (:mod:`sidecar.shell.tls`). ``reuse_port``:
    SO_REUSEPORT, so ``serve --workers N`` processes share one port (off otherwise:
    a second sidecar on a taken port must fail, not split traffic). With ``native``
    (routing.mode native/hybrid) it also serves the weights over RTDS and learns
    from the native path's access-log entries. Returns the server, the ext_proc
    service and the bound TCP port (None when TCP is off).
    """
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", grpc_receive_limit(app.config)),
            ("grpc.so_reuseport", 1 if reuse_port else 0),
            *KEEPALIVE_OPTIONS,
            *BACKLOG_OPTIONS,
            # Workers: Envoy multiplexes every stream onto one HTTP/2 connection per
            # worker thread, and SO_REUSEPORT places connections, not streams. Aged
            # connections are closed gracefully (GOAWAY: streams in flight finish), so
            # Envoy reconnects from a new port and the kernel re-spreads them.
            *(REUSEPORT_OPTIONS if reuse_port else ()),
        ]
    )
    service = ExtProcService(app, phase_hist)

    def not_utf8() -> None:  # a header value Envoy passed on as raw bytes (pb_tolerant)
        app.errors["not_utf8"] += 1

    add_extproc(service, server, not_utf8)
    feed: Sink = OutcomeFeed(app)
    reader = None
    if native is not None:
        native_feed = NativeFeed(app, native, feed)
        feed, reader = native_feed, native_feed.batch
        native.rtds = add_rtds(server, native.layer)
    service.access_log = AccessLogService(feed, app.envoy, reader)
    add_access_log(service.access_log, server, not_utf8)
    if register is not None:
        register(server)
    port: int | None = None
    if tcp:
        port = (server.add_secure_port(tcp, tcp_credentials) if tcp_credentials is not None
                else server.add_insecure_port(tcp))
        if port == 0:
            raise OSError(f"cannot bind gRPC on {tcp}")
    if unix:
        server.add_insecure_port(f"unix:{unix}")
    await server.start()
    return server, service, port


async def tick_loop(app: App, stop: asyncio.Event, max_sleep: float = 0.5) -> None:
    """Call the core's tick at its next deadline (at least every ``max_sleep`` s)."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        now = loop.time()
        app.tick(now)
        nd = app.router.next_deadline()
        delay = max_sleep if nd is None else min(max(nd - now, 0.01), max_sleep)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=delay)
