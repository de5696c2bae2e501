"""The long-lived generation is frozen out of the collector's full passes once routes
have grown it; cyclic garbage in it is collected first, never frozen."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from sidecar.shell.gc_freeze import LongLivedFreezer

GROWTH = 60_000  # objects a test adds to the long-lived generation


class _Node:
    __slots__ = ("other",)

    def __init__(self) -> None:
        self.other: _Node | None = None


@pytest.fixture
def started() -> Iterator[None]:
    """What ``serve`` froze at start (everything then), undone after the test."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _long_lived() -> int:
    gc.collect()  # survivors are promoted: what a running sidecar's routes become
    return len(gc.get_objects(generation=2))


def test_a_grown_long_lived_generation_is_frozen(started: None) -> None:
    freezer = LongLivedFreezer(threshold=GROWTH // 2)
    start = gc.get_freeze_count()
    _long_lived()
    assert not freezer.check()  # below the trigger: nothing happens
    kept = [_Node() for _ in range(GROWTH)]  # a route ring's worth of live state
    _long_lived()
    assert freezer.check()
    assert freezer.freezes == 1 and gc.get_freeze_count() - start >= GROWTH
    assert len(gc.get_objects(generation=2)) < GROWTH // 2  # out of the full passes
    assert freezer.counters() == {"gc:freezes": 1, "gc:frozen": gc.get_freeze_count()}
    del kept


def test_cyclic_garbage_is_collected_not_frozen(started: None) -> None:
    freezer = LongLivedFreezer(threshold=GROWTH // 2)
    start = gc.get_freeze_count()
    pairs = [(_Node(), _Node()) for _ in range(GROWTH // 2)]
    for a, b in pairs:
        a.other, b.other = b, a  # cycles: only the collector frees them
    _long_lived()  # promoted while still reachable
    del pairs, a, b  # now unreachable cycles in the long-lived generation
    assert not freezer.check()
    assert freezer.freezes == 0 and gc.get_freeze_count() == start
    assert not any(isinstance(o, _Node) for o in gc.get_objects())
