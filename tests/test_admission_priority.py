"""Strict priority under overload: pressed classes, reserves and the ``yield`` rows."""

from __future__ import annotations

import random

import pytest

from sidecar.core.admission import Situation, evaluate
from sidecar.core.admission_priority import PriorityPressure
from sidecar.core.config import ConfigError
from sidecar.core.router import Router
from sidecar.ops.state import state_json
from tests.test_admission import fill, make_router, request

S = Situation
CONTENDED = {"contended": True, "saturated": True}
CAPACITY = {**CONTENDED, "capacity_bound": True, "queue_window_ms": 250.0}
RNG = random.Random(3)


@pytest.mark.parametrize(
    ("situation", "outcome", "reason"),
    [
        (S(**CONTENDED, yields=True), "defer", "yield"),
        (S(**CONTENDED, yields=True, can_defer=False), "shed", "yield"),
        # a yielding class still waits its turn in the priority-ordered queue first
        (S(**CAPACITY, yields=True), "queue", "capacity"),
        (S(**CAPACITY, yields=True, queued=True, wait_expired=True), "defer", "yield"),
        (S(**CAPACITY, yields=True, queue_room=False, can_defer=False), "shed", "yield"),
        # below shed_below_priority: the old rows, reason unchanged
        (S(**CONTENDED, high=False, yields=True), "defer", "overload"),
        # nothing pressed above: served best effort as before
        (S(**CAPACITY, queued=True, wait_expired=True), "admit", "best_effort"),
        (S(yields=True), "admit", "ok"),  # not contended: a free slot beyond the reserve
    ],
)
def test_yield_rows(situation: Situation, outcome: str, reason: str) -> None:
    rule = evaluate(situation)
    assert (rule.outcome, rule.reason) == (outcome, reason)


AB = frozenset({"a", "b"})


@pytest.mark.parametrize(
    ("marks", "priority", "now", "held"),
    [
        ([], 1, 10.0, {}),
        ([("premium", 20, AB, 0.0)], 10, 1.0, {}),  # one request: not sustained yet
        ([("premium", 20, AB, 0.0), ("premium", 20, AB, 5.0)], 10, 5.0,
         {"a": "premium", "b": "premium"}),
        ([("premium", 20, AB, 0.0), ("premium", 20, AB, 5.0)], 20, 5.0, {}),  # not above itself
        ([("premium", 20, AB, 0.0), ("premium", 20, AB, 5.0)], 10, 15.0, {}),  # hold over
        # a gap longer than the hold starts a new episode: not sustained again yet
        ([("premium", 20, AB, 0.0), ("premium", 20, AB, 11.0)], 10, 12.0, {}),
        # each route yields to the most important class pressed on it
        ([("std", 10, AB, 0.0), ("std", 10, AB, 6.0), ("premium", 20, frozenset("b"), 0.0),
          ("premium", 20, frozenset("b"), 6.0)], 1, 6.0, {"a": "std", "b": "premium"}),
        ([("std", 10, AB, 0.0), ("std", 10, AB, 6.0)], 10, 6.0, {}),
    ],
)
def test_pressed_classes(marks: list[tuple[str, int, frozenset[str], float]], priority: int,
                         now: float, held: dict[str, str]) -> None:
    p = PriorityPressure(hold_s=10.0, reserve=0.1, after_s=5.0)
    for klass, prio, routes, at in marks:
        p.mark(klass, prio, routes, at)
    p.prune(now)
    assert p.held_routes(priority, now) == held
    assert p.above(priority, now) == bool(held)


@pytest.mark.parametrize(("reserve", "cap", "slots"),
                         [(0.1, 22, 3), (0.1, 10, 1), (0.1, 64, 7), (0.0, 64, 0), (1.0, 4, 4)])
def test_reserve_slots(reserve: float, cap: int, slots: int) -> None:
    assert PriorityPressure(10.0, reserve).reserve_slots(cap) == slots


def test_off_when_hold_is_zero() -> None:
    p = PriorityPressure(hold_s=0.0, reserve=0.1)
    p.mark("premium", 20, AB, 0.0)
    assert not p.above(1, 0.0) and p.snapshot(0.0) == []


def press_interactive(conc: int = 10) -> tuple[Router, float]:
    """Every route full for interactive traffic, sustained past yield_after_s."""
    r = make_router(conc=conc)
    fill(r, conc)
    for t in (1.0, 4.0, 7.0):
        d = r.decide(request(), t, RNG)  # the top class: deferred at full capacity
        assert d.admission == "defer" and d.detail.startswith("full")
    for c in ("a", "b", "c"):
        r.finished(c)  # one free slot per route: inside the reserve (ceil(0.1 x 10) = 1)
    return r, 7.0


