"""A cancel whose first token was measured keeps its TTFT as evidence.

The OpenAI SDK's default client never asks for usage and closes at ``data: [DONE]``;
when the provider ends its body a little later, Envoy logs the complete answer as a
cancel. Its first body byte came all the same: that TTFT is a measurement (not a lower
bound), while its e2e and TPOT are unknown. These tables follow such an entry from the
access log (envoy_log) through the router's judgement (judging) into the statistics,
and check what each consumer of the statistics makes of it.
"""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.core.buckets import Buckets
from sidecar.core.config import Config, parse_config
from sidecar.core.envoy_log import LogRecord, at_callers_deadline, observation_from_log
from sidecar.core.fleet_share import live_subwindows
from sidecar.core.health import HealthState
from sidecar.core.judging import judge_censored, within_budget
from sidecar.core.router import Router
from sidecar.core.series_snapshot import series_from_dict, series_to_dict
from sidecar.core.subwindow import NO_VALUE, latency_indices
from sidecar.core.types import Observation, SliceKey
from sidecar.fleet.codec import add, decode_sub, diff, encode_sub

S = SliceKey("m", "interactive", "short", True)  # a TTFT class, 500 ms
E = SliceKey("m", "batch", "short", True)  # an e2e class, 2 s
DC = frozenset({"downstream_remote_reset"})
GEOMETRY = Buckets(0.02)


def _config(**extra: Any) -> Config:
    return parse_config({
        "default_cluster": "a",
        "clusters": [{"name": n, "address": f"127.0.0.1:{9001 + i}", "models": ["m"]}
                     for i, n in enumerate("ab")],
        "models": [{"name": "m", "candidates": ["a", "b"]}],
        "classes": {
            "interactive": {"slo": {"metric": "ttft", "percentile": 95, "budget_ms": 500}},
            "batch": {"slo": {"metric": "e2e", "percentile": 95, "budget_ms": 2000}},
        },
        "stats": {"min_samples": 5},
        **extra,
    }, "cancel.yaml")


def _left(first_body_s: float | None, waited_s: float = 0.4, status: int = 200,
          flags: frozenset[str] = DC) -> LogRecord:
    """An entry of a stream its client left ``waited_s`` after t0 (0.1 s in)."""
    return LogRecord(status=status, flags=flags, duration_s=0.1 + waited_s,
                     upstream_tx_s=0.1, first_body_s=first_body_s)


# ------------------------------------------------------------------ the access log


@pytest.mark.parametrize(("rec", "kw", "ttft", "measured"), [
    # The first body byte came: plus the route's offset, a measurement.
    (_left(0.05), {}, 0.05, True),
    (_left(0.05), {"ttft_offset_s": 0.01}, 0.06, True),
    # This very request was timed at its first token (a sampled stream).
    (_left(0.05), {"first_token_s": 0.07}, 0.07, True),
    # A blind route: its median offset is no guide, unless this request was timed.
    (_left(0.05), {"ttft_from_log": False}, 0.05, False),
    (_left(0.05), {"ttft_from_log": False, "first_token_s": 0.07}, 0.07, True),
    # Its events were read and none was a token: it waited its whole wait.
    (_left(0.05), {"tokenless": True}, 0.4, False),
    # No body byte before the client left: the wait, a lower bound.
    (_left(None), {}, 0.4, False),
    (_left(None, status=0), {}, 0.4, False),
    # The offset puts the token after the client left: it never came.
    (_left(0.35), {"ttft_offset_s": 0.1}, 0.45, False),
])
def test_a_cancel_says_whether_its_ttft_is_measured(rec: LogRecord, kw: dict[str, Any],
                                                    ttft: float, measured: bool) -> None:
    obs = observation_from_log(rec, "a", S, streaming=True, **kw)
    assert obs is not None and obs.outcome == "cancel" and obs.censored
    assert obs.ttft_s == pytest.approx(ttft) and obs.e2e_s == pytest.approx(0.4)
    assert obs.ttft_measured is measured and obs.tpot_s is None


def test_an_unstreamed_cancel_has_no_ttft_to_measure() -> None:
    obs = observation_from_log(_left(0.05), "a", S._replace(streaming=False), streaming=False)
    assert obs is not None and obs.ttft_s is None and not obs.ttft_measured


