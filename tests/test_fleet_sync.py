"""The per-replica sync state machine against the in-process store (same semantics as
Redis, checked against a real redis-server in test_fleet_redis.py): every replica
sees the fleet's evidence once, one owner decides a route, the others follow, probes
count in one tally, and a flushed or unreachable store heals without double counting."""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.core.config import Config, parse_config
from sidecar.core.health import HealthState
from sidecar.core.health_board import CLUSTER_SLICE
from sidecar.core.router import Router
from sidecar.core.types import Observation, SliceKey, TransitionEvent
from sidecar.fleet import codec
from sidecar.fleet.memory import MemoryStore
from sidecar.fleet.sync import FleetSync
from tests.conftest import base_config_dict

SL = SliceKey("m", "interactive", "short", True)
CW = CLUSTER_SLICE


def _config(**stats: Any) -> Config:
    return parse_config(base_config_dict(stats={"subwindow_s": 10, "subwindows": 6,
                                                "min_samples": 5, **stats}), "t.yaml")


class Fleet:
    """k routers sharing through one MemoryStore, on one virtual clock."""

    def __init__(self, k: int, cfg: Config | None = None, offsets: list[float] | None = None):
        self.cfg = cfg or _config()
        self.store = MemoryStore()
        self.routers = [Router(self.cfg) for _ in range(k)]
        offsets = offsets or [0.0] * k
        self.syncs = [FleetSync(r, f"r{i}", 60.0, 3.0, offsets[i])
                      for i, r in enumerate(self.routers)]
        self.events: list[list[TransitionEvent]] = [[] for _ in range(k)]

    def cycle(self, now: float, only: list[int] | None = None) -> None:
        for i in only if only is not None else range(len(self.syncs)):
            s = self.syncs[i]
            ex = s.outgoing(now)
            reply = self.store.exchange(ex, (now + s.wall_offset) * 1000.0)
            self.events[i] += s.incoming(reply, now)

    def tick(self, now: float) -> None:
        for i, r in enumerate(self.routers):
            self.events[i] += r.tick(now)

    def share_route(self, t: float = 999.0) -> tuple[int, int]:
        """Every replica knows route a (a fine request each); returns (owner, another)."""
        for i, r in enumerate(self.routers):
            r.observe(Observation("a", SL, "ok", ttft_s=0.1), t + i * 0.1)
        self.cycle(t + 0.5)
        self.cycle(t + 0.6)
        owner = next(i for i, s in enumerate(self.syncs) if s.owned)
        return owner, next(i for i in range(len(self.syncs)) if i != owner)

    def state(self, i: int, cluster: str = "a", slice: SliceKey = SL) -> str:
        h = self.routers[i].board.peek(cluster, slice)
        return "healthy" if h is None else h.state.value


def _samples(r: Router, cluster: str, now: float) -> int:
    rs = r.stats.series(cluster, SL)
    return 0 if rs is None else rs.count("ttft", now)


def test_every_replica_sees_every_observation_exactly_once() -> None:
    f = Fleet(3)
    now = 1000.0
    for step in range(40):
        now = 1000.0 + step * 0.5
        for i, r in enumerate(f.routers):
            r.observe(Observation("a", SL, "ok", ttft_s=0.1 * (i + 1), e2e_s=1.0), now)
        if step % 2:
            f.cycle(now)
    f.cycle(now + 0.1)
    f.cycle(now + 0.2)  # a second round: everyone has everyone's last push
    for r in f.routers:
        assert _samples(r, "a", now + 0.2) == 120
        assert r.stats.lookup("a", SL, "ttft", 0.5, now + 0.2).value == pytest.approx(0.2, 0.03)
    # Re-pushing the same contents (as after a flush) adds nothing.
    f.store.flush()
    for _ in range(3):
        f.cycle(now + 0.3)
    assert [_samples(r, "a", now + 0.3) for r in f.routers] == [120, 120, 120]


