"""Arrival processes: Poisson (with rate changes), on/off bursts, MMPP and trace replay.

Each process is a generator of ``(t, input_tokens, output_tokens)`` where the
token counts are ``None`` unless the process carries them (trace replay); the
caller then draws them from the workload's distributions. Generators are lazy:
the engine keeps one pending arrival per workload in its event queue, so memory
does not grow with the run length.

Poisson, on/off and MMPP are all piecewise-constant-rate Poisson processes: an
exponential gap is drawn at the current rate and, if it crosses the end of the
segment, the draw restarts at the segment boundary (exact, by memorylessness).
A Poisson process with ``interpolate: linear`` ramps its rate between change
points instead (thinning: exact too).
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from sidecar.ops.config_file import TooLarge, read_capped
from sidecar.sim.bounds import MAX_FILE_BYTES
from sidecar.sim.dists import Stream
from sidecar.sim.scenario import Arrival, Mmpp, OnOff, Poisson, Trace, WorkloadSpec
from sidecar.sim.validate import ScenarioError

ArrivalItem = tuple[float, int | None, int | None]

_TRACE_CACHE: Final[dict[Path, list[tuple[float, int, int]]]] = {}


def arrivals(
    spec: Arrival, rng: Stream, start: float, end: float, source: str = ""
) -> Iterator[ArrivalItem]:
    """Arrivals of ``spec`` in ``[start, end)`` (seconds of simulated time)."""
    if isinstance(spec, Trace):
        return _trace(spec, start, end, source)
    if isinstance(spec, Poisson) and spec.linear:
        return _linear(spec, rng, start, end)
    return _piecewise(_segments(spec, rng, start, end), rng)


def _segments(
    spec: Poisson | OnOff | Mmpp, rng: Stream, start: float, end: float
) -> Iterator[tuple[float, float, float]]:
    """Yield ``(segment start, segment end, rate)`` covering ``[start, end)``."""
    if isinstance(spec, Poisson):
        points = [(0.0, spec.rate), *spec.changes]
        for i, (at, rate) in enumerate(points):
            nxt = points[i + 1][0] if i + 1 < len(points) else end
            lo, hi = max(at, start), min(nxt, end)
            if lo < hi:
                yield lo, hi, rate
    elif isinstance(spec, OnOff):
        period = spec.on_s + spec.off_s
        if start < spec.phase_s:
            yield start, min(spec.phase_s, end), spec.rate_off
        t = max(start, spec.phase_s)
        while t < end:
            k = int((t - spec.phase_s) // period)
            on_end = spec.phase_s + k * period + spec.on_s
            off_end = spec.phase_s + (k + 1) * period
            if t < on_end:
                yield t, min(on_end, end), spec.rate_on
                t = on_end
            else:
                yield t, min(off_end, end), spec.rate_off
                t = off_end
    else:
        t, state, n = start, 0, len(spec.states)
        while t < end:
            rate, mean = spec.states[state]
            stop = min(t + rng.expovariate(1.0 / mean), end)
            yield t, stop, rate
            t = stop
            # next state: uniformly one of the others (the 2-state case alternates)
            state = (state + 1 + rng.randrange(n - 1)) % n


def _piecewise(
    segments: Iterator[tuple[float, float, float]], rng: Stream
) -> Iterator[ArrivalItem]:
    expo = rng.expovariate
    for lo, hi, rate in segments:
        if rate <= 0:
            continue
        t = lo + expo(rate)
        while t < hi:
            yield t, None, None
            t += expo(rate)


def _linear(spec: Poisson, rng: Stream, start: float, end: float) -> Iterator[ArrivalItem]:
    """A Poisson process whose rate moves linearly between change points (a load ramp),
    constant after the last one. Exact by thinning: candidates at the segment's peak
    rate, each kept with probability rate(t) / peak."""
    points = [(0.0, spec.rate), *spec.changes]
    expo, uni = rng.expovariate, rng.random
    for i, (at, r0) in enumerate(points):
        nxt, r1 = points[i + 1] if i + 1 < len(points) else (end, r0)
        lo, hi = max(at, start), min(nxt, end)
        peak = max(r0, r1)
        if lo >= hi or peak <= 0:
            continue
        slope = (r1 - r0) / (nxt - at) if nxt > at else 0.0
        t = lo + expo(peak)
        while t < hi:
            if uni() * peak < r0 + slope * (t - at):
                yield t, None, None
            t += expo(peak)


# ---------------------------------------------------------------- traces


def load_trace(path: Path, where: str = "") -> list[tuple[float, int, int]]:
    """``(seconds since the first record, context tokens, generated tokens)``, sorted.

    Parsed once per process and cached: the files are read-only inputs.
    """
    key = path.resolve()
    cached = _TRACE_CACHE.get(key)
    if cached is not None:
        return cached
    try:
        lines = read_capped(path, MAX_FILE_BYTES).decode("utf-8").splitlines()
    except TooLarge as exc:
        raise ScenarioError(
            f"{where or path}: trace {path} is larger than {exc}: refused (replay a slice "
            "of it)") from None
    except OSError as exc:
        raise ScenarioError(
            f"{where or path}: cannot read trace {path}: {exc.strerror or exc} "
            f"(pass --trace PATH to point at AzureLLMInferenceTrace_*.csv)"
        ) from None
    except UnicodeDecodeError:
        raise ScenarioError(f"{where or path}: {path} is not an Azure LLM inference trace "
                            "(not UTF-8 text)") from None
    if not lines or lines[0].strip().split(",")[:3] != [
        "TIMESTAMP", "ContextTokens", "GeneratedTokens",
    ]:
        raise ScenarioError(
            f"{where or path}: {path} is not an Azure LLM inference trace "
            "(expected header TIMESTAMP,ContextTokens,GeneratedTokens)"
        )
    rows: list[tuple[float, int, int]] = []
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            ts, ctx, gen = line.split(",")[:3]
            rows.append((_seconds(ts), int(ctx), int(gen)))
        except ValueError:
            raise ScenarioError(f"{path}: line {n}: cannot parse {line[:80]!r}") from None
    if not rows:
        raise ScenarioError(f"{path}: trace has no records")
    rows.sort()
    t0 = rows[0][0]
    out = [(t - t0, c, g) for t, c, g in rows]
    _TRACE_CACHE[key] = out
    return out


def _seconds(ts: str) -> float:
    """``2023-11-16 18:15:46.6805900`` -> seconds since 0001-01-01 (7 fractional digits)."""
    date, _, clock = ts.strip().partition(" ")
    days = _dt.date.fromisoformat(date).toordinal()
    h, m, s = clock.split(":")
    return days * 86400.0 + int(h) * 3600.0 + int(m) * 60.0 + float(s)


def _trace(spec: Trace, start: float, end: float, source: str) -> Iterator[ArrivalItem]:
    rows = load_trace(spec.path, f"{source}: {spec.where}" if source else spec.where)
    for off, ctx, gen in rows:
        if off < spec.offset_s:
            continue
        t = start + (off - spec.offset_s) / spec.speedup
        if t >= end:
            return
        yield t, max(ctx, 1), max(gen, 1)


class Source:
    """One workload's arrival stream and its private random streams."""

    __slots__ = ("_i", "_inp", "_out", "arrived", "cancel_rng", "gen", "tok_rng", "wl")

    def __init__(self, wl: WorkloadSpec, gen: Iterator[ArrivalItem], seed: int) -> None:
        self.wl = wl
        self.gen = gen
        self.tok_rng = Stream(f"{seed}:tokens:{wl.name}")
        self.cancel_rng = Stream(f"{seed}:cancel:{wl.name}")
        self._inp: list[int] = []
        self._out: list[int] = []
        self._i = 0
        self.arrived = 0  # arrivals so far: the next one's ordinal (its draw key)

    def tokens(self) -> tuple[int, int]:
        """The next (input, output) token counts of the workload's distributions.

        Drawn in vectorised blocks: one list index per request on the hot path.
        """
        i = self._i
        if i >= len(self._inp):
            self._inp = self.wl.input_tokens.block(self.tok_rng, 4096)
            self._out = self.wl.output_tokens.block(self.tok_rng, 4096)
            i = 0
        self._i = i + 1
        return self._inp[i], self._out[i]