def test_a_cancel_at_the_callers_deadline_keeps_its_measured_first_token() -> None:
    # Envoy logs the status its client got: the stream's 200 went out before the timeout.
    rec = _left(0.05, flags=frozenset({"upstream_request_timeout"}), status=200)
    obs = observation_from_log(rec, "a", S, streaming=True)
    assert obs is not None and obs.outcome == "timeout" and obs.ttft_measured
    judged = at_callers_deadline(rec, obs, 300.0, 30_000.0)
    assert judged.outcome == "cancel" and judged.ttft_measured
    # An upstream's own 504 (a gateway's): its body is the error, no first token.
    rec = _left(0.05, flags=frozenset({"upstream_request_timeout"}), status=504)
    obs = observation_from_log(rec, "a", S, streaming=True)
    assert obs is not None and not obs.ttft_measured


# ------------------------------------------------------------------ the judgement

CONFIG = _config()


@pytest.mark.parametrize(("slice", "ttft", "e2e", "measured", "outcome", "kept"), [
    # A TTFT class: the first token within the budget stays a sample.
    (S, 0.05, 0.4, True, "cancel", 0.05),
    (S, 0.05, 3.0, True, "cancel", 0.05),  # the answer went on long after: no matter
    # ... and past it is a timeout, as before.
    (S, 0.6, 0.9, True, "timeout", 0.6),
    # Without a measured first token, unchanged: a timeout past the budget, else nothing.
    (S, 0.4, 0.4, False, "cancel", None),
    (S, 0.6, 0.6, False, "timeout", 0.6),
    # An e2e class: judged on the wait, the measured first token kept within it.
    (E, 0.05, 0.4, True, "cancel", 0.05),
    (E, 0.05, 2.5, True, "timeout", 0.05),
    (E, 0.05, 0.4, False, "cancel", None),
])
def test_judging_a_cancel(slice: SliceKey, ttft: float, e2e: float, measured: bool,
                          outcome: str, kept: float | None) -> None:
    obs = Observation("a", slice, "cancel", ttft_s=ttft, e2e_s=e2e, censored=True,
                      ttft_measured=measured)
    judged = judge_censored(CONFIG, obs)
    assert judged.outcome == outcome and judged.ttft_s == kept
    if outcome == "cancel":
        assert not judged.censored and judged.e2e_s is None and judged.tpot_s is None
        sample = latency_indices(judged, GEOMETRY)
        assert (sample is not None) is (kept is not None)
        if sample is not None:
            assert sample == (GEOMETRY.index_of(kept or 0.0), NO_VALUE, NO_VALUE)
    else:
        assert judged.censored and latency_indices(judged, GEOMETRY) is None


@pytest.mark.parametrize("obs", [
    # Not judged (still censored): no sample, whatever it says.
    Observation("a", S, "cancel", ttft_s=0.05, e2e_s=0.4, censored=True, ttft_measured=True),
    # A retry: latency evidence comes from first attempts only, as for ok.
    Observation("a", S, "cancel", ttft_s=0.05, is_retry=True, ttft_measured=True),
    # A timeout is a failure, never a sample, measured first token or not.
    Observation("a", S, "timeout", ttft_s=0.05, e2e_s=9.0, censored=True, ttft_measured=True),
])
def test_only_judged_first_attempt_cancels_give_a_sample(obs: Observation) -> None:
    assert latency_indices(obs, GEOMETRY) is None


# ------------------------------------------------------------------ the router


def _cancelled(cluster: str, ttft: float, **kw: Any) -> Observation:
    """A complete answer its client left at [DONE], as the access log gives it."""
    return Observation(cluster, S, "cancel", ttft_s=ttft, e2e_s=ttft + 0.3, censored=True,
                       ttft_measured=True, **kw)


