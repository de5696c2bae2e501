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
defer      429     ``retry-after: N``, ``retry-after-ms`` (spread, :func:`retry_after_ms`),
                   ``x-should-retry: true``, ``tailroute_deferred``; the body's
                   ``retry_after_s`` is ``retry-after-ms`` in seconds
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
import math
from collections.abc import Callable
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
SPREAD_CAP_MS = 60_000  # a deferral's spread wait stays within what every OpenAI SDK honours


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


def retry_after_ms(seconds: int, info: RequestInfo, spread: float) -> int:
    """The ``retry-after-ms`` of a deferral: ``seconds`` stretched by ``spread`` (0..1,
    a fresh draw per answer) up to twice as long.

    Why spread: the OpenAI SDKs wait exactly what they are told, so every request deferred
    in a burst came back in the same instant, when the routes had room for a few, and
    was deferred again together; after its two retries most of the burst failed.
    24 batch requests deferred while two routes of 2 slots were held full, then freed
    (answers in 300 ms): 8 served, 16 ``RateLimitError`` (docs/admission.md, "What the
    caller gets"). ``retry-after`` keeps the minimum, a whole number of seconds as
    RFC 9110 has it; the SDKs prefer ``retry-after-ms``. A call with a deadline is not
    spread: admission deferred it because it can wait ``seconds``, not twice that. Nor
    past :data:`SPREAD_CAP_MS`: the ``openai`` SDK does not retry at all after a wait
    over 120 s (older ones fell back to their own short backoff past 60 s)."""
    base = seconds * 1000
    if info.deadline_ms is not None or base >= SPREAD_CAP_MS:
        return base
    return min(base + int(base * min(max(spread, 0.0), 0.999)), SPREAD_CAP_MS)


def reason_of(decision: Decision) -> str:
    """The machine-readable reason: the code before the first ``:`` of the detail."""
    return decision.detail.split(":", 1)[0].strip() or decision.admission


def admission_response(decision: Decision, info: RequestInfo,
                       spread: float = 0.0) -> pb.ProcessingResponse:
    """The ImmediateResponse for a defer, shed, reject or skip decision (``spread``: a
    uniform draw in [0, 1) that spreads a deferral's ``retry-after-ms``)."""
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
    # The wait the body states is the one retry-after-ms states: a client reading the
    # body waited the unspread minimum, and a burst of such clients came back at once.
    wait_s: float | None = decision.retry_after_s
    if outcome == "defer" and decision.retry_after_s is not None:
        wait_ms = retry_after_ms(decision.retry_after_s, info, spread)
        headers["retry-after"] = str(decision.retry_after_s)
        headers["retry-after-ms"] = str(wait_ms)
        wait_s = wait_ms / 1000
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
                "retry_after_s": wait_s,
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
    """Wakes held requests when capacity may have freed: a stream closed, or the
    in-flight total dropped. Cheap when nobody waits: :meth:`observe_load` compares
    one integer.

    **One at a time, in service order.** The core admits a held request only when
    fewer waiters are ahead of it than slots are free (sidecar.core.admission_queue),
    so after one slot frees only the first waiter can take it. Waking them all made
    every waiter re-ask: 64 held requests (``queue_max``) cost 5.7 ms of the event loop
    per wake (89.5 us a re-ask), and wakes come with every stream that closes. Past
    ~170 requests a second under overload that was the whole loop, and the decisions
    themselves then timed out open. So :meth:`notify` wakes the first waiter in the
    core's order (``order``: the ticket's order key, None if the queue no longer holds
    it, which goes first); the holder calls :meth:`notify` again when its waiter left
    the queue (admitted or refused), passing the turn on while slots remain. A waiter
    still held ends the chain; the others wait for the next wake or their deadline.
    """

    def __init__(self, order: Callable[[str], tuple[int, int] | None]) -> None:
        self._order = order
        self._waiters: dict[str, asyncio.Future[None]] = {}
        self._last_load = 0

    @property
    def waiting(self) -> bool:
        """Is any held request waiting (only then is the load worth checking)?"""
        return bool(self._waiters)

    def notify(self) -> None:
        """Wake the first waiter in service order (none: nothing to do)."""
        if not self._waiters:
            return
        first = min(self._waiters, key=self._key)
        fut = self._waiters.pop(first)
        if not fut.done():
            fut.set_result(None)

    def _key(self, ticket: str) -> tuple[float, float]:
        key = self._order(ticket)
        return (-math.inf, -math.inf) if key is None else key

    def observe_load(self, load: int) -> None:
        """Call after an event that may finish a request; wakes a waiter if the load fell.
        (A stale comparison can only cause a spurious wake: the waiter re-asks, harmless.)"""
        if load < self._last_load:
            self.notify()
        self._last_load = load

    async def wait(self, ticket: str, timeout_s: float) -> None:
        """Return after ``timeout_s`` or when :meth:`notify` picks ``ticket``."""
        if timeout_s <= 0:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[ticket] = fut
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(fut, timeout_s)
        finally:
            if self._waiters.get(ticket) is fut:
                del self._waiters[ticket]
