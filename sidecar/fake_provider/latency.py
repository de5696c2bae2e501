"""Latency model, run-time profile and schedule parsing for the fake LLM provider.

Kept apart from the HTTP server so the statistical behaviour can be tested and
reused (e.g. by benchmarks) without starting sockets.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

#: Standard-normal quantile of 0.99: for a lognormal, p99 = median * exp(Z99 * sigma).
Z99 = 2.326
#: Samples are capped at this multiple of p99. It only bites beyond ~p99.99, and
#: keeps one freak sample from stalling a benchmark for minutes.
TAIL_CAP = 10.0
OUTAGE_MODES = ("close", "503")
#: How a stream that fails mid-way reports it (sidecar.fake_provider.reply.Reply.error_event).
MIDSTREAM_ERROR_SHAPES = ("openai", "anthropic", "vllm", "responses_error", "response_failed",
                          "plain_string", "error_code")
#: Control fields that change a :class:`Profile`; the rest are flags.
PROFILE_FIELDS = (
    "ttft_ms", "tpot_ms", "error_rate", "error_status", "stall_ms", "outage", "outage_mode",
    "role_first", "end_delay_ms", "midstream_error_rate", "midstream_error_shape",
    "retry_after", "retry_after_ms", "waiting_comment_ms",
)
#: Longest header value a control payload may set (the fake sends it verbatim).
MAX_HEADER_VALUE = 256
CONTROL_FLAGS = ("streaming_only", "reset", "clear_streaming_override")
#: A switch, not a flag: it stays as set until changed, so only a present one counts.
HOLD = "hold"


class ConfigError(ValueError):
    """An invalid latency spec, control payload or schedule."""


def _num(value: object, what: str) -> float:
    # bool is an int subclass; `"outage": true` sent to a numeric field is a mistake.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{what} must be a number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class LatencyDist:
    """A latency distribution in milliseconds: fixed, or lognormal from median and p99.

    With ``p99_ms`` None (or equal to the median) every sample is ``median_ms``.
    Otherwise samples are lognormal with ``mu = ln(median)`` and
    ``sigma = ln(p99 / median) / 2.326``.
    """

    median_ms: float
    p99_ms: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.median_ms) and self.median_ms >= 0):
            raise ConfigError(f"median must be a finite number >= 0, got {self.median_ms}")
        if self.p99_ms is not None:
            if not (math.isfinite(self.p99_ms) and self.p99_ms >= self.median_ms):
                raise ConfigError(f"p99 ({self.p99_ms}) must be finite and >= median")
            if self.median_ms == 0 and self.p99_ms > 0:
                raise ConfigError("a lognormal needs median > 0")

    @property
    def sigma(self) -> float:
        """Lognormal shape parameter (0 for a fixed latency)."""
        if self.p99_ms is None or self.p99_ms == self.median_ms:
            return 0.0
        return math.log(self.p99_ms / self.median_ms) / Z99

    def sample_ms(self, rng: random.Random) -> float:
        """Draw one latency in milliseconds using ``rng``."""
        sigma = self.sigma
        if sigma == 0.0 or self.p99_ms is None:
            return self.median_ms
        return min(rng.lognormvariate(math.log(self.median_ms), sigma), TAIL_CAP * self.p99_ms)

    @classmethod
    def parse(cls, spec: object) -> LatencyDist:
        """Build from ``50``, ``"50"``, ``"50:80"``, ``{"median": 50, "p99": 80}`` or
        ``{"fixed": 5}``.

        A bare number or a string without ``:P99`` means a fixed latency.
        """
        if isinstance(spec, str):
            med, _, tail = spec.partition(":")
            try:
                return cls(float(med), float(tail) if tail.strip() else None)
            except ValueError as exc:
                raise ConfigError(f"bad latency spec {spec!r} (want MEDIAN[:P99])") from exc
        if isinstance(spec, Mapping):
            unknown = set(spec) - {"median", "p99", "fixed"}
            if unknown:
                raise ConfigError(f"unknown latency keys {sorted(unknown)}")
            if "fixed" in spec:
                return cls(_num(spec["fixed"], "fixed"))
            if "median" in spec:
                p99 = spec.get("p99")
                median = _num(spec["median"], "median")
                return cls(median, None if p99 is None else _num(p99, "p99"))
            raise ConfigError("latency object needs 'median' or 'fixed'")
        return cls(_num(spec, "latency"))

    def to_json(self) -> dict[str, float | None]:
        """JSON form accepted back by :meth:`parse`."""
        return {"median": self.median_ms, "p99": self.p99_ms}


@dataclass(frozen=True)
class Profile:
    """Everything that decides how one request is answered."""

    ttft: LatencyDist = LatencyDist(50.0, 80.0)
    tpot: LatencyDist = LatencyDist(5.0, 8.0)
    error_rate: float = 0.0
    error_status: int = 500
    stall_ms: float = 0.0
    outage: bool = False
    #: "close": drop the connection without a response; "503": answer 503.
    outage_mode: str = "close"
    #: Streamed chat: open with a role-only event at once (as many servers do), so the
    #: first body byte comes about one prefill before the first token.
    role_first: bool = False
    #: Streamed: hold the body's terminating chunk this long after ``data: [DONE]`` (a
    #: server that flushes the last event before it finishes the response).
    end_delay_ms: float = 0.0
    #: Streamed: while a request waits for its first token, an SSE comment (``:
    #: keep-alive``) every this many ms (0: none), as gateways that keep idle
    #: connections open do: only the slow streams then open before their first token.
    waiting_comment_ms: float = 0.0
    #: Streamed: this share of the 200 streams fails half-way (after half the tokens,
    #: at least one): an error event of ``midstream_error_shape``, then the body ends.
    midstream_error_rate: float = 0.0
    midstream_error_shape: str = "openai"
    #: Sent verbatim with every ``error_rate`` answer (a 429 with ``error_status: 429``)
    #: as ``retry-after`` / ``retry-after-ms``; None: not sent. A number is sent as
    #: written (``2`` -> "2", ``1.5`` -> "1.5"); a string as it is, so a test can send
    #: an HTTP-date or garbage.
    retry_after: str | None = None
    retry_after_ms: str | None = None

    def updated(self, changes: Mapping[str, Any]) -> Profile:
        """Return a copy with control-JSON ``changes`` applied (see ``PROFILE_FIELDS``)."""
        kw: dict[str, Any] = {}
        for key, value in changes.items():
            if key in ("ttft_ms", "tpot_ms"):
                kw["ttft" if key == "ttft_ms" else "tpot"] = LatencyDist.parse(value)
            elif key in ("error_rate", "midstream_error_rate"):
                rate = _num(value, key)
                if not 0.0 <= rate <= 1.0:
                    raise ConfigError(f"{key} must be within [0, 1], got {rate}")
                kw[key] = rate
            elif key == "midstream_error_shape":
                if value not in MIDSTREAM_ERROR_SHAPES:
                    raise ConfigError(f"midstream_error_shape must be one of "
                                      f"{MIDSTREAM_ERROR_SHAPES}, got {value!r}")
                kw[key] = value
            elif key == "error_status":
                if isinstance(value, bool) or not isinstance(value, int) or not 400 <= value <= 599:
                    raise ConfigError(f"error_status must be an int in 400..599, got {value!r}")
                kw[key] = value
            elif key in ("stall_ms", "end_delay_ms", "waiting_comment_ms"):
                ms = _num(value, key)
                if not (math.isfinite(ms) and ms >= 0):
                    raise ConfigError(f"{key} must be >= 0, got {ms}")
                kw[key] = ms
            elif key in ("outage", "role_first"):
                if not isinstance(value, bool):
                    raise ConfigError(f"{key} must be a boolean, got {value!r}")
                kw[key] = value
            elif key in ("retry_after", "retry_after_ms"):
                kw[key] = _header_value(value, key)
            elif key == "outage_mode":
                if value not in OUTAGE_MODES:
                    raise ConfigError(f"outage_mode must be one of {OUTAGE_MODES}, got {value!r}")
                kw[key] = value
            else:
                raise ConfigError(f"unknown control field {key!r}")
        return replace(self, **kw)

    def to_json(self) -> dict[str, Any]:
        """Control-JSON form of this profile (round-trips through :meth:`updated`)."""
        return {
            "ttft_ms": self.ttft.to_json(),
            "tpot_ms": self.tpot.to_json(),
            "error_rate": self.error_rate,
            "error_status": self.error_status,
            "stall_ms": self.stall_ms,
            "outage": self.outage,
            "outage_mode": self.outage_mode,
            "role_first": self.role_first,
            "end_delay_ms": self.end_delay_ms,
            "waiting_comment_ms": self.waiting_comment_ms,
            "midstream_error_rate": self.midstream_error_rate,
            "midstream_error_shape": self.midstream_error_shape,
            "retry_after": self.retry_after,
            "retry_after_ms": self.retry_after_ms,
        }


def _header_value(value: object, what: str) -> str | None:
    """A header value to send verbatim: None (not sent), a finite number, or printable
    ASCII text (no CR/LF: a control payload must not be able to add headers)."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise ConfigError(f"{what} must be finite, got {value!r}")
        return str(int(value)) if float(value).is_integer() else repr(float(value))
    if (isinstance(value, str) and len(value) <= MAX_HEADER_VALUE
            and value.isascii() and value.isprintable()):
        return value
    raise ConfigError(f"{what} must be null, a number or printable ASCII text of at most "
                      f"{MAX_HEADER_VALUE} characters, got {value!r}")


