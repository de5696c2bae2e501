"""Outcome and timing of one request from Envoy's access-log entry (pure).

The shell turns each ``envoy.data.accesslog.v3.HTTPAccessLogEntry`` it receives
over the gRPC Access Log Service into a :class:`LogRecord` (plain values, no
protobuf) and asks this module what the entry says about the route. Nothing
here reads a clock: every time is a duration Envoy measured for that request.

Time base (all seconds, from Envoy's own timestamps):

* ``t0``       — first byte sent to the upstream (``US_TX_BEG``). The sidecar's
  decision and Envoy's buffering come before it and are never counted; so is
  a new upstream connection's handshake (Envoy sends nothing before it).
* TTFT     — first upstream *body* byte (``US_TX_BEG:US_RX_BODY_BEG``) plus the
  first-token offset the caller passes in: for a provider whose first SSE event
  already carries a token the offset is ~0; for one that sends a role-only
  event first it is the measured gap between that event and the first token
  (the shell measures it on a sampled share of requests, see
  :mod:`sidecar.core.ttft_offset`). A caller that timed this very request at
  its first token passes ``first_token_s`` instead, which wins. On a *blind*
  route (``ttft_from_log=False``) the entry gives no TTFT at all unless
  ``first_token_s`` is known: a median offset would flatten the tail.
* TPOT     — (end - first token) / (tokens - 1), tokens from the response's
  ``usage`` (lifted into dynamic metadata by Envoy's ``sse_to_metadata``) or
  from the caller's own count. Undefined with fewer than two tokens.
* e2e      — last upstream byte (``US_TX_BEG:US_RX_END``).

Outcome (first matching row wins)::

    answered by tailroute itself (details "tailroute_*")    -> None (not route evidence)
    2xx with an error event in the stream (see below)       -> error
    downstream reset / downstream connection terminated,
      2xx and the response complete (see below)            -> ok
    downstream reset / downstream connection terminated    -> cancel   (the client went away)
    upstream request timeout, stream idle timeout,
      max stream duration (flag, or details
      "max_duration_timeout": a route's max_stream_duration
      sets no flag), 408 / 504 from the upstream            -> timeout
    upstream reset / connect failure / overflow /
      no healthy upstream / 5xx / 429                       -> error
    2xx with the response complete                          -> ok
    other 4xx                                               -> None (the caller's fault)
    no response and no flag                                 -> cancel

A client that leaves *after* the response was complete -- the upstream ended it
(``US_RX_END`` logged) or its usage event, which OpenAI-style streams send last
before ``data: [DONE]``, went through -- is not a cancel: the OpenAI Python SDK's
synchronous stream closes the connection at ``[DONE]`` without reading on, so
Envoy often sees the end of the upstream response after the client is gone
(more often on a loaded machine). Such an entry is ``ok``; its e2e is the
upstream's last byte, or without one the time waited until the client left (the
client had the whole answer by then). A provider that repeats usage in every
chunk (vLLM's ``continuous_usage_stats``) makes a mid-stream leave look complete:
it is then a short ``ok``, whose TPOT is still right. A stream without usage (its
client did not ask, and ``timing.ask_usage`` is off) that the client left at
``[DONE]`` before Envoy saw its end has neither; for it Envoy's ``[DONE]`` mark
(:mod:`sidecar.shell.bootstrap_done`, ``timing.done_mark``, on the requests the usage
filter runs on) dates the stream's ``data: [DONE]`` line (``LogRecord.done_s``). A
marked entry whose client then left is a complete answer too: ``ok``, its e2e the
mark's time (at most the wait), its TTFT as any ``ok``'s, its TPOT from usage or the
caller's count if any. An unmarked one (the mark off, a request outside the usage
sample, a user who pressed stop before ``[DONE]``) stays a ``cancel``, whose first
token is still measured (below).

An error event is an SSE event whose JSON reports an error
(:data:`sidecar.core.timing.ERROR_SELECTORS`: an ``error``, a top-level ``message``
or a ``response.error`` whose value is an error value -- a non-empty string, an
object, ``true``, a non-zero number): a provider that fails mid-stream sends one
behind its ``200`` and then ends the stream, which the status and the flags alone
would log as a short ``ok``. Envoy's ``sse_to_metadata`` filter lifts those fields
into the entry's metadata and the access-log reader judges them
(``LogRecord.stream_error``); it wins over every flag, as the provider reported its
failure before the client left or Envoy gave up. The filter runs on
``envoy.usage_sample`` of the requests (all in extproc mode), so only those can
show it.

A 429 or 503 that declared a wait (``retry-after-ms`` / ``Retry-After``, which Envoy logs
with the entry and the shell reads into ``LogRecord.retry_after_s``, see
:mod:`sidecar.core.retry_after`) passes it on as ``Observation.retry_after_s``.

Timeouts and cancels are *censored* exactly as in :mod:`sidecar.core.timing`:
their e2e is the time waited since ``t0`` (a lower bound), and so is their TTFT
when no first token came; the router decides whether a cancel is evidence. A
first body byte stands for a first token there as for an ``ok``, except on a
stream whose own events were read without a token (``tokenless``: a sampled stream
that opened with a role-only event or comments and ended, or lost its client,
before any token): its TTFT is the wait. A first token that came (the first body
byte of a 2xx plus the offset, not ``tokenless``, not on a blind route unless this
request was timed, and not after the wait) is a *measurement* whatever the client did next:
such an observation is ``ttft_measured``, and a cancel keeps that TTFT as evidence
(:func:`sidecar.core.judging.judge_censored`) -- the cancels of complete answers to a
client that leaves at ``[DONE]`` above carry their route's TTFT so. A complete
such stream (an ``ok`` without a token: a filtered or empty answer) has no TTFT or
TPOT, as :class:`sidecar.core.timing.ResponseTimer` gives none.

A timeout at the caller's own deadline is the caller's, not the route's
(:func:`at_callers_deadline`): ``x-tailroute-deadline-ms`` becomes the request's
upstream timeout (an unstreamed answer's when below the class timeout; a stream's
always, its route having none), and Envoy's router answers 504 when it passes
(flag ``upstream_request_timeout``). Read as a route timeout, a hard failure, nine
requests sent with ``x-tailroute-deadline-ms: 50`` to a sidecar without latency data
yet (so none was refused as unreachable) quarantined two routes and restricted the
third: three timeouts in a row on each. Such an entry is judged as the caller giving
up at that moment -- a cancel, which the router counts as a timeout only once the wait
passed the class budget (:func:`sidecar.core.judging.judge_censored`) -- as in the
policy lab, where a workflow's deadline ends an attempt as the client's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sidecar.core.frozen import fast_init
from sidecar.core.timing import error_keeps_duration, outcome_for_status
from sidecar.core.types import Observation, Outcome, SliceKey

# ResponseFlags field names (envoy.data.accesslog.v3.ResponseFlags) by meaning.
CANCEL_FLAGS: Final = frozenset({"downstream_remote_reset", "downstream_connection_termination"})
TIMEOUT_FLAGS: Final = frozenset({
    "upstream_request_timeout", "stream_idle_timeout", "duration_timeout",
    "upstream_max_stream_duration_reached",
})
ERROR_FLAGS: Final = frozenset({
    "upstream_remote_reset", "upstream_connection_failure", "upstream_connection_termination",
    "upstream_overflow", "no_healthy_upstream", "upstream_retry_limit_exceeded",
    "upstream_protocol_error", "no_cluster_found", "dns_resolution_failure", "local_reset",
    "overload_manager",
})
# A route's max_stream_duration ends a stream with no response flag, only this detail
# (Envoy 1.40: "200 - max_duration_timeout" for a stream cut after its headers).
TIMEOUT_DETAILS: Final = frozenset({"max_duration_timeout"})
TAILROUTE_DETAILS_PREFIX: Final = "tailroute_"


@fast_init
@dataclass(frozen=True, slots=True)
class LogRecord:
    """What tailroute reads from one HTTP access-log entry (durations in seconds)."""

    status: int  # 0: no response was sent
    flags: frozenset[str] = frozenset()
    details: str = ""  # response_code_details ("via_upstream", "tailroute_defer_...")
    method: str = ""
    path: str = ""
    upstream_cluster: str = ""
    route_name: str = ""
    duration_s: float | None = None  # downstream start to end of the exchange
    upstream_tx_s: float | None = None  # downstream start to first upstream byte sent (t0)
    first_body_s: float | None = None  # t0 to first upstream body byte
    end_s: float | None = None  # t0 to last upstream byte
    tokens: int | None = None  # usage.completion_tokens / output_tokens, if logged
    rid: str | None = None  # tailroute's request id from dynamic metadata (None: undecided)
    route_key: str | None = None  # the route tailroute chose ("<cluster>|<class>|<n|s>")
    slice_label: str | None = None  # the slice tailroute classified the request into
    stream_id: str = ""
    stream_error: bool = False  # a 2xx stream carried an error event (as Envoy lifted it)
    # Upstream attempts Envoy made for the request (its route's retry_policy): the entry
    # is the last one's; the others failed on the same cluster, unseen otherwise.
    attempts: int = 1
    # A 429's or 503's declared wait in seconds (sidecar.core.retry_after), read by the shell from
    # the logged response headers; None for any other status or without a readable one.
    retry_after_s: float | None = None
    # A 429 or 503 whose Retry-After / retry-after-ms was there but unreadable (counted).
    retry_after_bad: bool = False
    # Request body bytes Envoy received from the client (None: not known). 0: a request
    # without a body, which nobody decides on any path (not an LLM request).
    body_bytes: int | None = None
    # t0 to the stream's "data: [DONE]" line, as Envoy's [DONE] mark dated it (None: not
    # marked; the mark runs where the usage filter does). A client that left after it
    # had the whole answer.
    done_s: float | None = None


def outcome_of(rec: LogRecord) -> Outcome | None:
    """The outcome table above; None means "not evidence about the route"."""
    if rec.details.startswith(TAILROUTE_DETAILS_PREFIX):
        return None
    if rec.stream_error and 200 <= rec.status < 300:
        return "error"  # the provider failed mid-stream behind its 200
    flags = rec.flags
    if flags & CANCEL_FLAGS:
        if 200 <= rec.status < 300 and (rec.end_s is not None or rec.tokens is not None
                                        or rec.done_s is not None):
            return "ok"  # the client left once it had the whole answer (module docstring)
        return "cancel"
    if flags & TIMEOUT_FLAGS or rec.details in TIMEOUT_DETAILS:
        return "timeout"
    if flags & ERROR_FLAGS:
        return "error"
    if rec.status == 0:
        return "cancel"
    return outcome_for_status(rec.status)


def waited_s(rec: LogRecord) -> float | None:
    """Time since ``t0`` until Envoy gave up or the client left (None: never sent upstream)."""
    if rec.upstream_tx_s is None or rec.duration_s is None:
        return None
    return max(rec.duration_s - rec.upstream_tx_s, 0.0)


def ok_timing(first: float | None, e2e: float | None, tokens: int | None,
              trust_first: bool) -> tuple[float | None, float | None]:
    """(TTFT, TPOT) of a complete streamed response (module docstring).

    ``first`` is the first token's time since ``t0`` (clamped to ``e2e``: a token
    cannot come after the last byte); ``trust_first`` says whether it may be
    reported as TTFT (False on a blind route, where only its TPOT is used).
    """
    if first is None:
        return None, None
    if e2e is not None and e2e < first:
        first = e2e
    tpot = None
    if tokens is not None and tokens >= 2 and e2e is not None:
        tpot = max(e2e - first, 0.0) / (tokens - 1)
    return (first if trust_first else None), tpot


def retried_attempts(rec: LogRecord, obs: Observation) -> tuple[Observation, ...]:
    """The upstream attempts Envoy retried before the one ``rec`` logs, as evidence
    about the same route: one ``error`` each (``Observation.attempt``).

    With a route ``retry_policy`` Envoy retries on the cluster it routed to, and only
    after a failure (a retriable status, a reset, a refused connection, a per-try
    timeout: which one is not logged, so an error without status or timing). Without
    them a provider failing on a third of its attempts would look healthy whenever the
    retry succeeded: its errors are the evidence the policy most needs (fast errors
    free slots, which the load score would reward). The request itself is still one
    outcome, its last attempt's (``obs``).
    """
    n = rec.attempts - 1
    if n <= 0:
        return ()
    failed = Observation(obs.cluster, obs.slice, "error", is_retry=obs.is_retry,
                         is_probe=obs.is_probe, attempt=True)
    return (failed,) * n


def observation_from_log(
    rec: LogRecord,
    cluster: str,
    slice: SliceKey,
    streaming: bool,
    *,
    ttft_offset_s: float = 0.0,
    first_token_s: float | None = None,
    tokenless: bool = False,
    ttft_from_log: bool = True,
    tokens: int | None = None,
    is_retry: bool = False,
    is_probe: bool = False,
    sent_load: float | None = None,
) -> Observation | None:
    """The :class:`Observation` an entry gives, or None when it is not evidence.

    ``first_token_s`` (time from ``t0`` to the first token, measured on this very
    request) beats ``first_body_s + ttft_offset_s``; ``tokenless`` says this very
    request's events were read and none was a token, so a timeout or cancel waited
    its whole wait for one; ``tokens`` (the caller's own count) is used when the entry
    carries no usage.
    """
    outcome = outcome_of(rec)
    if outcome is None:
        return None
    n = rec.tokens if rec.tokens is not None else tokens
    first = first_token_s
    if tokenless:
        first = None  # its events were read: no first token to date (as the timer)
    elif first is None and rec.first_body_s is not None and streaming:
        first = rec.first_body_s + ttft_offset_s
    ttft = tpot = e2e = None
    censored = outcome in ("timeout", "cancel")
    measured = False
    if outcome == "ok":
        e2e = rec.end_s
        if e2e is None and rec.flags & CANCEL_FLAGS:
            # Complete, then the client left: until its [DONE] if marked (never after
            # the client left), else as long as it waited.
            e2e = waited_s(rec)
            if rec.done_s is not None:
                e2e = rec.done_s if e2e is None else min(rec.done_s, e2e)
        if streaming:
            ttft, tpot = ok_timing(first, e2e, n, first_token_s is not None or ttft_from_log)
    elif censored:
        e2e = waited_s(rec)
        if streaming:
            ttft = e2e if first is None else first
            # A first token seen before the client left is timed as an ok's is: a
            # measurement (not on a blind route, where the offset is only a median).
            # A 2xx only: an error status's first body byte is its error, no token (a
            # fast 503 kept as a TTFT sample would make a failing route look quick).
            measured = (200 <= rec.status < 300 and first is not None
                        and (first_token_s is not None or ttft_from_log)
                        and (e2e is None or first <= e2e))
    elif error_keeps_duration(rec.status, bool(rec.flags & ERROR_FLAGS) or rec.stream_error):
        e2e = rec.end_s  # an upstream's 5xx: dates the error (never a latency sample)
    return Observation(
        cluster=cluster,
        slice=slice,
        outcome=outcome,
        status=rec.status or None,
        ttft_s=ttft,
        tpot_s=tpot,
        e2e_s=e2e,
        output_tokens=n if n else None,
        is_retry=is_retry,
        is_probe=is_probe,
        censored=censored,
        sent_load=sent_load,
        retry_after_s=rec.retry_after_s,
        ttft_measured=measured,
    )


def at_callers_deadline(rec: LogRecord, obs: Observation, timeout_ms: float | None,
                        class_timeout_ms: float) -> Observation:
    """``obs`` as a cancel if Envoy timed the request out at a per-request timeout from
    the caller's deadline (``timeout_ms``, the decision's), else ``obs`` (module
    docstring). An unstreamed answer's per-request timeout is the caller's when shorter
    than the class's own; a stream's route has no whole-answer timeout at all (the
    class timeout is its idle timeout, flag ``stream_idle_timeout``), so any per-request
    one is the caller's."""
    if (obs.outcome != "timeout" or timeout_ms is None
            or "upstream_request_timeout" not in rec.flags
            or (timeout_ms >= class_timeout_ms and not obs.slice.streaming)):
        return obs
    return obs.judged("cancel", obs.ttft_s, obs.e2e_s, censored=True)
