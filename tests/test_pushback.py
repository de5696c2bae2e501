"""Provider push-back (sidecar.core.pushback): concurrency limits learned from 429s,
alone and as the router's capacity rules see them."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core.config import parse_config
from sidecar.core.pushback import (
    BACKOFF_RESET_S,
    BACKOFF_S,
    HOLD_S,
    MAX_BACKOFF_S,
    MAX_HOLD_S,
    QUOTA_MEMORY_S,
    PushBack,
)
from sidecar.core.router import Router
from sidecar.core.types import Observation, RequestInfo, SliceKey
from tests.conftest import base_config_dict

S = SliceKey("m", "interactive", "short", True)


def _pb(cap: int = 40) -> PushBack:
    pb = PushBack()
    pb.configure({"a": cap, "b": cap})
    return pb


@pytest.mark.parametrize(
    ("refusals", "limit"),
    [
        ([], 40),  # untracked: the configured maximum
        ([16], 16),  # anchored at what the provider held
        ([16, 16, 17, 30], 16),  # refusals while holding the limit or more: nothing new
        ([16, 12], 12),
        ([16, 1], 1),
        ([45], 40),  # holding beyond the maximum (a panic send): no limit below it
    ],
)
def test_a_refusal_anchors_the_limit_at_what_the_provider_held(
    refusals: list[int],
    limit: int,
) -> None:
    pb = _pb()
    for k in refusals:
        pb.refused("a", k, 1.0)
    assert pb.limit("a") == limit
    assert pb.limit("b") == 40
    assert pb.refused_slots == ({"a": 40 - limit} if limit < 40 else {})


@pytest.mark.parametrize(
    ("refusals", "limit", "held_until", "quota"),
    [
        # (holding, time) of each 429 that declared no wait
        ([(16, 1.0), (3, 1.5)], 3, None, False),  # a concurrency limit, being learned
        ([(16, 1.0), (0, 2.0)], 40, 2.0 + BACKOFF_S, True),  # refused alone: a quota
        # from then on its 429s are the quota's: no limit, and while held, no new hold
        ([(0, 1.0), (10, 1.5)], 40, 1.0 + BACKOFF_S, True),
        # each hold within HOLD_S of the last one's end doubles, up to MAX_BACKOFF_S
        ([(0, 1.0), (10, 2.5)], 40, 2.5 + 2 * BACKOFF_S, True),
        ([(0, 1.0), (9, 2.0), (9, 4.0), (9, 8.0), (9, 16.0), (9, 32.0), (9, 64.0),
          (9, 96.0)], 40, 96.0 + MAX_BACKOFF_S, True),
        # a hold that starts BACKOFF_RESET_S after the last one's end starts anew
        ([(0, 1.0), (9, 2.0 + BACKOFF_RESET_S)], 40, 2.0 + BACKOFF_RESET_S + BACKOFF_S, True),
        ([(0, 1.0), (9, 1.9 + BACKOFF_RESET_S)], 40, 1.9 + BACKOFF_RESET_S + 2 * BACKOFF_S,
         True),
        # forgotten once QUOTA_MEMORY_S pass without a 429: a limit again
        ([(0, 1.0), (9, 1.0 + QUOTA_MEMORY_S)], 9, None, False),
        ([(0, 1.0), (9, 200.0), (9, 1.0 + QUOTA_MEMORY_S)], 40, 1.0 + QUOTA_MEMORY_S + 1.0,
         True),
    ],
)
def test_a_429_with_nothing_else_in_flight_is_a_quota_not_a_limit(
    refusals: list[tuple[int, float]], limit: int, held_until: float | None, quota: bool
) -> None:
    """No concurrency limit is below 1: a provider that refuses a request while it
    holds nothing else of ours refuses whatever it gets (lab hunt ``burst_429``). Its
    429s then back off instead of ratcheting the limit down as refusals drain it."""
    pb = _pb()
    for k, t in refusals:
        pb.release(t)
        pb.refused("a", k, t)
    now = refusals[-1][1]
    assert pb.limit("a") == limit
    assert pb.held().get("a") == held_until
    assert pb.quota("a", now) is quota and not pb.quota("b", now)
    pb.adopt("a", 4.0, now)  # a peer's limit, while its 429s are a quota's here
    assert pb.limit("a") == (limit if quota else min(limit, 4))


def test_a_quota_does_not_hold_a_cluster_that_is_some_models_only_route() -> None:
    """Held, such a cluster's model would get tailroute's own 429 for the whole hold,
    more than the provider refuses; the quota's 429s still learn no limit. A declared
    wait holds it all the same (the provider asked)."""
    pb = PushBack()
    pb.configure({"a": 40, "b": 40}, sole=["a"])
    pb.refused("a", 16, 1.0)
    pb.refused("a", 0, 2.0)  # alone: a quota's
    pb.refused("b", 0, 2.0)
    assert pb.quota("a", 2.0) and pb.limit("a") == 40 and pb.held() == {"b": 3.0}
    pb.refused("a", 9, 3.0)
    assert pb.limit("a") == 40 and "a" not in pb.held()
    pb.hold("a", 2.0, 3.0)
    assert pb.held()["a"] == 5.0


def test_the_router_names_the_clusters_that_are_some_models_only_route() -> None:
    data = base_config_dict()
    data["models"].append({"name": "solo", "candidates": ["b"]})
    data["clusters"][1]["models"].append("solo")
    r = Router(parse_config(data, "t.yaml"))
    r.observe(Observation("b", S, "error", status=429), 1.0)  # refused alone
    r.observe(Observation("a", S, "error", status=429), 1.0)
    assert r.pushback.quota("b", 1.0) and set(r.pushback.held()) == {"a"}
    solo = SliceKey("solo", "interactive", "short", True)
    d = r.decide(RequestInfo("chat", "solo", True, 100, 100, "interactive", 10, None, solo),
                 1.5, random.Random(1))
    assert d.cluster == "b" and d.admission == "admit", d  # sent: the provider decides


@pytest.mark.parametrize(
    ("waits", "held_until"),
    [
        ([2.0], 3.0),  # a 429 at 1.0 asking for 2 s
        ([2.0, 0.5], 3.0),  # a shorter wait later does not shorten the hold
        ([2.0, 5.0], 6.0),  # a longer one extends it
        ([3600.0], 1.0 + MAX_HOLD_S),  # a wait beyond the cap is cut to it
        ([0.0], None),  # "come back now" holds nothing
        ([-1.0], None),
        ([math.nan], None),
    ],
)
def test_a_declared_wait_holds_the_cluster_full_without_touching_its_limit(
    waits: list[float], held_until: float | None
) -> None:
    pb = _pb()
    pb.refused("a", 16, 0.5)  # a limit learned before: the hold leaves it alone
    for w in waits:
        pb.hold("a", w, 1.0)
    assert pb.limit("a") == 16
    assert pb.held().get("a") == held_until and pb.next_release == held_until
    assert pb.refused_slots["a"] == (40 if held_until is not None else 40 - 16)
    pb.hold("x", 5.0, 1.0)  # not a configured cluster: ignored
    assert "x" not in pb.held()


@pytest.mark.parametrize(("steps", "at", "refusing"), [
    ([], 1.0, False),  # never held nor refused by a quota
    ([("hold", 2.0)], 2.0, True),  # held now
    ([("hold", 2.0)], 3.0 + QUOTA_MEMORY_S - 0.1, True),  # its hold ended lately
    ([("hold", 2.0)], 3.0 + QUOTA_MEMORY_S, False),  # long enough ago
    ([("refuse", 0)], 1.0 + QUOTA_MEMORY_S - 0.1, True),  # its 429s read as a quota's
    ([("refuse", 16)], 2.0, False),  # a concurrency limit refuses by load, not by time
])
def test_a_cluster_refusing_by_time_lately(
        steps: list[tuple[str, float]], at: float, refusing: bool) -> None:
    """``refusing`` (the attainment score's gate): a hold, a declared wait's or a
    quota's backoff, ended less than QUOTA_MEMORY_S ago, or 429s read as a quota's."""
    pb = _pb()
    for kind, x in steps:
        if kind == "hold":
            pb.hold("a", x, 1.0)
        else:
            pb.refused("a", int(x), 1.0)
    assert pb.refusing("a", at) is refusing and not pb.refusing("b", at)


def test_a_hold_ends_by_itself_and_gives_back_every_slot() -> None:
    pb = _pb()
    pb.hold("a", 2.0, 1.0)
    pb.hold("b", 4.0, 1.0)
    assert pb.refused_slots == {"a": 40, "b": 40} and pb.next_release == 3.0
    pb.release(2.9)  # not yet
    assert pb.refused_slots == {"a": 40, "b": 40}
    pb.release(3.0)
    assert pb.refused_slots == {"b": 40} and pb.next_release == 5.0 and pb.limit("a") == 40
    pb.release(9.0)
    assert pb.refused_slots == {} and pb.next_release is None and pb.held() == {}


@pytest.mark.parametrize(
    ("pressed", "quiet_s", "limit"),
    [
        (True, HOLD_S, 24),  # 16 + 50 %
        (True, HOLD_S - 1, 16),  # not quiet long enough
        (False, 10 * HOLD_S, 16),  # nobody reached the limit: it says nothing
    ],
)
def test_a_limit_grows_only_after_a_quiet_spell_with_traffic_pressing_on_it(
    pressed: bool,
    quiet_s: float,
    limit: int,
) -> None:
    pb = _pb()
    pb.refused("a", 16, 100.0)
    pb.pressed("a", 16 if pressed else 15)
    pb.grow(100.0 + quiet_s)
    assert pb.limit("a") == limit


def test_a_lifted_quota_is_found_again_and_the_cluster_untracked() -> None:
    pb = _pb()
    pb.refused("a", 5, 0.0)
    t, steps = HOLD_S, 0
    while "a" in pb.refused_slots:
        pb.pressed("a", pb.limit("a"))
        pb.grow(t)
        t, steps = t + 10.0, steps + 1
    assert pb.limit("a") == 40 and steps <= 6  # 5 -> 7 -> 10 -> 15 -> 22 -> 33 -> 40


def test_a_reload_clamps_learned_limits_and_forgets_removed_clusters() -> None:
    pb = _pb()
    pb.refused("a", 20, 0.0)
    pb.refused("b", 30, 0.0)
    pb.refused("b", 0, 1.0)  # and a quota's
    pb.configure({"a": 10, "c": 8})
    assert pb.limit("a") == 10 and pb.refused_slots == {}  # 20 > 10: nothing to track
    assert pb.limit("b") == 0 and pb.limit("c") == 8 and not pb.quota("b", 1.0)
    assert pb.held() == {}


@pytest.mark.parametrize(
    ("ours", "theirs", "limit", "refused_at"),
    [
        (None, (12.0, 5.0), 12, 5.0),  # a limit we had not learned
        ((16, 9.0), (12.0, 5.0), 12, 9.0),  # theirs is lower; our refusal is the later
        ((10, 3.0), (12.0, 5.0), 10, 5.0),  # ours is lower; theirs the later refusal
        (None, (0.2, 5.0), 1, 5.0),  # never below one slot
        (None, (99.0, 5.0), None, None),  # at or above the maximum: nothing to track
        ((10, 3.0), (math.nan, 5.0), 10, 3.0),  # nonsense is ignored
        ((10, 3.0), (4.0, math.inf), 10, 3.0),
    ],
)
def test_an_adopted_limit_is_the_lower_one_with_the_later_refusal(
    ours: tuple[int, float] | None, theirs: tuple[float, float], limit: int | None,
    refused_at: float | None,
) -> None:
    pb = _pb()
    if ours is not None:
        pb.refused("a", ours[0], ours[1])
    pb.adopt("a", *theirs)
    pb.adopt("gone", 1.0, 5.0)  # a cluster no longer configured
    pb.adopt_quota("gone", 5.0)
    pb.adopt_quota("b", math.nan)  # a non-finite time
    assert not pb.quota("gone", 5.0) and not pb.quota("b", 5.0)
    assert pb.learned() == ({} if limit is None else {"a": (float(limit), refused_at)})
    assert pb.refused_slots == ({} if limit is None else {"a": 40 - limit})


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["refuse", "queue", "adopt", "adopt_quota", "press", "grow",
                             "hold", "release"]),
            st.integers(0, 80),
            st.floats(0, 50)
        ),
        max_size=60,
    ),
    st.integers(1, 64),
)
def test_limits_stay_within_one_and_the_maximum_and_move_the_right_way(
    events: list[tuple[str, int, float]],
    cap: int,
) -> None:
    pb = PushBack()
    pb.configure({"a": cap})
    now = 0.0
    for kind, k, dt in events:
        now += dt
        before = pb.limit("a")
        if kind == "refuse":
            pb.refused("a", k, now)
            if pb.quota("a", now):  # a quota's 429 (refused alone): no limit at all
                assert pb.limit("a") == cap and "a" in pb.held()
            else:
                assert pb.limit("a") <= before  # a refusal never raises a limit
        elif kind == "queue":  # requests sent while it held k or more queued
            pb.queued("a", k, now)
            assert pb.limit("a") <= before  # a queue never raises a limit
            if pb.limit("a") < before:
                assert pb.limit("a") == max(k, 1) and pb.source("a") == "queueing"
        elif kind == "adopt":  # a peer's or a snapshot's limit, its refusal dt ago
            pb.adopt("a", k / 2, now - dt)
            assert pb.limit("a") <= before  # nor does adopting one
        elif kind == "adopt_quota":  # a peer read the cluster's 429s as a quota's, dt ago
            held = pb.held()
            pb.adopt_quota("a", now - dt)
            assert pb.limit("a") == cap  # its limit is dropped ...
            assert pb.held() == held  # ... and no hold starts here (holds travel apart)
            if dt < QUOTA_MEMORY_S:
                assert pb.quota("a", now)  # read so until QUOTA_MEMORY_S after the peer's
        elif kind == "press":
            pb.pressed("a", k)
            assert pb.limit("a") == before
        elif kind == "hold":  # a declared wait of k / 4 s
            pb.hold("a", k / 4, now)
            assert pb.limit("a") == before  # a hold is not a limit
        elif kind == "release":
            pb.release(now)
            assert pb.limit("a") == before
        else:
            pb.grow(now)
            assert pb.limit("a") >= before  # time alone never lowers one
        assert 1 <= pb.limit("a") <= cap
        assert pb.quota("a", now) == ("a" in pb.quotas(now))  # what fleet mode publishes
        until = pb.held().get("a")
        assert until is None or until <= now + MAX_HOLD_S  # (possibly due, not yet released)
        full = until is not None
        capped = pb.source("a") == "queueing"  # a cap: full at it, nothing refused below
        assert ("a" in pb.caps) == capped and pb.caps.get("a", pb.limit("a")) == pb.limit("a")
        assert ("a" in pb.learned()) == (pb.source("a") == "429")  # caps stay our own
        refused = cap if full else 0 if capped else cap - pb.limit("a")
        assert pb.refused_slots.get("a", 0) == refused


# ------------------------------------------------------------ as the router sees it


def _router() -> Router:
    data = base_config_dict()
    for c in data["clusters"]:
        c["max_concurrency"] = 8
    return Router(parse_config(data, "t.yaml"))


def _req() -> RequestInfo:
    return RequestInfo("chat", "m", True, 100, 100, "interactive", 10, None, S)


def test_a_429_makes_the_router_treat_the_refused_capacity_as_occupied() -> None:
    r = _router()
    for _ in range(3):
        r.started("a")
    r.finished("a")
    r.observe(Observation("a", S, "error", status=429), 1.0)  # refused while holding 2
    assert r.pushback.limit("a") == 2
    assert r.held("a") == 2 and r.inflight("a") == 8  # full as capacity rules see it
    rng = random.Random(7)
    picks = {r.decide(_req(), 1.0 + i / 100, rng).cluster for i in range(200)}
    assert "a" not in picks and picks <= {"b", "c"}
    r.finished("a")  # one slot frees: a takes work again
    picks = {r.decide(_req(), 3.0 + i / 100, rng).cluster for i in range(200)}
    assert "a" in picks


def _capacity_verdict(r: Router, now: float) -> str:
    """What /explain says of ``a``'s capacity when a request is decided at ``now``."""
    d = r.decide(replace(_req(), explain=True), now, random.Random(1))
    assert d.explain is not None
    return next(c.verdicts["capacity"] for c in d.explain.candidates if c.cluster == "a")


@pytest.mark.parametrize(
    ("pressure", "verdict"),
    [
        ("429", "full: its limit of 2 in flight, learned from 429s (of 8)"),
        ("wait", "full: held until 3.0 s (a declared wait or a quota's backoff) (of 8)"),
        ("none", "full: 8/8 in flight"),
    ],
)
def test_explain_says_why_a_route_is_full(pressure: str, verdict: str) -> None:
    """A route full by a learned limit or a hold is not shown as 8 of 8 in flight when
    it holds two: the verdict names what filled it."""
    r = _router()
    for _ in range(8 if pressure == "none" else 2):
        r.started("a")
    if pressure != "none":
        r.started("a")
        r.finished("a")
        wait = 2.0 if pressure == "wait" else None
        r.observe(Observation("a", S, "error", status=429, retry_after_s=wait), 1.0)
    assert _capacity_verdict(r, 1.5) == verdict


def test_a_429_with_a_declared_wait_keeps_the_route_away_until_it_ends() -> None:
    """A time-based quota (lab hunt ``burst_429``): the route counts as full for the
    wait the provider declared, then has every slot back; its limit is not cut,
    however little it held when refused."""
    r = _router()
    r.started("a")
    r.observe(Observation("a", S, "error", status=429, retry_after_s=2.0), 1.0)
    r.finished("a")
    assert r.pushback.limit("a") == 8 and r.inflight("a") == 8
    assert r.next_deadline() is not None and r.next_deadline() <= 3.0  # type: ignore[operator]
    rng = random.Random(7)
    picks = {r.decide(_req(), 1.0 + i / 100, rng).cluster for i in range(150)}  # to 2.49
    assert "a" not in picks
    # past the wait: the first decision releases the hold, without waiting for a tick
    picks = {r.decide(_req(), 3.0 + i / 100, rng).cluster for i in range(200)}
    assert "a" in picks and r.inflight("a") == r.held("a")


@pytest.mark.parametrize(("status", "wait", "holding", "evidence"), [
    (429, 2.0, 0, False), (429, 0.0, 3, True), (429, None, 3, True),
    (429, None, 0, True),  # refused with nothing else in flight: a quota's that never said
    # a 503's declared wait says the route is unavailable: the route's own trouble
    (503, 2.0, 0, True), (503, None, 0, True),
])
def test_a_declared_quota_is_no_evidence_against_the_route(
    status: int, wait: float | None, holding: int, evidence: bool
) -> None:
    """A 429 that holds the route (a positive declared wait) is an outcome for the
    callers but says nothing about the route's health: it is kept out of the
    statistics and the health machine, so a run of them never escalates the route.
    A wait of 0 holds nothing, and such a 429 (like one that declares nothing while
    the route holds other requests: a concurrency limit) stays evidence; so does a
    503, held or not; and a 429 that came back alone, a quota's that did not say how
    long it lasts (sidecar.core.pushback)."""
    r = _router()
    for _ in range(holding):
        r.started("a")
    now = 1.0
    for _ in range(40):
        now += 0.25
        r.observe(Observation("a", S, "error", status=status, retry_after_s=wait), now)
    r.tick(now + 60.0)
    assert r.counters[("outcome", "error")] == 40
    series = r.stats.series("a", S)
    seen = 0 if series is None else series.requests(now)
    assert (seen > 0) is evidence
    if not evidence:
        assert r.health("a", S).state == "healthy" and not r.transitions


@pytest.mark.parametrize(("status", "held"), [(503, True), (429, True), (500, False),
                                             (504, False), (502, False)])
def test_a_503_with_a_declared_wait_holds_its_route_too(status: int, held: bool) -> None:
    """RFC 9110 gives a 503's Retry-After as how long the service expects to be
    unavailable: the route is held for it, as for a 429's quota, and its limit is
    kept. Other statuses carry no wait the router reads (the lab can attach one to
    any error status; the shell reads it only from 429s and 503s)."""
    r = _router()
    r.started("a")
    r.observe(Observation("a", S, "error", status=status, retry_after_s=2.0), 1.0)
    r.finished("a")
    assert r.pushback.limit("a") == 8
    assert (r.inflight("a") == 8) is held
    assert (r.pushback.next_release == 3.0) is held


@pytest.mark.parametrize("status", [503, 500, 504, 200])
def test_only_429_is_push_back(status: int) -> None:
    r = _router()
    r.started("a")
    outcome = "ok" if status == 200 else "error"
    r.observe(Observation("a", S, outcome, status=status), 1.0)  # type: ignore[arg-type]
    assert r.pushback.limit("a") == 8 and r.inflight("a") == r.held("a")


@pytest.mark.parametrize(
    ("cluster", "shown"),
    [
        ({"inflight": 3, "max_concurrency": 64, "concurrency_limit": 16}, "a 3/16 (of 64, 429s)"),
        ({"inflight": 3, "max_concurrency": 64, "concurrency_limit": 16,
          "limit_source": "queueing"}, "a 3/16 (of 64, queueing)"),
        ({"inflight": 3, "max_concurrency": 64, "concurrency_limit": 64}, "a 3/64 in flight"),
        ({"inflight": 3, "max_concurrency": 64}, "a 3/64 in flight"),  # an older sidecar's /state
        ({"inflight": 0, "max_concurrency": 64, "concurrency_limit": 64, "held_until": 4.6},
         "a 0/64, held 5s (Retry-After) in flight"),
        ({"inflight": 0, "max_concurrency": 64, "concurrency_limit": 64, "held_until": 4.6,
          "quota_429": True}, "a 0/64, held 5s (429 quota) in flight"),
        ({"inflight": 2, "max_concurrency": 64, "concurrency_limit": 64, "quota_429": True},
         "a 2/64, 429s: quota in flight"),
    ],
)
def test_status_shows_a_learned_limit(cluster: dict[str, int], shown: str) -> None:
    from sidecar.ops.status_cli import render

    assert shown in render({"now": 0.0, "routes": [], "clusters": {"a": cluster}})


def test_state_reports_the_learned_limit_and_real_in_flight() -> None:
    from sidecar.ops.state import state_json

    r = _router()
    r.started("a")
    r.started("a")
    r.finished("a")
    r.observe(Observation("a", S, "error", status=429), 1.0)
    a = state_json(r, 2.0)["clusters"]["a"]
    assert (a["inflight"], a["max_concurrency"], a["concurrency_limit"]) == (1, 8, 1)
    assert a["limit_source"] == "429"
    assert state_json(r, 2.0)["clusters"]["b"]["limit_source"] is None
    assert a["held_until"] is None and a["quota_429"] is False
    r.finished("a")
    r.observe(Observation("a", S, "error", status=429), 3.0)  # refused with nothing else
    a = state_json(r, 3.5)["clusters"]["a"]
    assert (a["concurrency_limit"], a["held_until"], a["quota_429"]) == (8, 4.0, True)
