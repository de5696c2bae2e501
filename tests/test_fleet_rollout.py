"""Replicas whose configs disagree (a rollout) against a real redis-server: what one
config shares that the other lacks is skipped while the rollout runs, and leaves the
store once no replica knows it any more."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis

from sidecar.core.config import parse_config
from sidecar.core.router import Router
from sidecar.core.types import Observation, SliceKey
from sidecar.devtools.redis_server import RedisServer
from sidecar.fleet import codec
from sidecar.fleet.memory import MemoryStore
from sidecar.fleet.redis_store import RedisStore
from sidecar.fleet.sync import FleetSync
from tests.conftest import base_config_dict

SL = SliceKey("m", "interactive", "short", True)
# stats_ttl_s 1 and stale_after_s 1: the health hash outlives its last writer by 2 s.
STATS = {"subwindow_s": 10, "subwindows": 6, "min_samples": 5, "stale_after_s": 1}
HEALTH = "{t}:health"


def _configs() -> tuple[Router, Router]:
    """(a replica of the old config, with cluster d; one of the new, without it)."""
    wider = base_config_dict(stats=STATS)
    wider["clusters"] = [*wider["clusters"], {"name": "d", "address": "127.0.0.1:9004",
                                              "models": ["m"]}]
    wider["models"] = [{"name": "m", "candidates": ["a", "b", "c", "d"]}]
    return (Router(parse_config(wider, "old.yaml")),
            Router(parse_config(base_config_dict(stats=STATS), "new.yaml")))


@pytest.fixture
def server(redis_tool: None) -> Iterator[RedisServer]:
    with RedisServer() as srv:
        yield srv


def test_a_removed_clusters_health_leaves_the_store_once_no_replica_knows_it(
    server: RedisServer,
) -> None:
    """Before, nothing deleted a health field: the hash's TTL is renewed at every push,
    so after a rollout that removed cluster d its fields stayed for good, every replica
    counted them foreign at every push, logged so once a minute, and
    TailrouteFleetRecordsSkipped never cleared. A field naming no route likewise."""
    client = redis.Redis(port=server.port)
    d_field = codec.route_field("d", SL).encode()
    r_old, r_new = _configs()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        store = RedisStore(server.url, "t", 0.5)
        s_old, s_new = (FleetSync(r, rid, 1.0, 0.5) for r, rid in
                        ((r_old, "old"), (r_new, "new")))

        async def cycle(*syncs: FleetSync) -> None:
            for s in syncs:
                now = loop.time()
                s.incoming(await store.exchange(s.outgoing(now), now * 1000.0), now)
            await asyncio.sleep(0.1)

        for _ in range(30):  # the rollout, for longer than the lease and the grace
            r_old.observe(Observation("d", SL, "ok", ttft_s=0.1), loop.time())
            await cycle(s_old, s_new)
        assert client.hexists(HEALTH, d_field)  # the old replica still owns it: kept
        assert s_new.counters.foreign_records > 0
        client.hset(HEALTH, "no route here", b"{}")  # no replica writes that
        for _ in range(150):  # the old replica is gone: its lease lapses
            await cycle(s_new)
            if not client.hexists(HEALTH, d_field) and not client.hexists(HEALTH,
                                                                          "no route here"):
                break
        assert not client.hexists(HEALTH, d_field)
        assert not client.hexists(HEALTH, "no route here")
        assert not client.hexists("{t}:leases", d_field)
        for _ in range(15):  # old's statistics expire too (stats_ttl_s 1)
            await cycle(s_new)
        counts = (s_new.counters.foreign_records, s_new.counters.bad_peer_records)
        for _ in range(3):
            await cycle(s_new)
        assert (s_new.counters.foreign_records, s_new.counters.bad_peer_records) == counts
        await store.close()

    asyncio.run(main())


def test_the_in_process_store_prunes_as_redis_does() -> None:
    """The policy lab's store (the unit tests' fake) deletes the same fields."""
    r_old, r_new = _configs()
    store = MemoryStore()
    s_old, s_new = FleetSync(r_old, "old", 1.0, 0.5), FleetSync(r_new, "new", 1.0, 0.5)
    d_field = codec.route_field("d", SL)
    t = 1000.0
    for k in range(20):
        t = 1000.0 + 0.1 * k
        r_old.observe(Observation("d", SL, "ok", ttft_s=0.1), t)
        for s in (s_old, s_new):
            s.incoming(store.exchange(s.outgoing(t), t * 1000.0), t)
    assert d_field in store.health.fields
    for _ in range(40):  # 4 s alone: the lease (0.5 s) and the grace (2 s) pass
        t += 0.1
        s_new.incoming(store.exchange(s_new.outgoing(t), t * 1000.0), t)
    assert d_field not in store.health.fields and d_field not in store.leases
