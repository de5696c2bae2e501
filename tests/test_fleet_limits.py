"""Concurrency limits learned from a provider's 429s are the provider's, so the fleet
shares them (sidecar.fleet.limits_sync): a peer holds back after one replica met the
refusals, while they are fresh; an old or higher limit moves nobody. Against the
in-process store, and the record's round trip through a real redis-server."""

from __future__ import annotations

import asyncio

import pytest
import redis

from sidecar.core.pushback import HOLD_S, QUOTA_MEMORY_S
from sidecar.core.types import Observation
from sidecar.devtools.redis_server import RedisServer
from sidecar.fleet import codec
from sidecar.fleet.redis_store import RedisStore
from sidecar.fleet.sync import FleetSync
from sidecar.ops.state import state_json
from tests.test_fleet_sync import SL, Fleet


def _refuse(f: Fleet, i: int, cluster: str, held: int, now: float) -> None:
    """Replica ``i`` has ``held`` requests on ``cluster`` when it answers 429."""
    r = f.routers[i]
    for _ in range(held):
        r.started(cluster)
    r.observe(Observation(cluster, SL, "error", status=429), now)
    for _ in range(held):
        r.finished(cluster)


def test_a_limit_one_replica_learned_holds_the_others_back_at_their_next_cycle() -> None:
    f = Fleet(3)
    f.cycle(1000.0)
    _refuse(f, 0, "a", 5, 1000.2)
    assert [r.pushback.limit("a") for r in f.routers] == [5, 64, 64]
    f.cycle(1000.5)
    assert [r.pushback.limit("a") for r in f.routers] == [5, 5, 5]
    assert state_json(f.routers[2], 1000.5)["clusters"]["a"]["concurrency_limit"] == 5
    # Its quiet spell runs from the refusal everywhere, not from when it arrived.
    assert {r.pushback.learned()["a"] for r in f.routers} == {(5.0, 1000.2)}
    assert f.syncs[1].counters.adopted_limits == 1
    f.cycle(1001.0)  # nothing new: not adopted again, not written again
    assert f.syncs[1].counters.adopted_limits == 1
    assert "_limits" not in f.syncs[0].outgoing(1001.5).stats_set


def test_a_declared_wait_one_replica_met_holds_every_peer_until_the_same_moment() -> None:
    """A 429's Retry-After is the provider's quota: peers hold the cluster until the
    hold's end on the wall clock, without
    meeting a 429 of their own first, and nobody's limit moves."""
    f = Fleet(3)
    f.cycle(1000.0)
    f.routers[0].observe(Observation("a", SL, "error", status=429, retry_after_s=4.0),
                         1000.2)
    f.cycle(1000.5)
    ends = [r.pushback.held().get("a") for r in f.routers]
    assert ends == [pytest.approx(1004.2)] * 3, ends
    assert all(r.inflight("a") == r.config.cluster("a").max_concurrency for r in f.routers)
    assert [r.pushback.limit("a") for r in f.routers] == [64, 64, 64]
    # A shorter wait a peer met later does not shorten anyone's hold; once over, the
    # hold is not published any more, and an expired one is not adopted.
    f.routers[1].observe(Observation("a", SL, "error", status=429, retry_after_s=1.0),
                         1000.6)
    f.cycle(1000.7)
    assert [r.pushback.held().get("a") for r in f.routers] == [pytest.approx(1004.2)] * 3
    for r in f.routers:
        r.tick(1004.3)
    f.cycle(1004.5)
    assert all(r.pushback.held() == {} for r in f.routers)
    assert "_holds" not in f.syncs[0].outgoing(1005.0).stats_set


@pytest.mark.parametrize("field", [codec.HOLDS_FIELD, codec.QUOTAS_FIELD])
@pytest.mark.parametrize("raw", [b"{not json", b"[1]", b'{"a": "soon"}', b'{"a": [1]}'])
def test_a_malformed_holds_or_quotas_record_is_counted_and_changes_nothing(
    field: str, raw: bytes,
) -> None:
    f = Fleet(2)
    f.cycle(1000.0)
    f.store.stats["r0"].fields[field] = raw
    f.cycle(1000.5, only=[1])
    pushback = f.routers[1].pushback
    assert pushback.held() == {} and pushback.quotas(1000.5) == {}
    assert f.syncs[1].counters.bad_peer_records == 1