def test_pushes_are_per_changed_subwindow_not_per_request() -> None:
    f = Fleet(2)
    for step in range(200):
        f.routers[0].observe(Observation("a", SL, "ok", ttft_s=0.1), 1000.0 + step * 0.01)
    ex = f.syncs[0].outgoing(1002.5)
    # 200 requests, one sub-window: one field (plus the in-flight record, every push).
    assert sorted(ex.stats_set) == ["_load", "a\tm|interactive|short|stream\t1005000"]
    f.store.exchange(ex, 1002.5e3)
    f.syncs[0].incoming(f.store.exchange(f.syncs[0].outgoing(1002.6), 1002.6e3), 1002.6)
    assert list(f.syncs[0].outgoing(1002.7).stats_set) == ["_load"]  # nothing else changed


@pytest.mark.parametrize(("offset", "indices"), [(120.0, [100]), (123.4, [100, 99])])
def test_clocks_with_different_origins_place_evidence_by_wall_clock(
    offset: float, indices: list[int]
) -> None:
    """Replica 1's loop clock reads ``offset`` s less for the same wall-clock instant.
    Sub-windows travel by their wall-clock midpoint: aligned boundaries (processes on
    one host share the monotonic clock) place them exactly, others within half of one."""
    f = Fleet(2, offsets=[0.0, offset])
    for step in range(10):
        f.routers[1].observe(Observation("a", SL, "ok", ttft_s=0.3), 1000.0 - offset + step)
    for _ in range(2):
        f.cycle(1009.5, only=[0])
        f.cycle(1009.5 - offset, only=[1])
    f.cycle(1009.6, only=[0])
    rs = f.routers[0].stats.series("a", SL)
    assert rs is not None and rs.count("ttft", 1009.6) == 10
    assert [s.index for _, s in rs.window.live(1009.6)] == indices


def test_peers_in_flight_counts_join_the_local_view_while_fresh() -> None:
    f = Fleet(2)
    for _ in range(3):
        f.routers[1].started("b")
    for t in (1000.0, 1000.3, 1000.6):  # a new peer is fetched from the cycle after it appears
        f.cycle(t)
    assert f.routers[0].inflight("b") == 3 and f.routers[1].inflight("b") == 3
    for t in (1001.0, 1002.0, 1003.0, 1004.5):  # replica 1 stops pushing
        f.cycle(t, only=[0])
    assert f.routers[0].inflight("b") == 0


def test_peers_low_priority_slots_are_known_as_such() -> None:
    """A peer's requests less important than shed_below_priority (Decision.low) are
    slots a top-class request may still take beyond capacity (admission's ``packed``),
    as this replica's own are; without the count every peer's batch request read as
    important work, and a full route deferred the top class fleet-wide."""
    f = Fleet(2)
    for _ in range(3):
        f.routers[1].started("b", low=True)
    f.routers[1].started("b")
    for t in (1000.0, 1000.3, 1000.6):
        f.cycle(t)
    r = f.routers[0]
    assert r.inflight("b") == 4 and r.peer_low == {"b": 3}
    assert r.admission.peer_low is r.peer_low  # admission reads the live counts
    for _ in range(3):
        f.routers[1].finished("b", low=True)
    for t in (1001.0, 1001.3):
        f.cycle(t)
    assert r.inflight("b") == 1 and r.peer_low == {}


@pytest.mark.parametrize(
    ("record", "decoded"),
    [
        (codec.encode_load(5, {"a": 3}, {"a": 2}), (5, {"a": 3}, {"a": 2})),
        (codec.encode_load(5, {"a": 3}), (5, {"a": 3}, {})),
        (b'{"n":{"a":3},"w":5}', (5, {"a": 3}, {})),  # an older replica's record
    ],
)
def test_load_records_carry_low_counts_and_read_older_ones(
    record: bytes, decoded: tuple[int, dict[str, int], dict[str, int]]
) -> None:
    assert codec.decode_load(record) == decoded


@pytest.mark.parametrize(
    "raw", [b'{"n":{"a":3},"w":5,"l":[1]}', b'{"n":{"a":3},"w":5,"l":{"a":"x"}}'])
def test_a_malformed_low_count_is_a_bad_record(raw: bytes) -> None:
    with pytest.raises(ValueError):
        codec.decode_load(raw)


