"""Shell side of admission control: HTTP answers for requests that are not
admitted, the per-request upstream timeout, and holding queued requests.

The core (:mod:`sidecar.core.admission`) decides; this module turns a
:class:`~sidecar.core.types.Decision` into what Envoy does (documented in
docs/admission.md):

=========  ======  ===============================================================
outcome    status  response
=========  ======  ===============================================================
admit      --      CONTINUE; ``x-envoy-upstream-rq-timeout-ms`` = remaining budget
queue      --      no answer yet: the stream is held (:class:`Hold`) and re-asked
defer      429     ``retry-after: N``, ``x-should-retry: true``, ``tailroute_deferred``
shed       503     ``x-should-retry: false``, ``tailroute_shed``
reject     503     ``x-should-retry: false``, ``tailroute_rejected``
skip       412     ``x-tailroute-skipped: optional-step``, ``x-should-retry: false``,
                   ``tailroute_skipped``
=========  ======  ===============================================================

Every non-admit answer carries ``x-tailroute-admission: <outcome>`` and
``x-tailroute-reason: <reason>`` and an OpenAI-style error body whose
``error.code`` is the machine-readable reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass

from sidecar.core.types import Decision, RequestInfo
from sidecar.pb.envoy.config.core.v3 import base_pb2
from sidecar.pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb

TIMEOUT_HEADER = "x-envoy-upstream-rq-timeout-ms"
ADMISSION_HEADER = "x-tailroute-admission"
REASON_HEADER = "x-tailroute-reason"
SKIPPED_HEADER = "x-tailroute-skipped"
SKIPPED_VALUE = "optional-step"
ERROR_TYPES: dict[str, str] = {
    "defer": "tailroute_deferred",
    "shed": "tailroute_shed",
    "reject": "tailroute_rejected",
    "skip": "tailroute_skipped",
}
_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


@dataclass(frozen=True, slots=True)
class Hold:
    """The request waits in the admission queue: re-ask at ``until`` (loop time) at
    the latest, or earlier when capacity may have freed (:class:`CapacitySignal`)."""

    until: float


def _opt(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode("latin-1", "replace")),
        append_action=_OVERWRITE,
    )


def timeout_header(decision: Decision) -> base_pb2.HeaderValueOption | None:
    """The per-request upstream timeout Envoy's router applies (the route permits it)."""
    if decision.timeout_ms is None:
        return None
    return _opt(TIMEOUT_HEADER, str(max(1, round(decision.timeout_ms))))


def reason_of(decision: Decision) -> str:
    """The machine-readable reason: the code before the first ``:`` of the detail."""
    return decision.detail.split(":", 1)[0].strip() or decision.admission


def admission_response(decision: Decision, info: RequestInfo) -> pb.ProcessingResponse:
    """The ImmediateResponse for a defer, shed, reject or skip decision."""
    outcome = decision.admission
    reason = reason_of(decision)
    status = decision.status or 503
    note = decision.detail.split(":", 1)[1].strip() if ":" in decision.detail else ""
    headers = {
        "content-type": "application/json",
        ADMISSION_HEADER: outcome,
        REASON_HEADER: reason,
        "x-should-retry": "true" if outcome == "defer" else "false",
    }
    if outcome == "defer" and decision.retry_after_s is not None:
        headers["retry-after"] = str(decision.retry_after_s)
    if outcome == "skip":
        headers[SKIPPED_HEADER] = SKIPPED_VALUE
    verb = {"defer": "deferred", "shed": "shed", "reject": "rejected", "skip": "skipped"}
    message = f"tailroute {verb.get(outcome, outcome)} this request ({reason})"
    body = {
        "error": {
            "message": f"{message}: {note}" if note else message,
            "type": ERROR_TYPES.get(outcome, "tailroute_admission"),
            "code": reason,
            "param": None,
            "tailroute": {
                "admission": outcome,
                "reason": reason,
                "class": info.klass,
                "priority": info.priority,
                "step": info.step,
                "deadline_ms": info.deadline_ms,
                "retry_after_s": decision.retry_after_s,
            },
        }
    }
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status={"code": status},
            headers=pb.HeaderMutation(set_headers=[_opt(k, v) for k, v in headers.items()]),
            body=json.dumps(body, separators=(",", ":")).encode(),
            details=f"tailroute_{outcome}_{reason}",
        )
    )


class CapacitySignal:
    """Wakes held requests when the total in-flight count drops (or a stream closes).

    Cheap when nobody waits: :meth:`observe_load` compares one integer.
    """

    def __init__(self) -> None:
        self._event: asyncio.Event | None = None
        self._waiters = 0
        self._last_load = 0

    @property
    def waiting(self) -> bool:
        """Is any held request waiting (only then is the load worth checking)?"""
        return self._waiters > 0

    def notify(self) -> None:
        if self._waiters and self._event is not None:
            self._event.set()
            self._event = None

    def observe_load(self, load: int) -> None:
        """Call after an event that may finish a request; wakes waiters if the load fell.
        (A stale comparison can only cause a spurious wake: the waiter re-asks, harmless.)"""
        if load < self._last_load:
            self.notify()
        self._last_load = load

    async def wait(self, timeout_s: float) -> None:
        """Return after ``timeout_s`` or at the next :meth:`notify`, whichever is first."""
        if timeout_s <= 0:
            return
        if self._event is None:
            self._event = asyncio.Event()
        event = self._event
        self._waiters += 1
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout_s)
        finally:
            self._waiters -= 1
