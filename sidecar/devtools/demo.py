"""`make demo`: a real Envoy, the sidecar and three simulated providers.

provider-a starts fastest, so it takes most interactive traffic; a third of the
way in its streaming TTFT tail degrades (p99 several seconds); two thirds in it
recovers. Traffic is driven through Envoy with the `openai` client. The demo
prints progress, then a table of traffic share per provider over time and the
client-observed TTFT p50/p99, and stops every process it started. Its output
stays short (under 60 lines): the client libraries' request logs are off.
"""

from __future__ import annotations

import asyncio
import logging
import random
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from sidecar.devtools.harness import Stack

PROVIDERS = {"provider-a": ("60:90", "4:6"), "provider-b": ("110:160", "5:7"),
             "provider-c": ("140:200", "5:8")}


def demo_config(ports: dict[str, int], subwindow_s: float) -> dict[str, Any]:
    return {
        "default_cluster": "provider-b",
        "clusters": [
            {"name": n, "address": f"127.0.0.1:{ports[n]}", "models": ["demo-model"],
             "max_concurrency": 32}
            for n in PROVIDERS
        ],
        "models": [{
            "name": "demo-model",
            "candidates": list(PROVIDERS),
            "algorithm": {"type": "latency_aware",
                          "latency_aware": {"ttft_percentile": 95, "tpot_percentile": 90}},
        }],
        "classes": {
            "interactive": {"slo": {"metric": "ttft", "percentile": 95, "budget_ms": 400,
                                    "timeout_ms": 20000}, "priority": 10},
            "batch": {"slo": {"metric": "e2e", "percentile": 99, "budget_ms": 20000,
                              "timeout_ms": 60000}, "priority": 1, "latency_sensitive": False,
                      "weights": {"latency": 0.2, "cost": 1.0, "capacity": 1.0}},
        },
        "stats": {"subwindow_s": subwindow_s, "subwindows": 4, "min_samples": 8},
        "health": {"degrade_windows": 2, "restrict_windows": 1, "recover_windows": 2,
                   "cooldown_s": 4 * subwindow_s, "probe_successes": 3},
    }


@dataclass
class Sample:
    at: float
    klass: str
    route: str
    ttft: float | None
    ok: bool


async def _one(client: Any, klass: str, rng: random.Random, t_start: float) -> Sample:
    t0 = time.monotonic()
    route = "?"
    ttft = None
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model="demo-model",
            messages=[{"role": "user", "content": "Say something short." * rng.randint(1, 4)}],
            stream=True,
            max_tokens=rng.randint(8, 24),
            extra_headers={"x-tailroute-class": klass},
        )
        route = raw.headers.get("x-fake-provider", "?")  # which simulated provider served it
        stream = raw.parse()
        async for ev in stream:
            if ttft is None and ev.choices and ev.choices[0].delta.content:
                ttft = time.monotonic() - t0
        return Sample(t0 - t_start, klass, route, ttft, True)
    except Exception:
        return Sample(t0 - t_start, klass, route, None, False)


