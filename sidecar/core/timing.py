"""Time one response from its phases: TTFT, TPOT, end-to-end, outcome.

A :class:`ResponseTimer` is fed events with ``now`` by whoever watches the
response (the ext_proc shell or the simulator) and produces an
:class:`~sidecar.core.types.Observation` at the end.

Definitions (seconds):

* ``t0``   — the moment the routing decision was released to Envoy. The
  sidecar's own decision time is before ``t0`` and so never counted.
* TTFT     — first non-empty SSE ``data:`` event carrying a token, minus ``t0``.
* TPOT     — (last token time - first token time) / (tokens - 1), tokens from
  the final ``usage.completion_tokens`` when present, else the number of
  token-bearing events. Undefined (None) with fewer than two tokens.
* e2e      — end of the response body minus ``t0``.

Outcome: 2xx -> ok; 408 and 504 -> timeout; 5xx and 429 -> error (the
provider failed or is overloaded); other 4xx -> None (the caller's fault, not
evidence about the route); stream closed before the end -> cancel. Error
responses are never latency samples. Non-streaming responses give e2e only.

Timeouts and cancels are *censored*: e2e (and TTFT when no token came) is the
time waited, a lower bound. The router keeps a cancel as evidence only when
the wait already exceeded the class budget (it then counts as a client-side
timeout); otherwise a user who pressed stop says nothing about the route.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sidecar.core.types import Observation, Outcome, SliceKey

_DONE = b"[DONE]"


def outcome_for_status(status: int) -> Outcome | None:
    """Map an HTTP status to an outcome; None means "not evidence about the route"."""
    if 200 <= status < 300:
        return "ok"
    if status in (408, 504):
        return "timeout"
    if status >= 500 or status == 429:
        return "error"
    return None


@dataclass(slots=True)
class ResponseTimer:
    """Incremental SSE-aware timer for one response. Cheap per chunk: JSON is
    parsed only to find the first token and the final usage object."""

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
    _pending: bytes = b""
    _is_sse: bool = False
    _body: bytearray | None = None

    def on_headers(self, status: int, content_type: str, now: float) -> None:
        self.status = status
        self._is_sse = "text/event-stream" in content_type.lower()
        if not self._is_sse:
            self._body = bytearray()

    def on_body(self, chunk: bytes, now: float, end: bool = False) -> None:
        if self._is_sse:
            self._feed_sse(chunk, now)
        elif self._body is not None and len(self._body) < 1 << 20:
            self._body += chunk  # bounded: usage is near the end of small JSON replies
        if end:
            self.on_end(now)

    def _feed_sse(self, chunk: bytes, now: float) -> None:
        buf = self._pending + chunk
        *events, self._pending = buf.split(b"\n\n")
        if len(self._pending) > 1 << 20:
            self._pending = b""  # a runaway event without a separator: drop, don't grow
        for ev in events:
            for line in ev.split(b"\n"):
                if line.startswith(b"data:"):
                    self._on_data(line[5:].strip(), now)

    def _on_data(self, data: bytes, now: float) -> None:
        if not data or data == _DONE:
            return
        if b'"usage"' in data and (b'"choices":[]' in data or b'"choices": []' in data):
            self._read_usage(data)
            return
        if self.first_token_at is None:
            if not _has_token(data):
                return  # role-only or empty delta: not a token yet
            self.first_token_at = now
        self.last_token_at = now
        self.token_events += 1
        if b'"usage"' in data:
            self._read_usage(data)

    def _read_usage(self, data: bytes) -> None:
        try:
            usage = json.loads(data).get("usage") or {}
            n = usage.get("completion_tokens", usage.get("output_tokens"))
            if isinstance(n, int) and n >= 0:
                self.usage_tokens = n
        except (ValueError, AttributeError):
            pass

    def on_end(self, now: float) -> None:
        if self.ended_at is None:
            self.ended_at = now
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
        )


def _has_token(data: bytes) -> bool:
    """True if a chunk carries generated text (chat delta, completion text, responses delta)."""
    try:
        obj = json.loads(data)
    except ValueError:
        return False
    if not isinstance(obj, dict):
        return False
    if obj.get("type") == "response.output_text.delta":
        return bool(obj.get("delta"))
    for choice in obj.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict) and (delta.get("content") or delta.get("tool_calls")):
            return True
        if choice.get("text"):
            return True
    return False
