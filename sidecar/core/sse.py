"""Incremental Server-Sent Events parser, as the WHATWG HTML standard defines the format.

(HTML Living Standard, "Server-sent events", section "Interpreting an event
stream".) Bytes go in as they arrive, in chunks cut anywhere; complete events
come out. Nothing here reads a clock: the caller timestamps what :meth:`feed`
returns, so an event's time is the arrival of the chunk that completed it.

Rules implemented (and where the standard says so, why):

* Lines end with CRLF, LF or CR. A CR at the end of one chunk and an LF at the
  start of the next are one line ending, not two (else a spurious blank line
  would dispatch an event early).
* A leading UTF-8 byte order mark is skipped once, at the start of the stream.
* ``:`` at the start of a line: a comment, ignored (servers send them as keep-alives).
* ``name: value`` — one space after the colon is removed; a line without a
  colon is a field with an empty value. Fields:

  ========  ================================================================
  ``data``  appended to the data buffer, followed by LF
  ``event`` sets the event type (default ``message``)
  ``id``    sets the last event id (kept across events) unless it holds NUL
  ``retry`` sets the reconnection time if the value is ASCII digits only
  other     ignored
  ========  ================================================================

* A blank line dispatches: the data buffer loses its final LF; an empty data
  buffer (no ``data`` line at all) dispatches nothing, but ``data:`` with an
  empty value does dispatch an event with empty data. Type and data reset;
  the last event id does not.
* End of stream: an event not terminated by a blank line is discarded.

Memory is bounded (the standard sets no limit, a sidecar must): a line longer
than ``max_line`` bytes or an event with more than ``max_event`` bytes of data
is dropped whole and counted in :attr:`SseParser.dropped`, and parsing resumes
at the next event.

Bytes are split before decoding, which is equivalent to decoding first: every
delimiter is ASCII and cannot occur inside a multi-byte UTF-8 sequence. Field
values are decoded as UTF-8 with invalid sequences replaced (U+FFFD), as the
standard's decoder does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

MAX_LINE_BYTES: Final = 1 << 20
MAX_EVENT_BYTES: Final = 4 << 20
_EOL: Final = re.compile(rb"\r\n|\r|\n")
_BOM: Final = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One dispatched event: ``data`` lines joined by LF, its type and the last event id."""

    data: str
    event: str = "message"
    last_event_id: str = ""


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


class SseParser:
    """Feed bytes with :meth:`feed`, get the events they complete; :meth:`end` at EOF."""

    __slots__ = ("_at_start", "_broken", "_data", "_data_bytes", "_event_type", "_last_id",
                 "_overlong", "_skip_lf", "_tail", "dropped", "max_event", "max_line",
                 "retry_ms")

    def __init__(self, max_line: int = MAX_LINE_BYTES, max_event: int = MAX_EVENT_BYTES) -> None:
        self.max_line = max_line
        self.max_event = max_event
        self.retry_ms: int | None = None  # the stream's reconnection time, if sent
        self.dropped = 0  # events dropped for exceeding the limits
        self._tail = b""  # the incomplete last line
        self._skip_lf = False  # the previous chunk ended with CR
        self._at_start = True  # no complete line yet: a BOM may still come
        self._overlong = False  # the line being received is over max_line: discard it
        self._broken = False  # the event being received lost a line: drop it
        self._data: list[bytes] = []
        self._data_bytes = 0
        self._event_type = b""
        self._last_id = b""

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """Consume ``chunk``; return the events it completes (often none or one)."""
        if not chunk:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
                if not chunk:
                    return []
        buf = self._tail + chunk if self._tail else chunk
        lines = _EOL.split(buf) if b"\r" in buf else buf.split(b"\n")
        self._tail = lines.pop()
        self._skip_lf = buf.endswith(b"\r")
        events: list[SseEvent] = []
        for line in lines:
            if self._at_start:
                self._at_start = False
                if line.startswith(_BOM):
                    line = line[len(_BOM):]
            if self._overlong:
                self._overlong = False
                self._broken = True
                continue
            if len(line) > self.max_line:  # whole in this chunk: the same as cut across chunks
                self._broken = True
                continue
            if not line:
                ev = self._dispatch()
                if ev is not None:
                    events.append(ev)
            elif line[0] != 0x3A:  # ":" starts a comment
                self._field(line)
        if len(self._tail) > self.max_line:
            self._tail = b""
            self._overlong = True  # its remainder, up to the next line end, goes too
        return events

    def end(self) -> bool:
        """End of stream: discard an unterminated event. True if something was discarded."""
        pending = bool(self._tail or self._data or self._event_type or self._overlong)
        self._tail, self._data, self._data_bytes, self._event_type = b"", [], 0, b""
        self._overlong = self._broken = self._skip_lf = False
        return pending

    def _field(self, line: bytes) -> None:
        name, sep, value = line.partition(b":")
        if sep and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
            self._data_bytes += len(value) + 1
            if self._data_bytes > self.max_event:
                self._data, self._data_bytes, self._broken = [], 0, True
        elif name == b"event":
            self._event_type = value
        elif name == b"id":
            if b"\0" not in value:
                self._last_id = value
        elif name == b"retry" and value.isdigit():  # bytes.isdigit: ASCII digits only
            self.retry_ms = int(value)

    def _dispatch(self) -> SseEvent | None:
        data, kind, broken = self._data, self._event_type, self._broken
        self._data, self._data_bytes, self._event_type, self._broken = [], 0, b"", False
        if broken:
            self.dropped += 1
            return None
        if not data:
            return None
        return SseEvent(_text(b"\n".join(data)), _text(kind) if kind else "message",
                        _text(self._last_id) if self._last_id else "")


def parse_all(stream: bytes) -> list[SseEvent]:
    """Every event of a complete stream (convenience for tests and tools)."""
    parser = SseParser()
    events = parser.feed(stream)
    parser.end()
    return events
