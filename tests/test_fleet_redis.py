"""The Redis store and the asyncio link against a real redis-server on 127.0.0.1:
the same semantics as the in-process store, a bounded number of commands and keys
whatever the request rate, and a store that dies, comes back empty or answers slowly
never stops a replica from deciding."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from sidecar.core.config import Config, parse_config
from sidecar.core.router import Router
from sidecar.core.types import Observation, SliceKey, TransitionEvent
from sidecar.devtools.redis_server import RedisServer
from sidecar.fleet.link import FleetLink
from sidecar.fleet.metrics import FLEET_METRIC_NAMES, FleetCollector
from sidecar.fleet.redis_store import RedisStore
from sidecar.fleet.sync import FleetSync
from sidecar.shell.app import App
from tests.conftest import base_config_dict

pytestmark = pytest.mark.usefixtures("redis_tool")

SL = SliceKey("m", "interactive", "short", True)


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as srv:
        yield srv


def _config(url: str, **fleet: Any) -> Config:
    return parse_config(base_config_dict(
        stats={"subwindow_s": 10, "subwindows": 6, "min_samples": 5},
        fleet={"url": url, "push_interval_s": 0.2, "lease_ttl_s": 1.0, "timeout_ms": 300,
               **fleet}), "t.yaml")


def _samples(r: Router, now: float, cluster: str = "a") -> int:
    rs = r.stats.series(cluster, SL)
    return 0 if rs is None else rs.count("ttft", now)


def _commands(client: redis.Redis) -> int:
    stats: dict[str, Any] = client.info("commandstats")  # type: ignore[assignment]
    return sum(int(v["calls"]) for k, v in stats.items()
               if k not in ("cmdstat_info", "cmdstat_config", "cmdstat_flushall"))


def test_exchanges_share_statistics_once_with_a_bounded_command_count(
    server: RedisServer,
) -> None:
    cfg = _config(server.url)
    client = redis.Redis(port=server.port)

    async def main() -> None:
        routers = [Router(cfg), Router(cfg)]
        syncs = [FleetSync(r, f"r{i}", 60.0, 1.0) for i, r in enumerate(routers)]
        store = RedisStore(server.url, "t", 0.5)
        now = 1000.0

        async def cycle(t: float) -> None:
            for s in syncs:
                s.incoming(await store.exchange(s.outgoing(t), t * 1000.0), t)

        await cycle(now)

        async def burst(per_cycle: int, t0: float) -> tuple[float, float]:
            client.config_resetstat()
            t = t0
            for step in range(10):  # 10 cycles, 2 x per_cycle requests each
                for i, r in enumerate(routers):
                    for j in range(per_cycle):
                        t = t0 + step * 0.5 + j * 0.2 / per_cycle
                        r.observe(Observation("a", SL, "ok", ttft_s=0.1 * (i + 1)), t)
                await cycle(t)
            return _commands(client) / (10 * 2), t

        slow, now = await burst(5, 1000.0)
        fast, now = await burst(100, 1005.0)
        print(f"commands per replica per cycle: {slow:.1f} at 5 req, {fast:.1f} at 100 req")
        # Never a write per request: 20x the rate, the same commands (up to an HDEL
        # when a sub-window leaves the window); ~13 per cycle plus 3 per route (lease
        # script) plus 3 inside each of the two inbox takes (acknowledge, two checks).
        assert abs(slow - fast) <= 0.5 and fast <= 25
        await cycle(now + 0.1)
        assert [_samples(r, now + 0.1) for r in routers] == [2100, 2100]
        client.flushall()  # the store loses everything: re-pushed, never counted twice
        for k in range(3):
            await cycle(now + 0.2 + k * 0.1)
        assert [_samples(r, now + 0.5) for r in routers] == [2100, 2100]
        assert client.hlen("{t}:stats:r0") == 1 + 2  # one live sub-window + meta + load
        keys = sorted(k.decode() for k in client.keys("*"))
        assert keys == ["{t}:health", "{t}:leases", "{t}:replicas", "{t}:stats:r0",
                        "{t}:stats:r1"]
        holders = {v.decode().split()[0] for v in client.hvals("{t}:leases")}
        assert len(holders) == 1  # one owner for the one route
        await store.close()

    asyncio.run(main())


def test_link_keeps_deciding_through_a_killed_store_and_resyncs(
    server: RedisServer, caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = _config(server.url)
    caplog.set_level(logging.INFO, logger="tailroute.fleet")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        apps = [App.create(cfg, seed=i) for i in range(2)]
        links = [FleetLink(app, cfg.fleet, rid=f"r{i}") for i, app in  # type: ignore[arg-type]
                 enumerate(apps)]
        assert all([await link.warm_start() for link in links])
        stop = asyncio.Event()
        tasks = [asyncio.create_task(link.run(stop)) for link in links]
        for i in range(20):
            apps[0].router.observe(Observation("a", SL, "ok", ttft_s=0.2), loop.time())
            await asyncio.sleep(0.02 if i else 0)
        await _until(lambda: _samples(apps[1].router, loop.time()) == 20)
        server.kill()
        await _until(lambda: all(link.up is False for link in links))
        assert _exported(links[0])["tailroute_fleet_store_up"] == 0.0
        # Decisions go on (they never touch the store); observations still count locally.
        for app in apps:
            d = app.router.decide(_request(), loop.time(), app.rng)
            assert d.cluster in ("a", "b", "c")
        apps[0].router.observe(Observation("a", SL, "ok", ttft_s=0.2), loop.time())
        assert all(link.sync.followed == 0 for link in links)  # every route local now
        server.start()  # back, empty
        await _until(lambda: all(link.up for link in links), timeout=15.0)
        await _until(lambda: _samples(apps[1].router, loop.time()) == 21)
        assert _samples(apps[0].router, loop.time()) == 21
        await _until(lambda: _exported(links[0])["tailroute_fleet_peers"] == 1.0)
        got = _exported(links[0])
        assert set(got) == {n.removesuffix("_total") for n in FLEET_METRIC_NAMES}
        assert got["tailroute_fleet_store_up"] == 1.0 and got["tailroute_fleet_syncs"] > 0
        stop.set()
        await asyncio.gather(*tasks)
        for link in links:
            await link.close()

    asyncio.run(main())
    down = [r for r in caplog.records if "unreachable" in r.getMessage()]
    back = [r for r in caplog.records if "back after" in r.getMessage()]
    assert len(down) == 2 and len(back) == 2  # one line each per replica, not per retry


def test_an_entry_that_reached_another_replica_reaches_its_decider(
    server: RedisServer,
) -> None:
    """The decider stops waiting for it (``elsewhere``), instead of counting it lost."""
    from sidecar.shell.outcomes import OutcomeFeed
    from tests.test_entry_forward import _decided
    from tests.test_extproc import entry

    cfg = _config(server.url)

    async def main() -> None:
        apps = [App.create(cfg, seed=i) for i in range(2)]
        links = [FleetLink(app, cfg.fleet, rid=f"r{i}") for i, app in  # type: ignore[arg-type]
                 enumerate(apps)]
        decider, receiver = apps
        rid = _decided(decider, 0.0)
        route = decider.pending[rid].decision.cluster + "|interactive|n"
        OutcomeFeed(receiver)(entry(rid, route=route,
                                    slice_label="m|interactive|short|stream"), 0.5)
        await links[1].cycle()  # the receiver forwards the id through the store
        assert decider.pending
        await links[0].cycle()  # the decider takes it
        assert not decider.pending and decider.envoy["elsewhere"] == 1
        assert decider.envoy["lost"] == 0 and receiver.envoy["orphan"] == 1
        client = redis.Redis(port=server.port)
        # Kept until the decider's next take acknowledges it (a lost reply loses nothing).
        assert [k for k in client.keys("*") if b":entries:" in k] == [
            f"{{tailroute}}:entries:{decider.prefix}:taken:0".encode()]
        await links[0].cycle()
        assert not [k for k in client.keys("*") if b":entries:" in k]  # taken, not left
        assert decider.envoy["elsewhere"] == 1  # delivered once
        for link in links:
            await link.close()

    asyncio.run(main())


def test_warm_start_fails_fast_without_a_store() -> None:
    from sidecar.devtools.harness import free_port

    cfg = _config(f"redis://127.0.0.1:{free_port()}/0")

    async def main() -> None:
        app = App.create(cfg)
        link = FleetLink(app, cfg.fleet)  # type: ignore[arg-type]
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        assert not await link.warm_start()
        assert loop.time() - t0 < 5.0  # bounded by timeout_ms, not a hang
        assert link.up is False and link.syncs_failed == 1
        await link.close()

    asyncio.run(main())


def _exported(link: FleetLink) -> dict[str, float]:
    """Family name -> first sample value, as a Prometheus scrape would see them."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    reg = CollectorRegistry()
    reg.register(FleetCollector(link))
    text = generate_latest(reg).decode()
    return {f.name: float(f.samples[0].value) for f in text_string_to_metric_families(text)}