def test_a_peers_native_load_joins_the_in_flight_counts() -> None:
    """Native routing's load (a window average from Envoy's log, not in the router's
    counts) travels in the same record, so peers plan for the provider's whole load."""
    f = Fleet(2)
    f.syncs[1].extra_load = lambda: {"b": 2.6}
    f.routers[1].started("b")
    for t in (1000.0, 1000.3, 1000.6):
        f.cycle(t)
    assert f.routers[0].inflight("b") == 4  # 1 per-request + 3 (2.6) native
    assert f.routers[1].inflight("b") == 1  # its own native load is planned by its weights


def _fail(f: Fleet, i: int, cluster: str, start: float, n: int = 10, status: int = 500) -> float:
    """``n`` failed requests through replica ``i``. Hard ones (5xx) trip the fast path,
    which ejects the whole cluster (:data:`CLUSTER_SLICE`); soft ones (429) are judged
    per slice by the window verdict."""
    now = start
    for j in range(n):
        now = start + j * 0.5
        f.routers[i].observe(Observation(cluster, SL, "error", status=status), now)
    return now


def test_one_owner_decides_and_the_others_follow_within_one_cycle() -> None:
    f = Fleet(3)
    f.cycle(999.0)
    owner, follower = f.share_route()  # route a is known to all three
    assert len({s.rid for s in f.syncs if any("a\t" in rf for rf in s.owned)}) == 1
    # Only the follower sees the (soft) failures; after sharing, the owner judges the
    # slice and quarantines it.
    _fail(f, follower, "a", 1000.0, status=429)
    f.cycle(1009.0)
    f.cycle(1009.1)
    f.tick(1010.01)
    assert f.state(owner) == "quarantined"
    assert f.state(follower) == "healthy"  # followers never judge a followed route
    assert f.state(follower, slice=CW) == "healthy"  # soft failures: no fast path
    f.cycle(1010.5)
    assert [f.state(i) for i in range(3)] == ["quarantined"] * 3
    assert any("fleet: following" in e.reason for e in f.events[follower])


def _owner_ejects_a(f: Fleet, owner: int) -> None:
    """The owner's run of hard failures on cluster a, its push, its window boundary."""
    _fail(f, owner, "a", 1000.0)
    f.cycle(1009.9)
    f.tick(1010.01)


def _probing_everywhere(probe_successes: int) -> tuple[Fleet, int, int]:
    """Cluster a ejected by its owner, probing there and (adopted) on the other."""
    cfg = parse_config(base_config_dict(
        stats={"subwindow_s": 10, "subwindows": 6, "min_samples": 5},
        health={"cooldown_s": 5, "probe_successes": probe_successes}), "t.yaml")
    f = Fleet(2, cfg)
    owner, other = f.share_route()
    _owner_ejects_a(f, owner)
    f.tick(1016.0)  # cooldown over: the owner moves to probing
    f.cycle(1016.1)
    f.cycle(1016.2)
    assert [f.state(i, slice=CW) for i in range(2)] == ["probing", "probing"]
    return f, owner, other


def test_probe_results_from_every_replica_count_toward_the_owners_tally() -> None:
    f, owner, other = _probing_everywhere(probe_successes=4)
    for k in range(2):  # two probes seen by each replica
        for i in (owner, other):
            probe = Observation("a", SL, "ok", ttft_s=0.1, e2e_s=0.2, is_probe=True)
            f.routers[i].observe(probe, 1016.5 + k)
    assert f.state(owner, slice=CW) == "probing"  # two of its own: not yet four
    f.cycle(1018.0)
    f.cycle(1018.1)
    f.cycle(1018.2)
    assert f.state(owner, slice=CW) == "restoring"
    assert f.syncs[owner].counters.applied_probes == 2
    # The circuit closed: the owner's router fenced cluster a's evidence, and the
    # follower fences its own on adopting that; neither counts the outage any more.
    f.cycle(1018.3)
    assert [f.state(i, slice=CW) for i in range(2)] == ["restoring", "restoring"]
    for r in f.routers:
        rs = r.stats.series("a", SL)
        assert rs is not None and rs.outcomes_in(100, 101, 1018.3)[1] == 10  # kept ...
        ev = rs.evidence("ttft", 1018.3, 0.0)
        assert ev is not None and ev.requests == 4  # ... but out of the evidence: the probes


