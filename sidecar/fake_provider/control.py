"""The fake provider's run-time latency profile and the control API that changes it.

Control JSON (every field optional; an invalid payload is rejected whole)::

    {"ttft_ms": {"median": 50, "p99": 80} | {"fixed": 50} | 50 | "50:80",
     "tpot_ms": <same forms>, "error_rate": 0.0, "error_status": 500,
     "stall_ms": 0, "outage": false, "outage_mode": "close" | "503",
     "role_first": false,                # streamed chat opens with a role-only event
     "end_delay_ms": 0,                  # streamed: body ends this long after [DONE]
     "waiting_comment_ms": 0,            # streamed: ": keep-alive" this often before token 1
     "midstream_error_rate": 0.0, "midstream_error_shape": "openai",  # see below
     "retry_after": null | 2 | "2" | "Wed, 21 Oct 2015 07:28:00 GMT",  # see below
     "retry_after_ms": null | 1500 | "1500",
     "streaming_only": false,            # fields above go to the streaming override
     "clear_streaming_override": false,  # drop the override first
     "reset": false,                     # back to the startup profile first (and release)
     "hold": true | false}               # new completions wait at arrival until released

``midstream_error_rate`` of the streams fail mid-way: 200, half the tokens (at least
one), one error event, the end (no usage, no ``[DONE]``; ``counters.midstream_errors``).
Shapes: ``openai`` ``{"error": {"message": ...}}``, ``anthropic`` (``event: error``,
``{"type": "error", "error": {...}}``), ``vllm`` ``{"object": "error", "message": ...}``,
``responses_error`` ``{"type": "error", "message": ...}``, ``response_failed``,
``plain_string`` ``{"error": "upstream overloaded: ..."}``, ``error_code``
``{"error": {"code": 500, "type": "server_error"}}`` (no message). A failed stream's
entry in ``/control/requests`` says ``"midstream_error": true``.

``retry_after`` / ``retry_after_ms`` are sent verbatim as ``retry-after`` /
``retry-after-ms`` with every ``error_rate`` answer: with ``"error_status": 429`` a
rate-limited provider that declares its wait (a number as written, a string as it
is, so an HTTP-date or garbage too). A schedule (or ``POST /control``) turns it on
and off for a time window.

A hold lets a test keep requests in flight for exactly as long as it needs (until
it sends ``"hold": false``) instead of for a latency it hopes outlasts its steps;
a held request's latency profile starts when it is released.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .latency import HOLD, Profile, split_control


class ProfileControl:
    """The profiles a :class:`~sidecar.fake_provider.server.FakeProvider` answers by:
    the base (non-streaming requests, and streaming ones where the override is
    silent), the streaming override, and whether new completions are held."""

    def __init__(self, profile: Profile) -> None:
        self.initial = self.base = profile
        # Streaming override = base + these fields, so later base changes still
        # show through wherever the override does not speak.
        self.stream_fields: dict[str, Any] = {}
        self.stream = profile
        self.held = False

    def apply(self, payload: Mapping[str, Any]) -> None:
        """Apply a control payload; ConfigError (nothing applied) if it is invalid."""
        flags, changes = split_control(payload)
        base, fields = self.base, self.stream_fields
        held = self.held
        if flags["reset"]:
            base, fields = self.initial, {}
            held = False
        if flags["clear_streaming_override"]:
            fields = {}
        if flags["streaming_only"]:
            fields = {**fields, **changes}
        else:
            base = base.updated(changes)
        stream = base.updated(fields)  # also validates before anything is committed
        self.base, self.stream_fields, self.stream = base, fields, stream
        self.held = flags.get(HOLD, held)

    def to_json(self) -> dict[str, Any]:
        """The profiles as ``GET /control`` shows them."""
        return {
            "base": self.base.to_json(),
            "streaming_override": self.stream.to_json() if self.stream_fields else None,
            "streaming_override_fields": sorted(self.stream_fields),
        }
