"""The lab's native and hybrid policies: window weights drawn like Envoy draws them."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from test_sim_fixtures import finished, make_attempt, tiny_scenario

from sidecar.core.types import Decision
from sidecar.sim.engine import Simulation
from sidecar.sim.policies import DEFAULT_POLICIES, PolicyContext
from sidecar.sim.policies.tailroute_native import TailrouteHybrid, TailrouteNative


def _picks(policy: TailrouteNative, now: float, n: int = 400) -> Counter[str]:
    sc = tiny_scenario()
    rng = random.Random(5)
    out: Counter[str] = Counter()
    for _ in range(n):
        d = policy.choose(make_attempt(sc), now, rng)
        assert isinstance(d, Decision) and d.admission == "admit"
        out[d.cluster] += 1
    return out


def test_native_weights_change_only_at_publication() -> None:
    sc = tiny_scenario()
    pol = TailrouteNative(PolicyContext(sc.config, {}))
    cold = _picks(pol, 0.1)
    assert set(cold) == {"a", "b", "c"}  # rendered equal split before any evidence
    for i in range(40):
        for c, ttft in (("a", 0.1), ("b", 0.1), ("c", 3.0)):
            pol.on_result(finished(sc, c, ttft=ttft, at=i * 0.1), i * 0.1)
    # Evidence alone moves nothing until the next publication (a window boundary).
    assert _picks(pol, 4.0)["c"] > 60
    for t in (10.0, 11.0):
        pol.tick(t)
    after = _picks(pol, 11.0)
    assert after["c"] < after["a"] / 4


def test_native_draws_respect_the_class_timeout_and_never_queue() -> None:
    """An unstreamed answer's slice route times it out at the class timeout; a stream's
    has no whole-answer timeout (the engine bounds its first byte by the class's)."""
    sc = tiny_scenario()
    pol = TailrouteNative(PolicyContext(sc.config, {}))
    d = pol.choose(make_attempt(sc, klass="batch", stream=False), 0.0, random.Random(1))
    assert isinstance(d, Decision) and d.timeout_ms == 60000 and d.admission == "admit"
    d = pol.choose(make_attempt(sc, klass="batch"), 0.0, random.Random(1))
    assert isinstance(d, Decision) and d.timeout_ms is None and d.admission == "admit"


def test_hybrid_decides_per_request_for_deadlines_only() -> None:
    sc = tiny_scenario()
    pol = TailrouteHybrid(PolicyContext(sc.config, {}))
    plain = make_attempt(sc)
    pol.choose(plain, 0.0, random.Random(1))
    assert pol.router.counters[("decision", "no_data")] == 0
    with_deadline = make_attempt(sc)
    with_deadline.call.deadline = 5.0
    pol.choose(with_deadline, 0.0, random.Random(1))
    assert sum(n for (k, _), n in pol.router.counters.items() if k == "decision") == 1


def test_native_runs_a_scenario_and_is_not_in_the_default_set() -> None:
    assert "tailroute_native" not in DEFAULT_POLICIES
    out = Simulation(tiny_scenario(duration_s=30), "tailroute_native").run()
    assert out["classes"]["interactive"]["scored"] > 0


def test_native_publishes_an_ejection_at_once_not_at_the_next_interval() -> None:
    sc = tiny_scenario()
    pol = TailrouteNative(PolicyContext(sc.config, {}))
    before = pol.publications
    slice = make_attempt(sc).call.slice
    for i in range(20):  # a run of hard failures, long enough for b's failure rate
        pol.on_result(finished(sc, "b", ttft=0.05, outcome="error", status=503, at=0.2),
                      0.2 + i * 0.001)
        if pol.router.health("b", slice).quarantined:
            break
    assert pol.router.health("b", slice).quarantined
    assert pol.publications > before  # no tick in between
    assert all(sw.weight("b") == 0 for sw in pol.weights.values()
               if "b" in dict(sw.weights) and not sw.panic)


@pytest.mark.parametrize(("retry_after", "hold_s"), [
    (0.5, 0.5),   # a declared wait
    (None, 1.0),  # a quota's 429 (nothing in flight): push-back's first backoff
])
def test_native_publishes_a_hold_at_once_and_its_end_at_the_deadline(
    retry_after: float | None, hold_s: float,
) -> None:
    """As the sidecar's publisher (sidecar.shell.native): a 429 that starts a hold
    wakes it, so the held route's weight is 0 without waiting for the interval, and
    the loop's wake-up at the router's next deadline (the hold's end) gives it back."""
    sc = tiny_scenario()
    pol = TailrouteNative(PolicyContext(sc.config, {}))
    refused = finished(sc, "b", ttft=0.01, outcome="error", status=429, at=0.2)
    refused.retry_after = retry_after
    before = pol.publications
    pol.on_result(refused, 0.21)
    assert pol.publications == before + 1  # no tick in between
    assert all(sw.weight("b") == 0 for sw in pol.weights.values() if "b" in dict(sw.weights))
    deadline = pol.router.pushback.next_release  # the hold's end: the loop wakes then
    assert deadline == pytest.approx(0.21 + hold_s)
    pol.tick(deadline)
    assert pol.publications == before + 2
    assert all(sw.weight("b") > 0 for sw in pol.weights.values() if "b" in dict(sw.weights))
