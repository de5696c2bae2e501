"""`serve --workers N` vs one worker: throughput and sidecar CPU per request, measured
through the real Envoy with a real redis-server (a benchmark, not a test: figures only).

    .venv/bin/python bench/fleet_workers.py [--requests 2000] [--concurrency 32]

Each setup: the same fake provider (2 ms TTFT, one token), Envoy with two worker
threads, the sidecar with a ``fleet:`` section; ``workers 1`` is a plain ``serve``.
CPU is user+system of every sidecar process (``/proc``), per routed request. The
machine is shared: read the figures as ratios within one run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sidecar.devtools.bench import cpu_seconds, run_load
from sidecar.devtools.bench_load import envoy_counters
from sidecar.devtools.harness import Stack
from sidecar.devtools.http_load import pct
from sidecar.devtools.redis_server import RedisServer


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def _cpu(pids: list[int]) -> float:
    return sum(cpu_seconds(p) for p in pids)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--envoy-concurrency", type=int, default=2)
    ns = ap.parse_args()
    rows = []
    with Stack() as stack, RedisServer() as redis_srv:
        port = stack.start_provider("p", ttft_ms="2", tpot_ms="1", seed=1,
                                    extra=["--max-tokens", "1"])
        for workers in (1, 2):
            cfg = {
                "default_cluster": "p",
                "clusters": [{"name": "p", "address": f"127.0.0.1:{port}",
                              "models": ["bench-model"], "max_concurrency": 1000},
                             {"name": "q", "address": f"127.0.0.1:{port}",
                              "models": ["bench-model"], "max_concurrency": 1000}],
                "models": [{"name": "bench-model", "candidates": ["p", "q"]}],
                "fleet": {"url": redis_srv.url, "key_prefix": f"bench{workers}"},
            }
            path = stack.write_config(cfg, name=f"w{workers}")
            stack.start_sidecar(path, name="sidecar",
                                extra=["--workers", str(workers)] if workers > 1 else None)
            sup = stack.procs["sidecar"].pid
            # The sidecar process is a Python -m ... child of the spawned shell-less argv.
            pids = _children(sup) if workers > 1 else [sup]
            stack.start_envoy(sidecar_port=stack.ports["sidecar"],
                              envoy_concurrency=ns.envoy_concurrency)
            eport = stack.ports["envoy"]
            run_load(eport, 200, 8)  # warm-up
            e0 = envoy_counters(stack.ports["envoy_admin"])
            c0 = _cpu(pids)
            res = run_load(eport, ns.requests, ns.concurrency)
            c1 = _cpu(pids)
            e1 = envoy_counters(stack.ports["envoy_admin"])
            key = "http.tailroute.ext_proc.tailroute_route.failure_mode_allowed"
            failed_open = e1.get(key, 0) - e0.get(key, 0)
            per_worker = [round(cpu_seconds(p), 2) for p in pids]
            rows.append((workers, res.rps, (c1 - c0) / len(res.latencies) * 1e3,
                         pct(res.latencies, 0.5) * 1e3, pct(res.latencies, 0.99) * 1e3,
                         per_worker, failed_open))
            stack.stop_envoy()
            stack.stop_sidecar()
    base = rows[0]
    print(f"{'workers':>7} {'req/s':>8} {'ratio':>6} {'cpu/req ms':>10} {'ratio':>6} "
          f"{'p50 ms':>7} {'p99 ms':>7} {'fail-open':>9}  cpu s per worker (cumulative)")
    for w, rps, cpu, p50, p99, per, fo in rows:
        print(f"{w:>7} {rps:8.0f} {rps / base[1]:6.2f} {cpu:10.3f} {cpu / base[2]:6.2f} "
              f"{p50:7.2f} {p99:7.2f} {fo:9d}  {per}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
