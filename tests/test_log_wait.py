"""The bounded book of finished requests waiting for their access-log entry."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.shell.log_wait import LogWait


def test_oldest_wait_follows_close_order() -> None:
    w = LogWait()
    assert w.oldest_wait(5.0) == 0.0
    w.closed("a", 1.0)
    w.closed("b", 2.0)
    w.closed("a", 3.0)  # closing twice keeps the first time
    assert w.oldest_wait(5.0) == 4.0
    w.done("a")
    assert w.oldest_wait(5.0) == 3.0 and list(w) == ["b"]


def test_cap_pushes_out_the_oldest() -> None:
    w = LogWait(cap=2)
    assert w.closed("a", 0.0) == [] and w.closed("b", 1.0) == []
    assert w.closed("c", 2.0) == ["a"] and list(w) == ["b", "c"]


def test_lost_ids_are_remembered_once_and_bounded() -> None:
    w = LogWait(remember=2)
    for rid in "abc":
        w.closed(rid, 0.0)
        w.lost(rid)
    assert len(w) == 0
    assert not w.take_lost("a")  # forgotten: the memory keeps the last two
    assert w.take_lost("b") and not w.take_lost("b")
    assert w.take_lost("c")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["close", "done", "lost"]),
                          st.integers(0, 30)), max_size=200),
       st.integers(1, 8))
def test_every_closed_request_leaves_exactly_once(ops: list[tuple[str, int]], cap: int) -> None:
    """Whatever the order of events, the book never exceeds its cap, and each id that
    entered leaves once: done, lost by the caller, or pushed out (and then given up)."""
    w = LogWait(cap=cap)
    inside: set[str] = set()
    for t, (op, n) in enumerate(ops):
        rid = f"r{n}"
        if op == "close":
            pushed = w.closed(rid, float(t))
            inside.add(rid)
            assert len(pushed) <= 1 and not set(pushed) & {rid}
            inside -= set(pushed)
        elif op == "done":
            w.done(rid)
            inside.discard(rid)
        else:
            w.lost(rid)
            inside.discard(rid)
        assert len(w) <= cap and set(w) == inside
        assert w.oldest_wait(float(t)) >= 0.0
