"""Upper bounds on policy-lab inputs: what a scenario file or the command line may ask for.

The simulator keeps every scored call in memory and a counter per time bucket, so a
scenario that asks for years of simulated time, nanosecond buckets or a billion
requests per second would run for hours or exhaust memory instead of failing. Each
bound below is far above anything the shipped scenarios or the generator use
(docs/scenarios.md, "Bounds"), and every one is checked before a run starts, with an
error naming the file and the field (or the command-line option).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from sidecar.sim.scenario import Mmpp, OnOff, Poisson, Trace, WorkloadSpec

#: Scenario files and trace CSVs larger than this are refused before they are read
#: (the shipped traces are about 1 MB; the largest shipped scenario a few kB).
MAX_FILE_BYTES: Final = 16 << 20
#: ``duration_s`` (and ``--duration``): three days of simulated time.
MAX_DURATION_S: Final = 3 * 86400.0
#: ``drain_s``: one day (the default is the slowest class timeout + 30 s, at most 90 s).
MAX_DRAIN_S: Final = 86400.0
#: Time buckets over ``duration_s + drain_s`` (``bucket_s`` may not be smaller than
#: that span / this); the default 10 s bucket gives 34,561 at the longest span.
MAX_BUCKETS: Final = 100_000
#: Any arrival rate (``rate_per_s``, ``rate_on``, ``rate_off``, MMPP state rates).
MAX_RATE_PER_S: Final = 10_000.0
#: Expected simulated requests of one scenario: arrival rate x duration summed over
#: the workloads, times the calls of one workflow (its steps' fan-outs). The largest
#: shipped scenario expects 18 thousand, the largest generated one (family seeds 1-20,
#: 200 each) 67 thousand. The simulator keeps a record per call: 576 thousand calls
#: took 64 s and 300 MB for one policy, so the cap means minutes and about 1 GB.
MAX_EXPECTED_CALLS: Final = 2_000_000
#: Repetitions of one event window (``repeat``) within ``duration_s + drain_s``.
MAX_EVENT_WINDOWS: Final = 100_000
#: ``--noise-seeds K``: runs of each policy per scenario.
MAX_NOISE_SEEDS: Final = 100
#: ``--generate N``: scenarios per run (the documented figures use 200).
MAX_GENERATE: Final = 10_000
#: ``--jobs J``: parallel processes.
MAX_JOBS: Final = 64


def mean_rate(arrival: Poisson | OnOff | Mmpp, start: float, end: float) -> float:
    """Expected arrivals of ``arrival`` in ``[start, end)`` (seconds of simulated time).

    Exact for Poisson (steps or linear ramps); the long-run mean for on/off and MMPP
    (a state's share of time is its mean sojourn's share: the next state is uniform
    over the others, so every state is entered equally often).
    """
    if end <= start:
        return 0.0
    if isinstance(arrival, OnOff):
        period = arrival.on_s + arrival.off_s
        mean = (arrival.rate_on * arrival.on_s + arrival.rate_off * arrival.off_s) / period
        return mean * (end - start)
    if isinstance(arrival, Mmpp):
        total = sum(m for _, m in arrival.states)
        return sum(r * m for r, m in arrival.states) / total * (end - start)
    points = [(0.0, arrival.rate), *arrival.changes]
    out = 0.0
    for i, (at, r0) in enumerate(points):
        nxt, r1 = points[i + 1] if i + 1 < len(points) else (end, r0)
        if not arrival.linear:
            r1 = r0
        lo, hi = max(at, start), min(nxt, end)
        if lo >= hi:
            continue
        slope = (r1 - r0) / (nxt - at) if nxt > at else 0.0
        rate_lo, rate_hi = r0 + slope * (lo - at), r0 + slope * (hi - at)
        out += (rate_lo + rate_hi) / 2.0 * (hi - lo)
    return out


def expected_calls(wl: WorkloadSpec, duration: float) -> float:
    """Expected calls of one workload over a run of ``duration`` seconds (0 for trace
    replay: a trace's records are bounded by :data:`MAX_FILE_BYTES`)."""
    if isinstance(wl.arrival, Trace):
        return 0.0
    end = min(wl.end if wl.end is not None else duration, duration)
    per_arrival = sum(s.fanout for s in wl.workflow.steps) if wl.workflow is not None else 1
    return mean_rate(wl.arrival, wl.start, end) * per_arrival


def calls_problem(workloads: Sequence[WorkloadSpec], duration: float) -> str | None:
    """Why the workloads ask for too many requests over ``duration``, or None."""
    per = [expected_calls(wl, duration) for wl in workloads]
    total = sum(per)
    if total <= MAX_EXPECTED_CALLS:
        return None
    top = max(range(len(per)), key=per.__getitem__)
    return (f"about {total:.3g} simulated requests expected (arrival rate x {duration:g} s, "
            f"workflow fan-out included; most from workloads[{top}] "
            f"{workloads[top].name!r}), more than the cap of {MAX_EXPECTED_CALLS:,}: shorten "
            f"duration_s or lower the rates")

