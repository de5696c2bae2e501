"""The miss-ratio score: light-load violation shares compared as ratios
(sidecar.core.scorers.MissRatio, sidecar.core.light_load "The record"); on by
default (``miss_ratio_exponent`` 1), which these tests also set explicitly."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.config import Config, ConfigError, parse_config
from sidecar.core.filters import DEFAULT_FILTERS
from sidecar.core.light_load import RECORD_HALF_LIFE_S, RECORD_MIN, LightOutcomes
from sidecar.core.pickers import PICKERS
from sidecar.core.pipeline import run_pipeline
from sidecar.core.scorers import DEFAULT_SCORERS
from sidecar.core.selection import Candidate, HealthView, SelectionContext
from tests.conftest import base_config_dict
from tests.test_pipeline import FakeView, _req

N = 10_000  # light outcomes per route: the prior (5 at the allowed share) barely moves them


def _with(exponent: object) -> dict[str, object]:
    """The test config with the interactive class's ``miss_ratio_exponent`` set."""
    return base_config_dict(classes={"interactive": {"miss_ratio_exponent": exponent}})


def _book(misses: dict[str, int], n: int = N, at: float = 0.0) -> LightOutcomes:
    """Each route's record: ``misses[route]`` violated of ``n`` light outcomes at ``at``."""
    book = LightOutcomes()
    for route, x in misses.items():
        for i in range(n):
            book.note(route, _req().slice, i < x, at)
    return book


def _candidates(book: LightOutcomes | None, cfg: Config | None = None,
                now: float = 0.0, busy: dict[str, int] | None = None) -> dict[str, Candidate]:
    cfg = cfg or parse_config(_with(1.0), "t.yaml")
    model, k = cfg.model("m"), cfg.workload_class("interactive")
    assert model is not None and k is not None
    view = FakeView(ttft={"a": 0.2, "b": 0.2, "c": 0.2}, busy=busy or {})
    ctx = SelectionContext(cfg, model, k, _req(), view, now, light=book)
    result = run_pipeline(ctx, DEFAULT_FILTERS, DEFAULT_SCORERS, PICKERS["weighted_random"],
                          random.Random(0))
    assert result is not None
    return {c.name: c for c in result.candidates}


def _scores(book: LightOutcomes | None, cfg: Config | None = None,
            now: float = 0.0, busy: dict[str, int] | None = None) -> dict[str, float]:
    """Each route's miss-ratio score (1 where none is written)."""
    return {n: c.scores.get("miss_ratio", 1.0)
            for n, c in _candidates(book, cfg, now, busy).items()}


@pytest.mark.parametrize(("misses_b", "expected"), [
    (0, 1.0),  # alike: nothing written
    (10, 0.005 / 0.006),  # 0.1 % against none: below the floor's scale, mild
    (100, 0.005 / 0.015),  # 1 %: inside a p95 SLO, yet three times the clean route's cost
    (300, 0.005 / 0.035),  # 3 %
])
def test_a_route_keeps_the_ratio_of_the_best_share_to_its_own(misses_b: int,
                                                              expected: float) -> None:
    """p95 class: a = 0.05, so the shares are compared with 0.5 % added to each."""
    s = _scores(_book({"a": 0, "b": misses_b, "c": 0}))
    assert s["a"] == s["c"] == 1.0
    assert s["b"] == pytest.approx(expected, rel=0.01)


def test_the_exponent_steepens_it_and_zero_turns_it_off() -> None:
    book = _book({"a": 0, "b": 100, "c": 0})
    steep = _scores(book, parse_config(_with(2.0), "t.yaml"))
    assert steep["b"] == pytest.approx((0.005 / 0.015) ** 2, rel=0.02)
    assert _scores(book, parse_config(_with(0), "t.yaml")) == {"a": 1.0, "b": 1.0, "c": 1.0}


def test_nothing_without_a_book_or_light_outcomes() -> None:
    """Fleet mode (no book) and native mode (no outcome has a send-time load, so the
    book is empty) leave the weights as they were."""
    assert _scores(None) == _scores(LightOutcomes()) == {"a": 1.0, "b": 1.0, "c": 1.0}


def test_a_route_without_a_record_is_not_compared() -> None:
    """c was never sent to under light load (the fastest route of a slice, busy with
    the rest of the traffic, is seldom light): no evidence, no score, and the others
    are compared among themselves."""
    s = _scores(_book({"a": 0, "b": 100}))
    assert s["a"] == s["c"] == 1.0
    assert s["b"] == pytest.approx(0.005 / 0.015, rel=0.01)
    assert _scores(_book({"a": 0, "b": 100, "c": 0}, n=int(RECORD_MIN) - 1))["b"] == 1.0


@pytest.mark.parametrize(("in_flight", "scored"), [
    (0, True), (31, True),  # below half of a's 64 slots: light
    (32, False), (64, False),  # half or more: what more traffic costs a is not in its record
])
def test_only_while_the_best_route_is_light(in_flight: int, scored: bool) -> None:
    """a has the fewest misses; the others are cut only while it has more than half its
    slots free. How busy the others are does not matter."""
    book = _book({"a": 0, "b": 100, "c": 300})
    s = _scores(book, busy={"a": in_flight, "b": 64, "c": 64})
    assert (s["b"] < 1.0 and s["c"] < s["b"]) is scored
    if not scored:
        assert s == {"a": 1.0, "b": 1.0, "c": 1.0}


