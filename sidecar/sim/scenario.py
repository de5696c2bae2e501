"""The validated, frozen form of a scenario file (the format is in docs/scenarios.md).

Parsing lives in :mod:`sidecar.sim.loader`; these types are what the engine,
the providers and the traffic generators read. Times are seconds here (the
YAML speaks milliseconds where the field name says ``_ms``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sidecar.core.config import Config
from sidecar.sim.dists import TokenDist
from sidecar.sim.heavy import Latency
from sidecar.sim.replica_spec import ReplicaSpec

StepKind = Literal["critical", "optional"]
MaxTokens = int | Literal["output"] | None


@dataclass(frozen=True, slots=True)
class ErrorSpec:
    """One part of a status mix: share ``rate`` of requests answered ``status`` after
    ``after``, declaring ``retry_after`` seconds (a ``Retry-After`` header) if set."""

    rate: float
    status: int
    after: Latency  # seconds (a fixed 20 ms for fast 503s, a spread for slow 504s)
    retry_after: float | None = None  # a time-based quota's declared wait (429s)


@dataclass(frozen=True, slots=True)
class ProviderSpec:
    """One simulated upstream (one cluster of the embedded tailroute config)."""

    name: str
    capacity: int  # concurrent generation slots
    queue_limit: int  # FIFO queue length beyond which the provider answers 429
    contention: float  # alpha: service time x (1 + alpha * busy / capacity)
    ttft: Latency  # seconds, for a request with no input tokens
    prefill_per_1k: float  # seconds added to the TTFT median per 1000 input tokens
    tpot: Latency  # seconds per output token after the first
    error_rate: float
    error_status: int
    error_after: float  # seconds until an error answer arrives
    stall_rate: float  # share of requests that never answer (held until the client gives up)
    keeps_working_on_cancel: bool  # abandoned requests keep their slot until they would end
    cost_per_1k_tokens: float
    errors: tuple[ErrorSpec, ...] = ()  # a status mix on top of error_rate


@dataclass(frozen=True, slots=True)
class SliceMatch:
    """Which requests a degradation event affects; ``None`` fields match anything."""

    klass: str | None = None
    model: str | None = None
    stream: bool | None = None
    profile: str | None = None
    min_input_tokens: int = 0
    min_output_tokens: int = 0

    def matches(
        self, klass: str, model: str, stream: bool, profile: str, input_tokens: int,
        output_tokens: int,
    ) -> bool:
        return (
            (self.klass is None or self.klass == klass)
            and (self.model is None or self.model == model)
            and (self.stream is None or self.stream == stream)
            and (self.profile is None or self.profile == profile)
            and input_tokens >= self.min_input_tokens
            and output_tokens >= self.min_output_tokens
        )


@dataclass(frozen=True, slots=True)
class EventSpec:
    """A scheduled change of one provider's behaviour, optionally repeating (flapping)."""

    provider: str
    at: float
    duration: float | None  # None: until the end of the run
    every: float | None = None  # repeat period (flapping); None = once
    count: int = 1  # number of windows when repeating
    match: SliceMatch | None = None
    ttft_factor: float = 1.0
    tpot_factor: float = 1.0
    error_rate: float | None = None
    stall_rate: float | None = None
    tail_rate: float = 0.0  # share of matching requests that hit a slow path ...
    tail_ttft_factor: float = 1.0  # ... whose TTFT is multiplied by this
    tail_tpot_factor: float = 1.0  # ... and TPOT by this (median unchanged: a tail event)
    outage: bool = False
    capacity: int | None = None
    label: str = ""
    errors: tuple[ErrorSpec, ...] = ()  # a status mix while active (scaled by the ramp level)
    ramp_in: float = 0.0  # seconds over which each window's effect grows from none to full
    ramp_out: float = 0.0  # seconds over which it fades to none before the window ends

    @property
    def degrades(self) -> bool:
        """The event changes service (not only capacity): it counts for the
        degraded-share metric and the provider's quiet-time fast path."""
        return (self.ttft_factor != 1.0 or self.tpot_factor != 1.0
                or self.error_rate is not None or self.stall_rate is not None or self.outage
                or self.tail_rate > 0 or bool(self.errors))

    def windows(self, horizon: float) -> list[tuple[float, float]]:
        """The active ``[start, end)`` windows, clipped to ``horizon``."""
        out: list[tuple[float, float]] = []
        n = self.count if self.every is not None else 1
        for k in range(n):
            start = self.at + k * (self.every or 0.0)
            if start >= horizon:
                break
            end = horizon if self.duration is None else min(start + self.duration, horizon)
            out.append((start, end))
        return out

    def active(self, t: float) -> bool:
        if t < self.at:
            return False
        if self.every is None:
            return self.duration is None or t < self.at + self.duration
        k = int((t - self.at) // self.every)
        if k >= self.count:
            return False
        return self.duration is None or t - self.at - k * self.every < self.duration

    def level(self, t: float) -> float:
        """How much of the effect applies at ``t``: 0 outside a window, 1 at full strength,
        linear in between during ``ramp_in`` after a window opens and ``ramp_out`` before
        it closes. A factor ``F`` applies as ``1 + level * (F - 1)``, a rate ``r`` as
        ``level * r``."""
        if t < self.at:
            return 0.0
        x = t - self.at
        if self.every is not None:
            k = int(x // self.every)
            if k >= self.count:
                return 0.0
            x -= k * self.every
        d = self.duration
        if d is not None and x >= d:
            return 0.0
        lvl = 1.0
        if x < self.ramp_in:
            lvl = x / self.ramp_in
        if d is not None and self.ramp_out > 0.0 and d - x < self.ramp_out:
            lvl = min(lvl, (d - x) / self.ramp_out)
        return lvl


@dataclass(frozen=True, slots=True)
class Poisson:
    rate: float  # arrivals per second
    changes: tuple[tuple[float, float], ...] = ()  # (at_s, new rate), ascending
    linear: bool = False  # the rate moves linearly from one change point to the next


@dataclass(frozen=True, slots=True)
class OnOff:
    rate_on: float
    rate_off: float
    on_s: float
    off_s: float
    phase_s: float = 0.0  # the first on-period starts here


@dataclass(frozen=True, slots=True)
class Mmpp:
    """Markov-modulated Poisson: states with a rate and a mean sojourn (exponential)."""

    states: tuple[tuple[float, float], ...]  # (rate, mean_s)


@dataclass(frozen=True, slots=True)
class Trace:
    """Replay of an Azure LLM inference trace (``TIMESTAMP,ContextTokens,GeneratedTokens``)."""

    path: Path
    speedup: float = 1.0  # trace seconds per simulated second
    offset_s: float = 0.0  # skip this much of the trace (trace seconds)
    where: str = ""  # field path, for errors at run time (missing file)


Arrival = Poisson | OnOff | Mmpp | Trace


@dataclass(frozen=True, slots=True)
class ClientSpec:
    """How the calling application behaves."""

    timeout: float | None = None  # seconds; None: the class's timeout (the route timeout)
    first_token_timeout: float | None = None  # give up when no first byte by then
    retries: int = 0
    backoff: float = 0.5  # seconds before the first retry
    backoff_factor: float = 2.0
    jitter: float = 0.2  # +-share of random spread on each backoff
    retry_on: frozenset[str] = frozenset({"error", "timeout"})
    cancel_rate: float = 0.0  # share of calls the user abandons at a uniform time


@dataclass(frozen=True, slots=True)
class StepSpec:
    """One stage of an agentic workflow: ``fanout`` parallel calls."""

    name: str
    kind: StepKind = "critical"
    fanout: int = 1
    input_tokens: TokenDist | None = None  # None: the workload's
    output_tokens: TokenDist | None = None
    max_tokens: MaxTokens = None
    min_budget: float = 0.0  # optional step skipped when less budget than this remains
    klass: str | None = None
    stream: bool | None = None


@dataclass(frozen=True, slots=True)
class WorkflowSpec:
    deadline: float  # seconds, end to end, shared by every step
    steps: tuple[StepSpec, ...]


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """A traffic source: arrivals of one kind of request (or workflow)."""

    name: str
    klass: str
    model: str
    stream: bool
    arrival: Arrival
    input_tokens: TokenDist
    output_tokens: TokenDist
    max_tokens: MaxTokens
    client: ClientSpec
    workflow: WorkflowSpec | None = None
    start: float = 0.0
    end: float | None = None


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    source: str
    seed: int
    duration: float
    warmup: float
    bucket: float
    drain: float
    config: Config
    providers: dict[str, ProviderSpec]
    events: tuple[EventSpec, ...]
    workloads: tuple[WorkloadSpec, ...]
    policies: tuple[str, ...] = ()
    tags: tuple[str, ...] = field(default=())
    replicas: ReplicaSpec | None = None  # tailroute as k replicas (sidecar.sim.replicas)


def merged_windows(events: list[EventSpec], horizon: float
                    ) -> tuple[list[float] | None, list[float]]:
    """Start and end times of the union of the events' windows (sorted, disjoint), or
    ``(None, [])`` when they cannot be listed (a window repeating forever)."""
    spans: list[tuple[float, float]] = []
    for e in events:
        if e.every is not None and not math.isfinite(horizon) and e.count > 10_000:
            return None, []
        spans += e.windows(horizon if math.isfinite(horizon) else math.inf)
    spans.sort()
    lo: list[float] = []
    hi: list[float] = []
    for a, b in spans:
        if lo and a <= hi[-1]:
            hi[-1] = max(hi[-1], b)
        else:
            lo.append(a)
            hi.append(b)
    return lo, hi
