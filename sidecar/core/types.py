"""Value types shared by the decision core, the server shell and the simulator.

All are frozen dataclasses: the core receives them as events and returns them
as decisions, never mutating what a caller holds.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Final, Literal, NamedTuple

from sidecar.core.frozen import fast_init

Outcome = Literal["ok", "error", "timeout", "cancel"]
Api = Literal["chat", "completions", "responses", "other"]
Step = Literal["critical", "optional"]

ANY: Final = "*"  # wildcard level in a broader slice
# Slice parts of the sidecar's own: requests for a model the config does not know, and
# the slices beyond stats.max_slices. No configured model or class may take these names.
UNKNOWN_MODEL: Final = "_unknown"
OVERFLOW_CLASS: Final = "_overflow"
# A class name the x-tailroute-class header can carry (sidecar.core.classify); no '|',
# which separates the parts of a slice label (SliceKey.label / parse) and of an Envoy
# route key (cluster|class|sampled), and no ANY.
NAME_OK: Final = re.compile(r"^[A-Za-z0-9._:/@+-]{1,128}$")


class SliceKey(NamedTuple):
    """A workload slice: traffic whose latency is comparable.

    ``profile`` is a token-profile bucket (see :func:`sidecar.core.classify.token_profile`).
    Broader slices replace the narrow levels with :data:`ANY`. A NamedTuple
    rather than a dataclass: it is a dict key on every lookup, and tuple
    hashing and equality run in C.
    """

    model: str
    klass: str
    profile: str
    streaming: bool | None  # None = either (broader slice)

    def broader(self) -> tuple[SliceKey, ...]:
        """The comparable fallbacks, narrowest first: model x class, then model.

        Long generations never share a percentile with short ones unless the
        narrow slice lacks data; the caller decides when to fall back.
        """
        return _broader(self)

    def label(self) -> str:
        """Stable text form, used in metrics labels, logs and snapshots."""
        return _label(self)

    @staticmethod
    def parse(text: str) -> SliceKey:
        model, klass, profile, s = text.split("|")
        streaming = None if s == ANY else s == "stream"
        return SliceKey(model, klass, profile, streaming)


@functools.lru_cache(maxsize=4096)
def _broader(key: SliceKey) -> tuple[SliceKey, ...]:
    out: list[SliceKey] = []
    if key.profile != ANY or key.streaming is not None:
        out.append(SliceKey(key.model, key.klass, ANY, None))
    if key.klass != ANY:
        out.append(SliceKey(key.model, ANY, ANY, None))
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def _label(key: SliceKey) -> str:
    s = ANY if key.streaming is None else ("stream" if key.streaming else "unary")
    return f"{key.model}|{key.klass}|{key.profile}|{s}"


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """What the classifier learned about one request."""

    api: Api
    model: str | None
    stream: bool
    max_tokens: int | None
    input_tokens: int
    klass: str
    priority: int
    tenant: str | None
    slice: SliceKey
    request_id: str | None = None
    retry_attempt: int = 0  # 0 = first attempt
    deadline_ms: float | None = None  # remaining end-to-end budget, if the caller gave one
    step: Step | None = None
    fanout: int = 1  # parallel calls in this workflow step (x-tailroute-fanout)
    explain: bool = False  # caller asked for the explain header
    class_known: bool = True  # False: header named an unknown class, default used
    model_known: bool = True  # False: model not in config, default route used

    # Written out for the compiled lab (one per simulated request; sidecar.core.frozen).
    def __init__(
        self, api: Api, model: str | None, stream: bool, max_tokens: int | None,
        input_tokens: int, klass: str, priority: int, tenant: str | None, slice: SliceKey,
        request_id: str | None = None, retry_attempt: int = 0,
        deadline_ms: float | None = None, step: Step | None = None, fanout: int = 1,
        explain: bool = False, class_known: bool = True, model_known: bool = True,
    ) -> None:
        object.__setattr__(self, "api", api)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "stream", stream)
        object.__setattr__(self, "max_tokens", max_tokens)
        object.__setattr__(self, "input_tokens", input_tokens)
        object.__setattr__(self, "klass", klass)
        object.__setattr__(self, "priority", priority)
        object.__setattr__(self, "tenant", tenant)
        object.__setattr__(self, "slice", slice)
        object.__setattr__(self, "request_id", request_id)
        object.__setattr__(self, "retry_attempt", retry_attempt)
        object.__setattr__(self, "deadline_ms", deadline_ms)
        object.__setattr__(self, "step", step)
        object.__setattr__(self, "fanout", fanout)
        object.__setattr__(self, "explain", explain)
        object.__setattr__(self, "class_known", class_known)
        object.__setattr__(self, "model_known", model_known)


fast_init(RequestInfo)


@dataclass(frozen=True, slots=True)
class Observation:
    """What happened to one routed request, measured by the shell or the simulator."""

    cluster: str
    slice: SliceKey
    outcome: Outcome
    status: int | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None  # an error status: how long it took (dates it; no sample)
    output_tokens: int | None = None
    is_retry: bool = False
    is_probe: bool = False
    # True for timeouts and cancels: ttft_s / e2e_s are then lower bounds (the
    # time waited so far), not measurements. See sidecar.core.timing.
    censored: bool = False
    # The route's load when the request was sent (in flight besides it over
    # max_concurrency, as Router.started returned it); None when unknown (native
    # mode). Only for sidecar.core.light_load.
    sent_load: float | None = None
    # A failed upstream attempt Envoy retried on the same cluster (its route's
    # retry_policy) before the one the request ended with: evidence about the route,
    # not a request, so not counted among the outcomes (sidecar.core.envoy_log).
    attempt: bool = False
    # What the provider asked for with a 429 or 503 (Retry-After / retry-after-ms), in
    # seconds from the response, already parsed (sidecar.core.retry_after); None when
    # absent or unreadable. sidecar.core.pushback holds the route for that long (a
    # 429's quota: instead of cutting its concurrency limit).
    retry_after_s: float | None = None
    # A probe admission sent instead of refusing (Decision.is_rescue): only its answer
    # may end a quarantine's cooldown early (sidecar.core.rescue_probe).
    is_rescue: bool = False
    # A censored outcome whose ttft_s is nevertheless a measurement: its first token
    # was seen (a stream's first body byte, not tokenless, plus the route's offset; the
    # lab's or the timer's first token) before the client left or Envoy gave up. Only
    # its e2e and TPOT are unknown, so a cancel keeps the TTFT as evidence
    # (sidecar.core.judging.judge_censored): the OpenAI SDK's default client leaves at
    # [DONE] and Envoy often logs its complete answers as cancels.
    ttft_measured: bool = False

    # Written out for the compiled lab (one per simulated request; sidecar.core.frozen).
    def __init__(
        self, cluster: str, slice: SliceKey, outcome: Outcome, status: int | None = None,
        ttft_s: float | None = None, tpot_s: float | None = None,
        e2e_s: float | None = None, output_tokens: int | None = None,
        is_retry: bool = False, is_probe: bool = False, censored: bool = False,
        sent_load: float | None = None, attempt: bool = False,
        retry_after_s: float | None = None, is_rescue: bool = False,
        ttft_measured: bool = False,
    ) -> None:
        object.__setattr__(self, "cluster", cluster)
        object.__setattr__(self, "slice", slice)
        object.__setattr__(self, "outcome", outcome)
        object.__setattr__(self, "status", status)
        object.__setattr__(self, "ttft_s", ttft_s)
        object.__setattr__(self, "tpot_s", tpot_s)
        object.__setattr__(self, "e2e_s", e2e_s)
        object.__setattr__(self, "output_tokens", output_tokens)
        object.__setattr__(self, "is_retry", is_retry)
        object.__setattr__(self, "is_probe", is_probe)
        object.__setattr__(self, "censored", censored)
        object.__setattr__(self, "sent_load", sent_load)
        object.__setattr__(self, "attempt", attempt)
        object.__setattr__(self, "retry_after_s", retry_after_s)
        object.__setattr__(self, "is_rescue", is_rescue)
        object.__setattr__(self, "ttft_measured", ttft_measured)

    def judged(self, outcome: Outcome, ttft_s: float | None, e2e_s: float | None,
               censored: bool) -> Observation:
        """This observation with another outcome, latencies and censoring, the rest
        kept (sidecar.core.judging.judge_censored): ``dataclasses.replace`` written out,
        which costs about 2.4x as much interpreted and 14x compiled."""
        return Observation(self.cluster, self.slice, outcome, self.status, ttft_s,
                           self.tpot_s, e2e_s, self.output_tokens, self.is_retry,
                           self.is_probe, censored, self.sent_load, self.attempt,
                           self.retry_after_s, self.is_rescue, self.ttft_measured)


fast_init(Observation)


@dataclass(frozen=True, slots=True)
class CandidateExplain:
    """One candidate's journey through the selection pipeline."""

    cluster: str
    verdicts: dict[str, str] = field(default_factory=dict)  # filter -> "pass" or reason
    scores: dict[str, float] = field(default_factory=dict)  # scorer -> value
    state: str = "healthy"
    weight: float = 1.0
    stats_slice: str = ""
    fell_back: bool = False


