"""Mutable per-request records of the simulation: workflows, calls and attempts.

Slotted plain classes rather than dataclasses: the engine creates one
:class:`Call` and at least one :class:`Attempt` per simulated request, and this
is on the hot path of a run of millions of requests.

* A :class:`Workflow` is one agentic task: stages of parallel calls sharing one
  end-to-end deadline.
* A :class:`Call` is what the application asked for once (a logical request);
  it may take several attempts (client retries).
* An :class:`Attempt` is one routed HTTP request: what a policy chooses a
  cluster for and later learns the outcome of. Its read-only properties mirror
  :class:`sidecar.core.types.Observation` so policies can read it directly.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from sidecar.core.config import ClassConfig
from sidecar.core.live_book import LiveEntry
from sidecar.core.timing import error_keeps_duration, outcome_for_status
from sidecar.core.types import Observation, Outcome, RequestInfo, SliceKey

if TYPE_CHECKING:
    from sidecar.sim.scenario import StepSpec, WorkloadSpec

# Attempt.state
PENDING, QUEUED, SERVING, DONE = 0, 1, 2, 3
# Attempt.deadline_kind: which clock ended it, if it did not finish
ROUTE, CLIENT, USER = "route", "client", "user"


class Workflow:
    __slots__ = ("cost", "deadline", "done", "failed", "key", "pending", "plan", "scored",
                 "stage", "start", "wl")

    def __init__(self, wl: WorkloadSpec, start: float, deadline: float, scored: bool) -> None:
        self.wl = wl
        self.start = start
        self.deadline = deadline
        self.scored = scored
        self.stage = 0
        self.pending = 0
        self.failed = False
        self.done = False
        self.cost = 0.0
        self.key = 0  # draw key of its first call; the others follow in plan order
        # per stage, per parallel call: (input tokens, output tokens), drawn at arrival so
        # every policy sees the same workflow (common random numbers)
        self.plan: list[list[tuple[int, int]]] = []


class Call:
    __slots__ = ("attempts", "candidates", "cls", "cost", "deadline", "draw_key", "end_at",
                 "first_token_at", "group", "hold_limit", "id", "input_tokens", "klass",
                 "max_tokens", "model", "output_tokens", "retries_left", "rows", "scored",
                 "slice", "start", "step", "stream", "tpot_s", "user_cancel_at", "wl",
                 "workflow")

    def __init__(
        self,
        cid: int,
        wl: WorkloadSpec,
        cls: ClassConfig,
        model: str,
        stream: bool,
        input_tokens: int,
        output_tokens: int,
        max_tokens: int | None,
        slice_key: SliceKey,
        candidates: tuple[str, ...],
        start: float,
        scored: bool,
        draw_key: int = -1,
    ) -> None:
        self.id = cid
        # policy-independent identity for the providers' keyed service draws (-1: none)
        self.draw_key = draw_key
        self.wl = wl
        self.cls = cls
        self.klass = cls.name
        self.model = model
        self.stream = stream
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.max_tokens = max_tokens
        self.slice = slice_key
        self.candidates = candidates
        self.start = start
        self.scored = scored
        self.attempts = 0
        self.retries_left = wl.client.retries
        self.deadline: float | None = None  # absolute end-to-end deadline (workflows)
        self.user_cancel_at: float | None = None
        self.workflow: Workflow | None = None
        self.step: StepSpec | None = None
        self.first_token_at: float | None = None
        self.end_at: float | None = None
        self.tpot_s: float | None = None
        self.cost = 0.0
        self.hold_limit: float | None = None  # client gives up while held by "queue"
        # the metrics' counters for this call's slice and its group (set on first use)
        self.rows: dict[str, list[int]] | None = None
        self.group = -1


class Attempt:
    """One routed request. ``draws`` may hold pre-drawn service randomness (oracle)."""

    __slots__ = ("call", "cluster", "deadline", "deadline_kind", "degraded", "draws", "end_at",
                 "first_token_at", "is_probe", "is_rescue", "live", "low", "n", "outcome",
                 "retry_after", "sent_at", "sent_load", "slot_until", "state", "status",
                 "tokens_done", "tpot_s", "ttft_deadline", "ttft_kind")

    def __init__(self, call: Call, n: int, now: float) -> None:
        self.call = call
        self.n = n
        self.sent_at = now
        self.cluster = ""
        self.deadline = 0.0
        # When the first byte must have come (a stream's route idle timeout, the client's
        # first-byte timeout), and whose clock that is.
        self.ttft_deadline = math.inf
        self.ttft_kind = CLIENT
        self.deadline_kind = ROUTE
        self.state = PENDING
        self.outcome: Outcome | None = None
        self.status: int | None = None
        self.retry_after: float | None = None  # an error's declared Retry-After (seconds)
        self.first_token_at: float | None = None
        self.end_at: float | None = None
        self.tpot_s: float | None = None
        self.tokens_done = 0
        self.slot_until: float | None = None
        self.is_probe = False
        self.is_rescue = False  # its Decision.is_rescue: only its answer ends a cooldown early
        self.low = False  # its Decision.low (Router.started / finished)
        self.degraded = False
        self.draws: Any = None
        self.sent_load: float | None = None  # the route's load when sent (Router.started)
        self.live: LiveEntry | None = None  # its entry in the router's live books, if any

    # ---------------------------------------------------- Observation-like view

    @property
    def stream(self) -> bool:
        return self.call.stream

    @property
    def slice(self) -> SliceKey:
        return self.call.slice

    @property
    def is_retry(self) -> bool:
        return self.n > 0

    @property
    def output_tokens(self) -> int | None:
        return self.tokens_done or None

    @property
    def ttft_s(self) -> float | None:
        """Time to first token as the sidecar measures it (streams only, ok only)."""
        if self.outcome != "ok" or not self.call.stream or self.first_token_at is None:
            return None
        return self.first_token_at - self.sent_at

    @property
    def e2e_s(self) -> float | None:
        if self.outcome != "ok" or self.end_at is None:
            return None
        return self.end_at - self.sent_at

    def observation(self) -> Observation | None:
        """The core :class:`Observation` the server's ResponseTimer would produce
        (the ``ttft_s`` / ``e2e_s`` properties inlined: this runs per request)."""
        outcome = self.outcome
        if outcome is None:
            return None
        call = self.call
        stream = call.stream
        end, sent = self.end_at, self.sent_at
        ttft = e2e = tpot = None
        censored = measured = False
        if outcome == "error" and self.status is not None and self.status >= 300:
            read = outcome_for_status(self.status)  # (a 2xx error: failed mid-stream)
            if read is None:
                return None  # a 4xx but 408/429: the caller's fault, as ResponseTimer has it
            outcome = read  # a 408 or 504 answer is a timeout to the ResponseTimer
        if outcome == "ok":
            if end is not None:
                e2e = end - sent
            if stream:
                ft = self.first_token_at
                if ft is not None:
                    ttft = ft - sent
                tpot = self.tpot_s
        elif outcome == "error":
            if end is not None and error_keeps_duration(self.status, False):
                e2e = end - sent  # as the ResponseTimer does: dates a 5xx (no sample)
        else:  # timeout or cancel
            censored = True
            if end is not None:
                # As the ResponseTimer does: the time waited, a lower bound.
                e2e = end - sent
                if stream:
                    ft = self.first_token_at
                    ttft = (ft if ft is not None else end) - sent
                    measured = ft is not None and ft <= end  # as the timer: a token came
        # Positional, in field order (cluster, slice, outcome, status, ttft_s, tpot_s,
        # e2e_s, output_tokens, is_retry, is_probe, censored, sent_load, attempt,
        # retry_after_s, is_rescue, ttft_measured): keywords cost a third more.
        return Observation(self.cluster, call.slice, outcome, self.status, ttft, tpot, e2e,
                           self.tokens_done or None, self.n > 0, self.is_probe, censored,
                           self.sent_load, False, self.retry_after, self.is_rescue,
                           measured)

    def request_info(self, now: float) -> RequestInfo:
        """What the classifier would have produced for this attempt's HTTP request."""
        c = self.call
        deadline_ms = None if c.deadline is None else max(c.deadline - now, 0.0) * 1000.0
        step = c.step
        # Positional, in field order (api, model, stream, max_tokens, input_tokens, klass,
        # priority, tenant, slice, request_id, retry_attempt, deadline_ms, step, fanout;
        # the rest default): keywords cost a third more, and this runs per request.
        return RequestInfo("chat", c.model, c.stream, c.max_tokens, c.input_tokens, c.klass,
                           c.cls.priority, None, c.slice, f"c{c.id}", self.n, deadline_ms,
                           None if step is None else step.kind,
                           1 if step is None else step.fanout)


def outcome_kind(att: Attempt) -> str:
    """How the attempt ended from the client's view: ok, error, timeout or cancelled."""
    if att.outcome == "ok":
        return "ok"
    if att.outcome == "error":
        return "error"
    return "cancelled" if att.deadline_kind == USER else "timeout"


def finalize_unfinished(att: Attempt) -> None:
    """Set the core outcome of an attempt that hit its deadline.

    The route timeout (Envoy's per-request timeout) answers 504: a ``timeout``.
    A client or user giving up first closes the downstream: the sidecar sees a
    ``cancel`` (as :class:`~sidecar.core.timing.ResponseTimer` would report it).
    """
    att.state = DONE
    if att.outcome is None:
        att.outcome = "timeout" if att.deadline_kind == ROUTE else "cancel"
        att.status = 504 if att.deadline_kind == ROUTE else None
