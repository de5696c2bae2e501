"""Queue signs (sidecar.core.queue_signs): capacity lost without a 429, found where a
route's misses begin by in-flight count, and the limit the router then keeps."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core.config import parse_config
from sidecar.core.pushback import GROW_QUEUED, HOLD_S, PushBack
from sidecar.core.queue_signs import (
    G_MIN,
    HIGH,
    LOW,
    MIN_ABOVE,
    MIN_BELOW,
    SPAN_S,
    QueueSigns,
    find_split,
    split_gain,
)
from sidecar.core.router import Router
from sidecar.core.types import Observation, RequestInfo, SliceKey
from tests.conftest import base_config_dict

S = SliceKey("m", "interactive", "short", True)


def _queueing(capacity: int, top: int, per_count: int = 3) -> list[tuple[int, bool]]:
    """A route that meets its budget below ``capacity`` in flight and misses above it."""
    return [(k, k >= capacity) for k in range(top) for _ in range(per_count)]


@pytest.mark.parametrize(
    ("outcomes", "split"),
    [
        (_queueing(20, 40), 20),  # misses begin where the capacity ends
        (_queueing(6, 40), 6),
        ([(k, True) for k in range(40) for _ in range(3)], None),  # slow at every count
        ([(k, False) for k in range(40) for _ in range(3)], None),  # never misses
        # a heavy tail: one miss in ten, at every count alike
        ([(k, i % 10 == 0) for i, k in enumerate(range(40)) for _ in range(3)], None),
        ([(k, False) for k in range(30)] + [(40, True)] * 2, None),  # two misses: too few
        (_queueing(3, 40, per_count=2), None),  # too few below it
        # a spike's outcomes of the same span: high counts and every one missed
        ([(k, True) for k in range(60, 90)] + [(k, False) for k in range(10)], None),
    ],
)
def test_the_split_is_where_the_misses_begin(
    outcomes: list[tuple[int, bool]], split: int | None
) -> None:
    assert find_split(outcomes) == split


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 300), st.booleans()), max_size=300))
def test_a_split_always_meets_every_condition_of_a_sign(outcomes: list[tuple[int, bool]]) -> None:
    k = find_split(outcomes)
    if k is None:
        return
    above = [y for c, y in outcomes if c >= k]
    below = [y for c, y in outcomes if c < k]
    assert len(above) >= MIN_ABOVE and len(below) >= MIN_BELOW
    assert sum(above) >= HIGH * len(above) and sum(below) <= LOW * len(below)
    assert split_gain(sum(above), len(above), sum(below), len(below)) >= G_MIN


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 150), st.integers(0, 2**31))
def test_a_clean_queue_is_found_at_its_capacity(capacity: int, seed: int) -> None:
    """Counts drawn at random on both sides of the capacity: the split is just above
    the highest count served within budget (a gap below the first miss is unknown)."""
    rng = random.Random(seed)
    outcomes = [(rng.randrange(0, capacity), False) for _ in range(40)]
    outcomes += [(rng.randrange(capacity, 2 * capacity + 10), True) for _ in range(20)]
    assert find_split(outcomes) == max(k for k, y in outcomes if not y) + 1


def _note_all(signs: QueueSigns, klass: str, rows: list[tuple[float, int, bool]],
              tpot: float | None = 0.02) -> None:
    for t, k, missed in rows:
        signs.note("a", klass, t, k, missed, tpot)


def test_a_route_that_serves_again_once_it_holds_less_shows_a_queue() -> None:
    """Sent while ``a`` held 40-59 the requests missed; sent afterwards, while it held
    fewer than 20, they met their budget: ``a`` serves up to 20."""
    signs = QueueSigns()
    _note_all(signs, "interactive", [(100.0 + i / 10, 40 + i, True) for i in range(20)])
    _note_all(signs, "interactive", [(103.0 + i / 10, i % 20, False) for i in range(40)])
    assert signs.judge(110.0) == {"a": 20}
    assert signs.judge(111.0) == {}  # nothing new since the last judgement


def test_a_slow_spell_is_no_queue_and_what_came_before_it_does_not_count() -> None:
    """Fine at 20-39 in flight, then a slow spell: every request missed, and the route
    held more as they lasted longer (Little's law). Comparing the misses with the
    requests before the first of them would read a queue at 40; from the first miss
    on, every count missed."""
    signs = QueueSigns()
    _note_all(signs, "interactive", [(100.0 + i / 10, 20 + i % 20, False) for i in range(40)])
    _note_all(signs, "interactive", [(104.0 + i / 10, 20 + i, True) for i in range(40)])
    assert signs.judge(110.0) == {}


@pytest.mark.parametrize(
    ("miss_tpot", "sign"),
    [
        (0.02, {"a": 20}),  # decoded as fast as the successes: they waited for a slot
        (0.028, {"a": 20}),  # 1.4x: a fuller batch decodes a little slower
        (0.06, {}),  # 3x slower: the route was slow, not short (a spike that ended)
        (None, {}),  # failed or timed out before a token: nothing tells them apart
    ],
)
def test_a_queue_delays_the_first_token_not_the_decode(
    miss_tpot: float | None, sign: dict[str, int]
) -> None:
    """A request that waited for a slot decodes at the usual pace once it has one; a
    route that turned slow decodes slowly too. Misses at high counts followed by
    successes at low ones read as a queue only when the misses decoded as fast."""
    signs = QueueSigns()
    _note_all(signs, "interactive", [(100.0 + i / 10, 40 + i, True) for i in range(20)],
              miss_tpot)
    _note_all(signs, "interactive", [(103.0 + i / 10, i % 20, False) for i in range(40)])
    assert signs.judge(110.0) == sign


def test_each_class_is_judged_on_its_own_outcomes() -> None:
    """A batch class's generous budget is met at any count: its outcomes do not dilute
    the interactive misses into a queue, nor hide one."""
    signs = QueueSigns()
    _note_all(signs, "interactive", [(100.0 + i / 10, 40 + i % 20, True) for i in range(20)])
    _note_all(signs, "batch", [(102.0 + i / 10, i % 20, False) for i in range(40)])
    assert signs.judge(110.0) == {}
    _note_all(signs, "interactive", [(103.0 + i / 10, i % 20, False) for i in range(40)])
    assert signs.judge(111.0) == {"a": 20}


def test_outcomes_age_out_by_send_time() -> None:
    signs = QueueSigns()
    _note_all(signs, "interactive", [(100.0 + i / 10, 40 + i, True) for i in range(20)])
    _note_all(signs, "interactive", [(103.0 + i / 10, i % 20, False) for i in range(40)])
    _note_all(signs, "interactive", [(100.0 + SPAN_S + 20.0, 1, False)])
    assert signs.judge(100.0 + SPAN_S + 21.0) == {}  # the misses were sent too long ago


def test_a_long_request_sent_before_the_span_does_not_count_when_it_ends_late() -> None:
    """The ring is in order of completion: misses sent long ago that end after newer
    requests are still outside the span, wherever they sit in the ring."""
    signs = QueueSigns()
    _note_all(signs, "interactive", [(200.0 + i / 10, i % 20, False) for i in range(40)])
    _note_all(signs, "interactive", [(100.0 + i / 10, 40 + i, True) for i in range(20)])
    _note_all(signs, "interactive", [(204.0 + i / 10, 40 + i, True) for i in range(2)])
    assert signs.judge(210.0) == {}  # two recent misses: too few above any count


def test_a_queue_limit_cuts_at_the_sign_and_regains_slowly() -> None:
    pb = PushBack()
    pb.configure({"a": 100})
    pb.queued("a", 30, 0.0)
    assert pb.limit("a") == 30 and pb.caps == {"a": 30} and "a" not in pb.refused_slots
    pb.queued("a", 40, 5.0)  # at or above the limit: requests sent before it fell
    assert pb.limit("a") == 30
    pb.pressed("a", 30)
    pb.grow(HOLD_S)
    assert pb.limit("a") == 30 + max(1, int(GROW_QUEUED * 30))  # a 429's would be 45
    pb.refused("a", 31, HOLD_S + 1)  # a 429 after all: its limit, its growth, its slots
    assert pb.caps == {} and pb.refused_slots == {"a": 69}
    pb.pressed("a", 31)
    pb.grow(2 * HOLD_S + 1)
    assert pb.limit("a") == 46


def test_a_cap_is_forgotten_with_its_cluster_and_yields_to_a_peers_lower_limit() -> None:
    pb = PushBack()
    pb.configure({"a": 100, "b": 100})
    pb.queued("a", 30, 0.0)
    pb.queued("b", 30, 0.0)
    pb.adopt("a", 40.0, 1.0)  # a peer's 429s taught it more: our cap stays
    assert pb.caps == {"a": 30, "b": 30} and pb.source("a") == "queueing"
    pb.adopt("a", 20.0, 1.0)  # less: the peer's limit, with its refused slots
    assert pb.limit("a") == 20 and pb.source("a") == "429" and pb.refused_slots == {"a": 80}
    pb.configure({"a": 100})  # b removed by a reload
    assert pb.caps == {} and pb.source("b") is None


def _router() -> Router:
    data = base_config_dict()
    for c in data["clusters"]:
        c["max_concurrency"] = 100
    return Router(parse_config(data, "t.yaml"))


def test_the_router_learns_a_limit_from_where_a_route_queues() -> None:
    """Requests sent while ``a`` held 25 or more waited for a slot and missed their 1 s
    TTFT budget; the ones sent while it held fewer met it. At the next window boundary
    ``a`` is trusted with 25: full at 25, and no slot counted as occupied below it."""
    r = _router()
    now = 1.0
    for k in [*range(25, 50), *range(25)] * 2:  # the queue's misses first, then its relief
        ttft = 0.3 if k < 25 else 4.0
        r.observe(Observation("a", S, "ok", ttft_s=ttft, tpot_s=0.02, e2e_s=ttft + 1.0,
                              sent_load=k / 100), now)
        now += 0.05
    assert r.pushback.limit("a") == 100  # nothing until the window is judged
    boundary = r.next_deadline()
    assert boundary is not None
    r.tick(boundary)
    assert r.pushback.limit("a") == 25 and r.inflight("a") == 0 and r.has_room("a")
    for _ in range(25):
        r.started("a")
    assert r.inflight("a") == 100 and not r.has_room("a")  # full at its cap
    assert r.pushback.limit("b") == 100
    # /explain names the cap, not the 100 slots the capacity rules count
    req = RequestInfo("chat", "m", True, 100, 100, "interactive", 10, None, S, explain=True)
    d = r.decide(req, boundary, random.Random(1))
    assert d.explain is not None
    verdicts = {c.cluster: c.verdicts.get("capacity") for c in d.explain.candidates}
    assert verdicts["a"] == "full: its limit of 25 in flight, learned from queueing (of 100)"
