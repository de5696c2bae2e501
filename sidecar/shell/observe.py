"""The sampled observing filter's ext_proc stream: the first content token, timed.

Envoy runs a second ext_proc filter (observability mode: it never waits for an
answer) on a sampled share of streamed responses (``timing.token_sample_share``,
more on routes whose first event is role-only, see :mod:`sidecar.core.ttft_offset`).
:class:`ObserveStream` times the first content token against the first body byte
and hands the offset to the app; outcome, TTFT and TPOT themselves come from the
access-log entry. A response whose body cannot hold a readable token (a
content-encoding such as gzip, or not ``text/event-stream``) is given up at its
headers; every sample is counted by result (``App.first_token_samples``:
``timed``, ``no_token``, ``encoded``, ``not_sse``), so an unreadable route is
visible rather than silently untimed. No I/O here: tests drive it with in-memory
messages.
"""

from __future__ import annotations

from sidecar.core.input_limits import parse_status
from sidecar.core.timing import ResponseTimer
from sidecar.core.types import SliceKey
from sidecar.pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from sidecar.shell import envoy_contract as ec
from sidecar.shell.app import App
from sidecar.shell.request_headers import header_map


class ObserveStream:
    """The sampled observing filter's stream: times the first content token against
    the first body byte, then asks the server to close the stream (``on_message``
    returns True). Never answers. Works from the forwarded metadata alone, so it
    does not matter which sidecar process decided the request."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.rid = ""
        self.cluster = ""
        self.slice: SliceKey | None = None
        self.timer: ResponseTimer | None = None
        self.first_body_at: float | None = None
        self.finished = False
        self.result = "no_token"  # what to count if no token is timed
        # on_message raised: the events were not all read, so finding no token among
        # them says nothing (the access log's reading stands, not "tokenless")
        self.broken = False

    def _start(self, msg: pb.ProcessingRequest, now: float) -> bool:
        meta = msg.metadata_context.filter_metadata.get(ec.METADATA_NS)
        if meta is None:
            return False
        f = meta.fields
        route = f[ec.ROUTE_KEY].string_value if ec.ROUTE_KEY in f else ""
        label = f[ec.SLICE_KEY].string_value if ec.SLICE_KEY in f else ""
        try:
            self.slice = SliceKey.parse(label)
        except ValueError:
            return False
        self.rid = f[ec.RID_KEY].string_value if ec.RID_KEY in f else ""
        self.cluster = route.rsplit("|", 2)[0]
        self.timer = ResponseTimer(self.cluster, self.slice, now, True)
        return True

    def on_message(self, msg: pb.ProcessingRequest, now: float) -> bool:
        """Feed one message; True means "close this stream now"."""
        if self.finished:
            return True
        if self.timer is None and not self._start(msg, now):
            self.finished = True
            return True  # not a request tailroute routed: nothing to time
        timer = self.timer
        assert timer is not None
        kind = msg.WhichOneof("request")
        if kind == "response_headers":
            h = header_map(msg.response_headers.headers)
            timer.on_headers(response_status(self.app, h), h.get("content-type", ""), now,
                             h.get("content-encoding", ""))
            if timer.unreadable is not None:
                self.result = timer.unreadable  # gzip & co: no token can be read
                return self._done(now)
            if not timer.reads_events:
                self.result = "not_sse"  # a JSON answer to a streamed request: no tokens
                return self._done(now)
            if msg.response_headers.end_of_stream:
                return self._done(now)
        elif kind == "response_body":
            if self.first_body_at is None and msg.response_body.body:
                self.first_body_at = now
            timer.on_body(msg.response_body.body, now)
            if timer.first_token_at is not None or msg.response_body.end_of_stream:
                return self._done(now)
        elif kind == "response_trailers":
            return self._done(now)
        return False

    def _done(self, now: float) -> bool:
        if not self.finished and self.slice is not None and self.timer is not None:
            self.finished = True
            token_at, body_at = self.timer.first_token_at, self.first_body_at
            offset = token_at - body_at if token_at is not None and body_at is not None else None
            self.app.first_token_samples["timed" if offset is not None else self.result] += 1
            # Read and tokenless: an event stream that ended, or whose client left, before
            # any token (not one given up unread: encoded, not an event stream).
            tokenless = (offset is None and self.result == "no_token" and not self.broken
                         and self.timer.reads_events)
            self.app.first_token_timed(self.rid, self.cluster, self.slice, offset, now,
                                       tokenless=tokenless)
        self.finished = True
        return True

    def close(self, now: float, cancelled: bool) -> None:
        """The stream ended (by us, by Envoy, or cut off): the observer has said all."""
        self._done(now)


def response_status(app: App, headers: dict[str, str]) -> int:
    """The response ``:status``; 0 (not evidence) and counted when it is not a valid status."""
    status = parse_status(headers.get(":status"))
    if status is None:
        app.errors["bad_status"] += 1
        return 0
    return status
