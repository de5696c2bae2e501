"""The request lane (sidecar.core.request_lane) decides exactly as the full per-request stage."""

from __future__ import annotations

import copy
import functools
import random
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core import request_lane
from sidecar.core.config import Config, parse_config
from sidecar.core.pipeline import run_request
from sidecar.core.request_lane import LanePick, RequestLane
from sidecar.core.router import Router
from sidecar.core.types import Decision, Observation, RequestInfo, SliceKey

SL = SliceKey("m", "interactive", "short", True)
LIMIT = 4  # max_concurrency of every cluster: small, so full clusters are common


def _config(limit: int = LIMIT, queue: float | None = None, **health: Any) -> Config:
    """``queue``: the interactive class's ``weights.queue`` (None: the default)."""
    classes = {} if queue is None else {"classes": {"interactive": {"weights": {"queue": queue}}}}
    return parse_config({
        "default_cluster": "a",
        "clusters": [{"name": n, "address": f"127.0.0.1:{9001 + i}", "models": ["m"],
                      "max_concurrency": limit} for i, n in enumerate("abc")],
        "models": [{"name": "m", "candidates": ["a", "b", "c"]}],
        "stats": {"min_samples": 5},
        **({"health": health} if health else {}),
        **classes,
    }, "lane.yaml")


def _request(i: int, **kw: Any) -> RequestInfo:
    return RequestInfo("chat", "m", True, 200, 300, "interactive", 10, None, SL,
                       request_id=f"r{i}", **kw)


def _observation(cluster: str, rng: random.Random, slow: dict[str, float],
                 errors: float = 0.05) -> Observation:
    if rng.random() < errors:
        return Observation(cluster, SL, "error", status=503)
    ttft = slow.get(cluster, 0.3) * rng.lognormvariate(0.0, 0.4)
    return Observation(cluster, SL, "ok", ttft_s=ttft, tpot_s=0.02, e2e_s=ttft + 2.0,
                       output_tokens=100)


def _drive(router: Router, seed: int, n: int, slow: dict[str, float],
           errors: float = 0.05) -> list[Decision]:
    """``n`` requests at 20 req/s, each observed 0.6 s later (so in-flight counts vary)."""
    rng = random.Random(seed)
    traffic = random.Random(seed + 1)
    out: list[Decision] = []
    pending: list[tuple[float, str, float]] = []
    now = 0.0
    for i in range(n):
        now += 0.05
        while pending and pending[0][0] <= now:
            _, cluster, load = pending.pop(0)
            router.finished(cluster)
            # With the load when sent: light-load outcomes cut the slow routes' floor.
            obs = replace(_observation(cluster, traffic, slow, errors), sent_load=load)
            router.observe(obs, now)
        if (t := router.next_deadline()) is not None and t <= now:
            router.tick(now)
        d = router.decide(_request(i), now, rng)
        out.append(d)
        if d.admission == "admit":
            pending.append((now + 0.6, d.cluster, router.started(d.cluster)))
    return out