@dataclass(frozen=True, slots=True)
class Explain:
    """Why a decision was made; rendered by /explain and the opt-in debug header."""

    slice: str
    candidates: tuple[CandidateExplain, ...]
    picker: str
    notes: tuple[str, ...] = ()


Admission = Literal["admit", "queue", "defer", "shed", "reject", "skip"]


@dataclass(frozen=True, slots=True)
class Decision:
    """The core's answer for one request.

    ``reason`` is a small closed vocabulary (used as a metrics label):
    scored, only_candidate, no_data, no_percentile, unknown_model, not_llm (a path
    outside the classified APIs: the default route by design), panic, probe,
    trial (a route on trial takes its next trial, sidecar.core.health), admission.
    """

    cluster: str
    reason: str
    upstream_model: str | None = None  # set when the cluster serves the model under another name
    admission: Admission = "admit"
    status: int | None = None  # HTTP status for non-admit outcomes
    retry_after_s: int | None = None
    timeout_ms: float | None = None  # per-request upstream timeout to set
    is_probe: bool = False
    is_retry: bool = False  # recognised retry: its latency is not counted as evidence twice
    # Priority below admission.shed_below_priority: the slot it holds gives way to more
    # important work beyond max_concurrency (Router.started/finished count it apart).
    low: bool = False
    explain: Explain | None = None
    detail: str = ""
    # A probe sent instead of a refusal for want of room (sidecar.core.rescue_probe):
    # carried to its Observation, whose answer alone may end a quarantine early.
    is_rescue: bool = False

    # Written out for the compiled lab: a native class there, whose fields the
    # decision path reads as C struct fields (sidecar.core.frozen).
    def __init__(
        self, cluster: str, reason: str, upstream_model: str | None = None,
        admission: Admission = "admit", status: int | None = None,
        retry_after_s: int | None = None, timeout_ms: float | None = None,
        is_probe: bool = False, is_retry: bool = False, low: bool = False,
        explain: Explain | None = None, detail: str = "", is_rescue: bool = False,
    ) -> None:
        object.__setattr__(self, "cluster", cluster)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "upstream_model", upstream_model)
        object.__setattr__(self, "admission", admission)
        object.__setattr__(self, "status", status)
        object.__setattr__(self, "retry_after_s", retry_after_s)
        object.__setattr__(self, "timeout_ms", timeout_ms)
        object.__setattr__(self, "is_probe", is_probe)
        object.__setattr__(self, "is_retry", is_retry)
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "explain", explain)
        object.__setattr__(self, "detail", detail)
        object.__setattr__(self, "is_rescue", is_rescue)


fast_init(Decision)


@fast_init
@dataclass(frozen=True, slots=True)
class TransitionEvent:
    """A health-state change of one (cluster, slice); every transition has a reason."""

    at: float
    cluster: str
    slice: str
    old: str
    new: str
    reason: str
