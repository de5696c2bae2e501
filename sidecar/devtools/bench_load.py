"""`tailroute bench load`: does tailroute hold up at production load? Measured, not asserted.

One fake provider, Envoys in front of it in the same run: Envoy alone (the
baseline) and Envoy + tailroute (rendered bootstrap, the sidecar process) for
each requested routing mode (``--modes``: ``extproc``, ``native``, ``hybrid``;
the hybrid setup sends every 10th request with ``x-tailroute-class: batch``, a
``routing.per_request_classes`` class, so 10 % take the per-request path).
For each concurrency all are driven by the same closed-loop client for the
same duration, in alternating rounds (``--rounds``, default 3), so drift in a
shared machine's load hits them alike. Per level it
prints requests/s, p50/p99 and what tailroute adds to them, the sidecar's CPU
per request (``/proc/<pid>/stat``), the share of requests tailroute decided as
Envoy's own ext_proc and circuit-breaker stats count them, and the sidecar's
ok/cancel/error/timeout outcomes next to what the client saw.

Bounded (duration and a request cap per level), 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.devtools import http_load
from sidecar.devtools.bench import cpu_seconds
from sidecar.devtools.harness import Stack, free_port, http_json

_ROUTE_FILTERS = ("tailroute_route", "tailroute_route_rich")
_REQUEST_CAP = 2_000_000


HYBRID_EVERY = (10, {"x-tailroute-class": "batch"})  # 10 % per-request traffic in hybrid


def _config(provider_port: int, sidecar_port: int, mode: str = "extproc") -> dict[str, Any]:
    routing: dict[str, Any] = {"mode": mode}
    if mode == "hybrid":
        routing["per_request_classes"] = ["batch"]
    return {
        "default_cluster": "p",
        "clusters": [{"name": "p", "address": f"127.0.0.1:{provider_port}",
                      "models": ["bench-model"], "max_concurrency": 4096}],
        "models": [{"name": "bench-model", "candidates": ["p"]}],
        "listen": {"grpc": f"127.0.0.1:{sidecar_port}"},
        "routing": routing,
    }


def envoy_counters(admin_port: int) -> dict[str, int]:
    """Envoy's counters (admin /stats, JSON), by full name."""
    url = f"http://127.0.0.1:{admin_port}/stats?format=json&type=Counters"
    with urllib.request.urlopen(url, timeout=10) as r:
        data = json.loads(r.read())
    return {s["name"]: int(s["value"]) for s in data.get("stats", []) if "value" in s}


def _delta(after: dict[str, int], before: dict[str, int]) -> Counter[str]:
    return Counter({k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)})


def _sum(stats: Counter[str], suffix: str, filters: tuple[str, ...] = _ROUTE_FILTERS) -> int:
    return sum(v for k, v in stats.items()
               if k.endswith(suffix) and any(f".{f}." in k for f in filters))


@dataclass
class Setup:
    """One Envoy + sidecar pair in a routing mode."""

    mode: str
    envoy_port: int
    envoy_admin: int
    sidecar_admins: list[int]  # one per process (each worker of serve --workers N)
    sidecar_pids: list[int]  # the sidecar, or the workers of serve --workers N


@dataclass
class Row:
    mode: str
    result: http_load.ClientResult
    cpu_s: float
    envoy: Counter[str]
    sidecar: Counter[str]


@dataclass
class Level:
    concurrency: int
    alone: http_load.ClientResult
    rows: list[Row]


def _sidecar_outcomes(admin_ports: list[int]) -> Counter[str]:
    """Every sidecar process's counters, summed (each worker decides and logs its own)."""
    out: Counter[str] = Counter()
    for port in admin_ports:
        state = http_json(f"http://127.0.0.1:{port}/state")
        out.update({k: int(v) for k, v in state["counters"].items()})
        out.update({f"envoy:{k}": int(v) for k, v in state.get("envoy", {}).items()
                    if isinstance(v, int)})
    return out


def _settle(admin_port: int, timeout_s: float = 10.0) -> None:
    """Wait (bounded) until the sidecar holds no request waiting for its log entry and
    no entry arrived for 0.3 s (native requests are never pending: they are only logged)."""
    deadline = time.monotonic() + timeout_s
    last = -1
    while time.monotonic() < deadline:
        envoy = http_json(f"http://127.0.0.1:{admin_port}/state").get("envoy", {})
        if envoy.get("pending", 0) == 0 and envoy.get("entries") == last:
            return
        last = envoy.get("entries", -1)
        time.sleep(0.3)
    print(f"  (sidecar still had pending requests after {timeout_s:g}s)", file=sys.stderr)


