"""What fleet mode costs the store: commands/s per replica under load, and memory at the
slice-cardinality limit, against a real redis-server (figures, not a test).

    .venv/bin/python bench/fleet_store.py [--replicas 2] [--rate 500] [--slices 512 64 8]

Replicas are core routers with the production sync (``FleetSync`` + ``RedisStore``)
on a virtual clock, so the figures do not depend on how busy the machine is:
``--rate`` observations per second per replica over 3 clusters, one push per
``fleet.push_interval_s`` (1 s). Memory: every cluster filled up to
``stats.max_slices`` narrow slices, observations in every sub-window of the window.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sidecar.core.config import parse_config
from sidecar.core.router import Router
from sidecar.core.types import Observation, SliceKey
from sidecar.devtools.redis_server import RedisServer
from sidecar.fleet.redis_store import RedisStore
from sidecar.fleet.sync import FleetSync

CLUSTERS = ("a", "b", "c")
WRITES = {"hset", "hdel", "pexpire", "zadd", "zremrangebyscore", "rpush", "lpop", "evalsha"}


def _config(max_slices: int) -> Any:
    return parse_config({
        "clusters": [{"name": c, "address": f"127.0.0.1:{9000 + i}", "models": ["m"]}
                     for i, c in enumerate(CLUSTERS)],
        "models": [{"name": "m", "candidates": list(CLUSTERS)}],
        "stats": {"max_slices": max_slices},
        "fleet": {"url": "redis://127.0.0.1:1/0"},
    }, "bench.yaml")


def _slices(n: int) -> list[SliceKey]:
    profiles = ("short", "medium", "long")
    return [SliceKey("m", f"class{i // 6}", profiles[i % 3], bool(i % 2)) for i in range(n)]


async def _run(srv: RedisServer, replicas: int, rate: int, slices: int, seconds: int,
               prefix: str) -> dict[str, Any]:
    cfg = _config(max(slices, 1))
    client = redis.Redis(port=srv.port)
    routers = [Router(cfg) for _ in range(replicas)]
    syncs = [FleetSync(r, f"r{i}", 60.0, 3.0) for i, r in enumerate(routers)]
    store = RedisStore(srv.url, prefix, 2.0)
    keys = _slices(slices)
    rng = random.Random(1)
    mem0 = int(client.info("memory")["used_memory"])
    client.config_resetstat()
    now = 1000.0
    for second in range(seconds):
        for i, r in enumerate(routers):
            for j in range(rate):
                t = 1000.0 + second + j / rate
                sl = keys[(j * replicas + i) % len(keys)]
                r.observe(Observation(rng.choice(CLUSTERS), sl, "ok",
                                      ttft_s=rng.lognormvariate(-1.5, 0.5),
                                      tpot_s=rng.lognormvariate(-4, 0.3),
                                      e2e_s=rng.lognormvariate(0, 0.5)), t)
        now = 1000.0 + second + 0.999
        for s in syncs:
            s.incoming(await store.exchange(s.outgoing(now), now * 1000.0), now)
    stats: dict[str, Any] = client.info("commandstats")  # type: ignore[assignment]
    calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
    calls.pop("info", None)
    calls.pop("config|resetstat", None)
    net: dict[str, Any] = client.info("stats")  # type: ignore[assignment]
    mem = int(client.info("memory")["used_memory"]) - mem0
    sent = store.commands_sent
    fields = client.hlen(f"{{{prefix}}}:stats:r0")
    nkeys = len(client.keys(f"{{{prefix}}}:*"))
    await store.close()
    total = sum(calls.values())
    writes = sum(n for c, n in calls.items() if c in WRITES)
    per = replicas * seconds
    return {"replicas": replicas, "rate": rate, "slices": slices,
            "sent_per_s": sent / per, "cmds_per_s": total / per, "writes_per_s": writes / per,
            "in_kib_per_s": int(net["total_net_input_bytes"]) / per / 1024,
            "out_kib_per_s": int(net["total_net_output_bytes"]) / per / 1024,
            "mem_mib": mem / 2**20, "keys": nkeys, "fields_per_replica": fields,
            "series": len(routers[0].stats)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--rate", type=int, default=500)
    ap.add_argument("--seconds", type=int, default=70, help="virtual seconds (> the window)")
    ap.add_argument("--slices", type=int, nargs="+", default=[8, 64, 512])
    ns = ap.parse_args()
    rows = []
    with RedisServer() as srv:
        for n in ns.slices:
            srv.stop()
            srv.start()
            rows.append(asyncio.run(_run(srv, ns.replicas, ns.rate, n, ns.seconds, f"b{n}")))
    print(f"{ns.replicas} replicas x {ns.rate} observations/s over {len(CLUSTERS)} clusters, "
          f"push every 1 s, {ns.seconds} virtual s")
    print(f"{'slices/cluster':>14} {'sent/s':>7} {'calls/s':>8} {'writes/s':>9} {'in KiB/s':>9} "
          f"{'out KiB/s':>10} {'keys':>5} {'fields/replica':>15} {'Redis MiB':>10}")
    for r in rows:
        print(f"{r['slices']:>14} {r['sent_per_s']:7.1f} {r['cmds_per_s']:8.1f} "
              f"{r['writes_per_s']:9.1f} "
              f"{r['in_kib_per_s']:9.1f} {r['out_kib_per_s']:10.1f} {r['keys']:>5} "
              f"{r['fields_per_replica']:>15} {r['mem_mib']:10.2f}")
    print("(per replica: sent = commands the replica sends, in one pipelined round trip per "
          "push; calls = what Redis executes, the lease script's per-route HGET/HSET included; "
          "writes = those of the calls that write)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