def _request() -> Any:
    from sidecar.core.types import RequestInfo

    return RequestInfo(api="chat", model="m", stream=True, max_tokens=16, input_tokens=10,
                       klass="interactive", priority=10, tenant=None, slice=SL)


async def _until(probe: Any, timeout: float = 10.0) -> None:
    """Readiness wait (bounds a broken run; not a timing assertion)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not probe():
        if loop.time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.02)


# Holds the single-threaded server busy for ARGV[1] seconds (no DEBUG command needed).
_BUSY_LUA = """
local function now() local t = redis.call('TIME') return t[1] + t[2] / 1e6 end
local start = now()
repeat until now() - start > tonumber(ARGV[1])
return 1
"""


def _inbox_exchange(rid: str, gen: int, ack: int | None,
                    entries: dict[str, list[bytes]] | None = None,
                    probes: dict[str, list[bytes]] | None = None) -> Any:
    from sidecar.fleet.exchange import Exchange

    return Exchange(rid=rid, meta=b"m", routes=[], stats_set={}, stats_del=[], health_set={},
                    probes=probes or {}, fetch=[], stats_ttl_ms=10_000, lease_ttl_ms=1_500,
                    health_ttl_ms=10_000, entries=entries or {}, entries_for=rid,
                    take_gen=gen, ack_gen=ack)


def test_a_take_whose_reply_is_lost_is_delivered_again(server: RedisServer) -> None:
    """The server ran the take, the client gave up waiting for it (a slow store): the
    forwarded request ids and probe results come with the next take, once, instead of
    being gone (they were LPOPped with the lost reply)."""

    async def main() -> None:
        sender, taker = RedisStore(server.url, "t", 0.2), RedisStore(server.url, "t", 0.2)
        now = 1e12
        await taker.exchange(_inbox_exchange("dec", 0, None), now)  # connected; nothing yet
        await sender.exchange(_inbox_exchange("A", 0, None, {"dec": [b"dec-1", b"dec-2"]},
                                              {"dec": [b"p1"]}), now)
        blocker = redis.Redis.from_url(server.url)
        busy = asyncio.get_running_loop().run_in_executor(
            None, lambda: blocker.eval(_BUSY_LUA, 0, "0.6"))
        await asyncio.sleep(0.1)
        with pytest.raises(TimeoutError):  # what FleetLink.cycle sees: a failed cycle
            await asyncio.wait_for(taker.exchange(_inbox_exchange("dec", 1, 0), now), 0.2)
        await busy  # the server then ran the take the client had given up on
        blocker.close()
        again = await taker.exchange(_inbox_exchange("dec", 1, 0), now)  # same take, retried
        assert again.entries == [b"dec-1", b"dec-2"] and again.probes == [b"p1"]
        after = await taker.exchange(_inbox_exchange("dec", 2, 1), now)  # acknowledged
        assert after.entries == [] and after.probes == []
        assert not redis.Redis.from_url(server.url).keys("{t}:*taken*")  # nothing left over
        await sender.close()
        await taker.close()

    asyncio.run(main())


@pytest.fixture(scope="module")
def locked_server() -> Iterator[RedisServer]:
    """A redis-server started with --requirepass (stopped by PID at the module's end)."""
    from sidecar.devtools.redis_server import redis_binary

    if redis_binary() is None:
        pytest.skip("redis-server not installed")  # redis_tool names the package
    with RedisServer(password="s3cret") as srv:
        yield srv


_REFUSED = ("it refused the user name and password in fleet.url (a wrong password, or an "
            "unknown or disabled user)")


@pytest.mark.parametrize(("credentials", "problem"), [
    (":n0tit@", _REFUSED),
    ("ghost:s3cret@", _REFUSED),
    ("", "it requires a password and fleet.url gives none (redis://:PASSWORD@HOST:PORT/DB, "
     "or redis://USER:PASSWORD@... for an ACL user)"),
    (":s3cret@", None),
])
def test_a_refused_password_is_reported_as_an_authentication_failure(
    locked_server: RedisServer, caplog: pytest.LogCaptureFixture, credentials: str,
    problem: str | None,
) -> None:
    """Not the server's words about the RESP3 handshake (HELLO), nor "unreachable":
    the store answered and refused the credentials. The password stays redacted."""
    url = f"redis://{credentials}127.0.0.1:{locked_server.port}/0"
    cfg = _config(url)
    caplog.set_level(logging.INFO, logger="tailroute.fleet")

    async def main() -> bool:
        link = FleetLink(App.create(cfg), cfg.fleet, rid="r0")  # type: ignore[arg-type]
        ok = await link.warm_start()
        await link.close()
        return ok

    ok = asyncio.run(main())
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    if problem is None:
        assert ok and all(level == "INFO" for level, _ in said), said
        return
    shown = f"redis://{'***@' if credentials else ''}127.0.0.1:{locked_server.port}/0"
    assert not ok
    assert said == [("ERROR", f"fleet store: authentication to the Redis at {shown} failed: "
                     f"{problem}; continuing on local state, retrying with backoff")], said
    assert not any(w in m for w in ("HELLO", "n0tit", "s3cret", "unreachable") for _, m in said)


def test_a_peers_hold_and_transitions_reach_the_native_publisher(server: RedisServer) -> None:
    """What a replica adopts from its peers wakes ``on_holds`` / ``on_transitions`` as
    its own would (native mode publishes the weights at once, not at the next
    interval); the adopted transitions are counted and logged."""
    cfg = _config(server.url)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        apps = [App.create(cfg, seed=i) for i in range(2)]
        links = [FleetLink(app, cfg.fleet, rid=f"r{i}") for i, app in  # type: ignore[arg-type]
                 enumerate(apps)]
        holds: list[int] = []
        seen: list[TransitionEvent] = []
        apps[1].on_holds = lambda: holds.append(1)
        apps[1].on_transitions = seen.extend
        for link in links:
            await link.cycle()
        apps[0].router.note_declared_wait("a", 5.0, loop.time())
        for link in links:
            await link.cycle()
        assert holds == [1] and apps[1].router.pushback.held()
        links[1]._record([TransitionEvent(1.0, "a", "*", "healthy", "quarantined", "fleet")])
        assert [e.new for e in seen] == ["quarantined"]
        assert apps[1].router.counters[("transition", "quarantined")] == 1
        for link in links:
            await link.close()

    asyncio.run(main())
