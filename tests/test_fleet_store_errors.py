"""A store that answers but will not serve the fleet is said as such, against a real
redis-server: an ACL refusal names what is missing and the grant that covers the
fleet; a primary demoted by a failover (READONLY) is reconnected to at every retry,
so a name that moves to the new primary is followed. A store that stays down but
changes how it fails is logged again."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest
import redis
from redis.exceptions import AuthenticationError, NoPermissionError

from sidecar.core.config import Config, parse_config
from sidecar.core.types import Observation, SliceKey
from sidecar.devtools.redis_server import RedisServer
from sidecar.fleet.exchange import Exchange, Reply
from sidecar.fleet.link import FleetLink
from sidecar.fleet.redis_store import RedisStore
from sidecar.fleet.store_errors import ACL_COMMANDS, acl_grant
from sidecar.shell.app import App
from tests.conftest import base_config_dict

pytestmark = pytest.mark.usefixtures("redis_tool")

SL = SliceKey("m", "interactive", "short", True)


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    from sidecar.devtools.redis_server import redis_binary

    if redis_binary() is None:
        pytest.skip("redis-server not installed")  # redis_tool names the package
    with RedisServer() as srv:
        yield srv


def _user(server: RedisServer, name: str, keys: str, commands: tuple[str, ...]) -> str:
    admin = redis.Redis(port=server.port)
    admin.execute_command("ACL", "SETUSER", name, "reset", "on", ">pw", keys, "-@all",
                          *(f"+{c}" for c in commands))
    admin.close()
    return f"redis://{name}:pw@127.0.0.1:{server.port}/0"


def _config(url: str) -> Config:
    return parse_config(base_config_dict(fleet={"url": url, "key_prefix": "acl",
                                                "timeout_ms": 500}), "t.yaml")


def _inbox(rid: str, gen: int, ack: int | None, to: dict[str, list[bytes]]) -> Exchange:
    return Exchange(rid=rid, meta=b"m", routes=[], stats_set={}, stats_del=[], health_set={},
                    probes=to, fetch=[], stats_ttl_ms=10_000, lease_ttl_ms=1_500,
                    health_ttl_ms=10_000, entries=to, entries_for=rid, take_gen=gen,
                    ack_gen=ack)


def test_the_documented_grant_is_all_the_fleet_needs(server: RedisServer) -> None:
    url = _user(server, "exact", "~{acl}:*", ACL_COMMANDS)
    cfg = _config(url)

    async def main() -> None:
        apps = [App.create(cfg, seed=i) for i in range(2)]
        links = [FleetLink(app, cfg.fleet, rid=f"r{i}") for i, app in  # type: ignore[arg-type]
                 enumerate(apps)]
        apps[0].router.observe(Observation("a", SL, "ok", ttft_s=0.1), 1.0)
        for _ in range(2):  # leases (EVALSHA, then SCRIPT LOAD), statistics, health
            for link in links:
                await link.cycle()
        # The inbox scripts: a forwarded entry and probe, taken, then acknowledged.
        sender, taker = RedisStore(url, "acl", 0.5), RedisStore(url, "acl", 0.5)
        await sender.exchange(_inbox("s", 0, None, {"t": [b"t-1"]}), 1e12)
        got = await taker.exchange(_inbox("t", 0, None, {}), 1e12)
        await taker.exchange(_inbox("t", 1, 0, {}), 1e12)
        assert got.entries == [b"t-1"] and got.probes == [b"t-1"]
        for closing in (sender, taker):
            await closing.close()
        assert all(link.syncs_failed == 0 for link in links)
        for link in links:
            await link.close()

    asyncio.run(main())


def test_a_grant_without_llen_and_memory_still_takes_and_drops_oversized_items(
    server: RedisServer,
) -> None:
    """The take script asks LLEN and MEMORY USAGE whether a list is too big to read
    (sidecar.fleet.redis_store); a user granted what the fleet used before they were
    (or a managed Redis without MEMORY) gets the list read and filtered instead: the
    same items, never a failed cycle."""
    older = tuple(c for c in ACL_COMMANDS if c not in ("llen", "memory|usage"))
    url = _user(server, "older-grant", "~{acl}:*", older)

    async def main() -> Reply:
        sender, taker = RedisStore(url, "acl", 2.0), RedisStore(url, "acl", 2.0)
        await taker.exchange(_inbox("o", 0, None, {}), 1e12)
        await sender.exchange(_inbox("s", 0, None, {"o": [b"o-1", b"x" * (1 << 20)]}), 1e12)
        got = await taker.exchange(_inbox("o", 1, 0, {}), 1e12)
        for closing in (sender, taker):
            await closing.close()
        return got

    got = asyncio.run(main())
    assert got.entries == [b"o-1"] and got.probes == [b"o-1"]
    assert {k: (v.items, v.size, v.whole) for k, v in got.oversized.items()} == {
        "entries": (1, 1 << 20, False), "probes": (1, 1 << 20, False)}


@pytest.mark.parametrize(("user", "keys", "drop", "said"), [
    ("no-evalsha", "~{acl}:*", "evalsha", "the user of fleet.url may not run EVALSHA"),
    ("no-hset", "~{acl}:*", "hset", "the user of fleet.url may not run HSET"),
    ("no-time", "~{acl}:*", "time",  # called only in a script: Redis does not name it
     "the user of fleet.url may not run a command the fleet's Lua scripts call"),
    ("other-keys", "~cache:*", "", "the user of fleet.url may not use the keys {acl}:* "
     "(fleet.key_prefix)"),
])
def test_an_acl_refusal_names_what_is_missing_and_the_grant(
    server: RedisServer, caplog: pytest.LogCaptureFixture, user: str, keys: str, drop: str,
    said: str,
) -> None:
    url = _user(server, user, keys, tuple(c for c in ACL_COMMANDS if c != drop))
    cfg = _config(url)
    caplog.set_level(logging.INFO, logger="tailroute.fleet")

    async def main() -> bool:
        link = FleetLink(App.create(cfg), cfg.fleet, rid="r0")  # type: ignore[arg-type]
        link.app.router.observe(Observation("a", SL, "ok", ttft_s=0.1), 1.0)
        ok = await link.warm_start()
        ok = await link._attempt() or ok  # a retry in the same state says nothing new
        await link.close()
        return ok

    assert not asyncio.run(main())
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    shown = f"redis://***@127.0.0.1:{server.port}/0"
    assert lines == [("ERROR", f"fleet store: the Redis at {shown} answers, but {said}; "
                      f"grant what the fleet uses with '{acl_grant('acl')}'; continuing on "
                      "local state, retrying with backoff")], lines


class _Failing:
    """A store failing as told, once per cycle; None answers an empty reply (every lease
    held by ``holder``, by default the asking replica)."""

    def __init__(self, script: list[BaseException | None], holder: str | None = None) -> None:
        self.script = script
        self.holder = holder

    async def exchange(self, ex: Exchange, now_ms: float) -> Reply:
        exc = self.script.pop(0)
        if exc is not None:
            raise exc
        return Reply([self.holder or ex.rid] * len(ex.routes), [ex.rid], {}, {}, {}, [], 0)

    async def close(self) -> None:
        return None


def test_a_store_that_stays_down_is_logged_again_only_when_its_failure_changes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Unreachable, then back but refusing the password, then its ACL: each kind is
    one line (the fix differs), retries of the same kind none."""
    cfg = _config("redis://u:s3cret@127.0.0.1:1/0")
    caplog.set_level(logging.INFO, logger="tailroute.fleet")
    store = _Failing([ConnectionError("refused"), ConnectionError("refused again"),
                      AuthenticationError("WRONGPASS"), AuthenticationError("WRONGPASS"),
                      NoPermissionError("this user has no permissions to run the 'hlen' "
                                        "command"), None, None, None])

    async def main() -> None:
        link = FleetLink(App.create(cfg), cfg.fleet, store=store,  # type: ignore[arg-type]
                         rid="r0")
        for _ in range(5):
            await link._attempt()
        shown = link.state(0.0)  # /state: why it is down, with the password hidden
        assert shown["up"] is False and shown["store"] == "redis://***@127.0.0.1:1/0"
        assert str(shown["problem"]).endswith("may not run HLEN; grant what the fleet uses "
                                              f"with '{acl_grant('acl')}'")
        for _ in range(2):
            await link._attempt()
        shown = link.state(0.0)
        assert shown["up"] is True and shown["problem"] is None and shown["down_for_s"] is None
        await link.close()

    asyncio.run(main())
    got = [(r.levelname, r.getMessage().split(";")[0]) for r in caplog.records]
    assert got == [
        ("WARNING", "fleet store redis://***@127.0.0.1:1/0 unreachable (refused)"),
        ("ERROR", "fleet store: authentication to the Redis at redis://***@127.0.0.1:1/0 "
                  "failed: it refused the user name and password in fleet.url (a wrong "
                  "password, or an unknown or disabled user)"),
        ("ERROR", "fleet store: the Redis at redis://***@127.0.0.1:1/0 answers, but the "
                  "user of fleet.url may not run HLEN"),
        ("INFO", got[3][1]),
    ] and got[3][1].startswith("fleet store redis://***@127.0.0.1:1/0 back after")
    assert "s3cret" not in caplog.text


