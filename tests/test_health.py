from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable, Mapping
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core.config import HealthConfig, SloConfig, StatsConfig
from sidecar.core.health import TRANSITIONS, HealthState, RouteHealth
from sidecar.core.health_board import HealthBoard
from sidecar.core.health_signals import History, Signal, WindowVerdict, classify
from sidecar.core.histogram import LogHistogram
from sidecar.core.stats import StatsStore, WindowSummary
from sidecar.core.types import Observation, SliceKey, TransitionEvent

S, G = HealthState, Signal
HC = HealthConfig()  # watch 0.8 x3, restrict 1.0 x2, recover 0.6 x2, restore 0.25, ...
SC = StatsConfig(subwindow_s=10.0, stale_after_s=300.0)
SLO = SloConfig("ttft", 95, 1000, 30000)
K = SliceKey("m", "interactive", "short", True)
FAST = settings(max_examples=50, deadline=None)
# Samples over (recover, watch, restrict) x budget out of 40, per latency signal.
OVER = {G.OK: (0, 0, 0), G.BAND: (10, 0, 0), G.ELEVATED: (30, 20, 0),
        G.THREATENING: (40, 40, 30)}
RATIO = {G.OK: 0.3, G.BAND: 0.7, G.ELEVATED: 0.9, G.THREATENING: 1.5}
WINDOW_SIGNALS = [*RATIO, G.INSUFFICIENT, G.INSUFFICIENT_ERRORS, G.STALE, G.BURST]


def verdict(index: int, over: tuple[int, int, int], samples: int = 40,
            failures: int = 0, requests: int | None = None) -> WindowVerdict:
    ratio = 0.3 if over[2] == 0 else 1.5
    req = samples + failures if requests is None else requests
    return WindowVerdict(index, "ttft", 95, ratio, ratio, samples, req, failures, over)


class Driver:
    """Feeds one RouteHealth a signal at a time, one evaluation window apart.
    The route starts with a mature, quiet history (so ELEVATED can fire)."""

    def __init__(self, state: HealthState = S.HEALTHY, cfg: HealthConfig = HC) -> None:
        self.now, self.idx = 1000.0, 100
        self.h = RouteHealth("a", K, cfg, SC, self.now)
        self.h.history = History(cfg.history_windows, 0.01, 0.01)
        self.h.state = state
        if state is S.QUARANTINED:
            self.h.offences, self.h.cooldown_until = 1, self.now + 10_000
        elif state is S.PROBING:
            self.h.offences = 1
        elif state is S.RESTORING:
            self.h.restore_base, self.h.restore_from_circuit = 0.25, True

    def verdict(self, signal: Signal) -> WindowVerdict:
        self.idx += 1
        if signal in OVER:
            return verdict(self.idx, OVER[signal])
        if signal is G.BURST:
            return WindowVerdict(self.idx, "ttft", 95, 0.2, 0.2, 4, 20, 16)  # 80 %: significant
        failures = 1 if signal is G.INSUFFICIENT_ERRORS else 0
        return WindowVerdict(self.idx, "ttft", 95, None, None, 2, 3, failures)

    def send(self, signal: Signal, may_quarantine: bool = True) -> list[TransitionEvent]:
        if signal is G.COOLDOWN_OVER:
            self.now = max(self.now, self.h.cooldown_until or self.now)
            return self.h.tick(self.now)
        if signal in (G.PROBE_OK, G.PROBE_FAIL, G.RESCUE_OK):
            return self.h.record_probe(signal is not G.PROBE_FAIL, self.now,
                                       rescue=signal is G.RESCUE_OK)
        if signal is G.FAST_FAIL:
            self.now += 0.5
            return self.h.eject(self.now, may_quarantine)
        if signal is G.PARTIAL_FAIL:  # a run of 3 on a route failing 30 of 100 since
            self.now += 0.5
            self.h.episode_since, self.h.episode_ok, self.h.episode_fail = self.now - 5, 70, 30
            self.h.streak = 3
            return self.h.eject(self.now, may_quarantine)
        self.now += SC.stale_after_s if signal is G.STALE else SC.subwindow_s
        return self.h.evaluate(self.verdict(signal), self.now, may_quarantine)


# ---------------------------------------------------------------- the table