def split_control(payload: Mapping[str, Any]) -> tuple[dict[str, bool], dict[str, Any]]:
    """Split a control payload into its boolean flags and its profile changes.

    Validates the changes against a default profile so that a bad payload is
    rejected as a whole before anything is applied.
    The flags are every one of :data:`CONTROL_FLAGS` (absent = false) and
    :data:`HOLD` only when the payload sets it.
    """
    flags: dict[str, bool] = {}
    for name in (*CONTROL_FLAGS, HOLD):
        if name == HOLD and name not in payload:
            continue
        value = payload.get(name, False)
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be a boolean, got {value!r}")
        flags[name] = value
    changes = {k: v for k, v in payload.items() if k not in flags}
    Profile().updated(changes)
    return flags, changes


@dataclass(frozen=True)
class ScheduleEntry:
    """Apply control payload ``changes`` ``at_s`` seconds after the server started."""

    at_s: float
    changes: Mapping[str, Any]


def parse_schedule(spec: str | list[Any]) -> list[ScheduleEntry]:
    """Parse ``[{"at_s": 5, "set": {...}}, ...]`` given as a list, JSON text or ``@path``."""
    if isinstance(spec, str):
        try:
            text = Path(spec[1:]).read_text() if spec.startswith("@") else spec
            spec = json.loads(text)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read schedule: {exc}") from exc
    if not isinstance(spec, list):
        raise ConfigError("schedule must be a JSON list")
    entries: list[ScheduleEntry] = []
    for item in spec:
        if not isinstance(item, Mapping) or set(item) != {"at_s", "set"}:
            raise ConfigError(f"schedule entries need exactly 'at_s' and 'set', got {item!r}")
        at_s = _num(item["at_s"], "at_s")
        if not (math.isfinite(at_s) and at_s >= 0) or not isinstance(item["set"], Mapping):
            raise ConfigError(f"bad schedule entry {item!r}")
        split_control(item["set"])  # fail at startup, not minutes later
        entries.append(ScheduleEntry(at_s, dict(item["set"])))
    return sorted(entries, key=lambda e: e.at_s)