def _probe(f: Fleet, i: int, at: float) -> None:
    f.routers[i].observe(Observation("a", SL, "ok", ttft_s=0.1, e2e_s=0.2, is_probe=True), at)


@pytest.mark.parametrize("when", ["forwarded", "queued after the push"])
def test_probe_results_on_their_way_when_a_push_fails_count_here(when: str) -> None:
    """A follower forwards the probe results it sees to the owner; its push fails, so
    the route is decided here from then on. Before, the failed push's results were gone
    (cleared from the outbox), and those seen after it were dropped by the next push
    (no holder known any more): the route here kept probing on probes already seen."""
    f, owner, other = _probing_everywhere(probe_successes=2)
    s = f.syncs[other]
    if when == "forwarded":
        _probe(f, other, 1016.3)
        _probe(f, other, 1016.4)
        assert sum(len(v) for v in s.outgoing(1016.5).probes.values()) == 2  # the push ...
    else:
        s.outgoing(1016.5)
        _probe(f, other, 1016.6)
        _probe(f, other, 1016.7)
    assert f.state(other, slice=CW) == "probing"  # followed: the owner's tally
    events = s.disconnected(1016.8)  # ... failed
    assert [(e.cluster, e.old, e.new) for e in events] == [("a", "probing", "restoring")]
    assert f.state(other, slice=CW) == "restoring" and f.state(owner, slice=CW) == "probing"
    rs = f.routers[other].stats.series("a", SL)
    ev = None if rs is None else rs.evidence("ttft", 1016.8, 0.0)
    assert ev is not None and ev.requests == 2  # fenced, as its router would: the probes


def test_probe_results_a_push_delivered_are_not_counted_again_on_a_later_failure() -> None:
    f, owner, other = _probing_everywhere(probe_successes=2)
    _probe(f, other, 1016.3)
    _probe(f, other, 1016.4)
    f.cycle(1016.5, only=[other])  # delivered to the owner's inbox
    assert f.syncs[other].disconnected(1016.6) == []  # the next push failed: nothing here
    assert f.state(other, slice=CW) == "probing"
    f.cycle(1016.7, only=[owner])
    assert f.state(owner, slice=CW) == "restoring" and f.syncs[owner].counters.applied_probes == 2


def test_a_dead_owners_lease_passes_on_without_losing_the_state() -> None:
    f = Fleet(2)
    owner, other = f.share_route()
    _owner_ejects_a(f, owner)
    f.cycle(1010.1)
    f.cycle(1010.2)
    assert f.state(other, slice=CW) == "quarantined"
    # The owner stops pushing; after the lease TTL the other replica owns the route,
    # continues from the adopted state and runs its cooldown itself.
    for t in (1011.0, 1012.0, 1013.5):
        f.cycle(t, only=[other])
    assert codec.route_field("a", CW) in f.syncs[other].owned
    assert f.state(other, slice=CW) == "quarantined"
    h = f.routers[other].board.peek("a", CW)
    assert h is not None and h.offences == 1  # the repeat-offender memory came along
    f.routers[other].tick(1060.0)
    assert f.state(other, slice=CW) == "probing"


def test_unreachable_store_means_local_decisions_then_convergence() -> None:
    f = Fleet(2)
    owner, other = f.share_route()
    for s in f.syncs:
        s.disconnected(999.7)  # the store went away
    # Only the non-owner sees the failures; its fast path ejects the cluster alone.
    _fail(f, other, "a", 1000.0)
    f.tick(1010.01)
    assert f.state(other, slice=CW) == "quarantined" and f.state(owner, slice=CW) == "healthy"
    f.store.flush()  # ... and came back empty
    f.cycle(1011.0, only=[other])  # the one that decided takes the lease first
    f.cycle(1011.1, only=[owner])
    # The new owner publishes on its next push; the other, which never had the
    # cluster-wide entry, sees it published, asks for it and adopts on the one after.
    for t in (1012.0, 1013.0, 1014.0):
        f.cycle(t)
    assert f.state(owner, slice=CW) == f.state(other, slice=CW) == "quarantined"
    assert any("fleet: following" in e.reason for e in f.events[owner])