@pytest.mark.parametrize(
    ("over", "samples", "failures", "requests", "stale", "mature", "signal"),
    [
        ((0, 0, 0), 40, 0, 40, False, True, G.OK),
        ((2, 0, 0), 40, 0, 40, False, True, G.OK),  # 5 % over recover: allowed share
        ((3, 0, 0), 40, 0, 40, False, True, G.BAND),  # above it: the hysteresis band
        # watch level vs 1.5 x history (7.5 %): 6 of 40 is not significant, 7 is
        ((20, 6, 0), 40, 0, 40, False, True, G.BAND),
        ((20, 7, 0), 40, 0, 40, False, True, G.ELEVATED),
        ((20, 7, 0), 40, 0, 40, False, False, G.BAND),  # ... but no history to compare
        ((40, 40, 4), 40, 0, 40, False, False, G.BAND),  # 10 % over budget: not yet
        ((40, 40, 5), 40, 0, 40, False, False, G.THREATENING),  # 12.5 %: significant
        ((0, 0, 0), 35, 5, 40, False, False, G.THREATENING),  # failures count as misses
        # burst: failures >= 50 % with confidence: 26 of 40 is, 25 of 40 is a breach only
        ((0, 0, 0), 14, 26, 40, False, True, G.BURST),
        ((0, 0, 0), 15, 25, 40, False, True, G.THREATENING),
        ((0, 0, 0), 20, 20, 40, False, True, G.THREATENING),  # 50 %: a breach, no burst
        ((0, 0, 0), 0, 5, 5, False, True, G.BURST),  # five of five
        ((0, 0, 0), 2, 3, 5, False, True, G.THREATENING),  # three of five: chance at 30 %
        ((0, 0, 0), 0, 4, 4, False, True, G.INSUFFICIENT_ERRORS),  # < error_min_samples
        ((0, 0, 0), 0, 2, 6, False, True, G.THREATENING),  # judged on failures alone
        ((0, 0, 0), 3, 0, 3, False, True, G.INSUFFICIENT),
        ((0, 0, 0), 0, 0, 0, True, True, G.STALE),
        ((0, 0, 0), 3, 1, 4, True, True, G.INSUFFICIENT_ERRORS),  # failures: never stale
    ],
)
def test_classify_boundaries(
    over: tuple[int, int, int], samples: int, failures: int, requests: int, stale: bool,
    mature: bool, signal: Signal,
) -> None:
    ratio = None if samples < 20 else 0.5
    v = WindowVerdict(1, "ttft", 95, ratio, ratio, samples, requests, failures, over)
    history = History(HC.history_windows if mature else 0, 0.05, 0.05)
    assert classify(v, HC, stale, history) is signal


@pytest.mark.parametrize(
    ("ratio", "samples", "requests", "failures", "over", "text"),
    [
        # The hunt's minor_errors_fastest: a fast route whose misses are its 503s.
        (0.41, 23, 27, 4, (0, 0, 0),
         "p95 ttft 0.41x budget; 15% of 27 over budget or failed (4 failed; allowed 5%)"),
        (1.5, 40, 40, 0, (10, 8, 6), "p95 ttft 1.50x budget; 15% of 40 over budget (allowed 5%)"),
        (1.2, 38, 40, 2, (6, 4, 3),
         "p95 ttft 1.20x budget; 12% of 40 over budget or failed (2 failed; allowed 5%)"),
        (None, 3, 8, 5, (0, 0, 0), "5 of 8 requests failed (62%; allowed 5%)"),
        (None, 3, 3, 0, (0, 0, 0), "3 ttft samples (too few)"),
    ],
)
def test_a_window_reason_names_its_failures_apart_from_slow_answers(
    ratio: float | None, samples: int, requests: int, failures: int,
    over: tuple[int, int, int], text: str,
) -> None:
    """A transition's reason is what an operator reads: failures count as misses, but
    a window whose tail is well inside the budget must not read as 'over budget'."""
    v = WindowVerdict(1, "ttft", 95, ratio, ratio, samples, requests, failures, over)
    assert v.describe() == text


def test_a_stationary_heavy_tail_reads_as_its_own_normal() -> None:
    """12 % of samples beyond the watch level every window: a breach of nothing
    once that is the route's history; twice as many is a change."""
    history = History(HC.history_windows, 0.12, 0.3)
    usual = WindowVerdict(1, "ttft", 95, 0.9, 0.9, 200, 200, 0, (60, 24, 8))
    assert classify(usual, HC, False, history) is G.OK
    worse = WindowVerdict(2, "ttft", 95, 0.95, 0.95, 200, 200, 0, (90, 48, 9))
    assert classify(worse, HC, False, history) is G.ELEVATED


def _label(key: tuple[HealthState, Signal]) -> str:
    return f"{key[0].value}+{key[1].value}"


@pytest.mark.parametrize("key", list(TRANSITIONS), ids=_label)
def test_every_transition_in_the_table(key: tuple[HealthState, Signal]) -> None:
    state, signal = key
    rule = TRANSITIONS[key]
    d = Driver(state)
    if rule.target is None:  # stay, clearing vote streaks
        d.h.votes = {S.DEGRADED: 1}
        assert d.send(signal) == [] and d.h.state is state and d.h.votes == {}
        return
    needed = d.h._threshold(rule.after) if rule.after else 1
    for _ in range(needed - 1):
        d.send(signal)
        assert d.h.state is (rule.meanwhile or state), "moved before the streak was complete"
    events = d.send(signal)
    assert d.h.state is rule.target
    assert events and events[-1].new == rule.target.value and events[-1].reason
    assert events[-1].slice == K.label() and events[-1].at == d.now


# Among them an ok probe while quarantined that is not a rescue: only RESCUE_OK ends a
# cooldown early (tests/test_rescue_probe.py).
NEUTRAL = [(st_, sig) for st_ in HealthState for sig in Signal if (st_, sig) not in TRANSITIONS]


@pytest.mark.parametrize("key", NEUTRAL, ids=_label)
def test_pairs_absent_from_the_table_change_nothing(key: tuple[HealthState, Signal]) -> None:
    state, signal = key
    d = Driver(state)
    d.h.votes = {S.HEALTHY: 1} if state is S.RESTORING else {}
    votes = dict(d.h.votes)
    assert d.send(signal) == []
    assert d.h.state is state and d.h.votes == votes


