"""Fast ejection through the real Envoy: a provider killed mid-run (its port closed)
stops receiving requests within a second of its first failure, at 20 req/s,
whatever share the scores gave it (the trial pace of sidecar.core.health).

Observed at the level of the client (which requests failed, and when) and the
sidecar's /state (the cluster-wide circuit opened after a run of hard failures),
so it holds whichever way the shell learns outcomes -- and in both routing
modes: per request (extproc) and by published weights (native). Open-loop
load, bounded in count and time; about 20 s per mode.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from sidecar.devtools.harness import Stack

pytestmark = pytest.mark.envoy

RATE = 20.0  # requests per second, open loop
KILL_AT = 6.0  # seconds into the load
DURATION = 12.0


def _config(ports: dict[str, int], mode: str) -> dict[str, Any]:
    return {
        "routing": {"mode": mode},
        "default_cluster": "a",
        "clusters": [{"name": n, "address": f"127.0.0.1:{ports[n]}", "models": ["m"]}
                     for n in ("a", "b", "c")],
        "models": [{"name": "m", "candidates": ["a", "b", "c"]}],
        "classes": {"interactive": {"slo": {"metric": "ttft", "percentile": 95,
                                            "budget_ms": 1000, "timeout_ms": 10000},
                                    "priority": 10}},
        "stats": {"subwindow_s": 2.0, "min_samples": 5},
    }


@dataclass
class Sent:
    at: float  # seconds after the load started
    done: float
    provider: str | None  # None: the request failed


async def _load(st: Stack, t0: float, sent: list[Sent], killed: asyncio.Event) -> None:
    client = openai.AsyncOpenAI(base_url=st.base_url, api_key="t", max_retries=0, timeout=10)

    async def one(at: float) -> None:
        try:
            raw = await client.chat.completions.with_raw_response.create(
                model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                stream=True, extra_headers={"x-tailroute-class": "interactive"})
            async for _ in raw.parse():
                pass
            provider: str | None = raw.headers.get("x-fake-provider")
        except openai.APIError:
            provider = None
        sent.append(Sent(at, time.monotonic() - t0, provider))

    tasks = []
    for i in range(int(DURATION * RATE)):
        at = i / RATE
        delay = t0 + at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        if at >= KILL_AT and not killed.is_set():
            killed.set()
            # In a thread: waiting for the process to exit must not pause the
            # open-loop load (on a slow machine that took 0.75 s, then sent the
            # backlog at once).
            tasks.append(asyncio.create_task(asyncio.to_thread(st.stop_provider, "b")))
        tasks.append(asyncio.create_task(one(time.monotonic() - t0)))
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
    await client.close()


@pytest.mark.parametrize("mode", ["extproc", "native"])
def test_killed_provider_stops_receiving_requests_within_a_second(mode: str) -> None:
    """In native mode the ejection is learned from the same log entries and
    published as weight 0 at once (not at the next publication interval)."""
    with Stack() as st:
        ports = {n: st.start_provider(n, "40:70", "3:5", seed=i + 1)
                 for i, n in enumerate(("a", "b", "c"))}
        st.start_sidecar(st.write_config(_config(ports, mode)))
        st.start_envoy()
        sent: list[Sent] = []
        t0 = time.monotonic()
        asyncio.run(_load(st, t0, sent, asyncio.Event()))
        state = st.sidecar_state()

    before = [s for s in sent if s.at < KILL_AT - 0.5]
    assert before and all(s.provider is not None for s in before)
    assert sum(s.provider == "b" for s in before) > 0.15 * len(before)  # b was in use
    failed = sorted((s for s in sent if s.provider is None), key=lambda s: s.done)
    assert failed, "the killed provider was never tried"
    first = failed[0].done
    late = [s for s in failed if s.at > first + 1.0]
    print(f"{len(sent)} requests, {len(failed)} failed; first failure at {first:.2f}s; "
          f"failed requests sent more than 1 s after it: {len(late)}")
    assert not late, ([round(s.at, 2) for s in late], [round(s.at, 2) for s in failed],
                      [e for e in state["transitions"] if e["cluster"] == "b"])
    assert len(failed) <= 10, len(failed)
    after = [s for s in sent if s.at > first + 1.0]
    assert after and all(s.provider in ("a", "c") for s in after)
    ejected = [e for e in state["transitions"]
               if e["cluster"] == "b" and e["new"] == "quarantined"]
    assert ejected and "consecutive hard failures" in ejected[0]["reason"], state["transitions"]
