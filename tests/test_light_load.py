"""Outcomes under light load (sidecar.core.light_load) and the floor share they give."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from sidecar.core.config import Config, parse_config
from sidecar.core.health import HealthState, RouteHealth
from sidecar.core.light_load import (
    FLOOR_PRICE,
    HALF_LIFE_S,
    MAX_ROUTES,
    PROBE_PRICE_MIN,
    RING,
    LightOutcomes,
    floor_share,
    load_of,
    violation_share,
)
from sidecar.core.router import Router
from sidecar.core.types import Observation, RequestInfo, SliceKey

SL = SliceKey("m", "interactive", "short", True)
LIMIT = 8


def _config(**extra: Any) -> Config:
    return parse_config({
        "default_cluster": "a",
        "clusters": [{"name": n, "address": f"127.0.0.1:{9001 + i}", "models": ["m"],
                      "max_concurrency": LIMIT} for i, n in enumerate("abc")],
        "models": [{"name": "m", "candidates": ["a", "b", "c"]}],
        "classes": {"interactive": {"slo": {"metric": "ttft", "percentile": 95,
                                            "budget_ms": 500}}},
        "stats": {"min_samples": 5},
        **extra,
    }, "light.yaml")


def _ok(cluster: str, ttft: float, load: float | None) -> Observation:
    return Observation(cluster, SL, "ok", ttft_s=ttft, tpot_s=0.02, e2e_s=ttft + 1.0,
                       output_tokens=50, sent_load=load)


# ---------------------------------------------------------------- the book


def test_the_ring_keeps_only_the_latest_outcomes() -> None:
    book = LightOutcomes()
    for i in range(RING + 5):
        book.note("a", SL, i < 5, 0.0)  # the five violations are the oldest
    assert book.counts("a", SL, 0.0) == (0.0, float(RING))


def test_the_book_holds_every_route_the_config_allows() -> None:
    """A config with more routes than MAX_ROUTES (4 clusters x 2,000 slices) keeps all
    of them: the book once started over at 4,096 pairs, again and again, and the floor
    and the miss-ratio score lost their evidence."""
    router = Router(_config(stats={"min_samples": 5, "max_slices": 2000}))
    assert router.light.max_routes >= 3 * 2000 > MAX_ROUTES
    slices = [SliceKey(f"m{i}", "interactive", "short", True) for i in range(2000)]
    for s in slices:
        for cluster in "abc":
            router.light.note(cluster, s, False, 0.0)
    assert all(router.light.counts(c, s, 0.0) == (0.0, 1.0) for c in "abc" for s in slices)
    assert Router(_config()).light.max_routes == MAX_ROUTES  # small configs: as before


def test_weights_halve_every_half_life_and_unknown_routes_count_nothing() -> None:
    book = LightOutcomes()
    book.note("a", SL, True, 10.0)
    x, n = book.counts("a", SL, 10.0 + HALF_LIFE_S)
    assert x == pytest.approx(0.5) and n == pytest.approx(0.5)
    assert book.counts("b", SL, 10.0) == (0.0, 0.0)
    assert book.counts("a", SliceKey("m", "batch", "short", True), 10.0) == (0.0, 0.0)


@pytest.mark.parametrize(("x", "n", "best", "want"), [
    (0.0, 0.0, 0.0, 0.375),  # outcomes aged away: the prior, beside a clean route
    (1.0, 10.0, 0.0, 0.1875),  # one miss in ten beside a clean route
    (7.0, 10.0, 0.0, 0.0268),  # seven in ten: about a fortieth
    (10.0, 10.0, 0.0, 0.0188),
    (1.0, 10.0, 1.0, 1.0),  # the best route itself: the whole floor
])
def test_floor_share_table(x: float, n: float, best: float, want: float) -> None:
    a = 0.05
    clean = violation_share(best, 10.0 if best == 0.0 else best, a)
    v = violation_share(x, n, a)
    assert floor_share(v, min(v, clean), a) == pytest.approx(want, abs=0.005)


_counts = st.tuples(st.floats(0.0, 10.0), st.floats(0.0, 10.0)).map(
    lambda t: (min(t), max(t)))  # x <= n
_allowed = st.sampled_from([0.01, 0.05, 0.05 / 8, 0.1])


@given(_counts, _counts, _allowed)
def test_floor_share_is_bounded_and_whole_for_the_best(
        mine: tuple[float, float], other: tuple[float, float], a: float) -> None:
    v, w = violation_share(*mine, a), violation_share(*other, a)
    best = min(v, w)
    f = floor_share(v, best, a)
    assert 0.0 < f <= 1.0
    assert floor_share(best, best, a) == 1.0
    # what the floor costs is bounded by FLOOR_PRICE x a
    assert f * (v - best) <= FLOOR_PRICE * a * (1 + 1e-9)


@given(_counts, st.floats(0.01, 5.0), _allowed)
def test_floor_share_is_monotone_in_evidence(
        mine: tuple[float, float], more: float, a: float) -> None:
    """More violations never raise a route's share; more successes never lower it."""
    x, n = mine
    best = violation_share(0.0, 10.0, a)  # a clean neighbour
    f = floor_share(violation_share(x, n, a), best, a)
    assert floor_share(violation_share(x + more, n + more, a), best, a) <= f + 1e-12
    assert floor_share(violation_share(x, n + more, a), best, a) >= f - 1e-12


