"""`tailroute bench soak --minutes M`: does the sidecar's memory stay flat under steady load?

A benchmark, not a test: it prints figures. Three fake providers, the sidecar
and Envoy on 127.0.0.1; the real ``openai`` client streams chat requests at
``--rate`` requests/s with at most ``--concurrency`` in flight, for ``--minutes``
(bounded). Every ``--sample-s`` it records the sidecar's resident set size
(``VmRSS`` from /proc), the gRPC streams Envoy holds open to it
(``upstream_rq_active`` of the sidecar cluster) and the requests in flight.

After ``--warmup-min`` (caches, arenas, histograms and rolling windows fill up)
it fits a least-squares line to RSS over time: the **RSS slope** in MB/min is
the figure (flat means about 0; the acceptance bar is <= 0.05 MB/min over 30
minutes at ~70 req/s). At the end: client ok/failed, the sidecar's counters
(outcomes, errors, fail-open), open streams.

``--distinct`` gives every request its own tenant and request id (the ids go
through the retry memory, which is bounded); ``--tracemalloc`` runs the sidecar
under :mod:`sidecar.devtools.traced_serve` and prints the 15 allocation sites
that grew most between the end of warm-up and the end (tracemalloc slows the
sidecar down: use it to find growth, not to measure the slope).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import tracemalloc
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar.devtools.harness import Stack
from sidecar.devtools.openai_load import ClientLoad

MODEL = "soak-model"
PROVIDERS = {"soak-a": ("20:40", "2:3"), "soak-b": ("25:45", "2:3"), "soak-c": ("30:60", "2:3")}


@dataclass
class Sample:
    t_s: float
    rss_mb: float
    open_streams: int
    inflight: int


@dataclass
class SoakResult:
    samples: list[Sample] = field(default_factory=list)
    warmup_s: float = 0.0

    def slope_mb_per_min(self) -> float | None:
        """Least-squares slope of RSS over time after warm-up (None with < 3 samples)."""
        pts = [(s.t_s / 60.0, s.rss_mb) for s in self.samples if s.t_s >= self.warmup_s]
        if len(pts) < 3:
            return None
        n = len(pts)
        mx = sum(x for x, _ in pts) / n
        my = sum(y for _, y in pts) / n
        sxx = sum((x - mx) ** 2 for x, _ in pts)
        return sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx else None


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:
        return bytes(r.read())


def envoy_stat(admin_port: int, name: str) -> int:
    data = json.loads(_get(f"http://127.0.0.1:{admin_port}/stats?filter=^{name}$&format=json"))
    stats = data.get("stats") or [{}]
    return int(stats[0].get("value", 0))


def sidecar_counters(admin_port: int) -> dict[str, float]:
    """Counter samples of the sidecar's /metrics worth printing at the end."""
    out: dict[str, float] = {}
    text = _get(f"http://127.0.0.1:{admin_port}/metrics").decode()
    keep = ("tailroute_outcomes_total", "tailroute_errors_total", "tailroute_fail_open_total",
            "tailroute_admission_total")
    for line in text.splitlines():
        if line.startswith(keep):
            name, _, value = line.rpartition(" ")
            if float(value):
                out[name] = float(value)
    return out


def _config(ports: dict[str, int]) -> dict[str, Any]:
    return {
        "default_cluster": "soak-b",
        "clusters": [{"name": n, "address": f"127.0.0.1:{p}", "models": [MODEL],
                      "max_concurrency": 256} for n, p in ports.items()],
        "models": [{"name": MODEL, "candidates": list(ports)}],
    }


def _top_growth(first: Path, last: Path, n: int = 15) -> list[str]:
    a = tracemalloc.Snapshot.load(str(first))
    b = tracemalloc.Snapshot.load(str(last))
    lines = []
    for stat in b.compare_to(a, "traceback")[:n]:
        frames = [f"{f.filename.rsplit('site-packages/', 1)[-1]}:{f.lineno}"
                  for f in stat.traceback[-4:]]
        lines.append(f"{stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks  "
                     + " < ".join(reversed(frames)))
    return lines


