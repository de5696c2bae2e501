"""The families of generated scenarios: what goes wrong, drawn with random parameters.

Each family draws a :class:`~sidecar.sim.gen_base.Base` (providers, traffic,
SLOs sized to be solvable) and adds its trouble; the parameter ranges are
listed per family below and in docs/scenarios.md. Times are seconds from the
start of the run (warm-up 60 s); "log" means log-uniform.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from statistics import NormalDist
from typing import Any, Final

from sidecar.sim.gen_base import MAX_SCENARIO_S, Z99, Base, Draw, r3

Family = Callable[[Draw], tuple[Base, str]]


def _base(d: Draw, n: tuple[int, int] = (2, 5), rate: tuple[float, float] = (0.5, 50.0),
          duration: float = 600.0, batch: float = 0.5) -> Base:
    b = Base(d, d.int_(*n), d.log(*rate), duration, d.chance(batch))
    b.draw_providers()
    return b


def _fastest(b: Base) -> str:
    return min(b.names, key=lambda n: b.providers[n]["ttft_ms"]["median"])


def _window(d: Draw, b: Base, lo: float, hi: float, until_end: float = 0.0
            ) -> dict[str, Any]:
    """``at_s`` and (unless it lasts to the end) ``duration_s`` of one event window."""
    at = r3(d.uniform(120, 0.4 * b.duration))
    if d.chance(until_end):
        return {"at_s": at}
    return {"at_s": at, "duration_s": r3(min(d.uniform(lo, hi), b.duration - at - 30))}


def drift(d: Draw) -> tuple[Base, str]:
    """One provider drifts slower along a linear ramp (60-400 s) to 2-6x (log) -- the
    TTFT, TTFT and TPOT, or only a tail (5-20 % of requests, the median stays) -- and
    half the time drifts back after 120-300 s; in 30 % of the runs the load also
    ramps up 1.3-2x over the run."""
    b = _base(d, duration=900.0)
    victim = d.pick(b.names)
    f = d.log(2.0, 6.0)
    kind = d.pick(("ttft", "ttft+tpot", "tail"))
    ramp = d.uniform(60, 400)
    ev: dict[str, Any] = {"provider": victim, "label": f"drift {kind} x{f:.1f}",
                          "at_s": r3(d.uniform(120, 300)), "ramp_s": r3(ramp)}
    if kind == "tail":
        ev.update(tail_rate=r3(d.uniform(0.05, 0.2)), tail_ttft_factor=r3(2 * f))
    else:
        ev["ttft_factor"] = r3(f)
        if kind == "ttft+tpot":
            ev["tpot_factor"] = r3(f ** 0.5)
    if d.chance(0.5):
        out = d.uniform(60, 200)
        ev["duration_s"] = r3(min(ev["ramp_s"] + d.uniform(120, 300) + out,
                                  b.duration - ev["at_s"] - 10))
        ev["ramp_out_s"] = r3(min(out, ev["duration_s"] - ev["ramp_s"]))
    b.events.append(ev)
    b.default_workloads()
    if d.chance(0.3):
        grow = d.uniform(1.3, 2.0)
        for wl in b.workloads:
            a = wl["arrival"]
            a["rate_changes"] = [{"at_s": b.duration, "rate_per_s": r3(a["rate_per_s"] * grow)}]
            a["interpolate"] = "linear"
        b.params["load_growth"] = r3(grow)
    b.params.update(victim=victim, kind=kind, factor=r3(f), ramp_s=ev["ramp_s"],
                    back="duration_s" in ev)
    return b, f"{victim} drifts ({kind}) to x{f:.1f} over {ramp:.0f} s"


def spike(d: Draw) -> tuple[Base, str]:
    """1-3 isolated spikes: a random provider 3-10x slower (log) for 4-40 s each. The
    right reaction is almost none."""
    b = _base(d)
    k = d.int_(1, 3)
    for i in range(k):
        f = d.log(3.0, 10.0)
        b.events.append({"provider": d.pick(b.names), "label": f"spike {i + 1} x{f:.1f}",
                         "at_s": r3(d.uniform(90, b.duration - 60)),
                         "duration_s": r3(d.uniform(4, 40)), "ttft_factor": r3(f),
                         "tpot_factor": r3(f ** 0.5)})
    b.default_workloads()
    b.params.update(spikes=k)
    return b, f"{k} isolated spike(s)"


def _errors(d: Draw, kind: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if kind in ("fast", "both"):
        out.append({"rate": r3(d.uniform(0.1, 0.4)), "status": d.pick((503, 500, 429)),
                    "after_ms": r3(d.uniform(5, 60))})
    if kind in ("slow", "both"):
        m = d.uniform(3000, 10000)
        out.append({"rate": r3(d.uniform(0.03, 0.15)), "status": 504,
                    "after_ms": {"median": r3(m), "p99": r3(m * 1.5)}})
    return out


def error_mix(d: Draw) -> tuple[Base, str]:
    """One provider (two in 30 % of runs with >= 3 providers) answers a share of its
    requests with errors: fast (10-40 % quick 503/500/429 after 5-60 ms), slow (3-15 %
    504 after 3-10 s) or both, for 120-400 s or to the end (30 %), ramped in 30 % of
    runs; clients retry once in half of the runs."""
    b = _base(d)
    k = 2 if b.n_providers >= 3 and d.chance(0.3) else 1
    victims = d.sample(b.names, k)
    kinds = []
    for v in victims:
        kind = d.pick(("fast", "slow", "both"))
        kinds.append(kind)
        ev = {"provider": v, "label": f"{kind} errors", **_window(d, b, 120, 400, 0.3),
              "errors": _errors(d, kind)}
        if d.chance(0.3):
            ev["ramp_s"] = r3(d.uniform(10, 60) if "duration_s" not in ev
                              else min(d.uniform(10, 60), ev["duration_s"] / 2))
        b.events.append(ev)
    b.default_workloads()
    if d.chance(0.5):
        for wl in b.workloads:
            wl["client"] = {"retries": 1, "backoff_ms": 200}
    b.params.update(victims=victims, kinds=kinds)
    return b, f"{', '.join(f'{v}: {k}' for v, k in zip(victims, kinds, strict=True))} errors"


def slice_confined(d: Draw) -> tuple[Base, str]:
    """A 3-8x (log) regression on the fastest provider confined to one slice of 5-25 %
    of the traffic: long inputs (> 2048 tokens: chat declares max_tokens 256, so they
    are tailroute's ``medium`` profile), long generations (a ``long``-profile workload,
    TTFT and TPOT) or non-streaming requests (TPOT); from 120-240 s for 300 s or more."""
    b = _base(d, batch=0.0)
    mode = d.pick(("long_input", "long_output", "non_streaming"))
    f = d.log(3.0, 8.0)
    share = d.uniform(0.05, 0.25)
    victim = _fastest(b)
    ev: dict[str, Any] = {"provider": victim, "label": f"{mode} x{f:.1f}",
                          "at_s": r3(d.uniform(120, 240))}
    if mode == "long_input":
        b.chat_max_tokens = 256
        b.output_median, b.output_p99 = 100.0, 250.0
        # share of inputs above 2048 tokens ~ share: a lognormal with median 600
        b.input_p99 = _p99_for_share_above(600.0, 2048.0, share)
        b.workloads = [b.chat(b.rate)]
        ev.update(match={"min_input_tokens": 2049}, ttft_factor=r3(f))
    elif mode == "long_output":
        b.workloads = [b.chat(b.rate * (1 - share)), {
            "name": "longform", "class": "interactive", "stream": True,
            "arrival": {"process": "poisson", "rate_per_s": r3(b.rate * share)},
            "input_tokens": {"median": 800, "p99": 4000},
            "output_tokens": {"median": 600, "p99": 1800}, "max_tokens": 2048}]
        ev.update(match={"profile": "long"}, ttft_factor=r3(f), tpot_factor=r3(f ** 0.5))
    else:
        b.workloads = [b.chat(b.rate * (1 - share)), b.batch_workload(b.rate * share)]
        ev.update(match={"stream": False}, tpot_factor=r3(f))
    if d.chance(0.5):
        ev["duration_s"] = r3(d.uniform(300, b.duration - ev["at_s"] - 30))
    b.events.append(ev)
    b.params.update(victim=victim, mode=mode, factor=r3(f), slice_share=r3(share))
    return b, f"{victim} x{f:.1f} on {mode} ({share * 100:.0f} % of traffic)"


def capacity_cliff(d: Draw) -> tuple[Base, str]:
    """One provider loses 60-90 % of its slots for 60-300 s under a high load (capacity
    1.3-1.8x the load over the others): queues build, the rest must absorb it."""
    b = _base(d, n=(2, 4))
    b.capacity_factor = d.uniform(1.3, 1.8)
    victim = d.pick(b.names)
    frac = d.uniform(0.1, 0.4)
    b.default_workloads()
    cap = b.capacities()[victim]
    b.events.append({"provider": victim, "label": f"capacity x{frac:.2f}",
                     **_window(d, b, 60, 300), "capacity": max(1, int(cap * frac))})
    b.params.update(victim=victim, capacity_left=r3(frac))
    return b, f"{victim} keeps {frac * 100:.0f} % of its capacity for a while"


def relapse(d: Draw) -> tuple[Base, str]:
    """One provider relapses 3-6 times: every 90-200 s it is bad for 20-60 s -- 3-8x TTFT
    (log), a tail (10-30 % of requests 5-10x) or 30-60 % fast errors."""
    b = _base(d)
    victim = d.pick(b.names)
    every, count = d.uniform(90, 200), d.int_(3, 6)
    kind = d.pick(("ttft", "tail", "errors"))
    ev: dict[str, Any] = {"provider": victim, "label": f"relapsing {kind}",
                          "at_s": r3(d.uniform(120, 200)),
                          "duration_s": r3(d.uniform(20, 60)),
                          "repeat": {"every_s": r3(every), "count": count}}
    if kind == "ttft":
        ev["ttft_factor"] = r3(d.log(3.0, 8.0))
    elif kind == "tail":
        ev.update(tail_rate=r3(d.uniform(0.1, 0.3)), tail_ttft_factor=r3(d.uniform(5, 10)))
    else:
        ev["errors"] = [{"rate": r3(d.uniform(0.3, 0.6)), "status": 503,
                         "after_ms": r3(d.uniform(5, 50))}]
    b.duration = float(round(ev["at_s"] + every * count + 120))
    b.events.append(ev)
    b.default_workloads()
    b.params.update(victim=victim, kind=kind, relapses=count, every_s=r3(every))
    return b, f"{victim} relapses {count}x ({kind})"


def fanout(d: Draw) -> tuple[Base, str]:
    """Agentic workflows under a deadline: plan -> 3-8-way fan-out -> optional critique
    (half the runs) -> answer, 0.3-3 workflows/s (log) beside 0.5-20 req/s of chat;
    a tail on one provider (3-12 % of requests, TTFT 4-8x, TPOT 1.5-3x) for 240-400 s
    or to the end. The deadline is 1.3-2x the stages' slow-but-healthy time."""
    b = _base(d, n=(3, 5), rate=(0.5, 20.0), batch=0.0)
    k = d.int_(3, 8)
    wf_rate = d.log(0.3, 3.0)
    out = {"plan": d.uniform(100, 200), "search": d.uniform(80, 150),
           "critique": d.uniform(100, 200), "answer": d.uniform(150, 300)}
    critique = d.chance(0.5)
    fan = {"plan": 1, "search": k, "critique": 1, "answer": 1}
    names = ["plan", "search", *(["critique"] if critique else []), "answer"]
    # each stage at the token quantile 90 % of workflows stay under (max of its fan-out)
    stage_ms = {s: b.e2e_ms(_quantile(2000, 8000, 0.9 ** (1 / fan[s])),
                            _quantile(out[s], out[s] * 2.5, 0.9 ** (1 / fan[s])))
                for s in names}
    deadline = r3(sum(stage_ms.values()) * d.uniform(1.2, 1.8))
    steps: list[dict[str, Any]] = []
    for s in names:
        step: dict[str, Any] = {"name": s, "output_tokens": {"median": r3(out[s]),
                                                            "p99": r3(out[s] * 2.5)}}
        if fan[s] > 1:
            step["fanout"] = fan[s]
        if s == "critique":
            step.update(step="optional", min_budget_ms=r3(stage_ms[s] * 1.5))
        steps.append(step)
    b.agentic_budget_ms = r3(max(b.e2e_ms(_quantile(2000, 8000, 0.95),
                                          _quantile(out[s], out[s] * 2.5, 0.95))
                                 for s in names) * 1.2)
    b.workloads = [
        {"name": "agent", "class": "agentic", "stream": True,
         "arrival": {"process": "poisson", "rate_per_s": r3(wf_rate)},
         "input_tokens": {"median": 2000, "p99": 8000},
         "output_tokens": {"median": 120, "p99": 500}, "max_tokens": 1024,
         "workflow": {"deadline_ms": deadline, "steps": steps}},
        b.chat(b.rate)]
    victim = d.pick(b.names)
    b.events.append({"provider": victim, "label": "tail",
                     **_window(d, b, 240, 400, 0.3),
                     "tail_rate": r3(d.uniform(0.03, 0.12)),
                     "tail_ttft_factor": r3(d.uniform(4, 8)),
                     "tail_tpot_factor": r3(d.uniform(1.5, 3))})
    b.params.update(victim=victim, fanout=k, workflows_per_s=r3(wf_rate), deadline_ms=deadline)
    return b, f"{k}-way fan-out under {deadline / 1000:.0f} s, tail on {victim}"


