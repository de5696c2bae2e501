"""The request lane (sidecar.core.request_lane) decides exactly as the full per-request stage."""

from __future__ import annotations

import functools
import random
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sidecar.core import request_lane
from sidecar.core.config import Config, parse_config
from sidecar.core.pipeline import run_request
from sidecar.core.request_lane import LanePick, RequestLane
from sidecar.core.router import Router
from sidecar.core.types import Decision, Observation, RequestInfo, SliceKey

SL = SliceKey("m", "interactive", "short", True)
LIMIT = 4  # max_concurrency of every cluster: small, so full clusters are common


def _config(**health: Any) -> Config:
    return parse_config({
        "default_cluster": "a",
        "clusters": [{"name": n, "address": f"127.0.0.1:{9001 + i}", "models": ["m"],
                      "max_concurrency": LIMIT} for i, n in enumerate("abc")],
        "models": [{"name": "m", "candidates": ["a", "b", "c"]}],
        "stats": {"min_samples": 5},
        **({"health": health} if health else {}),
    }, "lane.yaml")


def _request(i: int, **kw: Any) -> RequestInfo:
    return RequestInfo("chat", "m", True, 200, 300, "interactive", 10, None, SL,
                       request_id=f"r{i}", **kw)


def _observation(cluster: str, rng: random.Random, slow: dict[str, float]) -> Observation:
    if rng.random() < 0.05:
        return Observation(cluster, SL, "error", status=503)
    ttft = slow.get(cluster, 0.3) * rng.lognormvariate(0.0, 0.4)
    return Observation(cluster, SL, "ok", ttft_s=ttft, tpot_s=0.02, e2e_s=ttft + 2.0,
                       output_tokens=100)


def _drive(router: Router, seed: int, n: int, slow: dict[str, float]) -> list[Decision]:
    """``n`` requests at 20 req/s, each observed 0.6 s later (so in-flight counts vary)."""
    rng = random.Random(seed)
    traffic = random.Random(seed + 1)
    out: list[Decision] = []
    pending: list[tuple[float, str]] = []
    now = 0.0
    for i in range(n):
        now += 0.05
        while pending and pending[0][0] <= now:
            _, cluster = pending.pop(0)
            router.finished(cluster)
            router.observe(_observation(cluster, traffic, slow), now)
        if (t := router.next_deadline()) is not None and t <= now:
            router.tick(now)
        d = router.decide(_request(i), now, rng)
        out.append(d)
        if d.admission == "admit":
            router.started(d.cluster)
            pending.append((now + 0.6, d.cluster))
    return out


@pytest.mark.parametrize("slow", [{}, {"b": 0.9}, {"a": 0.05, "c": 3.0}])
def test_router_decides_the_same_with_and_without_the_lane(
    slow: dict[str, float], monkeypatch: pytest.MonkeyPatch
) -> None:
    with_lane = Router(_config())
    got = _drive(with_lane, 7, 800, slow)
    monkeypatch.setattr(request_lane.RequestLane, "of", classmethod(lambda *a: None))
    without = Router(_config())
    want = _drive(without, 7, 800, slow)
    assert got == want
    assert with_lane.counters == without.counters
    assert with_lane.decisions == without.decisions
    assert [rd.explain() for rd in with_lane.recent] == [rd.explain() for rd in without.recent]


def _warm_router(seed: int) -> Router:
    router = Router(_config())
    _drive(router, seed, 400, {"b": 0.6})
    return router


@functools.cache
def _warm_plan(seed: int) -> tuple[Router, Any]:
    """A warmed router and its one cached plan (read-only for the tests below)."""
    router = _warm_router(seed)
    router.decide(_request(10_000), 20.0, random.Random(0))
    return router, next(iter(router._plans.values()))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 3),
       counts=st.lists(st.integers(0, LIMIT), min_size=3, max_size=3),
       draw_seed=st.integers(0, 2**32 - 1))
def test_a_pick_is_the_full_stage_bit_for_bit(seed: int, counts: list[int], draw_seed: int) -> None:
    router, cached = _warm_plan(seed)
    lane = cached.lane
    assume(lane is not None)  # e.g. b restricted for the class: no lane (tested below)
    inflight = dict(zip("abc", counts, strict=True))
    rng_lane, rng_full = random.Random(draw_seed), random.Random(draw_seed)
    pick = lane.pick(inflight.__getitem__, rng_lane)
    router._inflight.clear()
    router._inflight.update(inflight)
    full = run_request(cached.plan, cached.ctx, router._picker, rng_full)
    assert full is not None
    if pick is None:  # some candidate full: the full stage runs (capacity or panic)
        assert any(n >= LIMIT for n in counts)
        assert rng_lane.getstate() == random.Random(draw_seed).getstate()  # nothing drawn
        return
    assert rng_lane.getstate() == rng_full.getstate()
    rebuilt = pick.result()
    assert rebuilt.chosen.name == full.chosen.name == pick.name
    assert [(c.name, c.weight, c.scores, c.dropped) for c in rebuilt.candidates] == \
        [(c.name, c.weight, c.scores, c.dropped) for c in full.candidates]
    assert rebuilt.panic is full.panic


def test_no_lane_when_the_class_restriction_acts() -> None:
    """A route restricted for a latency-sensitive class goes through the full stage
    (the herding guard reads every alternative's room)."""
    router = _warm_router(1)
    router.decide(_request(10_000), 20.0, random.Random(0))
    cached = next(iter(router._plans.values()))
    assert cached.lane is not None
    c = cached.plan.candidates[1]
    c.health = type(c.health)("restricted", 0.5, True, False)
    assert RequestLane.of(cached.plan, cached.ctx, router._picker) is None


def test_explain_and_deadline_requests_take_the_full_stage() -> None:
    router = _warm_router(2)
    now = 20.0
    d = router.decide(_request(20_000, explain=True), now, random.Random(3))
    assert d.explain is not None  # built from a real pipeline result
    router.decide(_request(20_001, deadline_ms=800.0), now, random.Random(3))
    assert not isinstance(router.recent[-2].result, LanePick)
    # A deadline request still picks in the lane; admission rebuilds the result it needs.
    assert router.recent[-1].explain() is not None
