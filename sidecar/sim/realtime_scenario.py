"""Adapting a scenario to the real-time run: what the fake provider can reproduce,
the simulator's traffic plan, the fake providers' profiles and control steps, and
the sidecar config pointing at them.

Part of :mod:`sidecar.sim.realtime` (split for size; the mapping between the
simulator and the real stack is described there).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from sidecar.ops.config_file import read_yaml
from sidecar.sim.dists import Lognormal, Stream
from sidecar.sim.heavy import Latency
from sidecar.sim.scenario import Scenario, WorkloadSpec
from sidecar.sim.traffic import Source, arrivals
from sidecar.sim.validate import ScenarioError

VALIDATION_SCENARIO: Final = Path(__file__).parent / "validation" / "envoy_short.yaml"


# ---------------------------------------------------------------- expressibility


def check_realtime(sc: Scenario) -> None:
    """Raise :class:`ScenarioError` listing what the fake provider cannot reproduce."""
    problems: list[str] = []
    for name, p in sc.providers.items():
        if p.prefill_per_1k:
            problems.append(f"providers.{name}.prefill_ms_per_1k: must be 0 (no prefill model)")
        if p.contention:
            problems.append(f"providers.{name}.contention: must be 0 (no contention model)")
        if p.stall_rate:
            problems.append(f"providers.{name}.stall_rate: must be 0 (stalls differ)")
        if p.keeps_working_on_cancel:
            problems.append(f"providers.{name}.keeps_working_on_cancel: not modelled")
        if p.errors:
            problems.append(f"providers.{name}.errors: one error status only (error_rate)")
        for key, d in (("ttft_ms", p.ttft), ("tpot_ms", p.tpot)):
            if not isinstance(d, Lognormal):
                problems.append(f"providers.{name}.{key}: only {{median, p99}} is expressible")
    for i, e in enumerate(sc.events):
        where = f"events[{i}]"
        if e.tail_rate:
            problems.append(f"{where}.tail_rate: a mixture is not expressible; use ttft_factor")
        if e.stall_rate is not None:
            problems.append(f"{where}.stall_rate: not expressible")
        if e.capacity is not None:
            problems.append(f"{where}.capacity: not expressible (no queueing model)")
        if e.errors:
            problems.append(f"{where}.errors: not expressible (one error status only)")
        if e.ramp_in or e.ramp_out:
            problems.append(f"{where}.ramp_s: ramps are not expressible (control steps only)")
        m = e.match
        if m is not None and (m.klass is not None or m.model is not None or m.profile
                              is not None or m.min_input_tokens or m.min_output_tokens
                              or m.stream is not True):
            problems.append(f"{where}.match: only {{stream: true}} is expressible")
        if e.outage and sc.providers[e.provider].error_status != 503:
            problems.append(f"{where}.outage: the fake provider's outage answers 503; set "
                            f"providers.{e.provider}.error_status: 503")
    for i, wl in enumerate(sc.workloads):
        where = f"workloads[{i}]"
        if wl.workflow is not None:
            problems.append(f"{where}.workflow: not supported in real time")
        if wl.max_tokens != "output":
            problems.append(f"{where}.max_tokens: must be 'output' (the fake provider "
                            "generates exactly max_tokens)")
        c = wl.client
        if c.retries or c.cancel_rate or c.first_token_timeout is not None:
            problems.append(f"{where}.client: retries, cancel_rate and first_token_timeout_ms "
                            "are not supported in real time")
    if problems:
        raise ScenarioError(f"{sc.source}: not runnable in real time:\n  " + "\n  ".join(problems))


# ---------------------------------------------------------------- traffic


@dataclass(frozen=True, slots=True)
class Planned:
    """One request of the scenario's traffic: the simulator's arrival, tokens and class."""

    t: float
    wl: WorkloadSpec
    input_tokens: int
    output_tokens: int


def plan_traffic(sc: Scenario) -> list[Planned]:
    """The arrivals and token counts the simulator draws for ``sc.seed``, in time order.

    Same generators and named streams as :class:`~sidecar.sim.engine.Simulation`
    (``"<seed>:arrivals:<workload>"``, ``"<seed>:tokens:<workload>"``), so the
    real run sends exactly the requests the simulator replays.
    """
    out: list[Planned] = []
    for wl in sc.workloads:
        end = min(wl.end if wl.end is not None else sc.duration, sc.duration)
        gen = arrivals(wl.arrival, Stream(f"{sc.seed}:arrivals:{wl.name}"), wl.start, end,
                       sc.source)
        src = Source(wl, gen, sc.seed)
        for t, inp, outp in gen:
            if inp is None or outp is None:
                inp, outp = src.tokens()
            out.append(Planned(t, wl, inp, outp))
    out.sort(key=lambda p: p.t)
    return out


# ---------------------------------------------------------------- providers and events


def _latency(d: Latency, factor: float = 1.0) -> dict[str, float]:
    return {"median": round(d.median * 1000.0 * factor, 3),
            "p99": round(d.p99 * 1000.0 * factor, 3)}


def provider_profile(sc: Scenario, name: str, t: float, stream: bool) -> dict[str, Any]:
    """The fake provider's control profile equivalent to provider ``name`` at time ``t``."""
    spec = sc.providers[name]
    f_ttft = f_tpot = 1.0
    err, outage = spec.error_rate, False
    for e in sc.events:
        if e.provider != name or not e.active(t):
            continue
        if e.match is not None and e.match.stream is True and not stream:
            continue
        f_ttft *= e.ttft_factor
        f_tpot *= e.tpot_factor
        if e.error_rate is not None:
            err = max(err, e.error_rate)
        outage = outage or e.outage
    return {"ttft_ms": _latency(spec.ttft, f_ttft), "tpot_ms": _latency(spec.tpot, f_tpot),
            "error_rate": err, "error_status": spec.error_status, "outage": outage,
            "outage_mode": "503"}


