"""Envoy's gRPC Access Log Service (``envoy.service.accesslog.v3``), received.

Envoy opens one long-lived client stream per worker thread (and log name) and
sends its HTTP access-log entries in batches (``buffer_flush_interval`` /
``buffer_size_bytes``); the stream is answered only when it ends. Each entry is
turned into a plain :class:`~sidecar.core.envoy_log.LogRecord` and handed to a
sink (normally :class:`sidecar.shell.outcomes.OutcomeFeed`) -- unless the sink's
batch reader takes it straight from the wire first (native mode's common entry,
:meth:`sidecar.shell.native_log.NativeFeed.batch`: every native request costs
the sidecar one entry, so that one is read without the intermediate record).

This module knows the wire format and nothing of routing, so any reader of
Envoy's access log (the outcome feed, a native-mode learner) can reuse it.
Bad entries are counted and skipped; they never end the stream.

Envoy (1.40, ``GrpcAccessLogger``) keeps one logger per worker for its whole
life; when its stream is closed by the server (any status) or reset, the next
flush that has entries opens a new one — so a restarted sidecar on the same
address gets its streams back within one ``buffer_flush_interval`` of its first
entries. At shutdown :meth:`AccessLogService.close` ends every stream with an OK
status instead of leaving it to the server's cancellation.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from sidecar.core.envoy_log import LogRecord
from sidecar.core.pushback import WAIT_STATUSES
from sidecar.core.retry_after import parse_retry_after
from sidecar.core.timing import ERROR_SELECTORS, is_error_value
from sidecar.pb.envoy.data.accesslog.v3 import accesslog_pb2 as al
from sidecar.pb.envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc
from sidecar.shell import envoy_contract as ec
from sidecar.shell.grpc_settle import settle

log = logging.getLogger("tailroute.access_log")

Sink = Callable[[LogRecord, float], None]


class EntryHandler(Protocol):
    """A sink's shortcut for the common entry, for one batch (:data:`BatchReader`)."""

    def __call__(self, entry: al.HTTPAccessLogEntry, /) -> bool:
        """Take the entry straight from the wire (True) or leave it to the sink as a
        LogRecord (False); before leaving one, learn what it took before it."""

    def finish(self) -> None:
        """The batch is read: learn whatever was taken and not yet learned."""


# Called once per batch with its receive time, it returns that batch's entry handler.
# Nothing the handler may cache for the batch changes while the batch is read (one
# synchronous pass on the event loop).
BatchReader = Callable[[float], EntryHandler]

VIA_UPSTREAM = "via_upstream"  # response_code_details of a response the upstream sent
_METHODS = ("", "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH")
_NO_FLAGS: frozenset[str] = frozenset()


def tag_us(tags: Any, key: str) -> float | None:
    """A custom-tag duration in microseconds, as seconds (absent or garbled: None)."""
    return us_seconds(tags.get(key))


def us_seconds(raw: str | None) -> float | None:
    """A logged duration in microseconds, as seconds (absent or garbled: None)."""
    if not raw or not raw.isdigit():
        return None
    return int(raw) * 1e-6


def entry_tag(tags: Any) -> list[str] | None:
    """The parts of the native bootstrap's one tag (``envoy_contract.TAG_ENTRY``), or
    None when the entry has none (or not all of it). A tag without the last part (the
    stream-error mark, added later) gets an empty one: an Envoy still running a
    bootstrap rendered before it keeps its entries on the fast path."""
    raw = tags.get(ec.TAG_ENTRY)
    if raw is None:
        return None
    parts: list[str] = raw.split("|")
    n = len(parts)
    if n == _ENTRY_PARTS:
        return parts
    if n == _ENTRY_PARTS - 1:  # a bootstrap rendered before the stream-error part
        parts.append("")
        return parts
    return None


_ENTRY_PARTS = ec.ENTRY_TAG_FORMAT.count("|") + 1


def usage_tokens(fm: Any) -> int | None:
    """The response's output tokens from the entry's ``filter_metadata`` (None: not logged)."""
    usage = fm.get(ec.USAGE_NS)
    if usage is None:
        return None
    v = usage.fields.get(ec.TOKENS_KEY)
    if v is None:
        return None
    n = v.number_value
    return int(n) if 0 <= n < 1e9 else None


_ERROR_VALUE_KEYS = tuple(ec.error_value_key(p) for p in ERROR_SELECTORS)


def stream_error(fm: Any) -> bool | None:
    """Did one of the stream's events report an error, as Envoy's usage filter saw it?
    None when the metadata has no mark (``envoy_contract.STREAM_ERROR_KEY``): no event
    had an error field, or the filter did not run. With the mark, the lifted values of
    the error fields (``envoy_contract.error_value_key``) decide, judged as the sampled
    timer judges them (``is_error_value``); a mark without any value is from a bootstrap
    rendered before the values were lifted, whose mark meant an error by itself."""
    usage = fm.get(ec.USAGE_NS)
    if usage is None:
        return None
    fields = usage.fields
    if ec.STREAM_ERROR_KEY not in fields:
        return None
    seen = False
    for key in _ERROR_VALUE_KEYS:
        v = fields.get(key)
        if v is not None:
            seen = True
            if is_error_value(_plain(v)):
                return True
    return not seen


