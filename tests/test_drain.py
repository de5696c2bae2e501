"""The shutdown drain through a real gRPC server in this process (no Envoy).

While draining, a new routing stream is refused (Envoy fails open to its default
route) but an observing stream is served: it times a request routed before the
signal, and its response may only start during the drain. The app's sweep keeps
running, and what is still pending when the drain ends is settled, observed from
its entry or counted lost, never dropped silently.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest

from sidecar.core.types import SliceKey
from sidecar.pb.envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from sidecar.serve import drain
from sidecar.shell.app import App
from sidecar.shell.extproc import RouteStream
from sidecar.shell.outcomes import OutcomeFeed
from sidecar.shell.server import start_grpc
from tests.streamharness import (
    POST_CHAT,
    body_only_msg,
    chat_request,
    headers_msg,
    metadata,
    observe_msg,
    routed_cluster,
    token,
)
from tests.test_extproc import SSE_HEADERS, entry, make_app

SLICE = SliceKey("m", "interactive", "short", True)


def _sampled_app() -> App:
    return make_app(share=1.0, min_samples=1)  # every response's first token timed


def _route(app: App, now: float) -> tuple[str, dict[str, str], str]:
    """One sampled request routed in memory: its id, forwarded metadata and cluster."""
    s = RouteStream(app)
    resp = s.on_message(body_only_msg(chat_request()), now)
    meta = metadata(resp)  # type: ignore[arg-type]
    assert meta["route"].endswith("|s")
    s.close(now + 0.3, cancelled=False)
    return s.rid or "", meta, routed_cluster(resp)  # type: ignore[arg-type]


async def _draining_serves_observers_and_refuses_routing() -> tuple[App, str, float]:
    app = _sampled_app()
    server, service, port = await start_grpc(app, "127.0.0.1:0", None)
    loop = asyncio.get_running_loop()
    try:
        rid, meta, cluster = _route(app, loop.time())
        OutcomeFeed(app)(entry(rid, first_body_s=0.02), loop.time())
        assert rid in app.pending  # held for its first-token time
        service.draining = True
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = pb_grpc.ExternalProcessorStub(ch)
            routing = stub.Process()
            await routing.write(headers_msg(POST_CHAT))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await routing.read()
            assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
            observing = stub.Process()
            await observing.write(observe_msg("response_headers", meta, SSE_HEADERS))
            await observing.write(observe_msg("response_body", meta, body=token("a")))
            await observing.done_writing()
            assert await observing.read() is grpc.aio.EOF  # type: ignore[attr-defined]
            assert await observing.code() is grpc.StatusCode.OK
    finally:
        await server.stop(0)
    return app, cluster, loop.time()


def test_a_draining_sidecar_still_serves_observing_streams() -> None:
    app, cluster, now = asyncio.run(_draining_serves_observers_and_refuses_routing())
    assert not app.pending and app.router.counters[("outcome", "ok")] == 1
    assert app.offsets.offset(cluster, SLICE) is not None  # the observer's timing was used
    series = app.router.stats.series(cluster, SLICE)
    assert series is not None and series.count("ttft", now) == 1


async def _drain_with_leftovers(drain_s: float, streaming: bool) -> App:
    app = _sampled_app()
    server, service, _ = await start_grpc(app, "127.0.0.1:0", None)
    loop = asyncio.get_running_loop()
    rid, _, _ = _route(app, loop.time())
    OutcomeFeed(app)(entry(rid, first_body_s=0.02), loop.time())  # no observer will come
    if streaming:  # a request that never ends
        RouteStream(app).on_message(body_only_msg(chat_request()), loop.time())
    await drain(server, service, app, drain_s)
    return app


def test_drain_settles_what_is_left(caplog: pytest.LogCaptureFixture) -> None:
    """A drain shorter than the observer's grace: the entry is observed alone, the
    request still streaming is counted lost, and the log says so."""
    with caplog.at_level(logging.WARNING, logger="tailroute"):
        app = asyncio.run(_drain_with_leftovers(0.2, streaming=True))
    assert not app.pending
    assert app.router.counters[("outcome", "ok")] == 1 and app.envoy["lost"] == 1
    assert any("1 requests observed from their entry alone, 1 without an entry counted lost"
               in r.getMessage() for r in caplog.records)


def test_drain_sweeps_an_entry_whose_observer_never_comes() -> None:
    """A drain longer than the observer's grace: the sweep observes the entry alone
    while draining (the tick loop has stopped), so nothing is left to settle."""
    app = asyncio.run(_drain_with_leftovers(30.0, streaming=False))
    assert not app.pending
    assert app.router.counters[("outcome", "ok")] == 1 and app.envoy["lost"] == 0
