"""Forwarding access-log entries to the process that decided them (fleet mode)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.config import parse_config
from sidecar.shell.app import App
from sidecar.shell.entry_forward import FORWARD_MAX, EntryForwards, decider_of
from sidecar.shell.extproc import RouteStream
from sidecar.shell.outcomes import OutcomeFeed
from tests.conftest import base_config_dict
from tests.streamharness import body_only_msg, chat_request
from tests.test_extproc import entry


@pytest.mark.parametrize(("rid", "decider"), [
    ("0a1b2c3d-17", "0a1b2c3d"),
    ("0a1b2c3d-0", "0a1b2c3d"),
    ("0A1B2C3D-17", None),  # ours are lower-case hex
    ("0a1b2c3-17", None),  # seven digits
    ("0a1b2c3d-", None),
    ("0a1b2c3d-x", None),
    ("0a1b2c3d", None),
    ("{t}:x-1", None),  # never a key fragment of someone else's choosing
    ("", None),
])
def test_decider_of(rid: str, decider: str | None) -> None:
    assert decider_of(rid) == decider


@given(st.text(max_size=40))
def test_decider_of_accepts_only_eight_hex_digits(rid: str) -> None:
    d = decider_of(rid)
    assert d is None or (len(d) == 8 and set(d) <= set("0123456789abcdef")
                         and rid.startswith(d + "-"))


def test_the_book_skips_own_ids_and_is_bounded() -> None:
    book = EntryForwards("aaaaaaaa")
    book.note("aaaaaaaa-1")  # decided here: nothing to forward
    book.note("bbbbbbbb-1")
    book.note("bbbbbbbb-2")
    book.note("cccccccc-1")
    assert book.take() == {"bbbbbbbb": ["bbbbbbbb-1", "bbbbbbbb-2"], "cccccccc": ["cccccccc-1"]}
    assert book.take() == {}
    book.count = FORWARD_MAX
    book.note("bbbbbbbb-3")
    assert book.dropped == 1 and book.by_decider == {}


def test_a_failed_cycle_puts_its_ids_back() -> None:
    book = EntryForwards("aaaaaaaa")
    book.note("bbbbbbbb-1")
    taken = book.take()
    book.put_back(taken)
    assert book.take() == taken


def _fleet_app(seed: int) -> App:
    data = base_config_dict(stats={"min_samples": 1},
                            fleet={"url": "redis://127.0.0.1:1/0"})
    return App.create(parse_config(data, "t.yaml"), seed=seed)


def _decided(app: App, now: float) -> str:
    """One request decided and over (its routing stream closed), waiting for its entry."""
    s = RouteStream(app)
    s.on_message(body_only_msg(chat_request()), now)
    s.close(now + 0.3, cancelled=False)
    assert s.rid is not None and s.rid in app.pending
    return s.rid


def test_an_entry_received_elsewhere_ends_the_wait_not_as_lost() -> None:
    decider, receiver = _fleet_app(1), _fleet_app(2)
    rid = _decided(decider, 0.0)
    route = decider.pending[rid].decision.cluster + "|interactive|n"
    OutcomeFeed(receiver)(entry(rid, route=route, slice_label="m|interactive|short|stream"),
                          0.5)
    assert receiver.envoy["orphan"] == 1 and receiver.router.counters[("outcome", "ok")] == 1
    forwarded = receiver.forwards.take()
    assert forwarded == {decider.prefix: [rid]}
    decider.settled_elsewhere(forwarded[decider.prefix], 1.0)
    assert not decider.pending and len(decider.waiting) == 0
    assert decider.envoy["elsewhere"] == 1 and decider.envoy["lost"] == 0
    assert decider.router.counters[("outcome", "ok")] == 0  # observed once, by the receiver
    decider.settled_elsewhere([rid], 1.0)  # a repeat changes nothing
    assert decider.envoy["elsewhere"] == 1


def test_a_forward_after_the_grace_counts_late() -> None:
    decider = _fleet_app(1)
    rid = _decided(decider, 0.0)
    decider.tick(1_000.0)  # the entry's grace is over: lost
    assert decider.envoy["lost"] == 1
    decider.settled_elsewhere([rid], 1.0)
    assert decider.envoy["late"] == 1 and decider.envoy["elsewhere"] == 0


def test_without_a_fleet_nothing_is_noted() -> None:
    data = base_config_dict(stats={"min_samples": 1})
    app = App.create(parse_config(data, "t.yaml"), seed=1)
    OutcomeFeed(app)(entry("bbbbbbbb-1", route="a|interactive|n",
                           slice_label="m|interactive|short|stream"), 0.0)
    assert app.envoy["orphan"] == 1 and app.forwards.take() == {}


def test_a_request_settled_elsewhere_keeps_the_live_books_even() -> None:
    """Live misses (sidecar.core.live_misses): an end-to-end request counts as a miss at
    its budget if still open, so one that closed in time must count as a hit even when
    its entry went to another process; else the decider's books lean to misses."""
    decider = _fleet_app(1)
    s = RouteStream(decider)
    s.on_message(body_only_msg(chat_request(stream=False), {"x-tailroute-class": "agentic"}),
                 0.0)
    s.close(0.3, cancelled=False)  # 8 s budget: answered in time
    assert s.rid is not None
    decider.settled_elsewhere([s.rid], 1.0)
    books = list(decider.router.live.books.values())
    assert [(b.k, b.m) for b in books] == [(0, 1)]