def test_a_quota_one_replica_read_is_every_peers_and_drops_their_limits() -> None:
    """A 429 that came back to a cluster the fleet had nothing in flight on is a
    quota's (sidecar.core.pushback). The quota is the provider's: peers that had
    learned a limit from its earlier refusals drop it, read their own next 429 of
    it as the quota's (no limit learned from it), and stop once it is forgotten."""
    f = Fleet(3)
    f.cycle(1000.0)
    _refuse(f, 1, "a", 5, 1000.1)  # a peer's 429 while requests were in flight
    f.cycle(1000.2)
    f.cycle(1000.25)  # (replica 0 pulls before replica 1 pushes within a cycle)
    assert [r.pushback.limit("a") for r in f.routers] == [5, 5, 5]
    _refuse(f, 0, "a", 0, 1000.3)  # replica 0's 429 to an empty cluster: a quota
    assert f.routers[0].pushback.quota("a", 1000.3)
    f.cycle(1000.5)
    f.cycle(1000.55)
    assert all(r.pushback.quota("a", 1000.5) for r in f.routers)
    assert [r.pushback.limit("a") for r in f.routers] == [64, 64, 64]
    assert [r.pushback.quotas(1000.5)["a"] for r in f.routers] == [pytest.approx(1000.3)] * 3
    _refuse(f, 2, "a", 7, 1000.6)  # read as the quota's: no limit learned
    assert f.routers[2].pushback.limit("a") == 64
    f.cycle(1000.7)  # nothing new from replica 0: its record is not written again
    assert "_quotas" not in f.syncs[0].outgoing(1000.8).stats_set
    later = 1000.6 + QUOTA_MEMORY_S + 1.0
    f.cycle(later)
    assert not any(r.pushback.quota("a", later) for r in f.routers)
    assert f.syncs[0].outgoing(later + 0.5).stats_set.get("_quotas") in (None, b"{}")


def test_a_peers_higher_or_old_limit_moves_nobody() -> None:
    f = Fleet(2)
    f.cycle(999.0)  # (the replicas learn of each other)
    _refuse(f, 0, "a", 12, 1000.0)
    _refuse(f, 1, "a", 4, 1000.1)
    f.cycle(1000.5)
    f.cycle(1000.6)  # (replica 0 pulls before replica 1 pushes within a cycle)
    assert [r.pushback.limit("a") for r in f.routers] == [4, 4]  # the lower one, both
    # Replica 0 grows back after the quiet spell, on its own pressure.
    t = 1000.0 + HOLD_S + 1.0
    f.routers[0].pushback.pressed("a", 4)
    f.routers[0].pushback.grow(t)
    assert f.routers[0].pushback.limit("a") == 6
    f.cycle(t + 0.5)
    assert [r.pushback.limit("a") for r in f.routers] == [6, 4]  # growth is not shared
    # A replica joining now adopts no limit older than the spell, so it does not pull
    # replica 0 back down through its own record either.
    late = Fleet(1)
    late.store = f.store
    late.syncs[0].rid = "late"
    for _ in range(2):
        f.cycle(t + 1.0)
        late.cycle(t + 1.0)
    assert late.routers[0].pushback.limit("a") == 64
    assert f.routers[0].pushback.limit("a") == 6


def test_a_flushed_store_is_given_the_fresh_limits_again() -> None:
    f = Fleet(2)
    _refuse(f, 0, "a", 5, 1000.0)
    f.cycle(1000.5)
    f.store.flush()
    f.cycle(1001.0)  # replica 0 sees its writes lost ...
    late = Fleet(1)
    late.store = f.store
    late.syncs[0].rid = "late"
    f.cycle(1001.5)  # ... and writes them again
    late.cycle(1001.6)
    late.cycle(1001.7)
    assert late.routers[0].pushback.limit("a") == 5


@pytest.mark.parametrize("raw", [b"{not json", b"[1]", b'{"a": [0.5, 1]}', b'{"a": ["x", 1]}',
                                 b'{"a": [NaN, 1]}', b'{"a": [3]}'])
def test_a_malformed_record_is_counted_and_changes_nothing(raw: bytes) -> None:
    f = Fleet(2)
    f.cycle(1000.0)
    f.store.stats["r0"].fields[codec.LIMITS_FIELD] = raw
    f.cycle(1000.5, only=[1])
    assert f.routers[1].pushback.limit("a") == 64
    assert f.syncs[1].counters.bad_peer_records == 1


@pytest.mark.usefixtures("redis_tool")
def test_the_record_travels_through_a_real_redis() -> None:
    f = Fleet(2)
    _refuse(f, 0, "a", 7, 1000.0)
    f.routers[0].observe(Observation("b", SL, "error", status=429, retry_after_s=3.0), 1000.0)
    _refuse(f, 0, "c", 0, 1000.0)  # a quota's 429 (held 1 s by its backoff)

    async def main(port: int) -> None:
        store = RedisStore(f"redis://127.0.0.1:{port}/0", "lim", 0.5)

        async def cycle(sync: FleetSync, now: float) -> None:
            sync.incoming(await store.exchange(sync.outgoing(now), now * 1000.0), now)

        for now in (1000.5, 1000.6):
            for s in f.syncs:
                await cycle(s, now)
        await store.close()

    with RedisServer() as srv:
        asyncio.run(main(srv.port))
        stored = redis.Redis(port=srv.port).hget("{lim}:stats:r0", codec.LIMITS_FIELD)
        holds = redis.Redis(port=srv.port).hget("{lim}:stats:r0", codec.HOLDS_FIELD)
        quotas = redis.Redis(port=srv.port).hget("{lim}:stats:r0", codec.QUOTAS_FIELD)
    assert stored == b'{"a":[7,1000000]}'
    assert holds == b'{"b":1003000,"c":1001000}'
    assert f.routers[1].pushback.held() == {"b": 1003.0, "c": 1001.0}
    assert quotas == b'{"c":1000000}' and f.routers[1].pushback.quota("c", 1000.6)
    assert f.routers[1].pushback.learned() == {"a": (7.0, 1000.0)}
