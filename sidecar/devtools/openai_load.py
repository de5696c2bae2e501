"""Bounded client load through Envoy with the real ``openai`` client, counted by outcome.

Used by the reliability tests (kill and restart the sidecar or Envoy under load,
count what the clients saw) and by ``tailroute bench soak``. The load runs in its
own thread with its own event loop, paced at ``rate`` requests/s with at most
``concurrency`` in flight, until :meth:`ClientLoad.stop` or ``max_requests``.
A request counts as ``ok`` only if its stream ran to its end without an error
and carried at least one chunk (the client raises on a stream cut short);
anything else is ``failed``, with the exception type kept as the reason.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class LoadCounts:
    ok: int = 0
    failed: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    providers: Counter[str] = field(default_factory=Counter)

    def snapshot(self) -> dict[str, Any]:
        return {"ok": self.ok, "failed": self.failed, "reasons": dict(self.reasons),
                "providers": dict(self.providers)}


class ClientLoad:
    """Streaming chat requests at a steady rate; start() / stop() / counts."""

    def __init__(self, base_url: str, model: str, rate: float = 20.0, concurrency: int = 8,
                 max_tokens: int = 8, max_requests: int = 100_000, distinct: bool = False,
                 headers: dict[str, str] | None = None, timeout_s: float = 30.0) -> None:
        self.base_url = base_url
        self.model = model
        self.rate = rate
        self.concurrency = concurrency
        self.max_tokens = max_tokens
        self.max_requests = max_requests
        self.distinct = distinct  # a distinct tenant and request id per request
        self.headers = headers or {}
        self.timeout_s = timeout_s
        self.counts = LoadCounts()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> ClientLoad:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        return self

    def stop(self, join_s: float = 60.0) -> LoadCounts:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(join_s)
        return self.counts

    def sent(self) -> int:
        with self._lock:
            return self.counts.ok + self.counts.failed

    def wait_sent(self, n: int, timeout_s: float = 60.0) -> None:
        """Block until ``n`` requests have finished (bounded by ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while self.sent() < n and time.monotonic() < deadline:
            time.sleep(0.02)

    async def _run(self) -> None:
        import openai

        for name in ("httpx", "httpx2", "openai"):  # one INFO line per request otherwise
            logging.getLogger(name).setLevel(logging.WARNING)
        client = openai.AsyncOpenAI(base_url=self.base_url, api_key="load", max_retries=0,
                                    timeout=self.timeout_s)
        sem = asyncio.Semaphore(self.concurrency)
        tasks: set[asyncio.Task[None]] = set()
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            for i in itertools.count():
                if self._stop.is_set() or i >= self.max_requests:
                    break
                delay = start + i / self.rate - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                await sem.acquire()
                task = asyncio.create_task(self._one(client, i, sem))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.wait(tasks, timeout=self.timeout_s + 5)
        finally:
            await client.close()

    async def _one(self, client: Any, i: int, sem: asyncio.Semaphore) -> None:
        headers = dict(self.headers)
        if self.distinct:
            headers |= {"x-tailroute-tenant": f"tenant-{i}", "x-request-id": f"req-{i}"}
        try:
            raw = await client.chat.completions.with_raw_response.create(
                model=self.model, messages=[{"role": "user", "content": f"hello {i}"}],
                stream=True, max_tokens=self.max_tokens, extra_headers=headers)
            chunks = 0
            async for _ in raw.parse():
                chunks += 1
            provider = str(raw.headers.get("x-fake-provider", "?"))
            ok, reason = chunks > 0, "empty_stream"
        except Exception as exc:  # every failure mode the client can see is counted
            ok, reason, provider = False, type(exc).__name__, ""
        finally:
            sem.release()
        with self._lock:
            if ok:
                self.counts.ok += 1
                self.counts.providers[provider] += 1
            else:
                self.counts.failed += 1
                self.counts.reasons[reason] += 1
