"""The access-log service's streams, driven in memory: entries reach the sink, open
streams are counted, and close() ends a stream Envoy would keep open for ever."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from sidecar.core.envoy_log import LogRecord
from sidecar.pb.envoy.service.accesslog.v3 import als_pb2
from sidecar.shell.access_log import AccessLogService


def _batch(n: int, first: bool = False) -> als_pb2.StreamAccessLogsMessage:
    msg = als_pb2.StreamAccessLogsMessage()
    if first:
        msg.identifier.node.id = "envoy-1"
        msg.identifier.log_name = "tailroute"
    for i in range(n):
        e = msg.http_logs.log_entry.add()
        e.request.path = f"/v1/chat/completions?{i}"
        e.response.response_code.value = 200
    return msg


async def _envoy(batches: list[als_pb2.StreamAccessLogsMessage], sent: asyncio.Event,
                 ) -> AsyncIterator[als_pb2.StreamAccessLogsMessage]:
    """Like Envoy: sends its batches, then keeps the stream open without a half-close."""
    for b in batches:
        yield b
    sent.set()
    await asyncio.Event().wait()


def test_close_ends_a_stream_envoy_keeps_open_and_refuses_new_ones() -> None:
    got: list[LogRecord] = []
    service = AccessLogService(lambda rec, now: got.append(rec))

    async def run() -> None:
        sent = asyncio.Event()
        call = asyncio.create_task(service.StreamAccessLogs(
            _envoy([_batch(2, first=True), _batch(3)], sent), None))
        await sent.wait()
        await asyncio.sleep(0)
        assert service.open_streams == 1 and dict(service.nodes) == {"envoy-1": 1}
        service.close()
        resp = await asyncio.wait_for(call, 5)
        assert isinstance(resp, als_pb2.StreamAccessLogsResponse)
        assert service.open_streams == 0 and not service.nodes
        late = await asyncio.wait_for(service.StreamAccessLogs(
            _envoy([_batch(1, first=True)], asyncio.Event()), None), 5)
        assert isinstance(late, als_pb2.StreamAccessLogsResponse)

    asyncio.run(run())
    assert len(got) == 5 and got[0].status == 200
    assert service.counters["log_batches"] == 2 and service.counters["log_streams_open"] == 0


def test_a_stream_envoy_ends_is_answered_and_a_bad_entry_skipped() -> None:
    def sink(rec: LogRecord, now: float) -> None:
        if rec.path.endswith("?1"):
            raise ValueError("not understood")

    service = AccessLogService(sink)

    async def finite() -> AsyncIterator[als_pb2.StreamAccessLogsMessage]:
        yield _batch(3, first=True)

    resp = asyncio.run(service.StreamAccessLogs(finite(), None))
    assert isinstance(resp, als_pb2.StreamAccessLogsResponse)
    assert service.counters["log_entry_errors"] == 1 and service.open_streams == 0


def test_an_entry_the_sink_raised_on_is_a_sidecar_error_in_the_metrics() -> None:
    """An entry the sink cannot handle is skipped (Envoy's stream goes on) and was
    counted only in the access-log service's own counter, which no metric and no /state
    view exported: in native mode such an entry vanished but for a throttled log line."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from sidecar.core.config import parse_config
    from sidecar.ops.metrics import build_registry
    from sidecar.shell.app import App
    from tests.conftest import base_config_dict

    app = App.create(parse_config(base_config_dict(), "t.yaml"), seed=1)

    def sink(rec: LogRecord, now: float) -> None:
        if rec.path.endswith("?1"):
            raise ValueError("not understood")

    AccessLogService(sink, app.envoy).consume(_batch(3, first=True), 1.0)
    registry = build_registry(lambda: app.router, lambda: 1.0, app.shell_counters).registry
    errors = {s.labels["kind"]: s.value
              for f in text_string_to_metric_families(generate_latest(registry).decode())
              if f.name == "tailroute_errors" for s in f.samples}
    assert errors == {"access_log_entry": 1}