def test_snapshot_contents_are_a_baseline_never_pushed_as_own() -> None:
    """A replica that warm-started from its (fleet-merged) snapshot because the store was
    away must not re-push the peers' evidence in it as its own."""
    f = Fleet(1)
    r = f.routers[0]
    for i in range(10):
        r.observe(Observation("a", SL, "ok", ttft_s=0.2), 1000.0 + i * 0.1)
    f.syncs[0].mark_baseline(1001.0)
    assert list(f.syncs[0].outgoing(1001.0).stats_set) == ["_load"]
    r.observe(Observation("a", SL, "ok", ttft_s=0.2), 1001.5)
    ex = f.syncs[0].outgoing(1001.6)
    (name,) = [n for n in ex.stats_set if not n.startswith("_")]
    assert b'"c":[1,0,0,0]' in ex.stats_set[name]  # just the new request


def test_a_follower_stops_choosing_a_route_as_soon_as_it_adopts_its_quarantine() -> None:
    """Adopting a state moves the board's version: no cached selection plan outlives it."""
    import random

    from sidecar.core.types import RequestInfo

    f = Fleet(2)
    owner, follower = f.share_route()
    req = RequestInfo(api="chat", model="m", stream=True, max_tokens=16, input_tokens=10,
                      klass="interactive", priority=10, tenant=None, slice=SL)
    rng = random.Random(7)
    r = f.routers[follower]
    for k in range(20):  # warm the follower's plan cache on cluster a being fine
        r.observe(Observation("a", SL, "ok", ttft_s=0.05, e2e_s=0.1), 999.7 + k * 0.01)
        r.observe(Observation("b", SL, "ok", ttft_s=0.5, e2e_s=1.0), 999.7 + k * 0.01)
    r.decide(req, 999.95, rng)
    _fail(f, owner, "a", 1000.0, status=429)  # soft failures: the owner's window verdict
    f.cycle(1009.9)
    f.tick(1010.01)
    assert f.state(owner) == "quarantined"
    f.cycle(1010.1)
    f.cycle(1010.2)
    assert f.state(follower) == "quarantined"
    picks = {r.decide(req, 1010.3 + i * 0.001, rng).cluster for i in range(20)}
    assert "a" not in picks


def _follow_cluster_wide(f: Fleet) -> tuple[int, int]:
    """Every replica once saw a hard failure of cluster a (its cluster-wide entry stays
    on each board, remembering the failure rate), so that entry has an owner before any
    outage, as in the lab's ``outage_recovery``; returns (its owner, a follower)."""
    f.share_route()
    for i, r in enumerate(f.routers):
        r.observe(Observation("a", SL, "error", status=500), 999.7 + i * 0.01)
    f.cycle(999.8)
    f.cycle(999.9)
    owner = next(i for i, s in enumerate(f.syncs)
                 if codec.route_field("a", CW) in s.owned)
    follower = next(i for i in range(len(f.syncs)) if i != owner)
    assert ("a", CW) in f.syncs[follower].board.followed
    return owner, follower


def test_a_follower_ejects_on_its_own_run_of_hard_failures_without_waiting() -> None:
    """A run of hard failures on a replica's own traffic ejects the cluster there at
    once, as an isolated replica's would, whoever holds the route's lease: the owner
    sees a share of the outage only, and waiting for it made shared replicas slower
    to leave a dead provider than isolated ones (lab: outage_recovery 5.2 s vs 2.5 s)."""
    f = Fleet(2)
    owner, follower = _follow_cluster_wide(f)
    _fail(f, follower, "a", 1000.0, n=3)
    assert f.state(follower, slice=CW) == "quarantined"
    assert f.state(owner, slice=CW) == "healthy"  # it saw none of them
    # The owner's published (older) state does not undo the follower's ejection ...
    for t in (1001.5, 1002.5):
        f.cycle(t)
    assert f.state(follower, slice=CW) == "quarantined"
    assert ("a", CW) not in f.syncs[follower].board.followed  # decided here meanwhile
    # ... and the follower runs its own cooldown and probes (none forwarded).
    f.tick(1040.0)
    assert f.state(follower, slice=CW) == "probing"
    assert f.syncs[follower].board.probe_outbox == []


