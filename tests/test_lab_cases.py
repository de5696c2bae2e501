"""Named lab cases (issues 11 and 15): one behaviour each, on tailroute's default
settings, asserted on what the router did (its decision trace) in the simulator.
The scenarios are in ``sidecar/sim/cases``; figures in docs/policy-lab.md."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any

import pytest

from sidecar.sim.cases import load_case, share, time_to_react, trace_of, traced_run
from sidecar.sim.engine import Simulation
from sidecar.sim.loader import load_scenario
from sidecar.sim.scenario import Scenario

HUNT = Path(__file__).resolve().parents[1] / "sidecar" / "sim" / "hunt"

ESCALATED = {"degraded", "restricted", "quarantined", "probing", "restoring"}


@pytest.mark.parametrize("rate", [20, 50])
def test_hard_outage_is_left_within_a_few_requests_and_restored_by_probing(rate: float) -> None:
    _, sim = traced_run(load_case("outage", rate=rate))
    trace = trace_of(sim)
    reached, n = share(trace, "provider-b", 120, 130)
    assert reached < 0.02 and n > 8 * rate, (reached, n)
    router = sim.policy.router  # type: ignore[attr-defined]
    kinds = [(e.old, e.new) for e in router.transitions if e.cluster == "provider-b"]
    assert kinds[0] == ("healthy", "quarantined")
    assert ("probing", "restoring") in kinds and kinds[-1][1] == "healthy"
    # Back in use once restored (at 20/s 17-23 % of 380-420 s with the class timeout a
    # stream's whole-answer cap, 15-22 % since it caps only its silences).
    back, _ = share(trace, "provider-b", 380, 420)
    assert back > 0.15, back


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_hard_outage_at_20_per_s_stays_under_2_percent_in_every_seed(seed: int) -> None:
    """While the ejection run grows, b takes no more requests than the run still needs
    (the trial limit of sidecar.core.health): what reaches b in the outage's first
    10 s is the run itself, however close together the traffic sends requests."""
    _, sim = traced_run(load_case("outage", rate=20, seed=seed))
    reached, n = share(trace_of(sim), "provider-b", 120, 130)
    assert reached < 0.02 and n > 160, (reached, n)


def test_outage_at_a_low_rate_costs_the_ejection_run_only() -> None:
    """At 5 req/s the first 10 s hold ~45 requests: the ejection run is what reaches b."""
    _, sim = traced_run(load_case("outage", rate=5))
    trace = trace_of(sim)
    sent = sum(1 for r in trace if 120 <= r.t < 130 and r.cluster == "provider-b")
    assert sent <= 4, sent


@pytest.mark.parametrize(
    ("rate", "within_s", "seed"),
    [(0.5, 120, None), (0.5, 120, 16), (50, 20, None), (50, 20, 4)],
)
def test_ttft_tripling_loses_share_at_the_traffic_tempo(
    rate: float, within_s: float, seed: int | None,
) -> None:
    """Seed 5 at 0.5 req/s took 180 s with shift_alpha 0.01 (three slow answers in a
    row wanted, two at 0.05). Seed 16 took 300 s while samples at a route's p10
    counted as below it (sidecar.core.shift); with that fixed, 2 of seeds 1..40 do
    not settle within 120 s (5 and 28; before: 16, 28, 36, 39), seed 5 by one later
    window holding 5 of its 20 answers. Seed 4 at 50 req/s took 25 s before
    enough_samples: the window held a minute of older samples."""
    _, sim = traced_run(load_case("ttft_triples", rate=rate, seed=seed))
    trace = trace_of(sim)
    before, _ = share(trace, "provider-a", 300, 600)
    after, n = share(trace, "provider-a", 600 + within_s, 900)
    assert before > 0.25 and after < 0.2, (before, after, n)
    step = 60.0 if rate < 1 else 5.0  # windows of ~30 requests at 0.5 req/s, ~250 at 50
    react = time_to_react(trace, "provider-a", 600, 900, 0.2, step)
    assert react is not None and react <= within_s, react


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_stationary_heavy_tail_inside_its_slo_never_goes_beyond_watching(seed: int) -> None:
    out, sim = traced_run(load_case("heavy_tail", seed=seed))
    transitions = out["policy_stats"]["transitions"]
    assert not ESCALATED & set(transitions), transitions
    # Preference still follows latency: the heavy-tailed route gets the least traffic.
    trace = trace_of(sim)
    shares = {c: share(trace, c, 60, 1800)[0] for c in ("provider-a", "provider-b", "provider-c")}
    assert shares["provider-b"] == min(shares.values()) and shares["provider-b"] > 0.03


def test_provider_failing_fast_on_30_percent_gets_under_10_percent() -> None:
    _, sim = traced_run(load_case("fast_errors"))
    got, n = share(trace_of(sim), "provider-c", 60, 600)
    assert got < 0.10 and n > 4000, got


def test_long_input_regression_moves_that_slice_only() -> None:
    """The precondition (a's share of the long slice before the regression) is noisy at
    the case's seed: 0.268 before the worse routes pooled their weight, 0.239 after;
    over the case's seed and seeds 1-5 it averaged 0.397 before and 0.402 after
    (docs/policy-lab.md, "Pooling"). An even split over three routes would be 0.33."""
    _, sim = traced_run(load_case("slice_long_inputs"))
    trace = trace_of(sim)

    def long(r: object) -> bool:
        return r.slice.profile != "short"  # type: ignore[attr-defined]

    def short(r: object) -> bool:
        return r.slice.profile == "short"  # type: ignore[attr-defined]

    assert share(trace, "provider-a", 60, 300, long)[0] > 0.2  # a was used for it
    moved, n = share(trace, "provider-a", 300 + 180, 720, long)
    assert moved < 0.10 and n > 300, moved
    stay_before = share(trace, "provider-a", 60, 300, short)[0]
    stay_after = share(trace, "provider-a", 300, 720, short)[0]
    assert abs(stay_after - stay_before) < 0.08, (stay_before, stay_after)


def test_relapsing_provider_regains_less_weight_each_time() -> None:
    _, sim = traced_run(load_case("relapse"))
    trace = trace_of(sim)
    router = sim.policy.router  # type: ignore[attr-defined]
    relapses = [e for e in router.transitions
                if e.cluster == "provider-b" and "relapse" in e.reason]
    # Six bad spells; one that the route sits out (quarantined, probing, or restoring
    # at so small a weight that no request lands in it) is no relapse.
    assert len(relapses) >= 3
    before = [next(r.weights["provider-b"] for r in reversed(trace) if r.t < e.at)
              for e in relapses]
    assert all(b < a for a, b in itertools.pairwise(before)), before


def test_a_cut_quota_is_learned_from_its_429s_and_found_again_when_lifted() -> None:
    """provider-a (configured for 64, really 16 then 5 from t=240 s to 540 s) is the
    fastest route. Trusting the configured limit sent a fifth of the cut's requests
    into 429s; the limit learned from them (sidecar.core.pushback) leaves a handful,
    while round robin keeps a third of its requests on a throughout."""
    sc = load_case("rate_limited")
    out, sim = traced_run(sc)
    errors = out["classes"]["interactive"]["outcomes"]["error"]
    rr, _ = traced_run(load_case("rate_limited"), "round_robin")
    assert errors < 0.3 * rr["classes"]["interactive"]["outcomes"]["error"], errors
    trace = trace_of(sim)
    before, _ = share(trace, "provider-a", 120, 240)
    during, _ = share(trace, "provider-a", 270, 540)
    after, _ = share(trace, "provider-a", 660, 780)
    assert before > 0.4 and during < 0.15 and after > 0.3, (before, during, after)


@pytest.mark.parametrize("seed", [None, 2, 3, 4])
def test_many_slow_alternatives_do_not_outweigh_the_one_good_route(seed: int | None) -> None:
    """Ten candidates, one fast with room for everything, nine each clearly slower:
    their small weights pool into one route's worth (sidecar.core.pooling), so the
    good route keeps most of the traffic (before pooling: 50-61 % over 120-600 s in
    these seeds), while every slow route is still sampled."""
    _, sim = traced_run(load_case("many_one_good", seed=seed))
    trace = trace_of(sim)
    good, n = share(trace, "p07", 120, 600)
    assert good > 0.68 and n > 3000, (good, n)
    names = sorted({r.cluster for r in trace} - {"p07"})
    slow = {c: share(trace, c, 120, 600)[0] for c in names}
    assert len(slow) == 9 and min(slow.values()) > 0.002, slow


def _without_yield(sc: Scenario) -> Scenario:
    """The admission before strict priority (and before the deferral beyond capacity,
    which alone already spares the top class part of the overload)."""
    adm = dataclasses.replace(sc.config.admission, yield_hold_s=0.0,
                              beyond_capacity="best_effort")
    return dataclasses.replace(sc, config=dataclasses.replace(sc.config, admission=adm))


@pytest.mark.parametrize("seed", [None, 2, 3])
def test_middle_class_yields_to_the_premium_class_only_while_routes_are_saturated(
    seed: int | None,
) -> None:
    """Premium (1 s p99 TTFT), standard chat and batch on three routes of 22 slots,
    ~130 % of capacity from 180 s to 360 s. Without the ordering between classes
    (yield_hold_s: 0) only batch gave way: premium missed its budget on 36-50 % of
    its requests in these seeds. With it, standard yields too (reason ``yield``),
    premium stays under 8 %, the whole case does better, and standard yields only
    around the ramp (a few requests in one short burst before it, in seed 3)."""
    sc = load_case("priority_overload", seed=seed)
    off, _ = traced_run(_without_yield(sc))
    out, sim = traced_run(sc)
    premium = out["classes"]["premium"]["violation_rate"]
    assert premium < 0.08 < 0.3 < off["classes"]["premium"]["violation_rate"], premium

    def total(r: dict[str, Any]) -> int:
        return sum(c["violations"] for c in r["classes"].values())

    assert total(out) < 0.7 * total(off), (total(out), total(off))
    refused = [r.t for r in trace_of(sim)
               if r.slice.klass == "interactive" and r.admission in ("defer", "shed")]
    early = sum(t < 120 for t in refused)  # seed 3: 10 in a saturated burst at 104-118 s
    assert len(refused) > 200 and early < 0.05 * len(refused) and max(refused) < 480, (
        len(refused), early, max(refused))
    counters = sim.policy.router.counters  # type: ignore[attr-defined]
    # Most yield to premium; the rest found every route full (admission.beyond_capacity,
    # counted over all classes: premium's own deferrals at full capacity too).
    yielded, full = counters[("admission_reason", "yield")], counters[("admission_reason", "full")]
    assert yielded <= len(refused) <= yielded + full and yielded > 0.7 * len(refused), (
        yielded, full, len(refused))


@pytest.mark.parametrize("seed", [None, 2, 3])
def test_the_top_class_is_deferred_beyond_capacity_only_at_the_peak(seed: int | None) -> None:
    """Interactive load ramps 3 -> 30 req/s and back over three routes of 20/80/80
    slots (the hunt's ``diurnal``). Sent beyond max_concurrency (``beyond_capacity:
    best_effort``) the overflow queues at the providers and 17-23 % of the calls
    miss their budget; deferred with reason ``full`` (the default) once the routes
    are full of interactive work (the batch requests in flight are slots it may
    still take), a few percent of the peak's calls are refused and 6-12 % of all
    miss. Nothing is refused outside the peak (330-500 s in these seeds)."""
    sc = load_scenario(HUNT / "diurnal.yaml")
    if seed is not None:
        sc = dataclasses.replace(sc, seed=seed)
    adm = dataclasses.replace(sc.config.admission, beyond_capacity="best_effort")
    off, _ = traced_run(dataclasses.replace(sc, config=dataclasses.replace(sc.config,
                                                                           admission=adm)))
    out, sim = traced_run(sc)

    def total(r: dict[str, Any]) -> int:
        return sum(c["violations"] for c in r["classes"].values())

    assert total(out) < 0.6 * total(off), (total(out), total(off))
    refused = [r.t for r in trace_of(sim)
               if r.slice.klass == "interactive" and r.admission in ("defer", "shed")]
    assert 100 < len(refused) < 0.05 * out["classes"]["interactive"]["calls"], len(refused)
    assert min(refused) > 300 and max(refused) < 550, (min(refused), max(refused))
    assert sim.policy.router.counters[("admission_reason", "full")] == len(refused)  # type: ignore[attr-defined]


def _against_round_robin(hunt: str, seed: int | None) -> tuple[int, int, Simulation]:
    """A hunt scenario (at another seed if given) run by tailroute and round robin: their
    violations (all classes) and tailroute's simulation."""
    sc = load_scenario(HUNT / hunt)
    if seed is not None:
        sc = dataclasses.replace(sc, seed=seed)
    out, sim = traced_run(sc)
    rr, _ = traced_run(sc, "round_robin")

    def total(r: dict[str, Any]) -> int:
        return sum(c["violations"] for c in r["classes"].values())

    return total(out), total(rr), sim


QUOTA_SEEDS: tuple[int | None, ...] = (None, 2, 3, 4, 5, 6, 7, 8)


def test_a_quota_that_does_not_say_so_is_not_read_as_a_concurrency_limit() -> None:
    """The hunt's ``burst_429``: the same quota without ``Retry-After``. Read as a
    concurrency limit, each 429 came back at a lower count as the refusals drained the
    route, the limit ratcheted 40 -> 1 and stayed there: 4-6x round robin's
    violations, and provider-a's share between bursts 0.05-0.09. A 429 that comes back
    with nothing else in flight is a quota's (sidecar.core.pushback): from then on the
    route's 429s hold it with a backoff and learn no limit, so in every seed it has no
    limit at the end. Pooled over eight seeds (one seed's share between bursts runs
    from 0.16 to 0.58, either way), the case costs at most 1.25x round robin's
    violations and provider-a has on average more than a third of the traffic back
    between bursts."""
    ours = rr = 0
    between: list[float] = []
    for seed in QUOTA_SEEDS:
        o, r, sim = _against_round_robin("burst_429.yaml", seed)
        ours, rr = ours + o, rr + r
        pushback = sim.policy.router.pushback  # type: ignore[attr-defined]
        assert pushback.learned() == {} and pushback.quota("provider-a", 700.0), seed
        trace = trace_of(sim)
        between += [share(trace, "provider-a", t + 15, t + 35)[0]
                    for t in (100 + 40 * k for k in range(15))]
    assert ours < 1.25 * rr, (ours, rr)
    assert sum(between) / len(between) > 0.35, between


@pytest.mark.parametrize("seed", [None, 2, 3])
def test_a_declared_quota_holds_the_route_for_its_wait_and_keeps_its_limit(
    seed: int | None,
) -> None:
    """The hunt's ``burst_429_retry_after``: the fastest route answers 70 % of
    requests 429 for 8 s of every 40 s, each saying ``Retry-After: 1``. Read as a
    concurrency limit (``burst_429``, no header) the refusals ratcheted the limit to
    1 and tailroute did 5x worse than round robin; a declared wait holds the route
    for that long instead (sidecar.core.pushback), and the quota is not counted
    against the route's health: no limit is learned, it takes little during a burst
    (19 % at most in these seeds, 60 % before the first) and has its share back
    between bursts (43 % at least, in one gap of seed None; 49-68 % in the others),
    and the case costs under a third of round robin's violations (27-32 against
    129-142)."""
    ours, rr, sim = _against_round_robin("burst_429_retry_after.yaml", seed)
    assert ours < 0.35 * rr, (ours, rr)
    assert sim.policy.router.pushback.learned() == {}  # type: ignore[attr-defined]
    trace = trace_of(sim)
    bursts = [100 + 40 * k for k in range(15)]
    during = max(share(trace, "provider-a", t + 1, t + 7)[0] for t in bursts)
    between = min(share(trace, "provider-a", t + 15, t + 35)[0] for t in bursts)
    assert during < 0.25 and between > 0.4, (during, between)


def _short_spike(live_horizon_s: float) -> tuple[int, int]:
    """``short_spike`` with every stream timed at its first token: interactive violations,
    and interactive requests sent to provider-a from 5 s into its 20 s spike."""
    sc = load_case("short_spike")
    cfg = sc.config
    cfg = dataclasses.replace(
        cfg, health=dataclasses.replace(cfg.health, live_horizon_s=live_horizon_s),
        timing=dataclasses.replace(cfg.timing, token_sample_share=1.0))
    out, sim = traced_run(dataclasses.replace(sc, config=cfg))
    sent = sum(1 for r in trace_of(sim) if r.slice.klass == "interactive"
               and r.cluster == "provider-a" and 205.0 <= r.t < 220.5)
    return out["classes"]["interactive"]["violations"], sent


def test_a_route_missing_its_budget_now_sits_out_the_rest_of_a_short_spike() -> None:
    """Live misses (sidecar.core.live_misses): a request still without its first token
    at the 2.25 s budget is a miss then, not ~10 s later at its answer. A third of the
    traffic goes to provider-a when it turns 5.6x slower for 20 s: with the misses
    judged at the budget it gets 3 requests after the first 5 s of the spike, against
    10 without (``live_horizon_s: 0``), and fewer requests miss."""
    live_v, live_sent = _short_spike(10.0)
    off_v, off_sent = _short_spike(0.0)
    assert live_sent * 2 <= off_sent and live_v < off_v, (live_sent, off_sent, live_v, off_v)


def _miss_ratio_exponent(sc: Scenario, g: float) -> Scenario:
    classes = tuple(dataclasses.replace(c, miss_ratio_exponent=g) for c in sc.config.classes)
    return dataclasses.replace(sc, config=dataclasses.replace(sc.config, classes=classes))


@pytest.mark.parametrize("seed", [None, 2, 3])
def test_a_clean_route_with_room_keeps_most_of_the_traffic(seed: int | None) -> None:
    """Beside two routes whose tails cross the budget on ~1 % of their requests (inside
    the 5 % allowance), the route that never misses gets ~80 % of the traffic with the
    miss-ratio score (on by default); without it (``miss_ratio_exponent: 0``) ~70 % in
    these seeds."""
    sc = load_case("clean_beside_tails", seed=seed)
    with_ratio = share(trace_of(traced_run(sc)[1]), "provider-a", 300, 900)[0]
    without = share(trace_of(traced_run(_miss_ratio_exponent(sc, 0.0))[1]),
                    "provider-a", 300, 900)[0]
    assert with_ratio > 0.75 and with_ratio > without + 0.08, (with_ratio, without)


@pytest.mark.parametrize("seed", [None, 2, 3])
def test_a_region_back_from_an_outage_is_found_by_the_requests_refused_meanwhile(
        seed: int | None) -> None:
    """The hunt's ``region_pair_outage``: east-a and east-b down 300-420 s, the west
    routes full. Each failed probe round doubled the cooldown, so the region was next
    probed at ~535 s and until then admission refused 860-1,070 answers, twice round
    robin's violations. A request refused for want of room now probes a cooling route
    (sidecar.core.rescue_probe): the region is found within ~20 s of its return, takes
    about half the traffic by 440-480 s, refusals end by ~440 s, and tailroute is within
    1.1x of round robin (540/541, 715/698, 691/756 violations in these seeds)."""
    ours, rr, sim = _against_round_robin("region_pair_outage.yaml", seed)
    assert ours < 1.1 * rr, (ours, rr)
    trace = trace_of(sim)
    east = share(trace, "east-a", 440, 480)[0] + share(trace, "east-b", 440, 480)[0]
    assert east > 0.3, east
    refused = [r.t for r in trace if r.t >= 420 and r.admission in ("defer", "shed")]
    assert max(refused, default=0.0) < 450, max(refused)
    assert sim.policy.router.counters[("admission_reason", "rescue")] > 0  # type: ignore[attr-defined]
