"""A store that is slow, not dead (``CLIENT PAUSE`` on a real redis-server): a cycle
that outlives ``fleet.timeout_ms`` fails, and the replica keeps what it knew as long
as it would have trusted it with the store answering. And a cycle with much to merge
does not hold the event loop, which the decisions share."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis

from sidecar.core.config import Config, parse_config
from sidecar.core.router import Router
from sidecar.core.types import Observation, SliceKey
from sidecar.devtools.redis_server import RedisServer
from sidecar.fleet.exchange import Exchange, Reply
from sidecar.fleet.link import FleetLink
from sidecar.fleet.memory import MemoryStore
from sidecar.fleet.stats_sync import MERGE_STEP
from sidecar.fleet.sync import FleetSync
from sidecar.shell.app import App
from tests.conftest import base_config_dict
from tests.test_fleet_sync import Fleet


@pytest.fixture
def server(redis_tool: None) -> Iterator[RedisServer]:
    with RedisServer() as srv:
        yield srv


def _config(url: str) -> Config:
    return parse_config(base_config_dict(
        stats={"subwindow_s": 10, "subwindows": 6, "min_samples": 5},
        fleet={"url": url, "push_interval_s": 0.2, "lease_ttl_s": 3.0, "timeout_ms": 300}),
        "t.yaml")


def test_a_paused_store_keeps_the_peers_in_flight_counts_while_fresh(
    server: RedisServer,
) -> None:
    """A provider's ``max_concurrency`` is shared by the fleet. Before, one round trip
    slower than ``timeout_ms`` (a paused or busy store) dropped every peer's in-flight
    count at once: each replica then admitted the provider's whole capacity by itself,
    the fleet up to k times it, until the store answered again."""
    cfg = _config(server.url)
    client = redis.Redis(port=server.port)

    async def main() -> None:
        apps = [App.create(cfg, seed=i) for i in range(2)]
        links = [FleetLink(app, cfg.fleet, rid=f"r{i}") for i, app in  # type: ignore[arg-type]
                 enumerate(apps)]
        for _ in range(4):
            apps[1].router.started("b")
        for _ in range(3):  # meet the peer, then read its count
            for link in links:
                assert await link._attempt()
        assert apps[0].router.inflight("b") == 4
        client.client_pause(3000)  # every command waits 3 s: the cycle times out
        try:
            assert not await links[0]._attempt()
        finally:
            client.client_unpause()
        assert links[0].up is False
        # Pulled within lease_ttl_s (3 s): still the peer's load, as with the store up.
        assert apps[0].router.peer_inflight == {"b": 4}
        assert apps[0].router.inflight("b") == 4
        for link in links:
            await link.close()

    asyncio.run(main())


def test_a_peers_count_still_ages_out_while_the_store_is_away() -> None:
    """Kept through a failed cycle, a count is dropped once older than ``lease_ttl_s``
    (3 s here) all the same: a peer that died meanwhile does not hold capacity."""
    f = Fleet(2)
    for _ in range(3):
        f.routers[1].started("b")
    for t in (1000.0, 1000.3, 1000.6):
        f.cycle(t)
    assert f.routers[0].inflight("b") == 3
    f.syncs[0].disconnected(1001.0)  # the link's answer to a failed cycle
    assert f.routers[0].inflight("b") == 3
    # The count replica 0 last read is replica 1's push at 1000.3 (it pushes second).
    f.syncs[0].disconnected(1003.2)  # under 3 s old
    assert f.routers[0].inflight("b") == 3
    f.syncs[0].disconnected(1003.4)  # over 3 s old
    assert f.routers[0].inflight("b") == 0 and f.routers[0].peer_inflight == {}


class _InProcess:
    """The link's Store over the in-process store (the Redis store's semantics)."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    async def exchange(self, ex: Exchange, now_ms: float) -> Reply:
        return self.store.exchange(ex, now_ms)

    async def close(self) -> None:
        return None


def test_merging_the_peers_whole_windows_lets_the_event_loop_serve_meanwhile() -> None:
    """A replica whose store answers only once it serves meets its peers' whole windows
    in one reply: 2 peers x 120 series x 3 sub-windows here. Before, the link merged
    them in one go (5,764 of them took 1.8 s of CPU), and no ext_proc message was
    answered meanwhile; now the loop runs between steps of MERGE_STEP sub-windows."""
    models = [f"m{i}" for i in range(20)]
    d = base_config_dict(stats={"subwindow_s": 10, "subwindows": 6, "min_samples": 5},
                         fleet={"url": "redis://127.0.0.1:1/0"})
    d["models"] = [{"name": m, "candidates": ["a", "b", "c"]} for m in models]
    for c in d["clusters"]:
        c["models"] = models
    cfg = parse_config(d, "t.yaml")
    slices = [SliceKey(m, k, "short", True) for m in models for k in ("interactive", "batch")]

    async def main() -> None:
        loop = asyncio.get_running_loop()
        store = MemoryStore()
        app = App.create(cfg, seed=0)
        link = FleetLink(app, cfg.fleet, store=_InProcess(store), rid="r0")  # type: ignore[arg-type]
        offset = link.sync.wall_offset
        peers = [FleetSync(Router(cfg), f"p{i}", 60.0, 3.0, offset) for i in range(2)]
        t0 = loop.time() - 25.0
        for step in range(3):  # three sub-windows of every series
            t = t0 + 10.0 * step
            for p in peers:
                for c in ("a", "b", "c"):
                    for s in slices:
                        p.router.observe(Observation(c, s, "ok", ttft_s=0.1), t)
                p.incoming(store.exchange(p.outgoing(t), (t + offset) * 1000.0), t)
        await link.cycle()  # meets the peers
        turns, done = 0, False

        async def other_work() -> None:  # what the ext_proc streams would be
            nonlocal turns
            while not done:
                turns += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(other_work())
        await link.cycle()  # takes their windows
        done = True
        await task
        fields = sum(len(h.fields) for h in store.stats.values())
        assert fields >= 2 * 120 * 3
        assert turns >= fields // MERGE_STEP - 2  # a turn between steps
        rs = app.router.stats.series("a", slices[0])
        assert rs is not None and rs.count("ttft", loop.time()) == 2 * 3  # merged whole

    asyncio.run(main())