def _start_setup(st: Stack, mode: str, provider_port: int, loop_args: list[str],
                 workers: int = 1, fleet_url: str | None = None) -> Setup:
    sport = free_port()
    cfg = _config(provider_port, sport, mode)
    worker_args: list[str] = []
    if fleet_url is not None:
        cfg["fleet"] = {"url": fleet_url, "key_prefix": f"bench-{mode}"}
        worker_args = ["--workers", str(workers)]
    path = st.write_config(cfg)
    path = path.rename(path.with_name(f"tailroute-{mode}.yaml"))
    st.start_sidecar(path, extra=[*loop_args, *worker_args, "--grpc", f"127.0.0.1:{sport}"])
    st.procs[f"sidecar_{mode}"] = sidecar = st.procs.pop("sidecar")
    port = st.start_envoy()
    st.procs[f"envoy_{mode}"] = st.procs.pop("envoy")
    pids = _worker_pids(sidecar.pid) if workers > 1 else [sidecar.pid]
    admins = _worker_admins(st.workdir) if workers > 1 else [st.ports["sidecar_admin"]]
    return Setup(mode, port, st.ports["envoy_admin"], admins, pids)


def run_load_bench(concurrency: tuple[int, ...] = (1, 16, 64, 256), duration_s: float = 30.0,
                   stream: bool = True, tokens: int = 4, loop: str = "auto",
                   warmup_s: float = 2.0, modes: tuple[str, ...] = ("extproc",),
                   rounds: int = 3, workers: int = 1) -> int:
    levels: list[Level] = []
    with Stack() as st, contextlib.ExitStack() as store:
        pport = st.start_provider("p", ttft_ms="2", tpot_ms="1", seed=1,
                                  extra=["--max-tokens", str(max(tokens, 1))])
        loop_args = [] if loop == "auto" else ["--loop", loop]
        fleet_url = None
        if workers > 1:  # serve --workers N shares state through a real redis-server
            from sidecar.devtools.redis_server import RedisServer

            fleet_url = store.enter_context(RedisServer()).url
        setups = [_start_setup(st, m, pport, loop_args, workers, fleet_url) for m in modes]
        alone_port = st.start_envoy(with_sidecar=False)

        def drive(port: int, c: int, seconds: float, mode: str = "") -> http_load.ClientResult:
            return asyncio.run(http_load.run(
                port, c, seconds, stream, tokens, cap=_REQUEST_CAP,
                every=HYBRID_EVERY if mode == "hybrid" else None))

        for su in setups:
            drive(su.envoy_port, 4, warmup_s, su.mode)
        drive(alone_port, 4, warmup_s)
        part = duration_s / rounds
        for c in concurrency:
            alone = http_load.ClientResult()
            rows = {su.mode: Row(su.mode, http_load.ClientResult(), 0.0, Counter(), Counter())
                    for su in setups}
            # Rounds alternate the setups, so drift in the machine's load (shared
            # machines) hits all of them alike instead of whichever ran last.
            for rnd in range(rounds):
                print(f"-- c={c} round {rnd + 1}/{rounds}: envoy alone", file=sys.stderr,
                      flush=True)
                alone.merge(drive(alone_port, c, part))
                for su in setups:
                    print(f"-- c={c} round {rnd + 1}/{rounds}: envoy + tailroute ({su.mode})",
                          file=sys.stderr, flush=True)
                    row = rows[su.mode]
                    e0, s0 = envoy_counters(su.envoy_admin), _sidecar_outcomes(su.sidecar_admins)
                    c0 = sum(cpu_seconds(p) for p in su.sidecar_pids)
                    row.result.merge(drive(su.envoy_port, c, part, su.mode))
                    row.cpu_s += sum(cpu_seconds(p) for p in su.sidecar_pids) - c0
                    if workers > 1:
                        print(f"   cpu per worker (cumulative s): "
                              f"{[round(cpu_seconds(p), 2) for p in su.sidecar_pids]}",
                              file=sys.stderr)
                    for admin in su.sidecar_admins:
                        _settle(admin)
                    row.envoy.update(_delta(envoy_counters(su.envoy_admin), e0))
                    row.sidecar.update(_delta(_sidecar_outcomes(su.sidecar_admins), s0))
            levels.append(Level(c, alone, list(rows.values())))
        restarts = [_worker_restarts(st.workdir)] if workers > 1 else []
    _print(levels, duration_s, stream, tokens, loop)
    if workers > 1:
        print(f"(sidecar: serve --workers {workers}, state shared through redis-server; "
              "cpu/req and the outcome columns sum every worker)")
        print(*restarts)
    return 0


def _worker_restarts(workdir: Path) -> str:
    """What the supervisor of the run's ``serve --workers N`` restarted: a worker killed for
    hanging under this load would be a false kill (docs/operations.md, "A hung worker")."""
    rec = http_json(f"http://127.0.0.1:{_worker_admins(workdir)[0]}/state")["workers"]["workers"]
    return "workers restarted (died / killed as hung; most heartbeat probes missed in a " \
        "row): " + ", ".join(f"w{i} {w['restarts'] - w['hung_restarts']} / "
                             f"{w['hung_restarts']}; {w['most_missed']}"
                             for i, w in enumerate(rec))


