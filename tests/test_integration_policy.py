"""The graduated policy through the real Envoy: a streaming-only TTFT tail on one
provider moves interactive traffic off it while batch keeps using it; after
recovery the route comes back through probing/restoring, not in one jump.

Windows are 1 s here so the test runs in about 40 s; the load loop is bounded
in time and count.

A slowed route's traffic leaves it within a second of its first slow answers
(the attainment score), and a ``watching`` route's cut exploration floor then
sends it almost nothing: when the answers in flight all land in one evaluation
window, the next lacks ``min_samples`` and the route stays ``watching`` until
its verdict goes stale (docs/policy-lab.md, "Estimators", the exploration floor;
seen twice in CI with ``degrade_windows: 2``, the second time as "100% of 14
over budget" and then no second window). This test is about the rest of the
ladder through the real Envoy, so one significant window degrades the route
(``degrade_windows: 1``; the persistence rule itself is unit-tested in
tests/test_health.py). Arrivals are open-loop at a fixed rate, as real clients
send, so the requests in flight on the route scale with the rate rather than
with a few closed-loop workers.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from sidecar.devtools.harness import Stack
from tests.ops_stack import open_loop

pytestmark = pytest.mark.envoy

INTERACTIVE = "m|interactive|short|stream"


def _config(ports: dict[str, int]) -> dict[str, Any]:
    return {
        "default_cluster": "b",
        "clusters": [
            {"name": "a", "address": f"127.0.0.1:{ports['a']}", "models": ["m"],
             "cost_per_1k_tokens": 0.5},
            {"name": "b", "address": f"127.0.0.1:{ports['b']}", "models": ["m"],
             "cost_per_1k_tokens": 1.0},
        ],
        "models": [{"name": "m", "candidates": ["a", "b"]}],
        "classes": {
            # The miss-ratio score is off: its record of light-load outcomes has a fixed
            # one-minute half-life, so in this test's compressed time (1 s windows) the
            # route's incident would still weigh on it at the end, where the ladder is
            # what is checked (the score's effect after an incident: tests/test_miss_ratio.py
            # and docs/policy-lab.md).
            "interactive": {"slo": {"metric": "ttft", "percentile": 95, "budget_ms": 300,
                                    "timeout_ms": 20000}, "priority": 10,
                            "miss_ratio_exponent": 0},
            "batch": {"slo": {"metric": "e2e", "percentile": 99, "budget_ms": 20000,
                              "timeout_ms": 60000}, "priority": 1,
                      "latency_sensitive": False,
                      "weights": {"latency": 0.2, "cost": 1.0, "capacity": 1.0}},
        },
        "stats": {"subwindow_s": 1.0, "subwindows": 6, "min_samples": 4},
        "health": {"degrade_windows": 1, "restrict_windows": 1, "recover_windows": 2,
                   "cooldown_s": 2, "probe_share": 0.1, "probe_successes": 3,
                   "restricted_probe_successes": 3, "restore_step": 0.25},
    }


@dataclass
class Hit:
    at: float
    klass: str
    provider: str


RATE = 60.0  # requests per second, open-loop
MAX_IN_FLIGHT = 64  # a slow route must not make the loop unbounded in memory


async def _drive(st: Stack, seconds: float, hits: list[Hit], t0: float, seed: int) -> None:
    """Send ``RATE`` requests per second for ``seconds``, 30 % batch: ``seconds x
    RATE`` requests in all, at most ``MAX_IN_FLIGHT`` at once, each bounded by the
    client's 20 s timeout."""
    rng = random.Random(seed)
    client = openai.AsyncOpenAI(base_url=st.base_url, api_key="t", max_retries=0, timeout=20)
    gate = asyncio.Semaphore(MAX_IN_FLIGHT)

    async def one(klass: str) -> None:
        async with gate:
            try:
                raw = await client.chat.completions.with_raw_response.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                    stream=True, extra_headers={"x-tailroute-class": klass},
                )
                async for _ in raw.parse():
                    pass
                hits.append(Hit(time.monotonic() - t0, klass, raw.headers["x-fake-provider"]))
            except openai.APIError:
                pass

    await open_loop(seconds, RATE, lambda: one("batch" if rng.random() < 0.3 else "interactive"))
    await client.close()


def _share(hits: list[Hit], klass: str, lo: float, hi: float, provider: str) -> float:
    c = Counter(h.provider for h in hits if h.klass == klass and lo <= h.at < hi)
    return c[provider] / max(sum(c.values()), 1)


def _transitions(st: Stack) -> list[dict[str, Any]]:
    return [e for e in st.sidecar_state()["transitions"]
            if e["cluster"] == "a" and e["slice"] == INTERACTIVE]


def test_tail_degradation_moves_interactive_only_and_recovers_gradually() -> None:
    with Stack() as st:
        ports = {"a": st.start_provider("a", "30:45", "2", seed=1),
                 "b": st.start_provider("b", "70:100", "2", seed=2)}
        st.start_sidecar(st.write_config(_config(ports)))
        st.start_envoy()
        hits: list[Hit] = []
        t0 = time.monotonic()
        asyncio.run(_drive(st, 5, hits, t0, 1))
        base_a = _share(hits, "interactive", 2, 5, "a")

        st.control("a", {"ttft_ms": {"median": 900, "p99": 1400}, "streaming_only": True})
        t_bad = time.monotonic() - t0
        asyncio.run(_drive(st, 12, hits, t0, 2))
        t_fix = time.monotonic() - t0
        degraded_a = _share(hits, "interactive", t_fix - 6, t_fix, "a")
        batch_a = _share(hits, "batch", t_fix - 6, t_fix, "a")
        seen_bad = _transitions(st)
        states_bad = [e["new"] for e in seen_bad]

        st.control("a", {"clear_streaming_override": True})
        asyncio.run(_drive(st, 18, hits, t0, 3))
        t_end = time.monotonic() - t0
        states_all = [e["new"] for e in _transitions(st)]

    assert base_a > 0.4, f"a is the faster route at first ({base_a:.2f})"
    # Moved off within the configured windows (1 to degrade + 1 to restrict, plus
    # growth of sparse evaluation windows): little interactive traffic left on a.
    assert {"degraded", "restricted"} & set(states_bad), [
        (e["at"], e["new"], e["reason"]) for e in seen_bad]
    # What is left is the exploration floor / probe trickle (probe_share = 0.1): about
    # 0.1-0.15 of the ~250 interactive requests of the last 6 s (the bound leaves
    # room for that sample's noise; the route had about 0.65 before).
    assert degraded_a < 0.25, (t_bad, degraded_a)
    # Batch is tolerant: it still uses the cheap route whose tail threatens nobody it serves.
    assert batch_a > 0.25, batch_a
    # Recovery: back through probes and restoring (weight in steps), never one jump.
    after = states_all[len(states_bad):]
    assert "restoring" in after, states_all
    assert after.index("restoring") < (after.index("healthy") if "healthy" in after else 99)
    assert _share(hits, "interactive", t_end - 4, t_end, "a") > 0.2