def test_an_open_circuit_is_left_only_through_probing() -> None:
    """Invariants 1 and 3: quarantine is left on COOLDOWN_OVER or RESCUE_OK alone, both to
    probing at once, so a rescue climbs the same restore ladder as a cooldown's end."""
    exits = {sig: r for (st_, sig), r in TRANSITIONS.items()
             if st_ is S.QUARANTINED and r.target is not None}
    assert set(exits) == {G.COOLDOWN_OVER, G.RESCUE_OK}
    assert all(r.target is S.PROBING and r.after is None for r in exits.values())
    # A rescue's answer counts wherever a probe's does, toward the same target.
    for st_ in (S.PROBING, S.RESTRICTED):
        assert TRANSITIONS[st_, G.RESCUE_OK] == TRANSITIONS[st_, G.PROBE_OK]


@pytest.mark.parametrize(("probe_successes", "signals", "end", "restoring_votes"), [
    (5, [G.RESCUE_OK], S.PROBING, 1),  # the cooldown over, and its first ok probe
    (5, [G.RESCUE_OK, G.PROBE_OK, G.RESCUE_OK, G.PROBE_OK], S.PROBING, 4),
    (5, [G.RESCUE_OK, *[G.PROBE_OK] * 4], S.RESTORING, 0),
    (1, [G.RESCUE_OK], S.RESTORING, 0),  # through probing: two events
    (5, [G.PROBE_OK] * 6, S.QUARANTINED, 0),  # not rescues: the cooldown runs on
    (5, [G.PROBE_FAIL] * 6, S.QUARANTINED, 0),  # nor is it lengthened
])
def test_a_rescue_ends_the_cooldown_as_the_first_probe(
    probe_successes: int, signals: list[Signal], end: HealthState, restoring_votes: int,
) -> None:
    d = Driver(S.QUARANTINED, replace(HC, probe_successes=probe_successes))
    until, events = d.h.cooldown_until, []
    for sig in signals:
        events += d.send(sig)
    assert d.h.state is end and d.h.votes.get(S.RESTORING, 0) == restoring_votes
    assert d.h.offences == 1
    if end is S.QUARANTINED:
        assert events == [] and d.h.cooldown_until == until
    else:
        assert [(e.old, e.new) for e in events][:1] == [("quarantined", "probing")]
        assert events[0].reason == "rescue probe ok during cooldown"
    if end is S.RESTORING:  # the circuit's restore weight (invariant 3)
        assert events[-1].old == "probing" and d.h.restore_from_circuit
        assert d.h.weight == min(HC.restore_step, 0.5)


@pytest.mark.parametrize(
    ("start", "signals", "end"),
    [
        # consecutive elevated windows: a band window restarts the count
        (S.HEALTHY, [G.ELEVATED, G.BAND, G.ELEVATED, G.ELEVATED], S.WATCHING),
        (S.HEALTHY, [G.ELEVATED, G.BAND, G.ELEVATED, G.ELEVATED, G.ELEVATED], S.DEGRADED),
        # insufficient windows are neutral: they neither count nor break a streak
        (S.HEALTHY, [G.ELEVATED, G.INSUFFICIENT, G.ELEVATED, G.ELEVATED], S.DEGRADED),
        # hysteresis: leaving needs recover_windows consecutive windows below recover_ratio
        (S.WATCHING, [G.OK, G.BAND, G.OK], S.WATCHING),
        (S.WATCHING, [G.OK, G.BAND, G.OK, G.OK], S.HEALTHY),
        (S.WATCHING, [G.BAND] * 20, S.WATCHING),
        (S.DEGRADED, [G.BAND] * 20, S.DEGRADED),
        (S.DEGRADED, [G.THREATENING, G.ELEVATED, G.THREATENING], S.DEGRADED),
        (S.DEGRADED, [G.OK, G.THREATENING, G.OK], S.DEGRADED),
        (S.RESTRICTED, [G.ELEVATED] * 20, S.RESTRICTED),
        # restricted never returns straight to healthy
        (S.RESTRICTED, [G.OK] * 2, S.DEGRADED),
        (S.RESTRICTED, [G.OK] * 4, S.RESTORING),
        (S.RESTRICTED, [G.OK] * 7, S.HEALTHY),
        # restoring holds its weight in the band and on sparse windows with errors
        (S.RESTORING, [G.BAND, G.INSUFFICIENT_ERRORS] * 5, S.RESTORING),
        # a long run of sparse windows: stale verdicts age out one level at a time
        (S.WATCHING, [G.INSUFFICIENT] * 29, S.WATCHING),
        (S.WATCHING, [G.INSUFFICIENT] * 30, S.HEALTHY),
        (S.DEGRADED, [G.INSUFFICIENT] * 30, S.WATCHING),
        (S.DEGRADED, [G.INSUFFICIENT] * 60, S.HEALTHY),
        (S.RESTRICTED, [G.INSUFFICIENT] * 30, S.WATCHING),
        (S.RESTRICTED, [G.INSUFFICIENT_ERRORS] * 60, S.RESTRICTED),
    ],
)
def test_hysteresis_and_streaks(
    start: HealthState, signals: list[Signal], end: HealthState
) -> None:
    d = Driver(start)
    for sig in signals:
        d.send(sig)
    assert d.h.state is end


# ---------------------------------------------------------------- semantics


def test_weights_and_exposure_per_state() -> None:
    d = Driver()
    assert (d.h.weight, d.h.excluded_for_sensitive, d.h.probe_share) == (1.0, False, 0.0)
    d.h.state = S.DEGRADED
    assert d.h.weight == HC.degraded_weight and d.h.weight_for(False) == 1.0
    d.h.state = S.RESTRICTED
    assert d.h.weight == 0.0 and d.h.excluded_for_sensitive and d.h.weight_for(False) == 1.0
    d.h.state = S.PROBING
    assert d.h.probe_share == HC.probe_share and d.h.circuit_open and d.h.weight_for(False) == 0