def test_on_by_default() -> None:
    book = _book({"a": 0, "b": 300, "c": 0})
    default = _scores(book, parse_config(base_config_dict(), "t.yaml"))
    assert default == _scores(book) and default["b"] < 1.0


def test_a_429_is_not_in_the_record_but_the_floor_counts_it() -> None:
    """A 429 is backpressure (sidecar.core.pushback), not the route's tail: the floor's
    ring counts it as a violation, the miss-ratio record leaves it out. (``a`` is its
    model's only route, so its quota's 429 holds nothing and it stays light.)"""
    from sidecar.core.router import Router
    from sidecar.core.types import Observation

    slice = _req().slice
    sole = base_config_dict(models=[{"name": "m", "candidates": ["a"]}])
    router = Router(parse_config(sole, "t.yaml"))
    router.observe(Observation("a", slice, "error", status=429, sent_load=0.0), 1.0)
    assert router.light.counts("a", slice, 1.0) == (1.0, 1.0)
    assert router.light.record("a", slice, 1.0) == (0.0, 0.0)
    router.observe(Observation("a", slice, "error", status=503, sent_load=0.0), 1.0)
    assert router.light.record("a", slice, 1.0) == (1.0, 1.0)


def test_a_route_the_health_machine_moved_keeps_its_ladder_weight() -> None:
    cfg = parse_config(_with(1.0), "t.yaml")
    model, k = cfg.model("m"), cfg.workload_class("interactive")
    assert model is not None and k is not None
    view = FakeView(ttft={"a": 0.2, "b": 0.2, "c": 0.2},
                    health_of={"b": HealthView("degraded", 0.3, False, False)})
    ctx = SelectionContext(cfg, model, k, _req(), view, 0.0,
                           light=_book({"a": 0, "b": 300, "c": 100}))
    result = run_pipeline(ctx, DEFAULT_FILTERS, DEFAULT_SCORERS, PICKERS["weighted_random"],
                          random.Random(0))
    assert result is not None
    scores = {c.name: c.scores.get("miss_ratio", 1.0) for c in result.candidates}
    assert scores["b"] == 1.0 and scores["c"] < 1.0


def test_misses_age_out_with_the_record() -> None:
    """Four half-lives later the 3 % route's misses and its clean outcomes weigh a
    sixteenth, and the prior pulls both toward the allowed share: nearer each other."""
    book = _book({"a": 0, "b": 300, "c": 0})
    now, later = _scores(book)["b"], _scores(book, now=4 * RECORD_HALF_LIFE_S)["b"]
    assert now < later < 1.0


def test_it_weighs_in_the_route_weight() -> None:
    """The route missing 1 % weighs far less beside the clean ones than without the
    score (a third as much before pooling, which then takes part of what it took)."""
    book = _book({"a": 0, "b": 100, "c": 0})
    on = _candidates(book)
    off = _candidates(book, parse_config(_with(0), "t.yaml"))
    assert on["b"].base / on["a"].base < off["b"].base / off["a"].base / 2.0


@given(st.integers(0, 150), st.integers(0, 150), st.integers(1, 99))  # at most 399 of 400
def test_bounded_best_is_one_and_more_misses_never_weigh_more(best: int, more: int,
                                                              step: int) -> None:
    """In (0, 1], 1 for the route with the fewest misses, and a route's score never
    rises as its own misses do."""
    low = _scores(_book({"a": best, "b": best + more, "c": best}, n=400))
    high = _scores(_book({"a": best, "b": best + more + step, "c": best}, n=400))
    assert low["a"] == high["a"] == 1.0
    assert 0.0 < high["b"] < low["b"] <= 1.0


@pytest.mark.parametrize("bad", [-0.5, 4.5, "steep"])
def test_config_errors_name_the_field(bad: object) -> None:
    with pytest.raises(ConfigError, match="miss_ratio_exponent"):
        parse_config(_with(bad), "t.yaml")


def test_the_router_keeps_records_only_while_a_class_reads_them() -> None:
    """The record is one exp per light outcome on the response path: kept only while
    some class has a miss-ratio exponent; a reload that turns it off drops them."""
    from sidecar.core.router import Router

    slice = _req().slice
    everyone_off = {k.name: {"miss_ratio_exponent": 0}
                    for k in parse_config(base_config_dict(), "t.yaml").classes}
    off = Router(parse_config(base_config_dict(classes=everyone_off), "t.yaml"))
    off.light.note("a", slice, True, 0.0)
    assert off.light.record("a", slice, 0.0) == (0.0, 0.0)
    assert off.light.counts("a", slice, 0.0) == (1.0, 1.0)  # the floor's ring is kept
    on = Router(parse_config(_with(1.0), "t.yaml"))
    on.light.note("a", slice, True, 0.0)
    assert on.light.record("a", slice, 0.0) == (1.0, 1.0)
    on.reload(parse_config(base_config_dict(classes=everyone_off), "t.yaml"))
    assert on.light.record("a", slice, 0.0) == (0.0, 0.0)