def correlated(d: Draw) -> tuple[Base, str]:
    """2 to n-1 of 3-5 providers slow down together (a shared dependency): a common
    2-5x (log) with +-30 % per provider, TTFT and a little TPOT, for 120-400 s, ramped
    over 10-90 s in half of the runs. At least one provider stays healthy."""
    b = _base(d, n=(3, 5))
    k = d.int_(2, b.n_providers - 1)
    victims = d.sample(b.names, k)
    f = d.log(2.0, 5.0)
    win = _window(d, b, 120, 400)
    ramp = d.uniform(10, 90) if d.chance(0.5) else 0.0
    for v in victims:
        fv = f * d.uniform(0.7, 1.3)
        ev: dict[str, Any] = {"provider": v, "label": f"correlated x{fv:.1f}", **win,
                              "ttft_factor": r3(max(fv, 1.2)),
                              "tpot_factor": r3(max(fv, 1.2) ** 0.3)}
        if ramp and "duration_s" in win:
            ev["ramp_s"] = r3(min(ramp, win["duration_s"] / 2))
        b.events.append(ev)
    b.default_workloads()
    b.params.update(victims=victims, factor=r3(f))
    return b, f"{k} of {b.n_providers} providers slow down together (x{f:.1f})"


def sparse(d: Draw) -> tuple[Base, str]:
    """Sparse traffic, 0.3-1.5 req/s: one provider's TTFT is 3-6x for 3-8 minutes,
    starting at 300-700 s of a 30-minute run; evidence comes slowly."""
    b = _base(d, n=(2, 4), rate=(0.3, 1.5), duration=MAX_SCENARIO_S, batch=0.0)
    victim = d.pick(b.names)
    f = d.uniform(3.0, 6.0)
    b.events.append({"provider": victim, "label": f"slow x{f:.1f}",
                     "at_s": r3(d.uniform(300, 700)), "duration_s": r3(d.uniform(180, 480)),
                     "ttft_factor": r3(f)})
    b.default_workloads()
    b.params.update(victim=victim, factor=r3(f))
    return b, f"{b.rate:.2f} req/s, {victim} x{f:.1f} for minutes"