def run_soak(minutes: float = 30.0, rate: float = 70.0, concurrency: int = 8,
             warmup_min: float | None = None, sample_s: float = 5.0, distinct: bool = False,
             traced: bool = False) -> int:
    """Run the soak and print its figures; returns the exit status."""
    duration_s = minutes * 60.0
    warmup_s = (warmup_min if warmup_min is not None else min(5.0, minutes / 5.0)) * 60.0
    result = SoakResult(warmup_s=warmup_s)
    with Stack() as stack:
        ports = {n: stack.start_provider(n, t, p, seed=i)
                 for i, (n, (t, p)) in enumerate(PROVIDERS.items())}
        path = stack.write_config(_config(ports))
        prefix = stack.workdir / "trace"
        launcher = ([sys.executable, "-m", "sidecar.devtools.traced_serve", str(prefix)]
                    if traced else None)
        stack.start_sidecar(path, launcher=launcher)
        stack.start_envoy()
        pid = stack.procs["sidecar"].pid
        admin, envoy_admin = stack.ports["sidecar_admin"], stack.ports["envoy_admin"]
        load = ClientLoad(stack.base_url, MODEL, rate=rate, concurrency=concurrency,
                          max_tokens=16, max_requests=int(rate * duration_s) + 1,
                          distinct=distinct).start()
        print(f"soak: {minutes:g} min at {rate:g} req/s (concurrency {concurrency}"
              f"{', distinct tenants and ids' if distinct else ''}), warm-up "
              f"{warmup_s / 60:g} min, sidecar pid {pid}", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        dumped_warm = False
        try:
            while (elapsed := time.monotonic() - t0) < duration_s:
                try:
                    state = json.loads(_get(f"http://127.0.0.1:{admin}/state"))
                    streams = envoy_stat(envoy_admin,
                                         "cluster.tailroute_sidecar.upstream_rq_active")
                except OSError:  # busy (e.g. writing a tracemalloc snapshot): next time
                    time.sleep(sample_s)
                    continue
                result.samples.append(Sample(
                    elapsed, rss_mb(pid), streams,
                    sum(c["inflight"] for c in state["clusters"].values())))
                s = result.samples[-1]
                print(f"  t={elapsed:7.1f}s rss={s.rss_mb:7.2f} MB streams={s.open_streams:4d} "
                      f"inflight={s.inflight:3d} sent={load.sent()}", file=sys.stderr,
                      flush=True)
                if traced and not dumped_warm and elapsed >= warmup_s:
                    os.kill(pid, signal.SIGUSR1)
                    dumped_warm = True
                time.sleep(sample_s)
        finally:
            counts = load.stop()
        if traced:
            os.kill(pid, signal.SIGUSR1)
            last = Path(f"{prefix}.1.snap")
            deadline = time.monotonic() + 120  # the traced sidecar writes it between requests
            while not last.exists() and time.monotonic() < deadline:
                time.sleep(0.5)
            time.sleep(2.0)
        time.sleep(1.0)
        streams_after = envoy_stat(envoy_admin, "cluster.tailroute_sidecar.upstream_rq_active")
        counters = sidecar_counters(admin)
        final_rss = rss_mb(pid)
        growth = (_top_growth(Path(f"{prefix}.0.snap"), Path(f"{prefix}.1.snap"))
                  if traced and Path(f"{prefix}.1.snap").exists() else [])
    if not result.samples:  # the sidecar never answered /state: nothing to report
        print(f"\nsoak benchmark: no samples in {minutes:g} min (the sidecar's /state never "
              "answered)", file=sys.stderr)
        return 1
    slope = result.slope_mb_per_min()
    post = [s for s in result.samples if s.t_s >= warmup_s]
    print(f"\nsoak benchmark: {minutes:g} min at {rate:g} req/s, {len(result.samples)} samples "
          f"every {sample_s:g} s (machine noise applies: compare runs made together)")
    print(f"  RSS: start {result.samples[0].rss_mb:.1f} MB, after warm-up "
          f"{post[0].rss_mb if post else float('nan'):.1f} MB, end {final_rss:.1f} MB")
    print(f"  RSS slope after warm-up: "
          f"{'n/a (run longer)' if slope is None else f'{slope:+.4f} MB/min'}")
    print(f"  open sidecar streams (Envoy): max {max(s.open_streams for s in result.samples)}"
          f" during, {streams_after} after the load stopped")
    print(f"  client: {counts.snapshot()}")
    print("  sidecar counters: " + ", ".join(f"{k} {v:g}" for k, v in sorted(counters.items())))
    if growth:
        print("  top allocation growth after warm-up (tracemalloc):")
        for line in growth:
            print(f"    {line}")
    return 0
