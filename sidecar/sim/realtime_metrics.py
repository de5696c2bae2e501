"""Scoring both runs with the simulator's own :class:`~sidecar.sim.metrics.Metrics`:
the simulator's summary with its attempt log and peak load, and the real calls in
the same summary format.

Part of :mod:`sidecar.sim.realtime` (split for size).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from sidecar.core.classify import token_profile
from sidecar.core.types import SliceKey
from sidecar.sim.engine import Simulation
from sidecar.sim.metrics import Metrics, slo_value
from sidecar.sim.realtime_load import RealCall
from sidecar.sim.records import Attempt, Call
from sidecar.sim.scenario import EventSpec, Scenario

# ---------------------------------------------------------------- metrics


class _Recording(Metrics):
    """The simulator's metrics, also logging ``(time, class, cluster)`` per attempt sent."""

    def __init__(self, sc: Scenario, horizon: float) -> None:
        super().__init__(sc.config, sc.warmup, sc.duration, sc.bucket, horizon)
        self.log: list[tuple[float, str, str]] = []

    def sent(self, att: Attempt, now: float) -> None:
        super().sent(att, now)
        self.log.append((now, att.call.klass, att.cluster))


def simulate(sc: Scenario, policy: str = "tailroute", *,
             noise_seed: int | None = None) -> dict[str, Any]:
    """The simulator's summary plus ``attempt_log`` ((time, class, cluster) per attempt)
    and ``peak_load`` (peak in-flight / capacity per provider).

    ``noise_seed`` varies the service draws and the policy's randomness but not the
    traffic (arrivals and tokens stay those of ``sc.seed``, as in the real run).
    """
    sim = Simulation(sc, policy, noise_seed=noise_seed)
    rec = _Recording(sc, sim.horizon)
    sim.metrics = rec
    out = sim.run()
    out["attempt_log"] = rec.log
    out["peak_load"] = {n: round(p.peak_inflight / p.spec.capacity, 4)
                        for n, p in sim.providers.items()}
    return out


def summarize_real(sc: Scenario, calls: Sequence[RealCall]) -> dict[str, Any]:
    """The real run in the simulator's summary format (same :class:`Metrics` code),
    plus ``attempt_log``, ``peak_load`` (peak in-flight / capacity per provider),
    ``unfinished`` (never sent or still open at the end) and ``no_cluster``
    (answered without an ``x-fake-provider`` header: by Envoy itself)."""
    horizon = sc.duration + sc.drain
    rec = _Recording(sc, horizon)
    candidates = {m.name: m.candidates for m in sc.config.models}
    inflight: dict[str, list[tuple[float, int]]] = {c: [] for c in sc.config.cluster_names}
    unfinished = unknown = 0
    for i, rc in enumerate(calls):
        p, wl = rc.planned, rc.planned.wl
        if math.isnan(rc.sent):
            unfinished += 1
            continue
        cls = sc.config.workload_class(wl.klass)
        assert cls is not None
        declared = p.output_tokens  # max_tokens: output
        key = SliceKey(wl.model, wl.klass, token_profile(p.input_tokens, declared), wl.stream)
        call = Call(i, wl, cls, wl.model, wl.stream, p.input_tokens, p.output_tokens, declared,
                    key, candidates[wl.model], rc.sent, sc.warmup <= rc.sent < sc.duration)
        if rc.cluster not in inflight:
            unknown += 1  # answered by Envoy itself (no upstream): no cluster to count
        else:
            att = Attempt(call, 0, rc.sent)
            att.cluster = rc.cluster
            att.degraded = _degraded(sc.events, rc.cluster, call, rc.sent)
            rec.sent(att, rc.sent)
            rec.attempt_done(att)
            inflight[rc.cluster].append((rc.sent, 1))
            inflight[rc.cluster].append((rc.end if rc.end is not None else horizon, -1))
        if rc.kind == "unfinished" or rc.end is None:
            unfinished += 1
            continue
        if rc.kind == "ok":
            call.end_at = rc.end
            call.first_token_at = rc.first
            if wl.stream and rc.first is not None and p.output_tokens > 1:
                call.tpot_s = (rc.end - rc.first) / (p.output_tokens - 1)
            rec.call_done(call, "ok", slo_value(call), rc.end)
        else:
            rec.call_done(call, rc.kind, None, rc.end)
    peaks = {c: _peak(ev) / sc.providers[c].capacity for c, ev in inflight.items()}
    out = rec.summary(peaks)
    out["unfinished"] = unfinished
    out["no_cluster"] = unknown
    out["attempt_log"] = rec.log
    out["peak_load"] = {c: round(v, 4) for c, v in peaks.items()}
    return out


def _degraded(events: Sequence[EventSpec], cluster: str, call: Call, t: float) -> bool:
    for e in events:
        if e.provider != cluster or not e.active(t):
            continue
        if e.match is None or e.match.matches(call.klass, call.model, call.stream,
                                              call.slice.profile, call.input_tokens,
                                              call.output_tokens):
            return True
    return False


def _peak(events: list[tuple[float, int]]) -> int:
    n = peak = 0
    for _, d in sorted(events):
        n += d
        peak = max(peak, n)
    return peak
