"""Parsing of distributions in scenario files: latencies, token counts and error mixes.

Part of :mod:`sidecar.sim.loader` (split for size); the formats are documented
in docs/scenarios.md and every error names the file and the field path.
Latencies are written in milliseconds and returned in seconds.
"""

from __future__ import annotations

from typing import Any, Final

from sidecar.sim.dists import Lognormal, TokenDist
from sidecar.sim.heavy import HeavyTailed, Latency, ParetoTail
from sidecar.sim.scenario import ErrorSpec
from sidecar.sim.validate import Reader

_WEIGHT_SLACK: Final = 1e-6
DEFAULT_ERROR_AFTER_MS: Final = 50.0


def parse_latency_ms(r: Reader, key: str, default: float | None) -> Latency:
    """A latency: ``300`` (fixed ms), ``{median, p99}`` (lognormal), optionally with
    ``pareto_tail``, or ``{mixture: [{weight, median, p99}, ...]}`` (lognormal mixture,
    optionally with ``pareto_tail``)."""
    raw: Any = r.raw(key)
    if raw is None:
        if default is None:
            r.fail("required field is missing", key)
        return Lognormal(float(default or 0.0) / 1000.0, float(default or 0.0) / 1000.0)
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        ms = r.num(key, lo=0)
        return Lognormal(ms / 1000.0, ms / 1000.0)
    s = r.sub(key)
    if s.has("mixture"):
        for k in ("median", "p99"):
            if s.has(k):
                s.fail("give either median/p99 or mixture, not both", k)
        comps = []
        for i, item in enumerate(s.list_("mixture", required=True)):
            c = s.item("mixture", i, item)
            w = c.num("weight", gt=0, hi=1)
            comps.append((w, _lognormal(c)))
            c.done()
        if not comps:
            s.fail("must list at least one component", "mixture")
        total = sum(w for w, _ in comps)
        if abs(total - 1.0) > _WEIGHT_SLACK:
            s.fail(f"weights must sum to 1, got {total:g}", "mixture")
    else:
        comps = [(1.0, _lognormal(s))]
    tail = _pareto(s, comps) if s.has("pareto_tail") else None
    s.raw("pareto_tail")
    s.done()
    if len(comps) == 1 and tail is None:
        return comps[0][1]
    return HeavyTailed(tuple(comps), tail)


def _lognormal(s: Reader) -> Lognormal:
    median = s.num("median", gt=0)
    p99 = s.num("p99", median, lo=0)
    if p99 < median:
        s.fail(f"must be >= median ({median:g}), got {p99:g}", "p99")
    return Lognormal(median / 1000.0, p99 / 1000.0)


def _pareto(s: Reader, comps: list[tuple[float, Lognormal]]) -> ParetoTail:
    t = s.sub("pareto_tail")
    body_p99 = HeavyTailed(tuple(comps)).p99 if len(comps) > 1 else comps[0][1].p99
    weight = t.num("weight", gt=0)
    if weight >= 1:
        t.fail(f"must be < 1 (the rest is the body), got {weight:g}", "weight")
    alpha = t.num("alpha", gt=0)
    start = t.num("from_ms", body_p99 * 1000.0, gt=0) / 1000.0
    cap = t.num("max_ms", start * 100_000.0, gt=0) / 1000.0
    if cap < start:
        t.fail(f"must be >= from_ms ({start * 1000:g}), got {cap * 1000:g}", "max_ms")
    t.done()
    return ParetoTail(weight, alpha, start, cap)


def parse_tokens(r: Reader, key: str, default: int | None) -> TokenDist:
    """``key: 200`` (fixed) or ``key: {median: 200, p99: 2000, min: 1, max: 8192}``."""
    raw: Any = r.raw(key)
    if raw is None:
        if default is None:
            r.fail("required field is missing", key)
        d = float(default or 1)
        return TokenDist(Lognormal(d, d))
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        n = r.int_(key, lo=1)
        return TokenDist(Lognormal(float(n), float(n)), n, n)
    s = r.sub(key)
    median = s.num("median", gt=0)
    p99 = s.num("p99", median, lo=0)
    lo = s.int_("min", 1, lo=1)
    hi = s.int_("max", 1_000_000, lo=1)
    s.done()
    if p99 < median:
        s.fail(f"must be >= median ({median:g}), got {p99:g}", "p99")
    if hi < lo:
        s.fail(f"must be >= min ({lo}), got {hi}", "max")
    return TokenDist(Lognormal(median, p99), lo, hi)


def parse_errors(r: Reader, key: str = "errors") -> tuple[ErrorSpec, ...]:
    """``errors: [{rate, status, after_ms, retry_after_ms}, ...]``: a status mix, each
    with its own delay (a latency, so slow errors can be spread: ``after_ms: {median:
    8000, p99: 15000}``) and, optionally, the wait its answers declare (``Retry-After``;
    absent: none, as a provider that says nothing). Status 200 is a stream that fails
    mid-way behind its 200 (an error event, then the end): an error to its client and,
    as the sidecar reads it (sidecar.core.timing), an error not dated by its duration."""
    out: list[ErrorSpec] = []
    for i, raw in enumerate(r.list_(key)):
        e = r.item(key, i, raw)
        wait = e.num("retry_after_ms", 0.0, lo=0) if e.has("retry_after_ms") else None
        status = e.int_("status", 503, lo=200, hi=599)
        if 200 < status < 400:
            e.fail(f"must be 200 (failed mid-stream) or 400..599, got {status}", "status")
        out.append(ErrorSpec(
            rate=e.num("rate", gt=0, hi=1),
            status=status,
            after=parse_latency_ms(e, "after_ms", DEFAULT_ERROR_AFTER_MS),
            retry_after=None if wait is None else wait / 1000.0,
        ))
        e.done()
    total = sum(x.rate for x in out)
    if total > 1.0 + _WEIGHT_SLACK:
        r.fail(f"rates add up to {total:g}, more than 1", key)
    return tuple(out)