def test_a_route_answering_clients_that_leave_at_done_has_ttft_evidence() -> None:
    router = Router(_config())
    for i in range(8):
        router.observe(_cancelled("a", 0.1 + 0.01 * i), 1.0 + 0.1 * i)
    router.observe(_cancelled("a", 0.9), 2.0)  # slow: a timeout
    assert router.counters[("outcome", "cancel")] == 8
    assert router.counters[("outcome", "timeout")] == 1
    assert router.counters[("outcome", "ok")] == 0
    rs = router.stats.series("a", S)
    assert rs is not None and rs.count("ttft", 2.0) == 8 and rs.count("e2e", 2.0) == 0
    median = rs.quantile("ttft", 0.5, 2.0)
    assert median is not None and 0.1 <= median <= 0.18
    ev = router.stats.evidence("a", S, "ttft", 2.0, 0.0)
    # The answers that came by their first token count as such: 8 of 9, not 0 of 1.
    assert ev is not None and ev.p_ok == pytest.approx(8 / 9)
    e2e = rs.evidence("e2e", 2.0, 0.0)  # the series alone, no broader slice blended in
    assert e2e is not None and (e2e.ok, e2e.requests) == (0, 1)  # their end: unknown


def test_a_retry_or_an_unmeasured_cancel_gives_no_evidence() -> None:
    router = Router(_config())
    router.observe(_cancelled("a", 0.1, is_retry=True), 1.0)
    router.observe(Observation("a", S, "cancel", ttft_s=0.1, e2e_s=0.1, censored=True), 1.0)
    rs = router.stats.series("a", S)
    assert rs is not None and rs.count("ttft", 1.0) == 0 and rs.requests(1.0) == 0
    assert router.counters[("outcome", "cancel")] == 2


def test_a_measured_cancel_under_light_load_is_a_met_ttft_budget() -> None:
    router = Router(_config())
    router.observe(_cancelled("a", 0.1, sent_load=0.0), 1.0)
    router.observe(Observation("a", S, "cancel", ttft_s=0.05, e2e_s=0.05, censored=True,
                               sent_load=0.0), 1.0)
    assert router.light.counts("a", S, 1.0) == (0.0, 1.0)
    # On an e2e class its end is unknown: not counted.
    router.observe(Observation("a", E, "cancel", ttft_s=0.05, e2e_s=0.3, censored=True,
                               ttft_measured=True, sent_load=0.0), 1.0)
    assert router.light.counts("a", E, 1.0) == (0.0, 0.0)


def test_a_cancelled_probe_is_still_no_probe_success() -> None:
    router = Router(_config())
    router.board.get("a", S).state = HealthState.PROBING
    results: list[bool] = []

    def record_probe(cluster: str, slice: SliceKey, ok: bool, now: float,
                     sent: float | None = None) -> list[Any]:
        results.append(ok)
        return []

    router.board.record_probe = record_probe  # type: ignore[method-assign]
    router.observe(_cancelled("a", 0.1, is_probe=True), 1.0)
    assert results == []  # the health machine hears nothing of it, as before
    rs = router.stats.series("a", S)
    assert rs is not None and rs.count("ttft", 1.0) == 1  # its first token is evidence


def test_live_misses_take_a_measured_first_token_as_a_hit() -> None:
    router = Router(_config(health={"live_horizon_s": 10}))
    for obs in (_cancelled("a", 0.1), _cancelled("a", 0.9)):
        router.live.outcome(obs, 1.0)
    book = router.live._book("a", S)
    assert book is not None and (book.k, book.m) == (1, 2)  # a miss and a hit


# ------------------------------------------------------------------ sharing and snapshots


def _router_with_firsts() -> Router:
    router = Router(_config())
    router.observe(Observation("a", S, "ok", ttft_s=0.1, e2e_s=0.5), 1.0)
    for _ in range(3):
        router.observe(_cancelled("a", 0.1), 1.0)
    return router


def test_a_snapshot_keeps_the_firsts() -> None:
    rs = _router_with_firsts().stats.series("a", S)
    assert rs is not None
    back = series_from_dict(series_to_dict(rs, 1.0), rs.cfg, 50.0)
    slot = next(s for _, s in back.live(50.0))
    assert (slot.ok, slot.cancel, slot.first, slot.requests) == (1, 3, 3, 4)
    old = series_to_dict(rs, 1.0)
    for sub in old["subwindows"]:
        sub.pop("first", None)  # a snapshot written before the firsts were counted
    slot = next(s for _, s in series_from_dict(old, rs.cfg, 50.0).live(50.0))
    assert (slot.cancel, slot.first) == (3, 0)
    bad = series_to_dict(rs, 1.0)
    bad["subwindows"][0]["first"] = 4  # more than its cancels
    with pytest.raises(ValueError, match="first"):
        series_from_dict(bad, rs.cfg, 50.0)