def test_load_of() -> None:
    assert load_of(3, 8) == 0.375
    assert load_of(0, 0) == 0.0  # an unset limit never divides by zero


# ---------------------------------------------------------------- through the router


@pytest.mark.parametrize(("sent", "at_finish", "counted"), [
    (0.0, 0, True),  # light both ways: the route's own outcome
    (0.6, 0, False),  # sent into a queue
    (0.0, LIMIT // 2, False),  # finished while half the limit is in flight
    (None, 0, False),  # no send-time load (native mode): not counted
])
def test_router_counts_only_light_load_outcomes(
        sent: float | None, at_finish: int, counted: bool) -> None:
    router = Router(_config())
    for _ in range(at_finish):
        router.started("c")
    router.observe(_ok("c", 2.0, sent), 1.0)  # over the 500 ms budget
    x, n = router.light.counts("c", SL, 1.0)
    assert (x, n) == ((1.0, 1.0) if counted else (0.0, 0.0))


def test_a_probe_within_budget_is_no_violation_and_a_cancel_is_not_counted() -> None:
    router = Router(_config())
    router.observe(_ok("a", 0.1, 0.0), 1.0)
    router.observe(Observation("a", SL, "cancel", ttft_s=0.05, e2e_s=0.05, censored=True,
                               sent_load=0.0), 1.0)
    assert router.light.counts("a", SL, 1.0) == (0.0, 1.0)


def _run(with_load: bool, seed: int = 3, n: int = 3000) -> Counter[str]:
    """Requests at 10 req/s, each answered 0.2 s later: route c is slow by itself
    (every answer over budget) under light load; returns the picks after warm-up."""
    router = Router(_config())
    rng, service = random.Random(seed), random.Random(seed + 1)
    picks: Counter[str] = Counter()
    pending: list[tuple[float, str, float]] = []
    now = 0.0
    for i in range(n):
        now += 0.1
        while pending and pending[0][0] <= now:
            _, cluster, load = pending.pop(0)
            router.finished(cluster)
            ttft = (2.0 if cluster == "c" else 0.1) * service.lognormvariate(0.0, 0.2)
            router.observe(_ok(cluster, ttft, load if with_load else None), now)
        if (t := router.next_deadline()) is not None and t <= now:
            router.tick(now)
        req = RequestInfo("chat", "m", True, 200, 50, "interactive", 10, None, SL,
                          request_id=f"r{i}")
        d = router.decide(req, now, rng)
        if d.admission != "admit":
            continue
        if i >= n // 2:
            picks[d.cluster] += 1
        pending.append((now + 0.2, d.cluster, router.started(d.cluster)))
    return picks


def test_a_route_slow_by_itself_loses_most_of_its_exploration_floor() -> None:
    """Same traffic and draws: with send-time loads the slow route's share of the
    second half shrinks well below what the whole floor gives it."""
    whole, cut = _run(False), _run(True)
    share: dict[str, Any] = {k: p["c"] / sum(p.values()) for k, p in
                             (("whole", whole), ("cut", cut))}
    assert share["cut"] < share["whole"] / 2, share


# ---------------------------------------------------------------- where it applies


def _plan_floor(config: Config, state: str | None = None) -> dict[str, float]:
    """Floor shares in a plan after route c missed its budget on ten light-load requests
    (``state``: c's health state as selection sees it, forced for the test)."""
    router = Router(config)
    for i in range(10):
        router.observe(_ok("c", 2.0, 0.0), 1.0 + i * 0.01)
        router.observe(_ok("a", 0.1, 0.0), 1.0 + i * 0.01)
    if state is not None:
        real = router.health

        def health(cluster: str, slice: SliceKey) -> Any:
            h = real(cluster, slice)
            return type(h)(state, h.weight, False, False) if cluster == "c" else h
        router.health = health  # type: ignore[method-assign]
    router.decide(RequestInfo("chat", "m", True, 200, 50, "interactive", 10, None, SL,
                              request_id="r"), 2.0, random.Random(0))
    cached = next(iter(router.plans.entries.values()))
    return {c.name: c.scores.get("floor", 1.0) for c in cached.plan.candidates}


@pytest.mark.parametrize(("state", "cut"), [
    (None, True), ("healthy", True), ("watching", True),
    ("degraded", False), ("restoring", False),  # moved: the health machine's traffic
])
def test_only_routes_health_has_not_moved_lose_part_of_the_floor(
        state: str | None, cut: bool) -> None:
    shares = _plan_floor(_config(), state)
    assert shares["a"] == shares["b"] == 1.0
    assert (shares["c"] < 0.2) is cut and (shares["c"] == 1.0) is not cut


def test_fleet_mode_keeps_the_whole_floor() -> None:
    config = _config(fleet={"url": "redis://127.0.0.1:1/0"})  # never connected: core only
    assert _plan_floor(config) == {"a": 1.0, "b": 1.0, "c": 1.0}


# ---------------------------------------------------------------- probes of restricted routes


def _probe_shares(state: HealthState, misses: int, hits: int = 0) -> dict[str, float]:
    """The plan's probe shares after route c (held in ``state``) missed its budget on
    ``misses`` light-load requests and met it on ``hits``, route a meeting it on ten."""
    router = Router(_config())
    for i in range(10):
        router.observe(_ok("a", 0.1, 0.0), 1.0 + i * 0.01)
    for i in range(misses + hits):
        router.observe(_ok("c", 2.0 if i < misses else 0.1, 0.0), 1.2 + i * 0.01)
    h = RouteHealth("c", SL, router.config.health, router.config.stats, 1.5)
    h.state = state
    router.board._routes[("c", SL)] = h
    router.board.version += 1
    router.decide(RequestInfo("chat", "m", True, 200, 50, "interactive", 10, None, SL,
                              request_id="r"), 2.0, random.Random(0))
    cached = next(iter(router.plans.entries.values()))
    return {p.cluster: p.share for p in cached.probes}


@pytest.mark.parametrize(("state", "misses", "hits", "priced"), [
    (HealthState.RESTRICTED, 10, 0, True),  # slow by itself: probes cost what the floor may
    (HealthState.RESTRICTED, 3, 7, True),  # still over the best by more than the price
    (HealthState.RESTRICTED, 0, 10, False),  # its probes meet the budget: the whole share
    (HealthState.RESTRICTED, 0, 0, False),  # no light evidence: the whole share
    (HealthState.PROBING, 10, 0, False),  # an open circuit's probes end its cooldown
])
def test_a_restricted_route_s_probes_are_priced_like_the_floor(
        state: HealthState, misses: int, hits: int, priced: bool) -> None:
    whole = _config().health.probe_share
    share = _probe_shares(state, misses, hits)["c"]
    assert PROBE_PRICE_MIN * whole <= share <= whole  # never starved of its way back
    assert (share < whole / 2) is priced, share


@given(st.integers(0, RING - 1), st.integers(0, RING - 1))
def test_a_probe_share_never_grows_with_one_more_miss(misses: int, hits: int) -> None:
    """Monotone in evidence: one more light-load miss (all kept by the ring) never
    raises a restricted route's probe share, and the share stays within
    [PROBE_PRICE_MIN, 1] x probe_share."""
    assume(misses + hits < RING)
    more, fewer = (_probe_shares(HealthState.RESTRICTED, m, hits)["c"]
                   for m in (misses + 1, misses))
    whole = _config().health.probe_share
    assert PROBE_PRICE_MIN * whole <= more <= fewer <= whole
