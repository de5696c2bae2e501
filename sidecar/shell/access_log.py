"""Envoy's gRPC Access Log Service (``envoy.service.accesslog.v3``), received.

Envoy opens one long-lived client stream per worker thread (and log name) and
sends its HTTP access-log entries in batches (``buffer_flush_interval`` /
``buffer_size_bytes``); the stream is answered only when it ends. Each entry is
turned into a plain :class:`~sidecar.core.envoy_log.LogRecord` and handed to a
sink (normally :class:`sidecar.shell.outcomes.OutcomeFeed`).

This module knows the wire format and nothing of routing, so any reader of
Envoy's access log (the outcome feed, a native-mode learner) can reuse it.
Bad entries are counted and skipped; they never end the stream.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

from google.protobuf import duration_pb2

from sidecar.core.envoy_log import LogRecord
from sidecar.pb.envoy.data.accesslog.v3 import accesslog_pb2 as al
from sidecar.pb.envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc
from sidecar.shell import envoy_contract as ec

log = logging.getLogger("tailroute.access_log")

Sink = Callable[[LogRecord, float], None]

_METHODS = ("", "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH")
_NO_FLAGS: frozenset[str] = frozenset()


def _seconds(d: duration_pb2.Duration) -> float:
    return d.seconds + d.nanos * 1e-9


def _tag_us(tags: Any, key: str) -> float | None:
    """A custom-tag duration in microseconds, as seconds (absent or garbled: None)."""
    raw = tags.get(key)
    if not raw or not raw.isdigit():
        return None
    return int(raw) * 1e-6


def record_from_entry(e: al.HTTPAccessLogEntry) -> LogRecord:
    """The parts of one entry tailroute reads (see sidecar.core.envoy_log)."""
    c = e.common_properties
    flags = _NO_FLAGS
    if c.HasField("response_flags"):
        set_flags = [f.name for f, v in c.response_flags.ListFields() if v is True]
        if set_flags:
            flags = frozenset(set_flags)
    rid = route = slice_label = None
    tokens = None
    fm = c.metadata.filter_metadata
    if ec.METADATA_NS in fm:
        fields = fm[ec.METADATA_NS].fields
        rid = fields[ec.RID_KEY].string_value if ec.RID_KEY in fields else None
        route = fields[ec.ROUTE_KEY].string_value if ec.ROUTE_KEY in fields else None
        slice_label = fields[ec.SLICE_KEY].string_value if ec.SLICE_KEY in fields else None
    if ec.USAGE_NS in fm:
        usage = fm[ec.USAGE_NS].fields
        if ec.TOKENS_KEY in usage:
            n = usage[ec.TOKENS_KEY].number_value
            tokens = int(n) if 0 <= n < 1e9 else None
    tags = c.custom_tags
    method = e.request.request_method
    return LogRecord(
        status=e.response.response_code.value,
        flags=flags,
        details=e.response.response_code_details,
        method=_METHODS[method] if 0 <= method < len(_METHODS) else "",
        path=e.request.path,
        upstream_cluster=c.upstream_cluster,
        route_name=c.route_name,
        duration_s=_seconds(c.duration) if c.HasField("duration") else None,
        upstream_tx_s=(_seconds(c.time_to_first_upstream_tx_byte)
                       if c.HasField("time_to_first_upstream_tx_byte") else None),
        first_body_s=_tag_us(tags, ec.TAG_FIRST_BODY_US),
        end_s=_tag_us(tags, ec.TAG_END_US),
        tokens=tokens,
        rid=rid or None,
        route_key=route or None,
        slice_label=slice_label or None,
        stream_id=c.stream_id,
    )


class AccessLogService(als_pb2_grpc.AccessLogServiceServicer):  # type: ignore[misc]
    """envoy.service.accesslog.v3.AccessLogService/StreamAccessLogs."""

    def __init__(self, sink: Sink, counters: Counter[str] | None = None) -> None:
        self.sink = sink
        self.counters: Counter[str] = counters if counters is not None else Counter()
        self.open_streams = 0
        self.nodes: Counter[str] = Counter()  # open streams per Envoy node id

    async def StreamAccessLogs(
        self, request_iterator: AsyncIterator[als_pb2.StreamAccessLogsMessage], context: Any
    ) -> als_pb2.StreamAccessLogsResponse:
        loop = asyncio.get_running_loop()
        node = ""
        self.open_streams += 1
        self.counters["log_streams"] += 1
        self.counters["log_streams_open"] += 1
        try:
            async for msg in request_iterator:
                if msg.HasField("identifier") and not node:
                    node = msg.identifier.node.id or msg.identifier.log_name or "?"
                    self.nodes[node] += 1
                now = loop.time()
                self.counters["log_batches"] += 1
                for entry in msg.http_logs.log_entry:
                    try:
                        self.sink(record_from_entry(entry), now)
                    except Exception:  # one bad entry must not end Envoy's stream
                        self.counters["log_entry_errors"] += 1
                        n = self.counters["log_entry_errors"]
                        if n <= 3 or n % 1000 == 0:  # a systematic bug must not flood the log
                            log.exception("access-log entry not understood (%d so far); "
                                          "skipped", n)
        finally:
            self.open_streams -= 1
            self.counters["log_streams_open"] -= 1
            if node:
                self.nodes[node] -= 1
                if self.nodes[node] <= 0:
                    del self.nodes[node]
        return als_pb2.StreamAccessLogsResponse()