def test_recovery_path_weights() -> None:
    d = Driver()
    events = d.send(G.BURST)
    assert events[0].new == "quarantined" and "cooldown 15s (offence 1)" in events[0].reason
    assert d.h.next_deadline() == d.now + HC.cooldown_s and d.h.weight == 0.0
    assert d.h.tick(d.now + 14.9) == [] and d.h.circuit_open
    d.send(G.COOLDOWN_OVER)
    assert d.h.probe_share == HC.probe_share  # probing
    for _ in range(HC.probe_successes):
        d.send(G.PROBE_OK)
    weights = [d.h.weight]
    while d.h.state is S.RESTORING:
        d.send(G.OK)
        weights.append(d.h.weight)
    assert weights == [0.25, 0.5, 0.75, 1.0] and d.h.state is S.HEALTHY
    assert d.h.weight_for(False) == 1.0
    d2 = Driver(S.DEGRADED)
    d2.send(G.OK)
    d2.send(G.OK)
    assert d2.h.state is S.RESTORING and d2.h.weight == pytest.approx(HC.degraded_weight)
    assert d2.h.weight_for(False) == 1.0  # tolerant classes were never throttled


@pytest.mark.parametrize(
    ("probes", "state"),
    [
        ("F", S.PROBING),  # one failed probe says little about a partly failing route
        ("FF", S.PROBING),
        ("FFF", S.QUARANTINED),  # eject_consecutive in a row: hard failure, back out
        ("FFOFF", S.PROBING),  # an answer between failures restarts the run
        ("FOFOOOOO", S.RESTORING),  # probe_successes in a row restore
    ],
)
def test_probing_is_judged_on_several_answers(probes: str, state: HealthState) -> None:
    d = Driver(S.PROBING)
    for p in probes:
        d.send(G.PROBE_OK if p == "O" else G.PROBE_FAIL)
    assert d.h.state is state


@pytest.mark.parametrize(
    ("probes", "state"),
    [
        ("OOOOO", S.RESTRICTED),  # a slow route passes five in a row one time in four
        ("O" * 9 + "F" + "O" * 9, S.RESTRICTED),  # a miss restarts the count
        ("F" * 20, S.RESTRICTED),  # slow, not down: probes never quarantine it
        ("F" + "O" * 10, S.DEGRADED),  # restricted_probe_successes in a row
    ],
)
def test_a_restricted_route_leaves_on_a_longer_run_of_probes(
        probes: str, state: HealthState) -> None:
    d = Driver(S.RESTRICTED)
    events = [e for p in probes for e in d.send(G.PROBE_OK if p == "O" else G.PROBE_FAIL)]
    assert d.h.state is state
    assert [e.reason for e in events] == (
        ["10 consecutive probes ok"] if state is S.DEGRADED else [])


def test_cooldown_grows_per_offence_caps_and_is_forgiven() -> None:
    d = Driver()
    d.send(G.BURST)
    cooldowns = []
    for _ in range(7):
        cooldowns.append(d.h.cooldown_until - d.now)  # type: ignore[operator]
        d.send(G.COOLDOWN_OVER)
        for _ in range(HC.eject_consecutive):
            d.send(G.PROBE_FAIL)
    assert cooldowns == [15, 30, 60, 120, 240, 300, 300] and d.h.offences == 8
    assert d.h.relapses == 0  # failed probes are the same episode, not relapses
    d.h.state, d.h.healthy_since = S.HEALTHY, d.now
    d.h.tick(d.now + HC.forgive_after_s - 1)
    assert d.h.offences == 8
    d.h.tick(d.now + HC.forgive_after_s)
    assert d.h.offences == 7


@pytest.mark.parametrize("start", [S.HEALTHY, S.WATCHING, S.DEGRADED, S.RESTORING, S.RESTRICTED])
def test_last_viable_route_is_restricted_not_quarantined(start: HealthState) -> None:
    d = Driver(start)
    events = d.send(G.BURST, may_quarantine=False)
    assert d.h.state is S.RESTRICTED and d.h.panic
    assert len(events) == 1 and events[0].reason.startswith("panic: last viable route")
    assert d.send(G.BURST, may_quarantine=False) == []  # one event per panic episode
    d.send(G.INSUFFICIENT_ERRORS, may_quarantine=False)
    assert d.send(G.BURST, may_quarantine=False)[0].new == "restricted"
    assert d.send(G.BURST)[0].new == "quarantined"  # another route is viable again


@pytest.mark.parametrize(("signal", "quarantined"), [(G.BURST, True), (G.THREATENING, False)])
def test_a_burst_asks_whether_another_route_serves_latency_whether_one_is_viable(
        signal: Signal, quarantined: bool) -> None:
    """Beside a route restricted for its latency (it serves, it is not viable), a route
    failing most requests is quarantined, while one that is only slow is kept."""
    d = Driver(S.RESTRICTED)
    for _ in range(HC.restricted_windows_to_quarantine):
        d.now += SC.subwindow_s
        d.h.evaluate(d.verdict(signal), d.now, may_quarantine=False, may_quarantine_failing=True)
        if d.h.state is not S.RESTRICTED:
            break
    assert (d.h.state is S.QUARANTINED) is quarantined
    assert d.h.panic is not quarantined


