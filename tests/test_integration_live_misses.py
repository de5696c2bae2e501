"""Live misses through the real Envoy (sidecar.core.live_misses): requests of an
end-to-end class still unanswered at their budget count as misses then, from the
routing streams' closes alone, and the route sits out while the other has room.

Open-loop arrivals at a fixed rate, bounded in count, in flight and time (each
request by the client's timeout).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import openai
import pytest

from sidecar.devtools.harness import Stack
from tests.ops_stack import open_loop, tailroute_metrics

pytestmark = pytest.mark.envoy

RATE = 30.0  # requests per second
MAX_IN_FLIGHT = 64
MISSING_A = 'tailroute_live_missing_total{cluster="a"}'


def _config(ports: dict[str, int]) -> dict[str, Any]:
    return {
        "default_cluster": "b",
        "clusters": [
            {"name": "a", "address": f"127.0.0.1:{ports['a']}", "models": ["m"]},
            {"name": "b", "address": f"127.0.0.1:{ports['b']}", "models": ["m"]},
        ],
        "models": [{"name": "m", "candidates": ["a", "b"]}],
        "classes": {
            "agentic": {"slo": {"metric": "e2e", "percentile": 95, "budget_ms": 600,
                                "timeout_ms": 20000}, "priority": 5},
        },
        "default_class": "agentic",
        "stats": {"subwindow_s": 1.0, "subwindows": 6, "min_samples": 4},
        "health": {"live_horizon_s": 5},
    }


async def _drive(url: str, seconds: float, served: Counter[str]) -> None:
    """``seconds x RATE`` non-streamed requests, at most MAX_IN_FLIGHT at once."""
    client = openai.AsyncOpenAI(base_url=url, api_key="t", max_retries=0, timeout=20)
    gate = asyncio.Semaphore(MAX_IN_FLIGHT)

    async def one() -> None:
        async with gate:
            raw = await client.chat.completions.with_raw_response.create(
                model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
            served[raw.headers["x-fake-provider"]] += 1

    await open_loop(seconds, RATE, one)
    await client.close()


def test_a_route_whose_requests_are_still_open_at_their_budget_sits_out() -> None:
    with Stack() as st:
        ports = {"a": st.start_provider("a", "20:30", "2", seed=1),
                 "b": st.start_provider("b", "60:90", "2", seed=2)}
        st.start_sidecar(st.write_config(_config(ports)))
        st.start_envoy()
        before: Counter[str] = Counter()
        asyncio.run(_drive(st.base_url, 2, before))
        quiet = tailroute_metrics(st).get(MISSING_A, 0.0)
        st.control("a", {"ttft_ms": {"median": 2500, "p99": 3000}})
        during: Counter[str] = Counter()
        asyncio.run(_drive(st.base_url, 4, during))
        kept_out = tailroute_metrics(st).get(MISSING_A, 0.0)
    assert before["a"] > 0 and sum(before.values()) == 60, before
    assert quiet == 0.0  # inside its budget: never kept out
    assert sum(during.values()) == 120, during  # every request answered
    # The misses were known 0.6 s after each send, from the closes alone: a sat out.
    assert kept_out > 0, (kept_out, during)