def done_at(fm: Any, c: Any, upstream_tx_s: float | None) -> float | None:
    """The stream's ``[DONE]`` line in seconds since ``t0``, from the mark
    (``envoy_contract.DONE_KEY``: Envoy's clock in microseconds since the epoch) and
    the entry's start on the same clock; None without a mark or a readable one, or
    without the times to place it (no upstream request). A mark before ``t0`` (a
    clock step) is placed at ``t0``: the reader caps it at the wait."""
    usage = fm.get(ec.USAGE_NS)
    if usage is None or upstream_tx_s is None or not c.HasField("start_time"):
        return None
    v = usage.fields.get(ec.DONE_KEY)
    if v is None:
        return None
    raw: str = v.string_value
    if not raw.isdigit():
        return None
    start: float = c.start_time.ToNanoseconds() * 1e-9
    return max(int(raw) * 1e-6 - start - upstream_tx_s, 0.0)


def _plain(v: Any) -> Any:
    """A ``google.protobuf.Value`` as the JSON value it holds."""
    kind = v.WhichOneof("kind")
    if kind == "string_value":
        return v.string_value
    if kind == "number_value":
        return v.number_value
    if kind == "bool_value":
        return v.bool_value
    if kind == "struct_value":
        return {}  # an object (Envoy lifts objects as text; any object reports an error)
    return None  # null, a list (Envoy lifts neither) or no value at all


def _string(fields: Any, key: str) -> str | None:
    v = fields.get(key)
    return (v.string_value or None) if v is not None else None


def declared_wait(e: al.HTTPAccessLogEntry) -> tuple[float | None, bool]:
    """A 429 or 503 entry's declared wait from its logged ``retry-after-ms`` / ``retry-after``
    (:func:`~sidecar.core.retry_after.parse_retry_after`), and whether a header was
    there but unreadable. An HTTP-date is measured against the end of the exchange on
    Envoy's wall clock (the entry's start time plus its duration): the entry may reach
    the sidecar a flush interval later, and the response's ``date`` is not logged
    (``envoy_contract.LOGGED_RESPONSE_HEADERS``)."""
    headers = e.response.response_headers
    seconds = headers.get(ec.RETRY_AFTER_HEADER)
    ms = headers.get(ec.RETRY_AFTER_MS_HEADER)
    if seconds is None and ms is None:
        return None, False
    c = e.common_properties
    if c.HasField("start_time"):
        now = c.start_time.ToNanoseconds() * 1e-9
        if c.HasField("duration"):
            now += c.duration.ToNanoseconds() * 1e-9
    else:
        now = time.time()
    wait = parse_retry_after(seconds, ms, None, now)
    return wait, wait is None


def record_from_entry(e: al.HTTPAccessLogEntry) -> LogRecord:
    """The parts of one entry tailroute reads (see sidecar.core.envoy_log).

    Per entry on every logged request, so each field is read once, maps with
    ``get`` (one lookup, not ``in`` + index) and durations as integers.
    """
    c = e.common_properties
    flags = _NO_FLAGS
    if c.HasField("response_flags"):
        set_flags = [f.name for f, v in c.response_flags.ListFields() if v is True]
        if set_flags:
            flags = frozenset(set_flags)
    rid = route = slice_label = None
    tokens = done = None
    judged: bool | None = None
    upstream_tx = (c.time_to_first_upstream_tx_byte.ToNanoseconds() * 1e-9
                   if c.HasField("time_to_first_upstream_tx_byte") else None)
    if c.HasField("metadata"):
        fm = c.metadata.filter_metadata
        ours = fm.get(ec.METADATA_NS)
        if ours is not None:
            fields = ours.fields
            rid = _string(fields, ec.RID_KEY)
            route = _string(fields, ec.ROUTE_KEY)
            slice_label = _string(fields, ec.SLICE_KEY)
        tokens = usage_tokens(fm)
        judged = stream_error(fm)
        done = done_at(fm, c, upstream_tx)
    tags = c.custom_tags
    parts = entry_tag(tags)
    if parts is not None:  # the native bootstrap: one tag instead of the two durations
        first, end = us_seconds(parts[2]), us_seconds(parts[3])
        if judged is None:  # the tag's mark without one in the metadata: an error
            judged = parts[6] not in ("", "-")
    else:
        first, end = tag_us(tags, ec.TAG_FIRST_BODY_US), tag_us(tags, ec.TAG_END_US)
    method = e.request.request_method
    response = e.response
    status = response.response_code.value
    # Only an upstream's own 429 or 503 is read for a declared wait (nothing else is parsed
    # per entry): tailroute's admission answers are 429s and 503s with a Retry-After of
    # their own, and Envoy's local replies (no healthy upstream) are not the provider's.
    wait, bad = (declared_wait(e) if status in WAIT_STATUSES
                 and response.response_code_details == VIA_UPSTREAM else (None, False))
    return LogRecord(
        status,
        flags,
        response.response_code_details,
        _METHODS[method] if 0 <= method < len(_METHODS) else "",
        e.request.path,
        c.upstream_cluster,
        c.route_name,
        c.duration.ToNanoseconds() * 1e-9 if c.HasField("duration") else None,
        upstream_tx,
        first,
        end,
        tokens,
        rid,
        route,
        slice_label,
        c.stream_id,
        bool(judged),
        max(c.upstream_request_attempt_count, 1),  # 0: not logged (no upstream request)
        wait,
        bad,
        e.request.request_body_bytes,
        done,
    )