def test_restricted_exhaustion_respects_last_viable_route() -> None:
    d = Driver(S.RESTRICTED)
    events = [e for _ in range(HC.restricted_windows_to_quarantine)
              for e in d.send(G.THREATENING, may_quarantine=False)]  # fmt: skip
    assert d.h.state is S.RESTRICTED and len(events) == 1 and "panic" in events[0].reason


def test_each_window_is_applied_once() -> None:
    h = RouteHealth("a", K, HC, SC, 0.0)
    v = verdict(7, OVER[G.THREATENING])
    assert h.evaluate(v, 10.0)[0].new == "watching"
    for _ in range(5):
        assert h.evaluate(v, 10.0) == []
    assert h.votes == {S.DEGRADED: 1}


# ---------------------------------------------------------------- the board


def summary(index: int, tail: float | None, requests: int = 40, errors: int = 0) -> WindowSummary:
    """A window of 40 samples all at ``tail`` (2 samples, too few, when None)."""
    h = LogHistogram()
    n = 40 if tail else 2
    for _ in range(n):
        h.add(tail or 0.2)
    return WindowSummary(index, index * 10.0, index * 10.0 + 10, "ttft", 0.95, n, tail,
                         requests, errors, 0, 0, h.cumulative())  # fmt: skip


def _evaluate(board: HealthBoard, cluster: str, slice: SliceKey, summary: WindowSummary,
              slo: SloConfig, now: float) -> list[TransitionEvent]:
    """A completed window's summary judged, as the router's window evaluation does."""
    return board.judge(cluster, slice, WindowVerdict.of(summary, slo, HC), now)


def test_board_keeps_only_routes_that_differ_from_healthy() -> None:
    b = HealthBoard(HC, SC)
    assert b.peek("a", K) is None and b.get("a", K).weight == 1.0
    assert _evaluate(b, "a", K, summary(1, None, requests=2), SLO, 20.0) == []
    assert b.items() == []  # nothing learned: nothing kept
    assert _evaluate(b, "a", K, summary(2, 0.2), SLO, 30.0) == []
    assert b.peek("a", K) is not None  # healthy, but it has history now
    assert _evaluate(b, "a", K, summary(3, 1.5), SLO, 40.0)[0].new == "watching"
    _evaluate(b, "a", K, summary(4, 0.2), SLO, 50.0)
    _evaluate(b, "a", K, summary(5, 0.2), SLO, 60.0)
    assert b.get("a", K).state is S.HEALTHY and b.get("a", K).history.windows == 3
    assert b.record_probe("b", K, True, 60.0) == []  # never seen: ignored
    with pytest.raises(ValueError):
        _evaluate(b, "a", K, summary(6, 0.2), replace(SLO, metric="e2e"), 60.0)


def test_board_tick_deadline_snapshot_and_prune() -> None:
    b = HealthBoard(HC, SC)
    other = SliceKey("m", "batch", "long", False)
    _evaluate(b, "a", K, summary(1, 0.2, requests=10, errors=9), SLO, 20.0)
    _evaluate(b, "b", other, summary(1, 1.5), SLO, 20.0)
    assert b.get("a", K).state is S.QUARANTINED and b.next_deadline() == 35.0
    data = json.loads(json.dumps(b.to_dict(21.0)))
    assert b.tick(34.0) == [] and b.tick(35.0)[0].new == "probing"
    back = HealthBoard.from_dict(data, HC, SC, 1021.0)  # new monotonic base
    assert back.next_deadline() == 1035.0 and back.get("b", other).state is S.WATCHING
    assert back.get("b", other).votes == {S.DEGRADED: 1}
    # window 1 was applied; rebased onto the new clock it is window 101
    _evaluate(back, "b", other, summary(101, 1.5), SLO, 1030.0)
    assert back.get("b", other).votes == {S.DEGRADED: 1}
    for _ in range(3):  # window 102 is new: counted once
        _evaluate(back, "b", other, summary(102, 1.5), SLO, 1030.0)
    assert back.get("b", other).votes == {S.DEGRADED: 2}
    assert back.prune([]) == 1 and back.peek("a", K) is not None  # cooldown pending: kept
    with pytest.raises(ValueError):
        HealthBoard.from_dict({"routes": [{"cluster": "a"}]}, HC, SC, 0.0)


# ---------------------------------------------------------------- properties


def run(
    store: StatsStore,
    board: HealthBoard,
    windows: int,
    traffic: Mapping[tuple[str, SliceKey], Callable[[int], np.ndarray]],
    rng: np.random.Generator,
) -> list[dict[tuple[str, SliceKey], HealthState]]:
    """Simulate ``windows`` sub-windows; ``traffic[key](k)`` gives ttft samples of window k.
    At each sub-window boundary every narrow series is evaluated, as the router does."""
    history = []
    for k in range(windows):
        for (cluster, slice), gen in traffic.items():
            for x in gen(k):
                t = k * 10.0 + float(rng.uniform(0, 9.99))
                store.observe(Observation(cluster, slice, "ok", ttft_s=float(x)), t)
        now = (k + 1) * 10.0
        for cluster, slice in store.narrow_keys():
            s = store.window_summary(cluster, slice, "ttft", 0.95, now)
            _evaluate(board, cluster, slice, s, SLO, now)
        history.append({key: board.get(*key).state for key in traffic})
    return history


def lognormal(rng: np.random.Generator, p95: float, sigma: float, n: int) -> np.ndarray:
    return rng.lognormal(np.log(p95) - 1.645 * sigma, sigma, n)


