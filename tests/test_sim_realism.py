"""Scenario realism: ramps, tail-only changes, status mixes, heavy-tailed distributions."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sim_engine import Driver
from test_sim_fixtures import tiny
from test_sim_scenarios import _error

from sidecar.sim.dists import Lognormal, Stream
from sidecar.sim.engine import run_once
from sidecar.sim.heavy import HeavyTailed, ParetoTail
from sidecar.sim.loader import parse_scenario
from sidecar.sim.provider import Provider
from sidecar.sim.scenario import EventSpec, Poisson
from sidecar.sim.traffic import arrivals

# ---------------------------------------------------------------- ramps


@pytest.mark.parametrize(
    ("t", "level"),
    [(9.0, 0.0), (10.0, 0.0), (15.0, 0.5), (20.0, 1.0), (35.0, 1.0), (45.0, 0.5),
     (50.0, 0.0), (70.0, 0.0), (75.0, 0.5), (95.0, 1.0), (105.0, 0.5), (130.0, 0.0)],
)
def test_ramp_level_rises_holds_and_fades_in_every_window(t: float, level: float) -> None:
    ev = EventSpec("a", at=10.0, duration=40.0, every=60.0, count=2, ttft_factor=3.0,
                   ramp_in=10.0, ramp_out=10.0)
    assert ev.level(t) == pytest.approx(level)


def _provider(events: list[EventSpec], **spec: Any) -> Provider:
    d = Driver(**spec)
    return Provider(d.sc.providers["a"], events, Stream("p"), d.push, d.end)


def test_a_ramped_factor_is_linear_in_time() -> None:
    d = Driver()
    ev = EventSpec("a", at=0.0, duration=None, ttft_factor=5.0, ramp_in=100.0)
    prov = Provider(d.sc.providers["a"], [ev], Stream("p"), d.push, d.end)
    att = d.send()
    for t, f in ((0.0, 1.0), (25.0, 2.0), (50.0, 3.0), (100.0, 5.0), (500.0, 5.0)):
        assert prov.effects(att, t)[0] == pytest.approx(f)


def test_a_ramped_tail_moves_p99_while_the_median_stays() -> None:
    d = Driver()
    ev = EventSpec("a", at=0.0, duration=None, tail_rate=0.1, tail_ttft_factor=8.0,
                   ramp_in=100.0)
    prov = Provider(d.sc.providers["a"], [ev], Stream("p"), d.push, d.end)
    att = d.send()

    def factors(t: float) -> np.ndarray:
        return np.array([prov.effects(att, t, u)[0]
                         for u in np.linspace(0, 1, 2000, endpoint=False)])

    early, late = factors(10.0), factors(100.0)
    assert np.median(early) == np.median(late) == 1.0
    assert np.percentile(early, 99) < 2.0 < 7.9 < np.percentile(late, 99)


# ---------------------------------------------------------------- status mixes


def test_fast_and_slow_errors_come_with_their_own_status_and_delay() -> None:
    data = tiny()
    data["providers"]["a"]["errors"] = [
        {"rate": 0.3, "status": 503, "after_ms": 20},
        {"rate": 0.1, "status": 504, "after_ms": {"median": 5000, "p99": 6000}},
    ]
    data["providers"]["a"]["contention"] = 0.0
    sc = parse_scenario(data, "t.yaml")
    d = Driver()
    prov = Provider(sc.providers["a"], [], Stream("e"), d.push, d.end)
    d.prov = prov
    atts = [d.send(at=i * 1.0, deadline=i * 1.0 + 30.0) for i in range(3000)]
    d.run()
    fast = [a for a in atts if a.status == 503]
    slow = [a for a in atts if a.status == 504]
    assert abs(len(fast) / 3000 - 0.3) < 0.03 and abs(len(slow) / 3000 - 0.1) < 0.02
    assert all(a.outcome == "error" for a in fast + slow)
    assert all(a.end_at is not None and a.end_at - a.sent_at == pytest.approx(0.02)
               for a in fast)
    waits = sorted((a.end_at or 0) - a.sent_at for a in slow)
    assert 4.5 < waits[len(waits) // 2] < 5.5


def test_an_event_status_mix_follows_its_ramp() -> None:
    data = tiny(events=[{"provider": "a", "at_s": 0, "ramp_s": 60,
                         "errors": [{"rate": 0.6, "status": 429, "after_ms": 5}]}])
    data["workloads"][0]["arrival"]["rate_per_s"] = 20
    sc = parse_scenario(data, "t.yaml")
    out = run_once(sc, "round_robin")
    errors = out["classes"]["interactive"]["outcomes"]["error"]
    # a third of the traffic reaches a; its error share averages 0.6 * ~0.5 over the ramp
    calls = out["calls"]
    assert 0.06 * calls < errors < 0.14 * calls


# ---------------------------------------------------------------- heavy tails


def test_mixture_quantiles_and_samples_agree() -> None:
    mix = HeavyTailed(((0.95, Lognormal(0.3, 0.7)), (0.05, Lognormal(1.5, 4.0))))
    s = Stream("mix")
    xs = np.array([mix.value(s.gauss(), s.random()) for _ in range(40000)])
    assert np.median(xs) == pytest.approx(mix.median, rel=0.03)
    assert np.percentile(xs, 99) == pytest.approx(mix.p99, rel=0.08)
    assert mix.p99 > Lognormal(0.3, 0.7).p99 * 2  # the slow path owns the tail


def test_pareto_tail_is_a_power_law_beyond_its_start() -> None:
    tail = ParetoTail(0.04, 1.5, 2.0, 1e6)
    d = HeavyTailed(((1.0, Lognormal(0.3, 0.8)),), tail)
    s = Stream("par")
    xs = np.array([d.value(s.gauss(), s.random()) for _ in range(100000)])
    for x in (4.0, 16.0):  # P(X > x) = w (x_m / x)^alpha beyond the body
        assert (xs > x).mean() == pytest.approx(0.04 * (2.0 / x) ** 1.5, rel=0.15)
    assert d.median == pytest.approx(0.3, rel=0.05)


@settings(max_examples=60, deadline=None)
@given(w=st.floats(0.005, 0.3), alpha=st.floats(0.8, 3.0), q=st.floats(0.05, 0.995))
def test_quantile_inverts_the_cdf(w: float, alpha: float, q: float) -> None:
    d = HeavyTailed(((1 - w, Lognormal(0.2, 0.6)), (w, Lognormal(1.0, 3.0))),
                    ParetoTail(w / 2, alpha, 0.6, 60.0))
    x = d.quantile(q)
    assert d.cdf(x * (1 + 1e-6)) >= q - 1e-9
    assert d.cdf(x * (1 - 1e-3)) <= q + 1e-9


@settings(max_examples=40, deadline=None)
@given(u=st.floats(0.0, 0.999999), z=st.floats(-4, 4))
def test_samples_are_positive_and_capped(u: float, z: float) -> None:
    d = HeavyTailed(((0.9, Lognormal(0.2, 0.5)), (0.1, Lognormal(0.8, 2.0))),
                    ParetoTail(0.05, 1.1, 0.5, 50.0))
    v = d.value(z, u)
    assert 0 < v <= 50.0


def test_a_heavy_tailed_provider_draws_wide_rows_and_runs() -> None:
    data = tiny()
    data["providers"]["a"]["ttft_ms"] = {
        "median": 200, "p99": 500, "pareto_tail": {"weight": 0.03, "alpha": 1.5}}
    data["providers"]["b"]["ttft_ms"] = {"mixture": [
        {"weight": 0.97, "median": 300, "p99": 600}, {"weight": 0.03, "median": 900,
                                                       "p99": 2000}]}
    sc = parse_scenario(data, "t.yaml")
    assert isinstance(sc.providers["a"].ttft, HeavyTailed)
    assert sc.providers["a"].ttft.tail is not None
    assert sc.providers["a"].ttft.tail.start == pytest.approx(0.5)  # default: the body's p99
    out = run_once(sc, "round_robin")
    assert out["unfinished"] == 0 and out["classes"]["interactive"]["outcomes"]["ok"] > 0
    prov = _provider([])
    assert not prov.wide


def test_plain_scenarios_keep_their_random_streams() -> None:
    """Adding wide rows must not change the draws of scenarios without heavy tails."""
    s1, s2 = Stream("same"), Stream("same")
    assert [s1.row() for _ in range(3)] == [s2.row() for _ in range(3)]


# ---------------------------------------------------------------- arrivals


def test_linear_rate_ramp_arrivals_follow_the_integral() -> None:
    spec = Poisson(2.0, ((1000.0, 20.0),), linear=True)
    ts = [t for t, _, _ in arrivals(spec, Stream("lin"), 0.0, 1000.0)]
    first, second = sum(t < 500 for t in ts), sum(t >= 500 for t in ts)
    # rate 2 -> 20 linearly: integral 0-500 = 3250, 500-1000 = 7750
    assert abs(first - 3250) < 4 * math.sqrt(3250)
    assert abs(second - 7750) < 4 * math.sqrt(7750)
    assert ts == sorted(ts)


# ---------------------------------------------------------------- validation


def _with_event(**ev: Any) -> dict[str, Any]:
    return tiny(events=[{"provider": "a", "at_s": 5, **ev}])


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (_with_event(outage=True, duration_s=30, ramp_s=5),
         "bad.yaml: events[0].ramp_s: capacity changes and outages are steps"),
        (_with_event(ttft_factor=2, duration_s=30, ramp_s=20, ramp_out_s=20),
         "bad.yaml: events[0].ramp_s: ramp_s + ramp_out_s (40) must be <= duration_s (30)"),
        (_with_event(ttft_factor=2, ramp_out_s=20),
         "bad.yaml: events[0].ramp_out_s: needs duration_s"),
        (_with_event(errors=[{"rate": 0.7}, {"rate": 0.6, "status": 429}]),
         "bad.yaml: events[0].errors: rates add up to 1.3, more than 1"),
        (_with_event(errors=[{"rate": 0.1, "status": 700}]),
         "bad.yaml: events[0].errors[0].status: must be <= 599"),
        (_with_event(errors=[{"rate": 0.1, "after": 3}]),
         "bad.yaml: events[0].errors[0]: unknown field(s): after"),
    ],
)
def test_new_event_fields_are_validated(data: dict[str, Any], expected: str) -> None:
    assert expected in _error(data)


def _with_ttft(lat: Any) -> dict[str, Any]:
    data = tiny()
    data["providers"]["a"]["ttft_ms"] = lat
    return data


@pytest.mark.parametrize(
    ("lat", "expected"),
    [
        ({"mixture": [{"weight": 0.9, "median": 100, "p99": 200},
                      {"weight": 0.2, "median": 300, "p99": 900}]},
         "providers.a.ttft_ms.mixture: weights must sum to 1, got 1.1"),
        ({"median": 100, "p99": 200, "mixture": []},
         "providers.a.ttft_ms.median: give either median/p99 or mixture"),
        ({"median": 100, "p99": 200, "pareto_tail": {"weight": 1, "alpha": 2}},
         "providers.a.ttft_ms.pareto_tail.weight: must be < 1"),
        ({"median": 100, "p99": 200, "pareto_tail": {"weight": 0.1}},
         "providers.a.ttft_ms.pareto_tail.alpha: required field is missing"),
        ({"median": 100, "p99": 200, "pareto_tail": {"weight": 0.1, "alpha": 2, "max_ms": 10}},
         "providers.a.ttft_ms.pareto_tail.max_ms: must be >= from_ms (200)"),
        ({"mixture": [{"weight": 1.0, "median": 100, "p99": 50}]},
         "providers.a.ttft_ms.mixture[0].p99: must be >= median"),
    ],
)
def test_heavy_tailed_latencies_are_validated(lat: Any, expected: str) -> None:
    assert expected in _error(_with_ttft(lat))


def test_provider_error_shares_may_not_exceed_one() -> None:
    data = tiny()
    data["providers"]["a"].update(error_rate=0.5, errors=[{"rate": 0.6}])
    assert "providers.a.errors: error_rate plus the rates of errors" in _error(data)


def test_interpolate_is_a_choice() -> None:
    data = tiny()
    data["workloads"][0]["arrival"]["interpolate"] = "cubic"
    assert "workloads[0].arrival.interpolate: must be one of step, linear" in _error(data)
