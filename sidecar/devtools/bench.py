"""`tailroute bench overhead`: what the sidecar adds to a request, measured, not asserted.

Same run, same load, same fake provider: Envoy alone vs Envoy + sidecar in each
response-observation mode. Serial and concurrent non-streaming requests give
added p50/p99 latency and requests/s; streamed responses give the
client-observed TPOT ratio against Envoy alone. Sidecar CPU comes from
/proc/<pid>/stat (user + system), divided by requests or by streamed chunks.
Load is bounded in count and stays on 127.0.0.1.
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from sidecar.devtools.harness import Stack
from sidecar.devtools.http_load import pct

_CLK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK


def _body(stream: bool, max_tokens: int) -> bytes:
    return json.dumps({
        "model": "bench-model", "stream": stream, "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "benchmark " * 20}],
    }).encode()


@dataclass
class LoadResult:
    latencies: list[float]
    wall: float
    chunks: int
    tpots: list[float]
    ttfts: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)  # inter-token gaps seen by the client

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.wall if self.wall else 0.0


def _worker(port: int, n: int, stream: bool, max_tokens: int, out: LoadResult,
            lock: threading.Lock, headers: dict[str, str]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = _body(stream, max_tokens)
    hdrs = {"content-type": "application/json", **headers}
    for _ in range(n):
        t0 = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", body=body, headers=hdrs)
        resp = conn.getresponse()
        times: list[float] = []
        if stream:
            buf = b""
            while True:
                data = resp.read1(65536)
                if not data:
                    break
                buf += data
                while b"\n\n" in buf:
                    ev, buf = buf.split(b"\n\n", 1)
                    if b'"content"' in ev:
                        times.append(time.perf_counter())
        else:
            resp.read()
        dt = time.perf_counter() - t0
        with lock:
            out.latencies.append(dt)
            out.chunks += len(times)
            if times:
                out.ttfts.append(times[0] - t0)
            if len(times) >= 2:
                out.tpots.append((times[-1] - times[0]) / (len(times) - 1))
                out.gaps.extend(b - a for a, b in itertools.pairwise(times))
    conn.close()


def run_load(port: int, requests: int, concurrency: int, stream: bool = False,
             max_tokens: int = 1, headers: dict[str, str] | None = None) -> LoadResult:
    out = LoadResult([], 0.0, 0, [])
    lock = threading.Lock()
    per = max(requests // concurrency, 1)
    threads = [threading.Thread(target=_worker,
                                args=(port, per, stream, max_tokens, out, lock, headers or {}))
               for _ in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    out.wall = time.perf_counter() - t0
    return out


def _config(port: int, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "default_cluster": "p",
        "clusters": [{"name": "p", "address": f"127.0.0.1:{port}", "models": ["bench-model"],
                      "max_concurrency": 1000}],
        "models": [{"name": "bench-model", "candidates": ["p"]}],
        **extra,
    }


@dataclass(frozen=True)
class Setup:
    label: str
    sidecar: bool
    config: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


SETUPS: tuple[Setup, ...] = (
    Setup("envoy alone", False),
    Setup("sidecar: one-message path (default)", True),
    Setup("sidecar: every stream timed at 1st token", True,
          {"timing": {"token_sample_share": 1.0}}),
    Setup("sidecar: rich path (deadline header)", True,
          headers={"x-tailroute-deadline-ms": "30000"}),
)


def run_bench(what: str, requests: int = 400, concurrency: int = 8) -> int:
    if what != "overhead":
        print(f"unknown benchmark {what}", file=sys.stderr)
        return 2
    rows: list[dict[str, Any]] = []
    with Stack() as stack:
        port = stack.start_provider("p", ttft_ms="2", tpot_ms="5", seed=1,
                                    extra=["--max-tokens", "64"])
        for setup in SETUPS:
            print(f"-- {setup.label}", file=sys.stderr, flush=True)
            path = stack.write_config(_config(port, setup.config))
            if setup.sidecar:
                stack.start_sidecar(path)
            eport = stack.start_envoy(with_sidecar=setup.sidecar)
            pid = stack.procs["sidecar"].pid if setup.sidecar else None
            hdrs = setup.headers
            run_load(eport, 50, 2, headers=hdrs)  # warm-up: connections, caches
            c0 = cpu_seconds(pid) if pid else 0.0
            serial = run_load(eport, requests // 2, 1, headers=hdrs)
            c1 = cpu_seconds(pid) if pid else 0.0
            conc = run_load(eport, requests, concurrency, headers=hdrs)
            c2 = cpu_seconds(pid) if pid else 0.0
            streamed = run_load(eport, max(requests // 8, 20), 4, stream=True, max_tokens=48,
                                headers=hdrs)
            c3 = cpu_seconds(pid) if pid else 0.0
            n_routed = len(serial.latencies) + len(conc.latencies)
            rows.append({
                "setup": setup.label,
                "serial_p50_ms": pct(serial.latencies, 0.5) * 1e3,
                "serial_p99_ms": pct(serial.latencies, 0.99) * 1e3,
                "conc_p50_ms": pct(conc.latencies, 0.5) * 1e3,
                "conc_p99_ms": pct(conc.latencies, 0.99) * 1e3,
                "rps": conc.rps,
                "cpu_per_req_ms": (c2 - c0) / n_routed * 1e3 if pid else 0.0,
                "tpot_ms": statistics.median(streamed.tpots) * 1e3 if streamed.tpots else 0.0,
                "ttft_ms": pct(streamed.ttfts, 0.5) * 1e3,
                "gap_p99_ms": pct(streamed.gaps, 0.99) * 1e3,
                "cpu_per_chunk_ms": ((c3 - c2) - (c2 - c1) / max(len(conc.latencies), 1)
                                     * len(streamed.latencies)) / max(streamed.chunks, 1) * 1e3
                if pid else 0.0,
            })
            stack.stop_envoy()
            if setup.sidecar:
                stack.stop_sidecar()
    base = rows[0]
    print(f"\noverhead benchmark: {requests // 2} serial + {requests} concurrent "
          f"(c={concurrency}) non-streaming requests, streamed 48-token responses at 5 ms TPOT")
    print(f"{'setup':42} {'p50':>7} {'+p50':>7} {'p99':>7} {'+p99':>7} {'c.p50':>7} "
          f"{'c.p99':>7} {'req/s':>7} {'cpu/req':>8} {'TTFT':>6} {'TPOT':>6} {'ratio':>6} "
          f"{'gap99':>6} {'cpu/chunk':>9}")
    for r in rows:
        print(f"{r['setup']:42} {r['serial_p50_ms']:7.2f} "
              f"{r['serial_p50_ms'] - base['serial_p50_ms']:+7.2f} {r['serial_p99_ms']:7.2f} "
              f"{r['serial_p99_ms'] - base['serial_p99_ms']:+7.2f} {r['conc_p50_ms']:7.2f} "
              f"{r['conc_p99_ms']:7.2f} {r['rps']:7.0f} {r['cpu_per_req_ms']:8.3f} "
              f"{r['ttft_ms']:6.2f} {r['tpot_ms']:6.2f} {r['tpot_ms'] / base['tpot_ms']:6.3f} "
              f"{r['gap_p99_ms']:6.2f} {r['cpu_per_chunk_ms']:9.3f}")
    print("(ms; +p50/+p99 = added over Envoy alone, serial; cpu = sidecar process CPU;"
          " TTFT = client p50 of streamed requests; ratio = client TPOT / Envoy-alone TPOT;"
          " gap99 = p99 of client inter-token gaps)")
    return 0