def test_lower_classes_yield_to_a_pressed_class_in_priority_order() -> None:
    r, now = press_interactive()
    d = r.decide(request("agentic"), now + 0.1, RNG)  # priority 8: above shed_below_priority
    assert (d.admission, d.status) == ("defer", 429)
    assert d.detail.startswith("yield:") and "held for pressed class interactive" in d.detail
    d = r.decide(request("agentic", deadline_ms=1500), now + 0.1, RNG)  # cannot wait 2 s
    assert (d.admission, d.detail.split(":")[0]) == ("shed", "yield")
    # Below shed_below_priority the overload rows govern, not the reserves: batch is
    # deferred whenever its routes are full or over budget, and a free slot is free.
    d = r.decide(request("batch"), now + 0.1, RNG)
    assert d.admission == "admit"
    assert r.decide(request(), now + 0.1, RNG).admission == "admit"  # the pressed class
    assert r.counters[("admission_reason", "yield")] == 2
    pressed = state_json(r, now + 0.1)["admission"]["pressed"]
    assert [(p["class"], p["priority"], p["since"]) for p in pressed] == [("interactive", 10, 1.0)]
    # Hysteresis: the class stays pressed for yield_hold_s after its last saturated request.
    assert r.decide(request("agentic"), now + 9.9, RNG).admission == "defer"
    d = r.decide(request("agentic"), now + 10.0, RNG)
    assert (d.admission, d.detail) == ("admit", "")
    assert state_json(r, now + 10.0)["admission"]["pressed"] == []


def test_a_free_slot_beyond_the_reserve_is_taken() -> None:
    r, now = press_interactive()
    r.finished("b")  # b: two free, one beyond the reserve
    d = r.decide(request("agentic"), now + 0.1, RNG)
    assert d.admission == "admit"


def test_nothing_yields_without_a_sustained_pressed_class() -> None:
    r = make_router(conc=10)
    fill(r, 10)
    r.decide(request(), 1.0, RNG)  # saturated once: not pressed yet
    for c in ("a", "b", "c"):
        r.finished(c)
    assert r.decide(request("agentic"), 1.1, RNG).admission == "admit"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("yield_reserve", 1.5, "yield_reserve"), ("yield_hold_s", -1, "yield_hold_s"),
     ("yield_after_s", "x", "yield_after_s")],
)
def test_config_errors_name_the_field(field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make_router(admission={field: value})


def test_the_pressed_table_is_capped_keeping_the_most_important() -> None:
    """Priorities are a client's choice (0..1000): one pressed entry per distinct claimed
    priority grew the table to ~1,000 entries per class, scanned at every decision."""
    p = PriorityPressure(hold_s=10.0, reserve=0.1, after_s=0.0)
    order = list(range(1001))
    random.Random(5).shuffle(order)
    for i, prio in enumerate(order):
        p.mark("interactive", prio, AB, i * 0.001)
    now = 1.0
    live = p.snapshot(now)
    assert len(live) == 64
    assert sorted(e["priority"] for e in live) == list(range(1001 - 64, 1001))
    assert p.overflow == 1001 - 64
    assert p.above(10, now) and p.held_routes(10, now) == {"a": "interactive", "b": "interactive"}
    # a known entry is refreshed, never counted; a mark less important than all is dropped
    p.mark("interactive", 1000, AB, now)
    p.mark("batch", 3, AB, now)
    assert p.overflow == 1001 - 64 + 1 and len(p.snapshot(now)) == 64
    # expired entries make room again
    p.prune(now + 20.0)
    p.mark("batch", 3, AB, now + 20.0)
    assert [e["class"] for e in p.snapshot(now + 20.0)] == ["batch"]


def test_distinct_claimed_priorities_under_saturation_keep_state_small() -> None:
    """Through the stream handler: every route full, 3,000 requests each claiming a random
    x-tailroute-priority (at or above shed_below_priority, so they queue and press)."""
    from sidecar.core.config import parse_config
    from sidecar.shell.app import App
    from sidecar.shell.extproc import RouteStream
    from tests.conftest import base_config_dict
    from tests.streamharness import POST_CHAT, body_msg, chat_request, headers_msg, is_hold

    data = base_config_dict(admission={"yield_after_s": 0})
    for c in data["clusters"]:
        c["max_concurrency"] = 1
    app = App.create(parse_config(data, "t.yaml"), seed=1)
    for _ in range(3):  # one request in flight per route: all full
        s = RouteStream(app)
        s.on_message(headers_msg(POST_CHAT), 1.0)
        s.on_message(body_msg(chat_request()), 1.0)
    rng = random.Random(1)
    now = 1.0
    for _ in range(3000):
        s = RouteStream(app)
        s.on_message(headers_msg({**POST_CHAT,
                                  "x-tailroute-priority": str(rng.randint(5, 1000))}), now)
        assert is_hold(s.on_message(body_msg(chat_request()), now))
        s.close(now, cancelled=True)
        now += 0.001
    state = state_json(app.router, now)["admission"]
    assert 0 < len(state["pressed"]) <= 64
    assert state["pressed_overflow"] > 0
    assert max(e["priority"] for e in state["pressed"]) >= 990