def _worker_admins(workdir: Path) -> list[int]:
    """The admin ports of the workers of the ``serve --workers N`` started last: its
    supervisor lists them beside its ready file (``sidecar.port.workers``)."""
    return [int(p) for p in (workdir / "sidecar.port.workers").read_text().split()]


def _worker_pids(supervisor: int) -> list[int]:
    """The worker processes of ``serve --workers N`` (children of the supervisor)."""
    try:
        with open(f"/proc/{supervisor}/task/{supervisor}/children") as f:
            text = f.read()
    except OSError:
        return [supervisor]
    return [int(x) for x in text.split()] or [supervisor]


def _print(levels: list[Level], duration_s: float, stream: bool, tokens: int, loop: str) -> None:
    kind = f"streamed {tokens}-token" if stream else f"non-streaming {tokens}-token"
    print(f"\nload benchmark: {kind} chat completions, {duration_s:g} s per setup and level "
          f"(in alternating rounds), "
          f"one fake provider (TTFT 2 ms, TPOT 1 ms); sidecar event loop: {loop}")
    print(f"{'c':>4} {'setup':16} {'req/s':>7} {'ratio':>6} {'p50':>7} {'+p50':>7} {'p99':>7} "
          f"{'+p99':>7} {'cpu/req':>8} {'decided':>8} {'ovfl':>5} {'f.open':>6} "
          f"{'client 2xx/other/fail':>22} {'sidecar ok/cancel/err/tmo':>26}")
    for lv in levels:
        a = lv.alone
        a50, a99 = http_load.pct(a.latencies, 0.5) * 1e3, http_load.pct(a.latencies, 0.99) * 1e3
        print(f"{lv.concurrency:4d} {'envoy alone':16} {a.rps:7.0f} {1:6.2f} {a50:7.2f} "
              f"{'':>7} {a99:7.2f} {'':>7} {'':>8} {'':>8} {'':>5} {'':>6} "
              f"{_client(a):>22}")
        for row in lv.rows:
            _print_row(lv.concurrency, row, a, a50, a99)
    print("(ms; ratio = req/s against Envoy alone at the same concurrency; +p50/+p99 = added "
          "over Envoy alone; cpu/req = sidecar process CPU per request; decided = 1 - "
          "Envoy's ext_proc failure_mode_allowed / requests the sidecar was asked about "
          "(native: routed by published weights, no ext_proc); ovfl = the sidecar "
          "cluster's circuit-breaker overflows; the machine may be shared: compare within "
          "a level, not across runs)")


def _print_row(c: int, row: Row, a: http_load.ClientResult, a50: float, a99: float) -> None:
    r = row.result
    r50, r99 = http_load.pct(r.latencies, 0.5) * 1e3, http_load.pct(r.latencies, 0.99) * 1e3
    total = row.envoy.get("http.tailroute.downstream_rq_total", 0)
    failed_open = _sum(row.envoy, ".failure_mode_allowed")
    overflow = sum(v for k, v in row.envoy.items()
                   if k.startswith("cluster.tailroute_sidecar.") and k.endswith("_overflow"))
    s = row.sidecar
    if row.mode == "native":
        decided = "native"
    else:
        asked = total - s["envoy:native"]
        decided = f"{(asked - failed_open) / asked:.2%}" if asked > 0 else "n/a"
    n = sum(r.statuses.values())
    cpu = row.cpu_s / n * 1e3 if n else float("nan")
    label = "envoy+tailroute" if row.mode == "extproc" else f"tailroute {row.mode}"
    print(f"{c:4d} {label:16} {r.rps:7.0f} "
          f"{r.rps / a.rps if a.rps else float('nan'):6.2f} {r50:7.2f} {r50 - a50:+7.2f} "
          f"{r99:7.2f} {r99 - a99:+7.2f} {cpu:8.3f} {decided:>8} {overflow:5d} "
          f"{failed_open:6d} {_client(r):>22} "
          f"{s['outcome:ok']:>8}/{s['outcome:cancel']}/{s['outcome:error']}/"
          f"{s['outcome:timeout']:<6}")
    mismatch = (s["outcome:ok"] - r.ok) / r.ok if r.ok else float("nan")
    print(f"{'':4} {'':16} sidecar ok vs client 2xx: {mismatch:+.2%}; access log: "
          f"{s['envoy:decided']} decided, {s['envoy:native']} native, "
          f"{s['envoy:fail_open']} fail-open, {s['envoy:orphan']} orphan; Envoy: {total} "
          f"requests, {_sum(row.envoy, '.message_timeouts')} ext_proc timeouts")


def _client(r: http_load.ClientResult) -> str:
    other = sum(n for s, n in r.statuses.items() if not 200 <= s < 300)
    return f"{r.ok}/{other}/{sum(r.failures.values())}"