def outage(d: Draw) -> tuple[Base, str]:
    """One of 2-4 providers is hard down for 30-180 s (every request fails: 503/502
    after 1-100 ms, like a refused connection or a dead backend), then back; clients
    retry once in half of the runs."""
    b = _base(d, n=(2, 4))
    victim = d.pick(b.names)
    b.providers[victim]["error_status"] = d.pick((503, 502))
    b.providers[victim]["error_after_ms"] = r3(d.log(1, 100))
    b.events.append({"provider": victim, "label": "outage",
                     "at_s": r3(d.uniform(120, 300)), "duration_s": r3(d.uniform(30, 180)),
                     "outage": True})
    b.default_workloads()
    if d.chance(0.5):
        for wl in b.workloads:
            wl["client"] = {"retries": 1, "backoff_ms": 200}
    b.params.update(victim=victim)
    return b, f"{victim} down for a while, then back"


def heavy_tail(d: Draw) -> tuple[Base, str]:
    """Stationary, healthy but noisy: one or two providers (one of them the fastest in
    half the runs) have a heavy tail inside the SLO -- a lognormal mixture (2-5 % of
    requests on a 2-4x slower path) or a Pareto tail (1-4 % of requests, alpha 1.2-2.5,
    from the body's p99). Nothing changes over the run: the right reaction is none
    beyond preferring the steadier routes."""
    b = _base(d, n=(2, 4), duration=900.0)
    k = 2 if b.n_providers >= 3 and d.chance(0.3) else 1
    victims = [_fastest(b)] if d.chance(0.5) else []
    victims += [n for n in d.sample(b.names, b.n_providers) if n not in victims][: k - len(victims)]
    kinds = []
    b.default_workloads()
    # the budget is computed from the bodies: the tails sit beyond p95 but inside the SLO
    for v in victims:
        lat = b.providers[v]["ttft_ms"]
        kind = d.pick(("mixture", "pareto"))
        kinds.append(kind)
        if kind == "mixture":
            w = round(d.uniform(0.02, 0.05), 4)
            slow = d.uniform(2.0, 4.0)
            b.providers[v]["ttft_ms"] = {"mixture": [
                {"weight": round(1 - w, 4), **lat},
                {"weight": w, "median": r3(lat["median"] * slow),
                 "p99": r3(lat["p99"] * slow)}]}
        else:
            b.providers[v]["ttft_ms"] = {**lat, "pareto_tail": {
                "weight": r3(d.uniform(0.01, 0.04)), "alpha": r3(d.uniform(1.2, 2.5))}}
    b.params.update(noisy=victims, kinds=kinds)
    return b, f"stationary; heavy tails on {', '.join(victims)}"


def _quantile(median: float, p99: float, q: float) -> float:
    """The ``q`` quantile of the lognormal with this median and p99."""
    return median * math.exp(math.log(p99 / median) / Z99 * NormalDist().inv_cdf(q))


def _p99_for_share_above(median: float, threshold: float, share: float) -> float:
    """The p99 of a lognormal with ``median`` that puts ``share`` of its mass above
    ``threshold``."""
    sigma = math.log(threshold / median) / NormalDist().inv_cdf(1.0 - share)
    return r3(median * math.exp(sigma * Z99))


#: Every family, in report order.
FAMILIES: Final[dict[str, Family]] = {
    "drift": drift,
    "spike": spike,
    "error_mix": error_mix,
    "slice_confined": slice_confined,
    "capacity_cliff": capacity_cliff,
    "relapse": relapse,
    "fanout": fanout,
    "correlated": correlated,
    "sparse": sparse,
    "outage": outage,
    "heavy_tail": heavy_tail,
}