@pytest.mark.parametrize("queue", [None, 0.0, 6.0])
@pytest.mark.parametrize("slow", [{}, {"b": 0.9}, {"a": 0.05, "c": 3.0}])
@pytest.mark.parametrize("limit", [LIMIT, 32])  # 32: light load, so floor shares apply
def test_router_decides_the_same_with_and_without_the_lane(
    slow: dict[str, float], queue: float | None, limit: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with_lane = Router(_config(limit, queue=queue))
    got = _drive(with_lane, 7, 800, slow)
    monkeypatch.setattr(request_lane.RequestLane, "of", classmethod(lambda *a: None))
    without = Router(_config(limit, queue=queue))
    want = _drive(without, 7, 800, slow)
    assert got == want
    assert with_lane.counters == without.counters
    assert with_lane.decisions == without.decisions
    assert [rd.explain() for rd in with_lane.recent] == [rd.explain() for rd in without.recent]


def _warm_router(seed: int, limit: int = LIMIT, errors: float = 0.05,
                 queue: float | None = None) -> Router:
    router = Router(_config(limit, queue))
    _drive(router, seed, 400, {"b": 0.6}, errors)
    return router


@functools.cache
def _warm_plan(seed: int, limit: int, restrict: bool,
               queue: float | None = None) -> tuple[Router, Any, RequestLane]:
    """A warmed router, its one cached plan and the plan's lane (read-only below);
    ``restrict``: candidate b restricted for the class (the herding guard runs)."""
    router = _warm_router(seed, limit, queue=queue)
    router.decide(_request(10_000), 20.0, random.Random(0))
    cached = next(iter(router.plans.entries.values()))
    if restrict:
        cached = copy.copy(cached)
        cands = tuple(copy.copy(c) for c in cached.plan.candidates)
        b = cands[1]
        b.health = type(b.health)("restricted", 0.5, True, False)
        cached.plan = replace(cached.plan, candidates=cands,
                              eligible=tuple(c for c in cands if c.dropped is None
                                             or c.soft_drop))
    lane = RequestLane.of(cached.plan, cached.ctx, router._picker)
    assert lane is not None
    return router, cached, lane


@settings(max_examples=120, deadline=None)
@given(seed=st.integers(0, 3), limit=st.sampled_from([4, 10]), restrict=st.booleans(),
       counts=st.lists(st.integers(0, 10), min_size=3, max_size=3),
       draw_seed=st.integers(0, 2**32 - 1), queue=st.sampled_from([None, 0.0, 6.0]))
def test_a_pick_is_the_full_stage_bit_for_bit(
    seed: int, limit: int, restrict: bool, counts: list[int], draw_seed: int,
    queue: float | None,
) -> None:
    router, cached, lane = _warm_plan(seed, limit, restrict, queue)
    inflight = dict(zip("abc", [min(n, limit) for n in counts], strict=True))
    rng_lane, rng_full = random.Random(draw_seed), random.Random(draw_seed)
    pick = lane.pick(inflight.__getitem__, rng_lane)
    router._inflight.clear()
    router._inflight.update(inflight)
    full = run_request(cached.plan, cached.ctx, router._picker, rng_full)
    if pick is None:  # a kept candidate full, or none kept: the full stage runs
        assert full is None or full.panic or any(
            c.dropped == "capacity" for c in full.candidates)
        assert rng_lane.getstate() == random.Random(draw_seed).getstate()  # nothing drawn
        return
    assert full is not None and not full.panic
    assert rng_lane.getstate() == rng_full.getstate()
    rebuilt = pick.result()
    assert rebuilt.chosen.name == full.chosen.name == pick.name
    assert [(c.name, c.weight, c.scores, c.dropped, c.verdicts, c.health)
            for c in rebuilt.candidates] == \
        [(c.name, c.weight, c.scores, c.dropped, c.verdicts, c.health)
         for c in full.candidates]


def test_the_herding_guard_runs_in_the_lane() -> None:
    """A route restricted for a latency-sensitive class is dropped while the
    alternatives have room and kept at the degraded weight when they have not,
    in the lane exactly as in the full stage."""
    router = _warm_router(1, limit=100, errors=0.0)
    router.decide(_request(10_000), 20.0, random.Random(0))
    cached = next(iter(router.plans.entries.values()))
    c = cached.plan.candidates[1]
    c.health = type(c.health)("restricted", 0.5, True, False)
    lane = RequestLane.of(cached.plan, cached.ctx, router._picker)
    assert lane is not None and lane.rows[1].guard is not None
    # alternatives a and c: 200 slots; 50 % free -> dropped; 20 % free -> kept
    for counts in ({"a": 50, "b": 0, "c": 50}, {"a": 80, "b": 0, "c": 80}):
        pick = lane.pick(counts.__getitem__, random.Random(5))
        assert pick is not None
        full = pick.result()
        by_name = {x.name: x for x in full.candidates}
        if counts["a"] == 50:
            assert 1 not in pick.kept and by_name["b"].dropped == "class_restriction"
        else:
            assert 1 in pick.kept and by_name["b"].verdicts["herding_guard"].startswith("kept")
        router._inflight.clear()
        router._inflight.update(counts)
        want = run_request(cached.plan, replace(cached.ctx, healths=None), router._picker,
                           random.Random(5))
        assert want is not None and want.chosen.name == full.chosen.name


def test_explain_and_deadline_requests_take_the_full_stage() -> None:
    router = _warm_router(2, errors=0.0)  # no open run of failures: no trial pre-empts
    now = 20.0
    d = router.decide(_request(20_000, explain=True), now, random.Random(3))
    assert d.explain is not None  # built from a real pipeline result
    router.decide(_request(20_001, deadline_ms=800.0), now, random.Random(3))
    assert not isinstance(router.recent[-2].result, LanePick)
    # A deadline request still picks in the lane; admission rebuilds the result it needs.
    assert router.recent[-1].explain() is not None