@FAST
@given(
    seed=st.integers(0, 2**32 - 1),
    p95=st.floats(0.05, 0.45),  # true p95 at most 0.45 x budget ("well under")
    sigma=st.floats(0.05, 0.6),
    noise=st.floats(0.0, 0.1),  # per-window drift of the median, +-10%
    per_window=st.integers(20, 60),
)
def test_stationary_route_stays_healthy(
    seed: int, p95: float, sigma: float, noise: float, per_window: int
) -> None:
    """(a) never beyond watching (no action is ever taken), and at most 10% of windows in
    watching: one sampling-noise spike costs >= 2 windows (watching, then recover_windows
    clean windows), so the bound allows a couple of such episodes in 50 windows."""
    rng = np.random.default_rng(seed)
    store, board = StatsStore(StatsConfig()), HealthBoard(HC, StatsConfig())

    def gen(k: int) -> np.ndarray:
        return lognormal(rng, p95 * (1 + rng.uniform(-noise, noise)), sigma, per_window)

    hist = run(store, board, 50, {("a", K): gen}, rng)
    states = [h[("a", K)] for h in hist]
    assert set(states) <= {S.HEALTHY, S.WATCHING}
    assert sum(st is S.WATCHING for st in states) <= 0.10 * len(hist)


@FAST
@given(
    seed=st.integers(0, 2**32 - 1),
    spike_at=st.integers(1, 25),
    kind=st.sampled_from(["bad_window", "huge_sample", "sparse_spike"]),
    factor=st.floats(2.0, 100.0),
)
def test_isolated_spike_never_quarantines(
    seed: int, spike_at: int, kind: str, factor: float
) -> None:
    """(b) one bad window or one huge sample: at most watching, weight stays 1."""
    rng = np.random.default_rng(seed)
    store, board = StatsStore(StatsConfig()), HealthBoard(HC, StatsConfig())
    per_window = 3 if kind == "sparse_spike" else 40

    def gen(k: int) -> np.ndarray:
        xs = lognormal(rng, 0.3, 0.3, per_window)
        if k == spike_at and kind == "bad_window":
            xs *= factor
        elif k == spike_at:
            xs[0] = 100.0 * factor  # up to 10^4 s
        return xs

    hist = run(store, board, 30, {("a", K): gen}, rng)
    states = {h[("a", K)] for h in hist}
    assert states <= {S.HEALTHY, S.WATCHING}
    if kind != "bad_window":
        assert states == {S.HEALTHY}
    assert hist[-1][("a", K)] is S.HEALTHY


@FAST
@given(seed=st.integers(0, 2**32 - 1), start=st.integers(2, 10), ratio=st.floats(1.5, 5.0))
def test_sustained_degradation_is_local_to_its_slice(seed: int, start: int, ratio: float) -> None:
    """(c) a clear breach (p95 at >= 1.5 x budget) is degraded within degrade_windows
    windows; other slices and clusters untouched."""
    rng = np.random.default_rng(seed)
    store, board = StatsStore(StatsConfig()), HealthBoard(HC, StatsConfig())
    long = SliceKey("m", "interactive", "long", True)

    def healthy(k: int) -> np.ndarray:
        return lognormal(rng, 0.3, 0.3, 30)

    def sick(k: int) -> np.ndarray:
        return lognormal(rng, 0.3 if k < start else ratio, 0.2, 30)

    traffic = {("a", K): sick, ("a", long): healthy, ("b", K): healthy}
    hist = run(store, board, start + HC.degrade_windows, traffic, rng)
    assert hist[start + HC.degrade_windows - 1][("a", K)] is S.DEGRADED
    assert all(h[("a", K)] is S.HEALTHY for h in hist[:start])
    for key in (("a", long), ("b", K)):
        assert all(h[key] is S.HEALTHY for h in hist)


@FAST
@given(
    seed=st.integers(0, 2**32 - 1),
    restore_step=st.floats(0.05, 1.0),
    probe_successes=st.integers(1, 6),
    degraded_weight=st.floats(0.0, 1.0),
)
def test_recovery_passes_probing_and_restoring_in_steps(
    seed: int, restore_step: float, probe_successes: int, degraded_weight: float
) -> None:
    """(d) quarantined -> probing -> restoring -> healthy; the weight rises at most
    restore_step per window through at least one intermediate value, and (for
    restore_step < 0.5) never jumps from <= restore_step straight to 1."""
    cfg = replace(HC, restore_step=restore_step, probe_successes=probe_successes,
                  degraded_weight=degraded_weight)  # fmt: skip
    rnd = random.Random(seed)
    d = Driver(cfg=cfg)
    d.send(G.BURST)
    states, weights = [d.h.state], [d.h.weight]
    noise = [G.BAND, G.INSUFFICIENT_ERRORS, G.PROBE_OK, G.COOLDOWN_OVER]
    for _ in range(200):
        if d.h.state is S.HEALTHY:
            break
        if d.h.state is S.QUARANTINED:  # the cooldown ends, or a rescue ends it early
            sig = rnd.choice([G.COOLDOWN_OVER, G.RESCUE_OK])
        elif d.h.state is S.PROBING:
            sig = G.PROBE_OK
        else:
            sig = rnd.choice([G.OK, G.INSUFFICIENT, rnd.choice(noise)])
        states += [S(e.new) for e in d.send(sig)]  # every state passed (a rescue: two)
        weights.append(d.h.weight)
    assert d.h.state is S.HEALTHY
    assert S.PROBING in states and S.RESTORING in states
    assert all(b - a <= restore_step + 1e-9 for a, b in itertools.pairwise(weights))
    assert any(0.0 < w < 1.0 for w in weights)
    jump_from = weights[weights.index(1.0) - 1]
    if restore_step < 0.5:
        assert jump_from > restore_step