def test_a_failed_cycle_records_what_the_probe_results_it_carried_changed() -> None:
    """The link records the transitions of the probe results a failed push was carrying
    (FleetSync.disconnected applies them here) as it records an answer's: in the
    router's transitions and log, for native mode to publish."""
    from sidecar.core.health_board import CLUSTER_SLICE

    cfg = parse_config(base_config_dict(
        health={"cooldown_s": 5, "probe_successes": 2},
        fleet={"url": "redis://127.0.0.1:1/0"}), "t.yaml")

    async def main() -> None:
        app = App.create(cfg)
        store = _Failing([None, ConnectionError("refused")], holder="r1")
        link = FleetLink(app, cfg.fleet, store=store, rid="r0")  # type: ignore[arg-type]
        r = app.router
        t0 = asyncio.get_running_loop().time() - 100.0
        for j in range(10):  # ejected, then probing once the cooldown is over
            r.observe(Observation("a", SL, "error", status=500), t0 + j * 0.5)
        r.tick(t0 + 20.0)
        h = r.board.peek("a", CLUSTER_SLICE)
        assert h is not None and h.state.value == "probing"
        assert await link._attempt()  # r1 owns every route: r0 follows them
        assert ("a", CLUSTER_SLICE) in link.sync.board.followed
        for k in range(2):
            r.observe(Observation("a", SL, "ok", ttft_s=0.1, e2e_s=0.2, is_probe=True),
                      t0 + 21.0 + k)
        seen = len(r.transitions)
        assert not await link._attempt()
        assert [(e.cluster, e.new) for e in list(r.transitions)[seen:]] == [("a", "restoring")]
        assert r.counters[("transition", "restoring")] == 1

    asyncio.run(main())


