"""Keyed service draws: the same row for a key whatever was asked before, as
Python floats made on demand from blocks kept as numpy arrays."""

from __future__ import annotations

import gc
import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.sim.dists import KeyedRows, service_array, service_block

BLOCK = 4096


def _generator(name: str, block: int) -> np.random.Generator:
    """The generator of ``KeyedRows(name)``'s block ``block`` (its documented seeding)."""
    seed = int.from_bytes(hashlib.sha256(f"{name}:{block}".encode()).digest()[:8], "little")
    return np.random.Generator(np.random.PCG64(seed))


@pytest.mark.parametrize("width", [5, 7])
@pytest.mark.parametrize("key", [0, 1, 4095, 4096, 3 * BLOCK + 17])
def test_a_row_is_its_blocks_row_as_python_floats(width: int, key: int) -> None:
    row = KeyedRows("7:service:a:chat", width).row(key)
    expected = service_block(_generator("7:service:a:chat", key >> 12), width)[key & 4095]
    assert row == expected
    assert type(row) is list and all(type(v) is float for v in row)
    assert len(row) == width
    assert all(0.0 <= row[i] < 1.0 for i in (0, 1, *range(4, width)))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=6 * BLOCK - 1), min_size=1, max_size=40))
def test_a_key_gets_the_same_row_whatever_was_asked_before(keys: list[int]) -> None:
    """Blocks are kept three at a time; one asked for again after it was dropped is
    made again from its own seed, so the order of requests never changes a row."""
    table = KeyedRows("9:service:b:batch")
    seen = [table.row(k) for k in keys]
    assert seen == [KeyedRows("9:service:b:batch").row(k) for k in keys]


def test_each_answer_is_a_fresh_row() -> None:
    """A caller may keep or change the row it got; the next answer is unaffected."""
    table = KeyedRows("1:service:a:chat")
    first = table.row(5)
    first[0] = -1.0
    assert table.row(5)[0] != -1.0
    assert table.row(5) is not table.row(5)


def test_kept_blocks_add_nothing_for_the_collector_to_traverse() -> None:
    """The blocks stay arrays: three kept blocks of 4096 rows leave the cyclic
    garbage collector's population where it was (as lists they added 12k)."""
    table = KeyedRows("3:service:c:chat")
    gc.collect()
    before = len(gc.get_objects())
    for b in range(3):
        table.row(b * BLOCK)
    gc.collect()
    assert len(gc.get_objects()) - before < 100


def test_the_block_array_and_the_stream_rows_agree() -> None:
    arr = service_array(_generator("x", 0), 5)
    assert arr.shape == (BLOCK, 5)
    assert arr.tolist() == service_block(_generator("x", 0), 5)