# ---------------------------------------------------------------- fast path and memory


@pytest.mark.parametrize(
    ("fail_rate", "threshold"),
    [(0.0, 3), (0.01, 3), (0.05, 4), (0.1, 4), (0.3, 8), (0.9, 88)],
)
def test_ejection_run_grows_with_the_usual_failure_rate(fail_rate: float, threshold: int) -> None:
    """K = max(eject_consecutive, ceil(ln 1e-4 / ln f)): a false ejection stays below 1e-4."""
    h = RouteHealth("a", K, HC, SC, 0.0)
    h.fail_rate = fail_rate
    assert h.eject_threshold() == threshold
    assert fail_rate ** threshold <= 1e-4 * (1 + 1e-9) or threshold == HC.eject_consecutive


def test_a_run_of_hard_failures_ejects_and_a_fresh_success_ends_it() -> None:
    h = RouteHealth("a", K, HC, SC, 0.0)
    assert not h.note_outcome(True, 1.0) and not h.note_outcome(True, 1.1)
    assert not h.note_outcome(False, 1.2, sent_at=0.5)  # sent before the run: old news
    assert h.streak == 2
    assert h.note_outcome(True, 1.3)  # the third failure in a row
    events = h.eject(1.3)
    assert h.state is S.QUARANTINED and "3 consecutive hard failures" in events[0].reason
    h2 = RouteHealth("a", K, HC, SC, 0.0)
    h2.note_outcome(True, 1.0)
    h2.note_outcome(False, 1.2, sent_at=1.05)  # sent after the run began: it works now
    assert h2.streak == 0


def test_an_open_run_holds_the_route_while_its_ejecting_trials_are_pending() -> None:
    """Trial limit: with s failures open, K - s pending trials hold the route; each
    trial's failure frees its slot; a success of a request sent since ends the run."""
    h = RouteHealth("a", K, HC, SC, 0.0)
    assert not h.run_held(1.0)
    h.note_outcome(True, 1.05, sent_at=1.0)  # s = 1, the failure took 50 ms
    assert not h.run_held(1.06)
    h.note_sent(1.06)
    assert not h.run_held(1.07)  # one of K - s = 2 pending
    h.note_sent(1.07)
    assert h.run_held(1.08)
    h.note_outcome(True, 1.11, sent_at=1.06)  # s = 2: need 1, and 1.07 is pending
    assert h.run_held(1.12)
    h.note_outcome(False, 1.30, sent_at=1.07)  # it answered: the run is over
    assert h.streak == 0 and not h.run_held(1.31) and not h.run_trials


def test_a_failure_whose_send_time_drifted_still_answers_a_trial() -> None:
    """On a loaded proxy a failure's send time (outcome time minus its measured
    duration) may drift from the router's record of the send by more than
    TRIAL_MATCH_S: it answers the oldest trial, or the route would be held back
    while the failure that should free it already counts in the run."""
    h = RouteHealth("a", K, HC, SC, 0.0)
    h.note_outcome(True, 1.05, sent_at=1.0)  # s = 1
    h.note_sent(1.06)
    h.note_sent(1.07)
    assert h.run_held(1.08)
    h.note_outcome(True, 1.40, sent_at=1.20)  # s = 2; matches no trial within 20 ms
    assert h.run_trials == [1.07] and h.run_held(1.41)  # one pending of the one needed
    h.note_outcome(True, 1.45, sent_at=0.5)  # sent before the run: answers none
    assert h.run_trials == [1.07]


@pytest.mark.parametrize(
    ("fail_latency", "unheld_after"),
    [(0.05, 0.35), (1.0, 2.25), (10.0, 20.25)],
)
def test_a_trial_unanswered_beyond_twice_the_runs_failure_time_stops_holding(
    fail_latency: float, unheld_after: float,
) -> None:
    """H = 2 x the run's fastest failure + RUN_TRIAL_GRACE_S: a trial still unanswered
    after that is not failing like the run, so a lone failure's hold is short."""
    h = RouteHealth("a", K, HC, SC, 0.0)
    h.note_outcome(True, 10.0 + fail_latency, sent_at=10.0)
    h.note_sent(11.0)
    h.note_sent(11.0)
    assert h.run_held(11.0 + unheld_after - 0.01)
    assert not h.run_held(11.0 + unheld_after + 0.01)


def test_the_fastest_failure_of_the_run_sets_how_long_a_trial_holds() -> None:
    """A killed provider: a stream cut mid-answer fails 0.6 s after it was sent, its
    new requests 5 ms after; a trial then holds the route for 2 x 5 ms + 0.25 s, not
    for 2 x 0.6 s + 0.25 s."""
    h = RouteHealth("a", K, HC, SC, 0.0)
    h.note_outcome(True, 6.1, sent_at=5.5)  # s = 1, the cut stream
    h.note_outcome(True, 6.105, sent_at=6.1)  # s = 2, a new request: 5 ms
    h.note_sent(6.11)
    assert h.run_held(6.11 + 0.25)
    assert not h.run_held(6.11 + 0.27)