def test_the_wire_form_carries_the_firsts_beside_the_four_counters() -> None:
    (_, subs), = list(live_subwindows(_router_with_firsts().stats, 1.0))
    raw = encode_sub(subs[0])
    assert b'"c":[1,0,0,3]' in raw and b'"f":3' in raw
    back = decode_sub(raw, subs[0].index, 0.02)
    assert (back.cancel, back.first) == (3, 3)
    assert diff(back, None).first == 3 and add(diff(back, None), back).first == 6
    assert diff(back, back).first == 0
    older = raw.replace(b',"f":3', b"")  # from a replica before the firsts
    assert decode_sub(older, 0, 0.02).first == 0
    with pytest.raises(ValueError):
        decode_sub(raw.replace(b'"f":3', b'"f":4'), 0, 0.02)


def test_the_health_window_counts_them_as_requests_that_did_not_fail() -> None:
    router = Router(_config())
    for i in range(8):
        router.observe(_cancelled("a", 0.1), 1.0 + 0.1 * i)
    router.observe(_cancelled("a", 0.9), 2.0)
    rs = router.stats.series("a", S)
    assert rs is not None
    w = rs.window_summary(rs.cfg.subwindow_s + 1.0, "ttft", 0.95)
    # Before, its requests were the one timeout: a failure rate of 100 %.
    assert (w.samples, w.requests, w.timeouts, w.cancels) == (8, 9, 1, 8)
    assert w.failure_rate == pytest.approx(1 / 9)
    # For e2e their end is unknown: no outcome there (nor a sample).
    rs.span.unjudged = None
    w = rs.window_summary(rs.cfg.subwindow_s + 1.0, "e2e", 0.95)
    assert (w.samples, w.requests, w.timeouts) == (0, 1, 1)


TPOT_CONFIG = parse_config({
    "default_cluster": "a",
    "clusters": [{"name": "a", "address": "127.0.0.1:9001", "models": ["m"]}],
    "models": [{"name": "m", "candidates": ["a"]}],
    "classes": {"chat": {"slo": {"metric": "tpot", "percentile": 95, "budget_ms": 100,
                                 "timeout_ms": 30_000}}},
}, "tpot.yaml")
T = SliceKey("m", "chat", "short", True)


@pytest.mark.parametrize(("ttft", "wait", "measured", "kept"), [
    (0.05, 2.0, True, 0.05),  # a client that left at [DONE] after a 2 s answer
    (0.3, 0.9, True, 0.3),
    (2.0, 2.0, False, None),  # a user who pressed stop before any token
])
def test_a_tpot_class_cancel_is_not_judged_on_its_wait(
        ttft: float, wait: float, measured: bool, kept: float | None) -> None:
    # A TPOT budget is per token (100 ms here): the whole wait of a cancel is no pace,
    # and read against it every answer longer than 100 ms that a client left (the
    # OpenAI SDK's default client at [DONE], unmarked) was a timeout, a hard failure.
    obs = Observation("a", T, "cancel", ttft_s=ttft, e2e_s=wait, censored=True,
                      ttft_measured=measured)
    judged = judge_censored(TPOT_CONFIG, obs)
    assert judged.outcome == "cancel" and judged.ttft_s == kept


def test_a_done_marked_answer_meets_a_tpot_budget_it_cannot_be_timed_against() -> None:
    # Envoy's [DONE] mark makes a client's leave at [DONE] an ok, without usage: no TPOT.
    # A TPOT budget is per token, so the answer's whole e2e is no measure of it; read so,
    # every such answer to a probe failed it (back to quarantine after three) and counted
    # as a miss for queue signs and light load.
    rec = LogRecord(status=200, flags=DC, duration_s=2.1, upstream_tx_s=0.1,
                    first_body_s=0.2, done_s=2.0)
    obs = observation_from_log(rec, "a", T, streaming=True)
    assert obs is not None and obs.outcome == "ok" and obs.tpot_s is None
    assert within_budget(TPOT_CONFIG, obs)
    # ... while a measured TPOT is still judged against it
    slow = Observation("a", T, "ok", 200, 0.2, 0.15, 2.0)
    fast = Observation("a", T, "ok", 200, 0.2, 0.05, 2.0)
    assert not within_budget(TPOT_CONFIG, slow) and within_budget(TPOT_CONFIG, fast)