def test_an_escalated_route_follows_the_owner_again_once_it_publishes_a_newer_state() -> None:
    f = Fleet(2)
    owner, follower = _follow_cluster_wide(f)
    _fail(f, follower, "a", 1000.0, n=3)  # the follower ejects at 1000.5
    _fail(f, owner, "a", 1003.0, n=3)  # the owner, later, on its own traffic
    f.cycle(1004.0)  # the owner publishes its ejection (entered after the follower's) ...
    f.cycle(1004.5)
    board = f.syncs[follower].board
    assert ("a", CW) in board.followed and board.escalated == {}  # ... and it is followed
    mine, theirs = f.routers[follower].board.peek("a", CW), f.routers[owner].board.peek("a", CW)
    assert mine is not None and theirs is not None and mine.since == theirs.since


def test_an_escalated_route_healthy_again_here_is_followed_again() -> None:
    f = Fleet(2)
    _, follower = _follow_cluster_wide(f)
    r = f.routers[follower]
    _fail(f, follower, "a", 1000.0, n=3)  # ejected here ...
    f.cycle(1001.5)
    assert ("a", CW) not in f.syncs[follower].board.followed
    h = r.board.peek("a", CW)
    assert h is not None and h.state is HealthState.QUARANTINED
    # ... and healthy here again (a stand-in for the way back through probing and
    # restoring, which the state machine's own tests cover).
    h.state = HealthState.HEALTHY
    f.cycle(1002.0)
    assert ("a", CW) in f.syncs[follower].board.followed
    assert f.syncs[follower].board.escalated == {}


def _quarantined_on_the_owner(f: Fleet) -> tuple[int, int]:
    owner, follower = f.share_route()
    _fail(f, owner, "a", 1000.0, status=429)  # soft failures: the owner's window verdict
    f.cycle(1009.9)
    f.tick(1010.01)
    assert f.state(owner) == "quarantined"
    return owner, follower


def test_a_state_entered_as_its_push_failed_still_reaches_the_followers() -> None:
    """The owner quarantines route a; its next push fails (a blip). Before, the
    followers never learned of the quarantine (ten cycles later, and until the route's
    next transition): the failed push had marked it published, and the republish after
    the outage was spent while the owner owned nothing yet."""
    f = Fleet(2)
    owner, follower = _quarantined_on_the_owner(f)
    f.syncs[owner].outgoing(1010.1)  # the push that carried the quarantine ...
    f.syncs[owner].disconnected(1010.1)  # ... failed
    for k in range(3):
        f.cycle(1010.2 + 0.1 * k)
    assert f.state(follower) == "quarantined"


def test_an_older_state_from_the_same_owner_is_not_adopted() -> None:
    """The store comes back with older contents (an older snapshot, a lagging replica
    promoted): the route's entry is the owner's quarantine, though the owner has
    published it healthy since. Before, a follower that read it first flipped the route
    back to quarantined (a transition logged, native weights republished) until the
    owner's next push."""
    from sidecar.core.fleet_share import adopt_route

    f = Fleet(2)
    owner, follower = _quarantined_on_the_owner(f)
    f.cycle(1010.1)
    f.cycle(1010.2)
    assert f.state(follower) == "quarantined"
    older = dict(f.store.health.fields)
    adopt_route(f.routers[owner].board, "a", SL, {}, 1020.0, 1020.0, "test: recovered")
    f.cycle(1020.1)
    f.cycle(1020.2)
    assert f.state(follower) == "healthy"
    f.store.health.fields.update(older)  # the store is back with its older contents
    for s in f.syncs:
        s.disconnected(1020.3)
    seen = len(f.events[follower])
    f.cycle(1021.0, only=[follower])  # the follower reads the older entry first
    assert f.state(follower) == "healthy" and len(f.events[follower]) == seen