def test_a_slice_confined_cluster_run_and_an_open_circuit_hold_nothing() -> None:
    h = RouteHealth("a", K, HC, SC, 0.0)
    h.note_outcome(True, 1.0, sent_at=0.99, part="long")
    h.note_outcome(False, 1.01, sent_at=0.5, part="short")  # another slice answers
    h.note_sent(1.02)
    h.note_sent(1.02)
    assert h.run_confined and not h.run_held(1.03)
    h2 = RouteHealth("a", K, HC, SC, 0.0)
    for t in (1.0, 1.1, 1.2):
        h2.note_outcome(True, t)
    h2.eject(1.2)
    h2.note_sent(1.3)
    assert h2.circuit_open and not h2.run_held(1.3) and not h2.run_trials


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("SFO"), st.floats(0.0, 0.5)), max_size=60))
def test_trials_stay_bounded_and_a_held_route_always_needs_its_trials(
    steps: list[tuple[str, float]],
) -> None:
    """Property: whatever sends (S) and outcomes (F failure, O success) arrive, the kept
    trials stay bounded, and the route is held only while a run is open and has at
    least K - s trials recorded."""
    h = RouteHealth("a", K, HC, SC, 0.0)
    now = 0.0
    for kind, dt in steps:
        now += dt
        if kind == "S":
            h.note_sent(now)
        elif not h.circuit_open:
            h.note_outcome(kind == "F", now, sent_at=max(0.0, now - dt))
        assert len(h.run_trials) <= 64
        if h.run_held(now):
            assert h.streak > 0 and len(h.run_trials) >= h.eject_threshold() - h.streak


@pytest.mark.parametrize("start", [S.HEALTHY, S.WATCHING, S.DEGRADED, S.RESTORING, S.RESTRICTED])
def test_fast_ejection_of_the_last_viable_route_restricts_it(start: HealthState) -> None:
    d = Driver(start)
    events = d.send(G.FAST_FAIL, may_quarantine=False)
    assert d.h.state is S.RESTRICTED and d.h.panic
    assert (start is S.RESTRICTED) or events[0].reason.startswith("panic: last viable route")


def _restore_episode(d: Driver) -> tuple[float, float]:
    """Quarantine -> probing -> restoring; (first restoring weight, probe share)."""
    d.send(G.COOLDOWN_OVER)
    share = d.h.probe_share
    for _ in range(HC.probe_successes):
        d.send(G.PROBE_OK)
    assert d.h.state is S.RESTORING
    return d.h.weight, share


def test_relapses_shrink_restore_steps_and_probe_shares_until_forgiven() -> None:
    d = Driver()
    d.send(G.FAST_FAIL)
    w, share = _restore_episode(d)
    firsts, shares = [w], [share]
    for _ in range(3):
        d.send(G.OK)  # one clean window, then the next relapse while restoring
        events = d.send(G.FAST_FAIL)
        assert "relapse" in events[-1].reason
        w, share = _restore_episode(d)
        firsts.append(w)
        shares.append(share)
    assert firsts == pytest.approx([0.25, 0.125, 0.0625, 0.03125])
    assert shares == pytest.approx([HC.probe_share * HC.relapse_factor ** i for i in range(4)])
    assert d.h.relapses == 3
    while d.h.state is not S.HEALTHY:
        d.send(G.OK)
    d.h.tick(d.now + HC.forgive_after_s)
    assert d.h.relapses == 2  # sustained health forgives, one relapse at a time


def test_an_escalation_long_after_a_restore_is_not_a_relapse() -> None:
    d = Driver()
    d.send(G.FAST_FAIL)
    _restore_episode(d)
    while d.h.state is not S.HEALTHY:
        d.send(G.OK)
    d.now += HC.forgive_after_s + 1
    events = d.send(G.FAST_FAIL)
    assert "relapse" not in events[-1].reason and d.h.relapses == 0


@FAST
@given(
    start=st.sampled_from([S.HEALTHY, S.WATCHING, S.DEGRADED, S.RESTRICTED, S.RESTORING]),
    signals=st.lists(st.sampled_from([*WINDOW_SIGNALS, G.FAST_FAIL]), max_size=40),
)
def test_the_last_viable_route_is_never_quarantined(
    start: HealthState, signals: list[Signal]
) -> None:
    d = Driver(start)
    for sig in signals:
        d.send(sig, may_quarantine=False)
        assert not d.h.circuit_open, (sig, d.h.state)


@pytest.mark.parametrize(
    ("outcomes", "state"),
    [
        ("FFF", S.QUARANTINED),  # hard outage: nothing but failures since the first one
        ("O" * 60 + "FFF", S.QUARANTINED),  # healthy, then hard down
        ("F" + "O" * 40 + "FFF", S.QUARANTINED),  # 4 of 44: a run of 3 is not chance
        ("FOFOOFOOFOFOOOFOFOOFFOOFFFFF", S.RESTRICTED),  # ~40 % failing: runs are chance
    ],
)
def test_partial_failure_runs_restrict_not_eject(outcomes: str, state: HealthState) -> None:
    """A run of hard failures that is expected on a partly failing route restricts it
    (kept while others lack headroom); a hard outage is ejected as before."""
    h = RouteHealth("a", K, HC, SC, 0.0)
    now, events = 0.0, []
    for o in outcomes:
        now += 0.1
        if h.note_outcome(o == "F", now, now - 0.05):
            events = h.eject(now)
    assert h.state is state and len(events) == 1