async def _drive(stack: Stack, duration_s: float, seed: int) -> list[Sample]:
    import openai

    rng = random.Random(seed)
    client = openai.AsyncOpenAI(base_url=stack.base_url, api_key="demo", max_retries=0,
                                timeout=30.0)
    samples: list[Sample] = []
    t_start = time.monotonic()
    phase = 0
    max_requests = int(duration_s * 40)  # bounded in count as well as time
    sem = asyncio.Semaphore(6)
    tasks: set[asyncio.Task[None]] = set()
    last_report = 0.0

    async def run_one(klass: str) -> None:
        async with sem:
            samples.append(await _one(client, klass, rng, t_start))

    issued = 0
    while (elapsed := time.monotonic() - t_start) < duration_s and issued < max_requests:
        if phase == 0 and elapsed > duration_s / 3:
            phase = 1
            stack.control("provider-a", {"ttft_ms": {"median": 250, "p99": 3000},
                                         "streaming_only": True})
            print(f"[{elapsed:5.1f}s] provider-a develops a TTFT tail (p99 3 s)", flush=True)
        elif phase == 1 and elapsed > 2 * duration_s / 3:
            phase = 2
            stack.control("provider-a", {"ttft_ms": {"median": 60, "p99": 90},
                                         "streaming_only": True})
            print(f"[{elapsed:5.1f}s] provider-a recovers", flush=True)
        klass = "batch" if rng.random() < 0.2 else "interactive"
        t = asyncio.create_task(run_one(klass))
        tasks.add(t)
        t.add_done_callback(tasks.discard)
        issued += 1
        if elapsed - last_report >= 5:
            last_report = elapsed
            recent = [s for s in samples if s.at > elapsed - 5]
            share = Counter(s.route for s in recent)
            tot = sum(share.values()) or 1
            mix = "  ".join(f"{k} {100 * v / tot:3.0f}%" for k, v in sorted(share.items()))
            print(f"[{elapsed:5.1f}s] {len(samples):4d} done; last 5 s: {mix}", flush=True)
        await asyncio.sleep(rng.expovariate(20.0))
    if tasks:
        await asyncio.wait(tasks, timeout=30)
    await client.close()
    return samples


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def print_table(samples: list[Sample], duration_s: float, buckets: int = 6) -> None:
    width = duration_s / buckets
    names = sorted(PROVIDERS)
    print("\ninteractive requests per window: share served by each provider, client TTFT")
    print(f"{'window':>9} {'n':>5} " + " ".join(f"{n:>10}" for n in names)
          + f" {'p50 ms':>7} {'p99 ms':>7} {'errors':>6}")
    by_bucket: dict[int, list[Sample]] = defaultdict(list)
    for s in samples:
        if s.klass == "interactive":
            by_bucket[min(int(s.at / width), buckets - 1)].append(s)
    for b in range(buckets):
        ss = by_bucket.get(b, [])
        share = Counter(s.route for s in ss if s.ok)
        tot = max(sum(share.values()), 1)
        ttfts = [s.ttft * 1000 for s in ss if s.ttft is not None]
        cols = " ".join(f"{100 * share.get(n, 0) / tot:9.0f}%" for n in names)
        window = f"{b * width:.0f}-{(b + 1) * width:.0f}s"
        print(f"{window:>9} {len(ss):>5} {cols} {_pct(ttfts, 0.5):7.0f} {_pct(ttfts, 0.99):7.0f} "
              f"{sum(not s.ok for s in ss):>6}")
    print("p50/p99: time to first token as the client saw it (request sent to Envoy until the "
          "first\n  content token), over all of the window's interactive requests, whichever "
          "provider served them.")
    batch = [s for s in samples if s.klass == "batch" and s.ok]
    bshare = Counter(s.route for s in batch)
    print("batch requests (not latency sensitive), share overall: " + "  ".join(
        f"{n} {100 * bshare.get(n, 0) / max(len(batch), 1):.0f}%" for n in names))


MAX_TRANSITIONS = 10  # keep the demo's output short; the sidecar log has them all


def run_demo(duration_s: float = 60.0, seed: int = 7) -> int:
    print(f"tailroute demo: Envoy + sidecar + 3 simulated providers, {duration_s:.0f}s", flush=True)
    root = logging.getLogger()
    if root.level > logging.DEBUG:  # without -v: no per-request INFO logs of the HTTP clients
        root.setLevel(logging.WARNING)
    with Stack(keep=True) as stack:  # its output points at the logs in the workdir
        ports = {}
        for i, (name, (ttft, tpot)) in enumerate(PROVIDERS.items()):
            ports[name] = stack.start_provider(name, ttft, tpot, seed=seed + i)
        path = stack.write_config(demo_config(ports, subwindow_s=max(duration_s / 30, 1.0)))
        stack.start_sidecar(path)
        stack.start_envoy()
        print(f"envoy on {stack.base_url}, sidecar gRPC on :{stack.ports['sidecar']}, "
              f"logs in {stack.workdir}", flush=True)
        samples = asyncio.run(_drive(stack, duration_s, seed))
        print_table(samples, duration_s)
        transitions = [ln for ln in stack.log("sidecar").splitlines() if " health " in ln]
        if transitions:
            print("\nhealth transitions seen by the sidecar:")
            for ln in transitions[:MAX_TRANSITIONS]:
                print("  " + ln.split(" tailroute: ", 1)[-1])
            if len(transitions) > MAX_TRANSITIONS:
                print(f"  ... {len(transitions) - MAX_TRANSITIONS} more in "
                      f"{stack.workdir}/sidecar.log")
    print("\nall processes stopped.")
    return 0


if __name__ == "__main__":
    sys.exit(run_demo())
