"""Time one response from its phases: TTFT, TPOT, end-to-end, outcome.

A :class:`ResponseTimer` is fed events with ``now`` by whoever watches the
response (the ext_proc shell or the simulator) and produces an
:class:`~sidecar.core.types.Observation` at the end.

Definitions (seconds):

* ``t0``   — the moment the routing decision was released to Envoy. The
  sidecar's own decision time is before ``t0`` and so never counted.
* TTFT     — arrival of the first SSE event carrying generated output, minus
  ``t0``. Events are framed by :mod:`sidecar.core.sse` (the WHATWG standard);
  a role-only or empty delta, a usage-only chunk (``choices: []``), ``[DONE]``
  and non-JSON data are not tokens (the full table: docs/response-timing.md,
  "Reading the event stream").
* TPOT     — (last token time - first token time) / (tokens - 1), tokens from
  the last ``usage`` seen (``completion_tokens``, or ``output_tokens`` of the
  Responses API) when present, else the number of token-bearing events.
  Undefined (None) with fewer than two tokens.
* e2e      — end of the response body minus ``t0``.

Outcome: 2xx -> ok; 408 and 504 -> timeout; 5xx and 429 -> error (the
provider failed or is overloaded); other 4xx -> None (the caller's fault, not
evidence about the route); stream closed before the end -> cancel; a 2xx
stream that carries an error event (:func:`is_error_event`: ``event: error``, or
data with one of :data:`ERROR_SELECTORS`, the same definition Envoy's
``sse_to_metadata`` rules apply on the access-log path) -> error. Error responses are never
latency samples; a 5xx status keeps its e2e all the same (how long it took
dates the request for the fast path's runs of failures, and the duration
metric), a stream cut by an error event keeps none (dated when seen).
Non-streaming responses give e2e only. A body with a content-encoding (gzip,
br, ...) is not read at all (:attr:`ResponseTimer.unreadable`): outcome and e2e
only, no token, no usage.

Timeouts and cancels are *censored*: e2e (and TTFT when no token came) is the
time waited, a lower bound. The router keeps a cancel as evidence only when
the wait already exceeded the class budget (it then counts as a client-side
timeout); otherwise a user who pressed stop says nothing about the route.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from sidecar.core.sse import SseEvent, SseParser
from sidecar.core.types import Observation, Outcome, SliceKey

_DONE: Final = "[DONE]"
_MAX_JSON_BODY: Final = 1 << 20
# Delta fields that carry generated output (role alone does not).
_DELTA_TOKEN_KEYS: Final = (
    "content", "tool_calls", "function_call", "refusal", "reasoning_content", "reasoning",
)
# Responses-API event types whose ``delta`` is generated output.
_TOKEN_TYPES: Final = frozenset({
    "response.output_text.delta", "response.refusal.delta",
    "response.function_call_arguments.delta", "response.reasoning_text.delta",
    "response.reasoning_summary_text.delta", "response.audio.delta",
    "response.audio.transcript.delta", "response.code_interpreter_call_code.delta",
    "response.custom_tool_call_input.delta", "response.mcp_call_arguments.delta",
})
# Where an event's JSON reports an error: a field at one of these paths whose value is
# an error value (:func:`is_error_value`: a non-empty string, an object, true, a non-zero
# number). OpenAI (``{"error": {"message": ...}}``), Anthropic (``{"type": "error",
# "error": {...}}``) and servers that say ``{"error": "upstream overloaded"}`` or
# ``{"error": {"code": 500}}`` put it under ``error``; vLLM's ``{"object": "error",
# "message": ...}`` and the Responses API's ``{"type": "error", "message": ...}`` in a
# top-level ``message`` (no other chat, completions or Responses event has one);
# ``response.failed`` under ``response.error`` (every other Responses event says
# ``"error": null``). Envoy's sse_to_metadata filter applies the very same paths
# (sidecar.shell.bootstrap_filters.usage_filters): it lifts each path's value into
# dynamic metadata and the sidecar judges it with the same is_error_value, so both
# paths agree on what an error event is.
ERROR_SELECTORS: Final[tuple[tuple[str, ...], ...]] = (
    ("error",), ("message",), ("response", "error"),
)


def outcome_for_status(status: int) -> Outcome | None:
    """Map an HTTP status to an outcome; None means "not evidence about the route"."""
    if 200 <= status < 300:
        return "ok"
    if status in (408, 504):
        return "timeout"
    if status >= 500 or status == 429:
        return "error"
    return None


def error_keeps_duration(status: int | None, cut: bool) -> bool:
    """Whether an ``error`` outcome carries how long it took as ``e2e_s`` (never a
    latency sample): a 5xx status the upstream answered with does, so a slow 503's run
    of failures begins when it was sent and answers to later requests end it
    (:mod:`sidecar.core.failure_run`); a 429 (no hard failure) does not, nor a reset
    or a stream cut by an error event (``cut``), which are dated when seen: a killed
    provider's streams were sent long before it died. One rule for the server's
    timer, the access log and the lab."""
    return (status or 0) >= 500 and not cut


@dataclass(slots=True)
class ResponseTimer:
    """Incremental SSE-aware timer for one response.

    Event framing is :class:`~sidecar.core.sse.SseParser`'s (the WHATWG
    standard: CRLF, LF or CR line endings, events cut anywhere across chunks);
    an event is timed at the arrival of the chunk that completes it.
    """

    cluster: str
    slice: SliceKey
    t0: float
    streaming: bool
    is_retry: bool = False
    is_probe: bool = False
    status: int | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    token_events: int = 0
    usage_tokens: int | None = None
    ended_at: float | None = None
    stream_error: bool = False  # an error event inside a 2xx stream
    # Why the body cannot be read, if it cannot: "encoded" (a content-encoding such
    # as gzip; the sidecar does not decompress). Nothing is then read from it: no
    # token, no usage, never a guess.
    unreadable: str | None = None
    _sse: SseParser | None = None
    _body: bytearray | None = None

    @property
    def reads_events(self) -> bool:
        """Is the body an event stream this timer parses (``text/event-stream``, no
        content-encoding)? Known once :meth:`on_headers` has run."""
        return self._sse is not None

    def on_headers(self, status: int, content_type: str, now: float,
                   content_encoding: str = "") -> None:
        self.status = status
        encoding = content_encoding.strip().lower()
        if encoding and encoding != "identity":
            self.unreadable = "encoded"  # compressed bytes are not events
        elif "text/event-stream" in content_type.lower():
            self._sse = SseParser()
        else:
            self._body = bytearray()

    def on_body(self, chunk: bytes, now: float, end: bool = False) -> None:
        if self._sse is not None:
            for event in self._sse.feed(chunk):
                self._on_event(event, now)
        elif self._body is not None and len(self._body) < _MAX_JSON_BODY:
            self._body += chunk  # bounded: usage is near the end of small JSON replies
        if end:
            self.on_end(now)

    def _on_event(self, event: SseEvent, now: float) -> None:
        if event.event == "error":
            # By its type alone: its data may be plain text, empty or any JSON.
            self.stream_error = True
            return
        if event.data == _DONE:
            return
        try:
            obj = json.loads(event.data)
        except (ValueError, RecursionError):
            # Not JSON, or nested past the interpreter's stack (a hostile upstream):
            # says nothing about tokens, and must not end the stream's reading.
            return
        if not isinstance(obj, dict):
            return
        if is_error_event(obj):
            self.stream_error = True
            return
        n = _usage_tokens(obj)
        if n is not None:
            self.usage_tokens = n
        if not _has_token(obj):
            return  # role-only, empty or usage-only chunk: not a token
        if self.first_token_at is None:
            self.first_token_at = now
        self.last_token_at = now
        self.token_events += 1

    def _read_usage(self, data: bytes) -> None:
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError):
            return
        n = _usage_tokens(obj) if isinstance(obj, dict) else None
        if n is not None:
            self.usage_tokens = n

    def on_end(self, now: float) -> None:
        if self.ended_at is None:
            self.ended_at = now
            if self._sse is not None:
                self._sse.end()  # an unterminated last event is discarded (the standard)
            if self._body is not None:
                self._read_usage(bytes(self._body))
                self._body = None

    def observation(self, now: float, cancelled: bool = False) -> Observation | None:
        """The finished measurement, or None when the response is not evidence."""
        if self.status is None:
            # No response headers: Envoy or the client gave up before the upstream answered.
            outcome: Outcome | None = "cancel" if cancelled else "timeout"
        elif cancelled and self.ended_at is None:
            outcome = "cancel"
        else:
            outcome = outcome_for_status(self.status)
            if outcome == "ok" and self.stream_error:
                outcome = "error"  # the provider failed mid-stream behind a 200
        if outcome is None:
            return None
        ttft = tpot = e2e = None
        tokens = self.usage_tokens if self.usage_tokens is not None else self.token_events
        censored = outcome in ("timeout", "cancel")
        if outcome == "ok":
            if self.first_token_at is not None:
                ttft = self.first_token_at - self.t0
                if tokens >= 2 and self.last_token_at is not None:
                    tpot = (self.last_token_at - self.first_token_at) / (tokens - 1)
            if self.ended_at is not None:
                e2e = self.ended_at - self.t0
        elif (outcome == "error" and error_keeps_duration(self.status, self.stream_error)
              and self.ended_at is not None):
            e2e = self.ended_at - self.t0  # dates the error (never a latency sample)
        elif censored:
            # Lower bounds: the request was given up after this long. The router
            # decides whether that is evidence (waited beyond the class budget).
            e2e = (self.ended_at or now) - self.t0
            ttft = (self.first_token_at - self.t0) if self.first_token_at is not None else (
                e2e if self.streaming else None
            )
        return Observation(
            cluster=self.cluster,
            slice=self.slice,
            outcome=outcome,
            status=self.status,
            ttft_s=ttft,
            tpot_s=tpot,
            e2e_s=e2e,
            output_tokens=tokens if tokens else None,
            is_retry=self.is_retry,
            is_probe=self.is_probe,
            censored=censored,
            # A token read before the end: a measured TTFT even though censored.
            ttft_measured=censored and self.first_token_at is not None,
        )


def is_error_event(obj: dict[str, Any]) -> bool:
    """True if an event's JSON object reports an error: the value at one of
    :data:`ERROR_SELECTORS` is an error value (:func:`is_error_value`)."""
    for path in ERROR_SELECTORS:
        node: Any = obj
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if is_error_value(node):
            return True
    return False


def is_error_value(value: Any) -> bool:
    """Does this value of an error field report an error?

    Yes: a non-empty string, an object (``{"code": 500}``, even ``{}``), ``true``, a
    non-zero number. No: ``null``, ``""``, ``false``, ``0`` (how a provider says "no
    error" in an event that always carries the field) and an array. The rule is also
    what Envoy's JSON content parser can pass on: it lifts strings, numbers, booleans
    and objects (an object as its JSON text, ``{}`` as the text ``null``: a non-empty
    string, so an object either way) and never null or an array.
    """
    if value is None or isinstance(value, list):
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return value != 0
    if isinstance(value, str):
        return value != ""
    return isinstance(value, dict)


def _usage_tokens(obj: dict[str, Any]) -> int | None:
    """Output tokens from a chunk's ``usage`` (chat/completions ``completion_tokens``;
    the Responses API's ``output_tokens``, also nested in ``response.completed``)."""
    usage = obj.get("usage")
    if not isinstance(usage, dict):
        inner = obj.get("response")
        usage = inner.get("usage") if isinstance(inner, dict) else None
    if not isinstance(usage, dict):
        return None
    n = usage.get("completion_tokens", usage.get("output_tokens"))
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


def _has_token(obj: dict[str, Any]) -> bool:
    """True if a chunk carries generated output: a chat delta with content, refusal,
    reasoning, tool/function calls or audio (data or transcript), completion text, or
    a Responses-API output delta (text, refusal, reasoning, audio, tool arguments)."""
    kind = obj.get("type")
    if isinstance(kind, str) and kind.startswith("response."):
        return kind in _TOKEN_TYPES and bool(obj.get("delta"))
    choices = obj.get("choices")
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict):
            if any(delta.get(k) for k in _DELTA_TOKEN_KEYS):
                return True
            audio = delta.get("audio")  # an id or expires_at alone is not output
            if isinstance(audio, dict) and (audio.get("data") or audio.get("transcript")):
                return True
        if choice.get("text"):
            return True
    return False