@pytest.mark.parametrize(("rescue", "state"), [(False, "quarantined"), (True, "probing")])
def test_a_peers_probe_of_a_route_its_owner_quarantined_again_leaves_the_cooldown(
    rescue: bool, state: str,
) -> None:
    """The owner's probes fail and it quarantines cluster a again (a longer cooldown);
    until its next push the follower still holds the probing copy and sends probes
    there. Before, the first ok one, forwarded, ended the owner's new cooldown at once
    (a probe result while quarantined was read as a rescue, sidecar.core.rescue_probe),
    which no probe seen by the owner itself could do. A rescue the follower sent since
    the new quarantine began ends it, as one sent by the owner would: marked at the
    decision, it goes with its send time whatever state the copy here is in."""
    f, owner, other = _probing_everywhere(probe_successes=2)
    for k in range(f.cfg.health.eject_consecutive):
        f.routers[owner].observe(Observation("a", SL, "error", status=503, e2e_s=0.01,
                                             is_probe=True), 1016.3 + 0.01 * k)
    assert f.state(owner, slice=CW) == "quarantined"
    f.routers[other].observe(Observation("a", SL, "ok", ttft_s=0.1, e2e_s=0.2, is_probe=True,
                                         is_rescue=rescue), 1016.6)  # sent at 1016.4: after
    assert f.state(other, slice=CW) == "probing"  # not adopted yet: a probe here
    f.cycle(1016.7, only=[other])
    f.cycle(1016.8, only=[owner])
    assert f.syncs[owner].counters.applied_probes == 1
    assert f.state(owner, slice=CW) == state


@pytest.mark.parametrize(("sent", "state"), [
    (None, "quarantined"),  # a probe of a state the peer saw probing (or an older peer)
    (1009.0, "quarantined"),  # sent before the quarantine began (1010.01): a straggler
    (1011.0, "probing"),  # a rescue sent since: the cooldown is over
])
def test_a_forwarded_probe_counts_while_quarantined_only_as_a_rescue_sent_since(
    sent: float | None, state: str,
) -> None:
    f = Fleet(2)
    owner, _ = _quarantined_on_the_owner(f)
    raw = codec.encode_probe(codec.route_field("a", SL), True,
                             None if sent is None else round(sent * 1000.0))
    f.store.probes[f.syncs[owner].rid] = [raw]
    f.cycle(1011.5, only=[owner])
    assert f.syncs[owner].counters.applied_probes == 1
    assert f.state(owner) == state


@pytest.mark.parametrize("rescue", [True, False])
def test_a_followers_rescue_carries_its_send_time_to_the_owner(rescue: bool) -> None:
    """A rescue goes with its send time (the third element); any other probe answer is
    no evidence for the quarantined copy here, so nothing goes (before, every probe
    answer sent since the copy's quarantine went as a rescue)."""
    f = Fleet(2)
    owner, follower = _quarantined_on_the_owner(f)
    f.cycle(1010.1)
    f.cycle(1010.2)
    assert f.state(follower) == "quarantined"
    f.routers[follower].observe(Observation("a", SL, "ok", ttft_s=0.1, e2e_s=0.5,
                                            is_probe=True, is_rescue=rescue),
                                1011.5)  # sent at 1011.0
    ex = f.syncs[follower].outgoing(1011.6)
    assert ex.probes == ({f.syncs[owner].rid: [codec.encode_probe(
        codec.route_field("a", SL), True, 1_011_000)]} if rescue else {})


@pytest.mark.parametrize("raw", [b'["r", true, 1.5]', b'["r", true, true]',
                                 b'["r", true, 1, 2]', b'["r"]', b'7'])
def test_a_malformed_probe_result_is_refused(raw: bytes) -> None:
    with pytest.raises(ValueError):
        codec.decode_probe(raw)