@dataclass(frozen=True, slots=True)
class ControlStep:
    """Control payloads for one fake provider at ``at_s`` seconds into the traffic."""

    at_s: float
    provider: str
    payloads: tuple[dict[str, Any], ...]


def control_plan(sc: Scenario) -> list[ControlStep]:
    """Initial profiles (at 0) and one step per event window edge, in time order."""
    steps: list[ControlStep] = []
    horizon = sc.duration + sc.drain
    for name in sc.providers:
        edges = {0.0}
        for e in sc.events:
            if e.provider == name:
                for lo, hi in e.windows(horizon):
                    edges.update(t for t in (lo, hi) if t < horizon)
        for t in sorted(edges):
            base = provider_profile(sc, name, t, stream=False)
            streaming = provider_profile(sc, name, t, stream=True)
            payloads: list[dict[str, Any]] = [{"clear_streaming_override": True, **base}]
            if streaming != base:
                payloads.append({"streaming_only": True, **streaming})
            steps.append(ControlStep(t, name, tuple(payloads)))
    steps.sort(key=lambda s: (s.at_s, s.provider))
    return steps


def provider_args(sc: Scenario, name: str, max_tokens: int) -> tuple[str, str, list[str]]:
    """``(ttft "M:P", tpot "M:P", extra CLI flags)`` for ``Stack.start_provider``.

    ``max_tokens``: the fake provider's cap on generated tokens (at least the
    largest ``output_tokens`` of the plan, so it never truncates).
    """
    spec = sc.providers[name]
    ttft, tpot = _latency(spec.ttft), _latency(spec.tpot)
    extra = ["--max-tokens", str(max(max_tokens, 1)), "--error-rate", str(spec.error_rate)]
    return f"{ttft['median']}:{ttft['p99']}", f"{tpot['median']}:{tpot['p99']}", extra


def raw_config(path: str | Path) -> dict[str, Any]:
    """The scenario's tailroute config as a plain mapping (inline or ``config_file``)."""
    p = Path(path)
    data = read_yaml(p, "scenario", ScenarioError)
    if "config" in data:
        return dict(data["config"])
    cfg_path = Path(data["config_file"]).expanduser()
    if not cfg_path.is_absolute():
        cfg_path = p.parent / cfg_path
    return dict(read_yaml(cfg_path))


def sidecar_config(raw: Mapping[str, Any], ports: Mapping[str, int]) -> dict[str, Any]:
    """``raw`` with every cluster's address pointing at its fake provider on 127.0.0.1."""
    out = dict(raw)
    out["clusters"] = [{**c, "address": f"127.0.0.1:{ports[c['name']]}"}
                       for c in raw["clusters"]]
    return out
