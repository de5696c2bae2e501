"""Shared helpers for the operations tests: a real stack and bounded traffic through it.

Every process is started through :class:`sidecar.devtools.harness.Stack`, which stops
them all (TERM, then KILL) when the ``with`` block ends, and binds 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from sidecar.devtools.harness import Stack

T = TypeVar("T")
MODEL = "ops-model"
PROVIDERS = {"provider-a": ("20:35", "2:3"), "provider-b": ("30:50", "2:3"),
             "provider-c": ("40:60", "2:3")}


def ops_config(ports: dict[str, int], **overrides: Any) -> dict[str, Any]:
    """A small config: three providers, one model; short windows so tests see data quickly."""
    data: dict[str, Any] = {
        "default_cluster": "provider-b",
        "clusters": [
            {"name": n, "address": f"127.0.0.1:{ports[n]}", "models": [MODEL],
             "max_concurrency": 32}
            for n in PROVIDERS
        ],
        "models": [{"name": MODEL, "candidates": list(PROVIDERS)}],
        "stats": {"subwindow_s": 1.0, "subwindows": 20, "min_samples": 3},
    }
    data.update(overrides)
    return data


def start_providers(stack: Stack) -> dict[str, int]:
    return {name: stack.start_provider(name, ttft, tpot, seed=i + 1)
            for i, (name, (ttft, tpot)) in enumerate(PROVIDERS.items())}


def start_stack(stack: Stack, extra_args: list[str] | None = None,
                **overrides: Any) -> Path:
    """Providers, the sidecar (TCP gRPC) and Envoy; returns the sidecar's config path."""
    ports = start_providers(stack)
    path = stack.write_config(ops_config(ports, **overrides))
    stack.start_sidecar(path, extra=extra_args)
    stack.start_envoy()
    return path


async def _drive(base_url: str, n: int, concurrency: int, max_tokens: int = 8) -> list[str]:
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key="test", max_retries=0, timeout=20.0)
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> str:
        async with sem:
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": f"hello {i}"}],
                stream=True, max_tokens=max_tokens,
            )
            async for _ in raw.parse():
                pass
            return str(raw.headers.get("x-fake-provider", "?"))

    try:
        return list(await asyncio.gather(*(one(i) for i in range(n))))
    finally:
        await client.close()


def drive(stack: Stack, n: int = 40, concurrency: int = 4) -> list[str]:
    """Send ``n`` streamed chat requests through Envoy; returns the provider of each."""
    return asyncio.run(_drive(stack.base_url, n, concurrency))


def admin_get(stack: Stack, path: str) -> str:
    url = f"http://127.0.0.1:{stack.ports['sidecar_admin']}{path}"
    with urllib.request.urlopen(url, timeout=5) as r:
        return str(r.read().decode())


def tailroute_metrics(stack: Stack) -> dict[str, float]:
    """The sidecar's own samples on /metrics (``tailroute_*``), by series name with labels."""
    out = {}
    for line in admin_get(stack, "/metrics").splitlines():
        if line.startswith("tailroute_") and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def wait_for(probe: Callable[[], T | None], what: str, timeout_s: float = 20.0) -> T:
    """Poll ``probe`` until it returns a value other than None/False (a readiness wait,
    not a timing assertion: the deadline only bounds a broken run)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def e2e_samples(state: dict[str, Any]) -> dict[tuple[str, str], int]:
    """Latency samples per routed (narrow) cluster x slice in a /state document."""
    return {(r["cluster"], r["slice"]): r["latency"]["e2e"]["samples"]
            for r in state["routes"] if r["narrow"]}


async def open_loop(seconds: float, rate: float, one: Callable[[], Awaitable[None]]) -> None:
    """Start ``one()`` ``rate`` times a second for ``seconds`` (open-loop arrivals, as real
    clients send: ``seconds x rate`` in all, whatever the answers take), then wait for
    every one of them."""
    start = time.monotonic()
    tasks = []
    for i in range(int(seconds * rate)):
        await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
        tasks.append(asyncio.create_task(one()))
    await asyncio.gather(*tasks)
