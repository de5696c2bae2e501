"""Hostile or foreign data in the keys a replica reads: a record another replica (a
bug, another version) or another program wrote. It must never stop a replica from
sharing the rest, never reach a decision, and always be counted."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from sidecar.core.config import Config, parse_config
from sidecar.core.router import Router
from sidecar.core.types import Observation, RequestInfo
from sidecar.devtools.redis_server import RedisServer
from sidecar.fleet import codec
from sidecar.fleet.exchange import Exchange, Reply
from sidecar.fleet.link import FleetLink
from sidecar.fleet.redis_store import RedisStore
from sidecar.fleet.store_errors import WrongTypeError, describe
from sidecar.fleet.sync import FleetSync
from sidecar.shell.app import App
from sidecar.shell.bootstrap import upstream_max_requests
from tests.conftest import base_config_dict
from tests.test_fleet_redis import _config as _redis_config
from tests.test_fleet_sync import SL, Fleet

FIELD = "a\tm|interactive|short|stream\t1005000"  # route a's sub-window [1000, 1010)


def _request() -> RequestInfo:
    return RequestInfo(api="chat", model="m", stream=True, max_tokens=16, input_tokens=10,
                       klass="interactive", priority=10, tenant=None, slice=SL)


def _shared(f: Fleet, t: float = 1000.0) -> None:
    """Both replicas know each other and route a."""
    for i, r in enumerate(f.routers):
        r.observe(Observation("a", SL, "ok", ttft_s=0.1), t + i * 0.1)
    for k in range(3):
        f.cycle(t + 0.5 + 0.1 * k)


def _decides(f: Fleet, i: int, now: float) -> Any:
    return f.routers[i].decide(_request(), now, random.Random(0))


def test_a_peers_nan_weight_is_refused_and_decisions_go_on() -> None:
    """A peer's sub-window whose zero bucket weighs NaN was merged, and every later
    decision on the route raised (``cannot convert float NaN to integer``)."""
    f = Fleet(2)
    _shared(f)
    f.store.stats["r1"].fields[FIELD] = b'{"c":[1,0,0,0],"h":{"ttft":[0,NaN,1]}}'
    f.cycle(1001.0, only=[0])
    assert f.syncs[0].counters.bad_peer_records == 1
    assert _decides(f, 0, 1001.1).cluster in ("a", "b", "c")


DEEP = b"[" * 100_000
# Valid JSON a replica never writes, past codec.MAX_RECORD_BYTES: refused unparsed.
HUGE = b'{"c":[1,0,0,0],"pad":"' + b"x" * (5 * 1024 * 1024) + b'"}'
ROUTE = "a\tm|interactive|short|stream"
NEXT = ROUTE + "\t1015000"  # its next sub-window


@pytest.mark.parametrize(("where", "name", "raw"), [
    ("health", ROUTE, b'{"o":"r1","w":1e999,"r":{}}'),  # OverflowError
    ("health", ROUTE, DEEP),  # RecursionError
    ("health", "no route", b'{"o":"r1","w":1,"r":{}}'),  # leased, then failed to publish
    ("stats", NEXT, b'{"c":[1e999,0,0,0]}'),
    ("stats", NEXT, b'{"c":[1,0,0,0],"h":{"ttft":[1e999,0,1]}}'),
    ("stats", NEXT, DEEP),
    ("stats", "_load", b'{"n":{"a":1e999},"w":1000000}'),
    ("stats", "_load", b'{"n":{"a":1},"w":Infinity}'),
    ("stats", "_limits", b'{"a":[2,1e999]}'),
    ("stats", "_meta", DEEP),
    ("probes", "", DEEP),
    ("stats", NEXT, HUGE),
    ("probes", "", HUGE),
])
def test_one_unreadable_record_is_counted_and_everything_else_still_shared(
    where: str, name: str, raw: bytes,
) -> None:
    """Before, each of these raised OverflowError or RecursionError (or, for a health
    field that names no route, ValueError at the next publishing) out of the cycle: the
    replica saw the store as down, and every replica that read the record stopped
    sharing for as long as it stayed there."""
    f = Fleet(2)
    _shared(f)
    f.routers[1].observe(Observation("a", SL, "ok", ttft_s=0.1), 1001.0)
    f.cycle(1001.2, only=[1])
    if where == "health":
        f.store.health.fields[name] = raw
    elif name == "_meta":
        f.store.metas["r1"] = raw
    elif where == "stats":
        f.store.stats["r1"].fields[name] = raw
    else:
        f.store.probes["r0"] = [raw]
    for k in range(3):  # raised here
        f.cycle(1001.5 + 0.1 * k, only=[0])
    assert f.syncs[0].counters.bad_peer_records + f.syncs[0].counters.mismatched_peers >= 1
    assert _decides(f, 0, 1002.0).cluster in ("a", "b", "c")
    if name != "_meta":  # a peer whose meta is unreadable is not merged at all
        rs = f.routers[0].stats.series("a", SL)
        assert rs is not None and rs.count("ttft", 1002.0) == 3  # r1's new request too


# Four Envoys' breakers on a cluster (sidecar.fleet.stats_sync.load_bound): a replica
# counting more in flight there is not a working one.
BOUND = 4 * upstream_max_requests(parse_config(base_config_dict(), "t.yaml").clusters[0])


@pytest.mark.parametrize(("n", "low", "inflight", "peer_low", "skipped"), [
    # Held every cluster full on every replica: the top class was refused fleet-wide.
    ({"a": 10**9, "b": 10**9, "c": 10**9}, {"b": 10**9}, [0, 1, 0], {},
     [f"n[{c!r}]: {10**9} in flight is over {BOUND}" for c in "abc"]),
    ({"b": 3}, {"b": 5}, [0, 4, 0], {"b": 3}, ["l['b']: 5 low-priority of 3 in flight: "
                                               "read as 3"]),
    ({"b": 3}, {"c": 2}, [0, 4, 0], {}, ["l['c']: 2 low-priority of 0 in flight"]),
    ({"b": BOUND}, {"b": BOUND}, [0, BOUND + 1, 0], {"b": BOUND}, []),  # the most: summed
    ({"x": 10**9}, {"x": 10**10}, [0, 1, 0], {}, []),  # a cluster not here: ignored as was
])
def test_a_peers_impossible_in_flight_counts_are_skipped_not_summed(
    n: dict[str, int], low: dict[str, int], inflight: list[int], peer_low: dict[str, int],
    skipped: list[str],
) -> None:
    """A peer's in-flight counts are capacity taken on every replica that reads them.
    Before, a count no replica can hold (a bug, a corrupt record) was summed as sent and
    held the cluster full everywhere, and a low-priority count over its total made
    admission take important work's slots for a batch's."""
    f = Fleet(2)
    _shared(f)
    r = f.routers[0]
    r.started("b")
    f.store.stats["r1"].fields["_load"] = codec.encode_load(1_001_400, n, low)
    f.cycle(1001.5, only=[0])  # fresh (written 0.1 s ago): summed, unless impossible
    assert [r.inflight(c) for c in "abc"] == inflight and r.peer_low == peer_low
    c = f.syncs[0].counters
    assert c.bad_peer_records == len(skipped)
    if skipped:
        assert c.last_bad.startswith(f"r1's _load {skipped[-1]}"), c.last_bad
    assert _decides(f, 0, 1001.6).admission == "admit"


def _probe_of(route: str, pad: int = 0) -> bytes:
    """A forwarded probe result (route ``route``), padded to ``pad`` bytes if given."""
    raw = codec.encode_probe(route, True)
    return raw if len(raw) >= pad else raw[:-1] + b" " * (pad - len(raw)) + b"]"


@pytest.mark.parametrize(("inbox", "said"), [
    ([b"x" * (1 << 20)], "1 item(s) of this replica's probes inbox: their list takes "
     "1048576 bytes, more than 1 item(s) of at most 4096 bytes can: dropped unread, all"),
    ([_probe_of(ROUTE)] * 10 + [_probe_of(ROUTE + "x", 5000)], "1 item(s) of this "
     "replica's probes inbox: over 4096 bytes (the largest 5000): dropped"),
])
def test_an_oversized_inbox_item_is_dropped_by_the_take_and_counted(
    inbox: list[bytes], said: str,
) -> None:
    """A forwarded probe result or request id is tens of bytes: a larger item in a
    replica's inbox no replica wrote. Before, it was handed on whole (a 5,000-byte
    probe result of a route nobody has was parsed, then ignored without a count)."""
    f = Fleet(2)
    _shared(f)
    f.store.probes["r0"] = list(inbox)
    f.cycle(1001.5, only=[0])
    c = f.syncs[0].counters
    assert (c.bad_peer_records, c.last_bad) == (1, said)


# ---------------------------------------------------------------- in a real Redis


@pytest.fixture
def server(redis_tool: None) -> Iterator[RedisServer]:
    with RedisServer() as srv:
        yield srv


def _exchange(rid: str, routes: list[str], fetch: list[str] | None = None) -> Exchange:
    return Exchange(rid=rid, meta=codec.encode_meta(10.0, 0.01), routes=routes, stats_set={},
                    stats_del=[], health_set={}, probes={}, fetch=fetch or [],
                    stats_ttl_ms=60_000, lease_ttl_ms=3_000, health_ttl_ms=120_000)


def _net_out(client: redis.Redis) -> int:
    return int(client.info("stats")["total_net_output_bytes"])


@pytest.mark.parametrize("whole", [True, False])
def test_an_oversized_inbox_item_never_crosses_the_network(
    server: RedisServer, whole: bool,
) -> None:
    """Before, a take returned a replica's inbox lists whole: a take of two 50 MB items
    took 0.5-0.7 s over a loopback, past the default fleet.timeout_ms (the cycle failed,
    and the same take was delivered again). Now the take script drops an item over 4096
    bytes on the server; a list too big for its count (MEMORY USAGE) is dropped whole,
    unread: nothing in it can be told from the rest without reading."""
    client = redis.Redis(port=server.port)
    big = b"x" * ((8 << 20) if whole else 5000)
    ids = [b"dec-%d" % i for i in range(2 if whole else 100)]
    probes = [_probe_of(ROUTE)] * 3

    async def main() -> tuple[Reply, int]:
        sender, taker = RedisStore(server.url, "t", 2.0), RedisStore(server.url, "t", 2.0)
        take = Exchange(rid="dec", meta=b"m", routes=[], stats_set={}, stats_del=[],
                        health_set={}, probes={}, fetch=[], stats_ttl_ms=60_000,
                        lease_ttl_ms=3_000, health_ttl_ms=120_000, entries_for="dec")
        await taker.exchange(take, 1e12)  # connected
        await sender.exchange(Exchange(
            rid="A", meta=b"m", routes=[], stats_set={}, stats_del=[], health_set={},
            probes={"dec": [*probes, big]}, fetch=[], stats_ttl_ms=60_000,
            lease_ttl_ms=3_000, health_ttl_ms=120_000, entries={"dec": [ids[0], big, *ids[1:]]}),
            1e12)
        before = _net_out(client)
        take.take_gen, take.ack_gen = 1, 0
        reply = await taker.exchange(take, 1e12)
        sent = _net_out(client) - before
        for closing in (sender, taker):
            await closing.close()
        return reply, sent

    reply, sent = asyncio.run(main())
    assert sent < 64 * 1024, sent  # the take's answer: small, whatever the inbox holds
    if whole:
        assert reply.entries == [] and reply.probes == []
        got = {k: (v.items, v.size > len(big), v.whole) for k, v in reply.oversized.items()}
        assert got == {"entries": (3, True, True), "probes": (4, True, True)}
    else:
        assert reply.entries == ids and reply.probes == probes
        got = {k: (v.items, v.size, v.whole) for k, v in reply.oversized.items()}
        assert got == {"entries": (1, 5000, False), "probes": (1, 5000, False)}


@pytest.mark.parametrize("lease", [b"garbage", b"r9 soon", b"r9 1e999", b"r9 99999999999999"])
def test_a_lease_no_replica_wrote_is_free(server: RedisServer, lease: bytes) -> None:
    """Before, the lease script failed on a value without a space or a number (a Lua
    error: every replica's cycle failed until the hash expired), and one that expires
    never held its route for ever: every replica followed an owner that never was."""
    client = redis.Redis(port=server.port)
    client.hset("{t}:leases", ROUTE, lease)

    async def main() -> list[str]:
        store = RedisStore(server.url, "t", 2.0)
        try:
            return (await store.exchange(_exchange("r0", [ROUTE]), 1e12)).holders
        finally:
            await store.close()

    assert asyncio.run(main()) == ["r0"]


def test_a_peers_key_of_another_type_is_skipped_not_the_whole_cycle(
    server: RedisServer,
) -> None:
    """Before, one peer's statistics key holding a string failed every replica's cycle
    (WRONGTYPE): the store read as down for all of them."""
    client = redis.Redis(port=server.port)
    client.set("{t}:stats:r1", b"x")

    async def main() -> Reply:
        store = RedisStore(server.url, "t", 2.0)
        try:
            return await store.exchange(_exchange("r0", [ROUTE], fetch=["r1"]), 1e12)
        finally:
            await store.close()

    reply = asyncio.run(main())
    assert reply.holders == ["r0"] and reply.unreadable == ["{t}:stats:r1"]
    assert reply.stats == {"r1": {}}


def test_a_shared_key_of_another_type_is_named_in_the_problem(server: RedisServer) -> None:
    """Not "unreachable (WRONGTYPE ...)": the key, and what to do about it."""
    client = redis.Redis(port=server.port)
    client.set("{t}:health", b"x")

    async def main() -> BaseException:
        store = RedisStore(server.url, "t", 2.0)
        try:
            await store.exchange(_exchange("r0", [ROUTE]), 1e12)
        except WrongTypeError as exc:
            return exc
        finally:
            await store.close()
        raise AssertionError("no error")

    problem = describe(asyncio.run(main()), server.url, "t")
    assert problem.kind == "foreign" and problem.level == logging.ERROR
    assert problem.text.startswith(f"fleet store: the key {{t}}:health in the Redis at "
                                   f"{server.url} holds another type than the fleet keeps")


def test_a_replica_whose_clock_runs_ahead_does_not_evict_the_others(
    server: RedisServer,
) -> None:
    """Membership is on the server's clock. Before, each replica scored itself with its
    own wall clock: one 300 s ahead (stats TTL 60 s) removed every other replica at
    each push and saw none (measured with three routers: it merged none of the
    others' requests, and one of the others lost the third)."""
    async def main() -> list[list[str]]:
        store = RedisStore(server.url, "t", 2.0)
        now_ms = 1.7e12
        skew_ms = {"r0": 0.0, "r1": 0.0, "r2": 300_000.0}
        seen: list[list[str]] = []
        try:
            for _ in range(2):
                seen = [sorted((await store.exchange(_exchange(r, []), now_ms + s)).replicas)
                        for r, s in skew_ms.items()]
        finally:
            await store.close()
        return seen

    assert asyncio.run(main()) == [["r0", "r1", "r2"]] * 3


@pytest.mark.parametrize("skew_s", [300.0, -300.0])
def test_a_host_clock_minutes_off_shares_on_the_stores_clock(
    server: RedisServer, caplog: pytest.LogCaptureFixture, skew_s: float,
) -> None:
    """Replica 1's host clock is ``skew_s`` off. Before, its sub-windows were named by
    it: replica 0 dropped all of its requests as older than the window (or placed
    them in its current sub-window), and replica 1 dropped replica 0's, silently."""
    cfg = _redis_config(server.url)
    caplog.set_level(logging.WARNING, logger="tailroute.fleet")

    async def main() -> tuple[list[int], dict[str, Any]]:
        loop = asyncio.get_running_loop()
        apps = [App.create(cfg, seed=i) for i in range(2)]
        walls = [time.time, lambda: time.time() + skew_s]
        links = [FleetLink(app, cfg.fleet, rid=f"r{i}", wall=w)  # type: ignore[arg-type]
                 for i, (app, w) in enumerate(zip(apps, walls, strict=True))]
        for link in links:
            assert await link.warm_start()
        for i, app in enumerate(apps):
            for _ in range(5):
                app.router.observe(Observation("a", SL, "ok", ttft_s=0.1 * (i + 1)),
                                   loop.time())
        for _ in range(3):
            for link in links:
                await link.cycle()
        counts = [app.router.stats.series("a", SL).count("ttft", loop.time())  # type: ignore[union-attr]
                  for app in apps]
        state = links[1].state(loop.time())
        for link in links:
            await link.close()
        return counts, state

    counts, state = asyncio.run(main())
    assert counts == [10, 10]
    assert state["on_store_clock"] is True and abs(state["clock_skew_s"] + skew_s) < 1.0
    said = [r.getMessage() for r in caplog.records]
    way = "ahead of" if skew_s > 0 else "behind"
    assert said == [f"fleet: this host's clock is 300.0 s {way} the fleet store's; sharing "
                    "on the store's clock instead (fix the host's clock: NTP)"], said


def test_skipped_records_are_counted_shown_and_said_once_a_minute(
    server: RedisServer, caplog: pytest.LogCaptureFixture,
) -> None:
    """Before, skipped records were only counted in memory: no metric, no /state, no
    log line, so a fleet could lose a peer's evidence with no sign of it."""
    cfg = _redis_config(server.url)
    client = redis.Redis(port=server.port)
    caplog.set_level(logging.WARNING, logger="tailroute.fleet")

    async def main() -> tuple[dict[str, Any], dict[str, float]]:
        links = [FleetLink(App.create(cfg, seed=i), cfg.fleet, rid=f"r{i}")  # type: ignore[arg-type]
                 for i in range(3)]
        for link in links:
            assert await link.warm_start()
        client.hset("{tailroute}:stats:r1", "_load", b'{"n":{"a":1e999},"w":1}')
        client.hset("{tailroute}:stats:r2", "_meta", codec.encode_meta(5.0, 0.02))
        for _ in range(4):
            await links[0].cycle()
        state = links[0].state(0.0)
        exported = _exported(links[0])
        for link in links:
            await link.close()
        return state, exported

    state, exported = asyncio.run(main())
    skipped = state["skipped"]
    assert skipped["unreadable"] >= 1 and skipped["mismatched"] >= 1
    assert skipped["last_unreadable"] == ("r1's _load: malformed load record: "
                                          "ValueError('number out of range: inf')")
    assert skipped["last_mismatched"] == ("r2: subwindow_s 5, accuracy 0.02; here "
                                          "subwindow_s 10, accuracy 0.02")
    assert exported['unreadable'] == skipped["unreadable"]
    assert exported['mismatched'] == skipped["mismatched"]
    said = [r.getMessage() for r in caplog.records]
    assert said == [  # four cycles, one line of each
        "fleet: skipped 1 unreadable record(s) in the store (last: r1's _load: malformed "
        "load record: ValueError('number out of range: inf')); the rest is shared",
        "fleet: not merging 1 reading(s) of peers whose statistics do not compare with "
        "this replica's (last: r2: subwindow_s 5, accuracy 0.02; here subwindow_s 10, "
        "accuracy 0.02)"], said


def _exported(link: FleetLink) -> dict[str, float]:
    """tailroute_fleet_skipped_records_total by reason, as a scrape sees it."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from sidecar.fleet.metrics import FleetCollector

    reg = CollectorRegistry()
    reg.register(FleetCollector(link))
    text = generate_latest(reg).decode()
    return {s.labels["reason"]: s.value for f in text_string_to_metric_families(text)
            if f.name == "tailroute_fleet_skipped_records" for s in f.samples
            if s.name.endswith("_total")}


def test_a_store_back_with_older_contents_counts_nothing_twice(server: RedisServer) -> None:
    """The store restarts from an older snapshot (or a lagging replica is promoted):
    a peer's sub-window comes back with fewer requests than were merged. Before, the
    reader took the older contents as its new base, and the writer's re-sent full
    contents then counted the difference a second time: 16 requests instead of 11."""
    cfg = _redis_config(server.url)
    client = redis.Redis(port=server.port)

    async def main() -> list[int]:
        routers = [Router(cfg), Router(cfg)]
        syncs = [FleetSync(r, f"r{i}", 60.0, 1.0) for i, r in enumerate(routers)]
        store = RedisStore(server.url, "t", 2.0)

        async def cycle(t: float, *which: int) -> None:
            for i in which:
                ex = syncs[i].outgoing(t)
                syncs[i].incoming(await store.exchange(ex, t * 1000.0), t)

        def observe(n: int, t: float) -> None:
            for k in range(n):
                routers[1].observe(Observation("a", SL, "ok", ttft_s=0.1), t + k * 0.01)

        observe(5, 1000.0)
        for t in (1000.5, 1000.6, 1000.7):
            await cycle(t, 1, 0)
        client.save()  # the snapshot the store will come back from
        observe(5, 1001.0)
        await cycle(1001.5, 1, 0)
        assert _samples(routers[0], 1001.5) == 10
        await store.close()
        client.close()
        server.kill()
        for s in syncs:
            s.disconnected(1001.6)  # what the link does when a cycle fails
        server.start()
        store = RedisStore(server.url, "t", 2.0)
        await cycle(1002.0, 0)  # the reader first: it meets the older contents
        observe(1, 1002.5)
        await cycle(1003.0, 1, 0)  # the writer re-pushes everything it has
        await cycle(1003.1, 0)
        await store.close()
        return [_samples(r, 1003.1) for r in routers]

    assert asyncio.run(main()) == [11, 11]


def _samples(r: Router, now: float) -> int:
    rs = r.stats.series("a", SL)
    return 0 if rs is None else rs.count("ttft", now)


def _warm_start(cfg: Config) -> bool:
    """One replica's warm start against the configured store (then closed)."""
    async def main() -> bool:
        link = FleetLink(App.create(cfg), cfg.fleet, rid="r0")  # type: ignore[arg-type]
        ok = await link.warm_start()
        await link.close()
        return ok

    return asyncio.run(main())


def test_a_database_the_server_lacks_is_said_as_such(
    server: RedisServer, caplog: pytest.LogCaptureFixture,
) -> None:
    """Not "unreachable (DB index is out of range)": the store answers, the URL's
    database number is the mistake."""
    url = f"redis://127.0.0.1:{server.port}/99"
    cfg = _redis_config(url)
    caplog.set_level(logging.WARNING, logger="tailroute.fleet")

    assert not _warm_start(cfg)
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said == [("ERROR", f"fleet store: the Redis at {url} has no such database "
                     "(fleet.url's /DB: a server has 'databases' of them, 16 unless "
                     "configured, from 0); continuing on local state, retrying with backoff")]


def test_a_replica_with_another_config_shares_its_clusters_only_with_its_kind() -> None:
    """Replica 1's config has a cluster ``d`` replica 0's lacks (a rollout under way).
    Before, replica 0 merged d's statistics into a series of its own (shown in /state
    and /metrics, for a cluster it cannot route to) and, once replica 1 missed a lease
    renewal, took d's leases and owned its health, judged without its config."""
    stats = {"subwindow_s": 10, "subwindows": 6, "min_samples": 5}
    wider = base_config_dict(stats=stats)
    wider["clusters"] = [*wider["clusters"], {"name": "d", "address": "127.0.0.1:9004",
                                              "models": ["m"]}]
    wider["models"] = [{"name": "m", "candidates": ["a", "b", "c", "d"]}]
    f = Fleet(2, cfg=parse_config(base_config_dict(stats=stats), "old.yaml"))
    f.routers[1] = Router(parse_config(wider, "new.yaml"))
    f.syncs[1] = FleetSync(f.routers[1], "r1", 60.0, 3.0)
    t = 1000.0
    for k in range(10):
        t = 1000.0 + 0.2 * k
        for cluster in ("a", "d"):
            f.routers[1].observe(Observation(cluster, SL, "ok", ttft_s=0.1), t)
        f.cycle(t)
    for k in range(25):  # replica 1 misses its renewals: its leases expire
        f.cycle(t + 0.2 * (k + 1), only=[0])
    assert {c for c, _ in f.routers[0].stats.narrow_keys()} == {"a"}
    assert not any(rf.startswith("d\t") for rf in f.syncs[0].owned)
    counters = f.syncs[0].counters
    assert counters.foreign_records >= 1 and "no cluster 'd' here" in counters.last_foreign
    rs = f.routers[0].stats.series("a", SL)
    assert rs is not None and rs.count("ttft", t) == 10  # the clusters both know: shared


def test_a_full_store_is_said_as_such(server: RedisServer,
                                      caplog: pytest.LogCaptureFixture) -> None:
    """Not "unreachable (command not allowed when used memory > 'maxmemory'.)": the
    store answers and refuses writes; what to change."""
    client = redis.Redis(port=server.port)
    client.set("filler", b"x" * 2_000_000)
    client.config_set("maxmemory", "1mb")
    client.config_set("maxmemory-policy", "noeviction")
    cfg = _redis_config(server.url)
    caplog.set_level(logging.WARNING, logger="tailroute.fleet")

    assert not _warm_start(cfg)
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said == [("ERROR", f"fleet store: the Redis at {server.url} is full (its used "
                     "memory is over maxmemory) and refuses the fleet's writes; give it more "
                     "memory, or an eviction policy for keys with a TTL (every fleet key has "
                     "one: maxmemory-policy volatile-ttl, as deploy/ runs it); continuing on "
                     "local state, retrying with backoff")], said


@pytest.fixture
def tls_server(redis_tool: None, tmp_path: Path) -> Iterator[tuple[int, int, Path]]:
    """A redis-server with a TLS port and a plain one: (tls port, plain port, CA file).
    Stopped by its PID."""
    from sidecar.devtools.harness import free_port
    from sidecar.devtools.redis_server import redis_binary
    from tests.certs import make_pki

    pki = make_pki(tmp_path / "pki")
    tls, plain = free_port(), free_port()
    argv = [str(redis_binary()), "--port", str(plain), "--tls-port", str(tls), "--bind",
            "127.0.0.1", "--tls-cert-file", str(pki.server_cert), "--tls-key-file",
            str(pki.server_key), "--tls-ca-cert-file", str(pki.ca), "--tls-auth-clients",
            "no", "--save", "",
            "--appendonly", "no", "--dir", str(tmp_path)]
    with open(tmp_path / "redis.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 10.0
        while not _answers(plain):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.skip(f"redis-server without TLS here: "
                            f"{(tmp_path / 'redis.log').read_text()[-300:]}")
            time.sleep(0.05)
        yield tls, plain, pki.ca
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(10)


def _answers(port: int) -> bool:
    try:
        return bool(redis.Redis(port=port, socket_timeout=0.5).ping())
    except redis.RedisError:
        return False


def test_a_tls_mismatch_says_which_way(tls_server: tuple[int, int, Path]) -> None:
    """Before: 'unreachable (... Connection reset by peer)', 'unreachable
    (TimeoutError)' and a bare verify failure, none naming what to change."""
    tls, plain, ca = tls_server

    async def problem(url: str) -> str:
        cfg = _redis_config(url)
        link = FleetLink(App.create(cfg), cfg.fleet, rid="r0")  # type: ignore[arg-type]
        ok = await link.warm_start()
        await link.close()
        return "ok" if ok else str(link.state(0.0)["problem"])

    async def main() -> list[str]:
        return [await problem(f"redis://127.0.0.1:{tls}/0"),
                await problem(f"rediss://127.0.0.1:{plain}/0"),
                await problem(f"rediss://127.0.0.1:{tls}/0"),
                await problem(f"rediss://127.0.0.1:{tls}/0?ssl_ca_certs={ca}")]

    got = asyncio.run(main())
    assert got[0].endswith("; fleet.url is redis:// (no TLS): if that port wants TLS, use "
                           "rediss://"), got[0]
    assert got[1].endswith("; fleet.url is rediss:// (TLS): if that port does not speak TLS, "
                           "use redis://"), got[1]
    assert got[2].endswith("; fleet.url needs the CA that signed the server's certificate: "
                           "?ssl_ca_certs=/path/ca.pem"), got[2]
    assert got[3] == "ok"


def test_a_host_clock_stepped_after_start_is_shown_not_warned_of(
    server: RedisServer, caplog: pytest.LogCaptureFixture,
) -> None:
    """The replica shares by the clock it took at start; a later step of the host's
    clock (NTP, an operator) does not move it, so what it shares stays placed right.
    Before, the skew was measured on the host's clock and said the replica's evidence
    was 'misplaced by as much' when it was not."""
    cfg = _redis_config(server.url)
    caplog.set_level(logging.WARNING, logger="tailroute.fleet")
    real = time.time
    step = [0.0]

    async def main() -> dict[str, Any]:
        link = FleetLink(App.create(cfg), cfg.fleet, rid="r0",  # type: ignore[arg-type]
                         wall=lambda: real() + step[0])
        assert await link.warm_start()
        step[0] = 300.0  # the host's clock jumps ahead
        await link.cycle()
        state = link.state(0.0)
        await link.close()
        return state

    state = asyncio.run(main())
    assert abs(state["clock_skew_s"] + 300.0) < 1.0 and state["on_store_clock"] is False
    assert not caplog.records, [r.getMessage() for r in caplog.records]


def test_a_replica_that_placed_evidence_before_the_store_answered_keeps_its_clock(
    server: RedisServer, caplog: pytest.LogCaptureFixture,
) -> None:
    """Its sub-windows were named by its clock already: it keeps it (no double
    naming), and says once that what it shares is misplaced."""
    cfg = _redis_config(server.url)
    caplog.set_level(logging.WARNING, logger="tailroute.fleet")
    real = time.time

    async def main() -> dict[str, Any]:
        app = App.create(cfg)
        link = FleetLink(app, cfg.fleet, rid="r0",  # type: ignore[arg-type]
                         wall=lambda: real() + 300.0)
        server.kill()
        app.router.observe(Observation("a", SL, "ok", ttft_s=0.1),
                           asyncio.get_running_loop().time())
        assert not await link._attempt()  # offered (and lost) by the host's clock
        server.start()
        for _ in range(3):
            assert await link._attempt()
        state = link.state(0.0)
        await link.close()
        return state

    state = asyncio.run(main())
    assert state["on_store_clock"] is False
    said = [r.getMessage() for r in caplog.records if "clock" in r.getMessage()]
    assert said == ["fleet: the clock this replica shares by (this host's at its start) is "
                    "300.0 s ahead of the fleet store's; what it shares is misplaced by as "
                    "much (evidence older than the statistics window is dropped): fix the "
                    "host's clock (NTP) and restart"], said