def test_a_demoted_primary_is_reconnected_to_at_every_retry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """redis-py keeps a healthy socket to a node that a failover turned into a replica;
    every write then answers READONLY. Reusing that socket, a replica never followed
    the DNS name of a managed Redis to its new primary; it must connect afresh."""
    caplog.set_level(logging.INFO, logger="tailroute.fleet")
    with RedisServer() as node, RedisServer() as other:
        admin = redis.Redis(port=node.port)
        cfg = _config(node.url)

        def connections() -> int:
            return int(admin.info("stats")["total_connections_received"])

        async def main() -> None:
            link = FleetLink(App.create(cfg), cfg.fleet, rid="r0")  # type: ignore[arg-type]
            link.app.router.observe(Observation("a", SL, "ok", ttft_s=0.1), 1.0)
            assert await link.warm_start()
            admin.replicaof("127.0.0.1", other.port)  # the failover demotes it
            seen = []
            for _ in range(3):
                assert not await link._attempt()
                seen.append(connections())
            assert seen[1] > seen[0] and seen[2] > seen[1]  # a new connection per retry
            admin.replicaof("NO", "ONE")
            assert await link._attempt()
            await link.close()

        asyncio.run(main())
        admin.close()
    said = [(r.levelname, r.getMessage().split(";")[0]) for r in caplog.records][1:]
    assert said[0] == ("WARNING", f"fleet store {node.url} is a read-only replica (a failover "
                                  "demoted it?)")
    assert len(said) == 2 and said[1][1].startswith(f"fleet store {node.url} back after")


def test_an_unexpected_error_shows_its_traceback_once_per_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bug in a cycle recurs at every retry; before, each retry logged its traceback
    again (seven in the first minute of backoff). Once per outage and kind of error."""
    cfg = _config("redis://127.0.0.1:1/0")
    caplog.set_level(logging.INFO, logger="tailroute.fleet")
    store = _Failing([RuntimeError("boom")] * 4 + [KeyError("other")] + [None]
                     + [RuntimeError("boom")])

    async def main() -> None:
        link = FleetLink(App.create(cfg), cfg.fleet, store=store,  # type: ignore[arg-type]
                         rid="r0")
        for _ in range(7):
            await link._attempt()
        await link.store.close()

    asyncio.run(main())
    tracebacks = [str(r.exc_info[1]) for r in caplog.records if r.exc_info]
    assert tracebacks == ["boom", "'other'", "boom"]  # the new kind, and the next outage
