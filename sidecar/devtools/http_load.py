"""A small closed-loop HTTP/1.1 load client on asyncio (for `tailroute bench load`).

``concurrency`` connections each send one request after the other (keep-alive)
until the duration is over or the request cap is hit; every request's latency
(to the end of its body), status and completeness is recorded. Bounded in time
and count, 127.0.0.1 only. Responses are read by Content-Length or chunked
framing, so a streamed (SSE) response counts as complete only when its
terminating chunk arrived.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class ClientResult:
    latencies: list[float] = field(default_factory=list)  # complete 2xx responses only
    statuses: Counter[int] = field(default_factory=Counter)  # complete responses by status
    failures: Counter[str] = field(default_factory=Counter)  # no complete response: why
    wall: float = 0.0

    @property
    def ok(self) -> int:
        return sum(n for s, n in self.statuses.items() if 200 <= s < 300)

    def merge(self, other: ClientResult) -> None:
        """Add another run's requests (rounds of one setup); walls add up."""
        self.latencies.extend(other.latencies)
        self.statuses.update(other.statuses)
        self.failures.update(other.failures)
        self.wall += other.wall

    @property
    def rps(self) -> float:
        return sum(self.statuses.values()) / self.wall if self.wall else 0.0


def request_bytes(stream: bool, tokens: int, headers: dict[str, str] | None = None) -> bytes:
    body = json.dumps({
        "model": "bench-model", "stream": stream, "max_tokens": tokens,
        "messages": [{"role": "user", "content": "benchmark " * 20}],
    }).encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: bench\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n{extra}\r\n")
    return head.encode() + body


async def _read_response(reader: asyncio.StreamReader) -> int:
    """Read one whole response; return its status (raises on a broken connection)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length, chunked = None, False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if chunked:
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    elif length:
        await reader.readexactly(length)
    return status


async def _worker(port: int, payloads: list[bytes], until: float, cap: int,
                  out: ClientResult) -> None:
    reader = writer = None
    sent = 0
    try:
        while time.perf_counter() < until and sent < cap:
            if writer is None:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            assert reader is not None
            t0 = time.perf_counter()
            payload = payloads[sent % len(payloads)]
            sent += 1
            try:
                writer.write(payload)
                status = await asyncio.wait_for(_read_response(reader), 60)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                    TimeoutError, ValueError) as exc:
                out.failures[type(exc).__name__] += 1
                writer.close()
                reader = writer = None
                continue
            dt = time.perf_counter() - t0
            out.statuses[status] += 1
            if 200 <= status < 300:
                out.latencies.append(dt)
    finally:
        if writer is not None:
            writer.close()


async def run(port: int, concurrency: int, duration_s: float, stream: bool, tokens: int,
              headers: dict[str, str] | None = None, cap: int = 1_000_000,
              every: tuple[int, dict[str, str]] | None = None) -> ClientResult:
    """``every=(n, extra)``: every n-th request of each connection also sends ``extra``."""
    out = ClientResult()
    payloads = [request_bytes(stream, tokens, headers)]
    if every is not None:
        n, extra = every
        payloads = [request_bytes(stream, tokens, {**(headers or {}), **extra}),
                    *payloads * (n - 1)]
    t0 = time.perf_counter()
    until = t0 + duration_s
    per = max(cap // concurrency, 1)
    await asyncio.gather(*(_worker(port, payloads, until, per, out)
                           for _ in range(concurrency)))
    out.wall = time.perf_counter() - t0
    return out


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]