def _collect(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


class AccessLogService(als_pb2_grpc.AccessLogServiceServicer):  # type: ignore[misc]
    """envoy.service.accesslog.v3.AccessLogService/StreamAccessLogs."""

    def __init__(self, sink: Sink, counters: Counter[str] | None = None,
                 reader: BatchReader | None = None) -> None:
        self.sink = sink
        self.reader = reader
        self.counters: Counter[str] = counters if counters is not None else Counter()
        self.open_streams = 0
        self.nodes: Counter[str] = Counter()  # open streams per Envoy node id
        self._closing = asyncio.Event()

    def close(self) -> None:
        """End every open stream (and refuse new ones) with an OK status: Envoy sees a
        normal close (and opens a new stream at its next flush, to whichever sidecar
        then listens), and the server's own stop has nothing left to cancel."""
        self._closing.set()

    async def _messages(
        self, request_iterator: AsyncIterator[als_pb2.StreamAccessLogsMessage]
    ) -> AsyncIterator[als_pb2.StreamAccessLogsMessage]:
        """The stream's messages until Envoy ends it or :meth:`close` is called."""
        if self._closing.is_set():
            return
        closing = asyncio.ensure_future(self._closing.wait())
        it = aiter(request_iterator)
        nxt: asyncio.Future[als_pb2.StreamAccessLogsMessage] | None = None
        try:
            while True:
                nxt = asyncio.ensure_future(anext(it))
                # Whoever ends first (gRPC cancelling this handler, close()), the read
                # task's own end is collected, so asyncio never reports it as lost.
                nxt.add_done_callback(_collect)
                await asyncio.wait((nxt, closing), return_when=asyncio.FIRST_COMPLETED)
                if not nxt.done():
                    return
                try:
                    msg = nxt.result()
                except StopAsyncIteration:
                    return
                yield msg
        finally:
            closing.cancel()
            if nxt is not None:
                nxt.cancel()

    def consume(self, msg: als_pb2.StreamAccessLogsMessage, now: float) -> None:
        """One batch of entries, all received at ``now``: each goes to the ``reader``'s
        handler for this batch, and to the sink as a LogRecord if the handler leaves it."""
        self.counters["log_batches"] += 1
        take = self.reader(now) if self.reader is not None else None
        sink = self.sink
        for entry in msg.http_logs.log_entry:
            try:
                if take is None or not take(entry):
                    sink(record_from_entry(entry), now)
            except Exception:  # one bad entry must not end Envoy's stream
                self._not_understood()
        if take is not None:
            try:
                take.finish()
            except Exception:
                self._not_understood()

    def _not_understood(self) -> None:
        self.counters["log_entry_errors"] += 1
        n = self.counters["log_entry_errors"]
        if n <= 3 or n % 1000 == 0:  # a systematic bug must not flood the log
            log.exception("access-log entry not understood (%d so far); skipped", n)

    async def StreamAccessLogs(
        self, request_iterator: AsyncIterator[als_pb2.StreamAccessLogsMessage], context: Any
    ) -> als_pb2.StreamAccessLogsResponse:
        loop = asyncio.get_running_loop()
        node = ""
        self.open_streams += 1
        self.counters["log_streams"] += 1
        self.counters["log_streams_open"] += 1
        try:
            async for msg in self._messages(request_iterator):
                if msg.HasField("identifier") and not node:
                    node = msg.identifier.node.id or msg.identifier.log_name or "?"
                    self.nodes[node] += 1
                self.consume(msg, loop.time())
        finally:
            self.open_streams -= 1
            self.counters["log_streams_open"] -= 1
            if node:
                self.nodes[node] -= 1
                if self.nodes[node] <= 0:
                    del self.nodes[node]
        if not self._closing.is_set():
            # Envoy ends these streams only by cancelling them (it never half-closes):
            # returning at once would leak native memory in grpc.aio.
            await settle()
        return als_pb2.StreamAccessLogsResponse()
