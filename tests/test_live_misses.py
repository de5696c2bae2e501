"""Live misses (sidecar.core.live_misses): books, the binomial threshold, and the router
keeping a route that misses its budget now out of the slice while another can serve."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from conftest import base_config_dict
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.binomial import _threshold_by_logs, binomial_threshold
from sidecar.core.config import Config, parse_config
from sidecar.core.live_book import LiveEntry
from sidecar.core.live_misses import ALPHA, EPISODE_GAP, LiveMisses
from sidecar.core.router import Router
from sidecar.core.types import Observation, RequestInfo, SliceKey

STREAM = SliceKey("m", "interactive", "short", True)  # TTFT, 1 s budget, p95
WHOLE = SliceKey("m", "agentic", "short", False)  # end to end, 8 s budget, p95


def make_config(**health: Any) -> Config:
    return parse_config(base_config_dict(health=health), "t.yaml")


def ok(cluster: str, slice: SliceKey, latency_s: float, outcome: str = "ok") -> Observation:
    return Observation(cluster, slice, outcome, 200 if outcome == "ok" else None,
                       ttft_s=latency_s, e2e_s=latency_s)


def tail(m: int, p: float, k: int) -> float:
    """P(X >= k), X ~ Binomial(m, p), summed exactly."""
    return sum(math.comb(m, i) * p**i * (1 - p) ** (m - i) for i in range(k, m + 1))


# ------------------------------------------------------------------ threshold


@pytest.mark.parametrize(("m", "p", "expected"), [
    (0, 0.05, 1),
    (2, 0.05, 2),  # two late of two: 0.25 % at a 5 % share
    (20, 0.05, 5),  # four of twenty is 1.6 %: not yet
    (100, 0.05, 12),
    (5, 0.5, 6),  # even five of five is 3 % at a 50 % share: never
])
def test_threshold_values(m: int, p: float, expected: int) -> None:
    assert binomial_threshold(m, p, ALPHA) == expected


@given(st.integers(0, 300), st.sampled_from([0.001, 0.01, 0.05, 0.1, 0.3]))
def test_threshold_is_the_least_unlikely_count(m: int, p: float) -> None:
    t = binomial_threshold(m, p, ALPHA)
    if t <= m:
        assert tail(m, p, t) < ALPHA * (1 + 1e-9)  # a tie at ALPHA may round either way
    if t >= 1:
        assert tail(m, p, t - 1) >= ALPHA * (1 - 1e-9)


@given(st.integers(0, 400), st.sampled_from([0.01, 0.05, 0.2]))
def test_threshold_grows_with_evidence(m: int, p: float) -> None:
    """More outcomes never make fewer misses enough (monotone in evidence)."""
    assert binomial_threshold(m + 1, p, ALPHA) >= binomial_threshold(m, p, ALPHA)


@pytest.mark.parametrize(("m", "p"), [(50, 0.05), (400, 0.01), (1000, 0.05)])
def test_the_log_sum_agrees(m: int, p: float) -> None:
    assert _threshold_by_logs(m, p, ALPHA) == binomial_threshold(m, p, ALPHA)


def test_huge_counts_do_not_underflow() -> None:
    t = binomial_threshold(40000, 0.05, ALPHA)
    assert 2000 < t < 2200  # mean 2000, sd ~44


# ------------------------------------------------------------------ books


def test_a_watched_request_past_its_budget_is_a_miss_at_the_budget() -> None:
    live = LiveMisses(make_config())
    late = [live.sent("a", WHOLE, 0.0, timed=False) for _ in range(3)]
    assert all(e is not None and e.watched for e in late)  # end to end: every close is seen
    assert not live.missing("a", WHOLE, 7.9)
    assert live.missing("a", WHOLE, 8.0)  # three of three late: known without an answer
    book = live.books[("a", WHOLE)]
    assert (book.k, book.m) == (3, 3)


def test_an_answer_in_time_waits_for_its_outcome() -> None:
    live = LiveMisses(make_config())
    e = live.sent("a", WHOLE, 0.0, timed=False)
    assert e is not None
    LiveMisses.closed(e, 2.0)
    assert not live.missing("a", WHOLE, 9.0)
    assert live.books[("a", WHOLE)].m == 0  # closed in time: the outcome decides
    live.observed(e, ok("a", WHOLE, 2.0, "error"), 9.0)
    assert live.books[("a", WHOLE)].m == 0  # an error resolves nothing


def test_an_untimed_stream_counts_only_with_its_outcome() -> None:
    live = LiveMisses(make_config())
    entries = [live.sent("a", STREAM, 0.0, timed=False) for _ in range(3)]
    assert all(e is not None and not e.watched for e in entries)
    assert not live.missing("a", STREAM, 5.0)  # its first token may well have come
    for e in entries:
        assert e is not None
        live.observed(e, ok("a", STREAM, 3.0), 6.0)
    assert live.missing("a", STREAM, 6.0)


def test_a_timed_stream_is_judged_at_its_budget_by_its_first_token() -> None:
    live = LiveMisses(make_config())
    on_time = live.sent("a", STREAM, 0.0, timed=True)
    late = [live.sent("a", STREAM, 0.0, timed=True) for _ in range(2)]
    assert on_time is not None
    LiveMisses.first_token(on_time, 0.4)
    LiveMisses.closed(on_time, 0.5)  # a stream's close is not its first token
    assert live.missing("a", STREAM, 1.0)
    assert live.books[("a", STREAM)].k == 2
    for e in late:
        assert e is not None
        live.observed(e, ok("a", STREAM, 2.0), 3.0)  # already counted: once
    assert live.books[("a", STREAM)].k == 2


def test_an_observer_that_read_no_token_unwatches() -> None:
    live = LiveMisses(make_config())
    e = live.sent("a", STREAM, 0.0, timed=True)
    assert e is not None
    LiveMisses.unwatch(e)
    live.missing("a", STREAM, 5.0)
    assert live.books[("a", STREAM)].m == 0


@pytest.mark.parametrize(("outcome", "waited", "counted"), [
    ("timeout", 9.0, (1, 1)),  # waited past the budget: a miss
    ("cancel", 9.0, (1, 1)),
    ("cancel", 2.0, (0, 0)),  # a user pressing stop says nothing
    ("ok", 2.0, (0, 1)),
    ("ok", 9.0, (1, 1)),
])
def test_outcomes(outcome: str, waited: float, counted: tuple[int, int]) -> None:
    live = LiveMisses(make_config())
    e = live.sent("a", WHOLE, 0.0, timed=False)
    assert e is not None
    LiveMisses.closed(e, 0.1)  # closed early: only the outcome counts
    live.observed(e, ok("a", WHOLE, waited, outcome), 10.0)
    book = live.books[("a", WHOLE)]
    assert (book.k, book.m) == counted


@pytest.mark.parametrize(("slice_", "timed", "answer", "counted"), [
    (WHOLE, False, 2.0, (0, 1)),  # watched, closed in time: its hit counts
    (WHOLE, False, None, (0, 0)),  # not answered yet, no outcome coming: nothing
    (STREAM, False, None, (0, 0)),  # unwatched: only an outcome could say
    (STREAM, True, 0.5, (0, 1)),  # a timed stream's first token in time
])
def test_an_outcome_that_never_comes(slice_: SliceKey, timed: bool, answer: float | None,
                                      counted: tuple[int, int]) -> None:
    live = LiveMisses(make_config())
    e = live.sent("a", slice_, 0.0, timed=timed)
    assert e is not None
    if answer is not None:
        LiveMisses.first_token(e, answer)
        LiveMisses.closed(e, answer)
    live.unobserved(e, 0.6)
    live.unobserved(e, 0.7)  # once
    book = live.books[("a", slice_)]
    assert (book.k, book.m) == counted


@pytest.mark.parametrize(("outcome", "waited", "counted"), [
    ("ok", 0.5, (0, 1)),
    ("ok", 1.5, (1, 1)),  # the stream's first token after its 1 s budget
    ("timeout", 30.0, (1, 1)),
    ("cancel", 0.3, (0, 0)),
    ("error", 0.1, (0, 0)),  # errors have their own rules
])
def test_a_native_outcome_resolves_at_once(outcome: str, waited: float,
                                           counted: tuple[int, int]) -> None:
    """Native mode: no send, no entry; the log entry's outcome is the whole evidence."""
    live = LiveMisses(make_config())
    live.outcome(ok("a", STREAM, waited, outcome), 5.0)
    book = live.books[("a", STREAM)]
    assert (book.k, book.m) == counted


def test_a_batch_of_native_successes_is_one_note() -> None:
    """``outcomes_ok`` reads the class metric of each sample (TTFT here; the first
    item) and skips samples without it; the book is as if each came alone."""
    batched, single = LiveMisses(make_config()), LiveMisses(make_config())
    samples = [(0.2, 0.01, 3.0, 50), (1.4, 0.01, 4.0, 50), (None, None, 2.0, 50),
               (2.5, 0.02, 6.0, 80)]
    batched.outcomes_ok("a", STREAM, samples, 5.0)
    for ttft, tpot, e2e, n in samples:
        single.outcome(Observation("a", STREAM, "ok", 200, ttft, tpot, e2e, n), 5.0)
    b, s1 = batched.books[("a", STREAM)], single.books[("a", STREAM)]
    assert (b.k, b.m) == (s1.k, s1.m) == (2, 3)
    assert batched.missing("a", STREAM, 5.0) == single.missing("a", STREAM, 5.0) is True
    assert not batched.missing("a", STREAM, 15.1)  # aged out together


def test_watched_misses_are_not_diluted_by_older_streams_ending() -> None:
    """A streaming TTFT route turns slow: the streams sent before it did keep ending
    (hits, resolved at their outcome), and among them two watched requests miss at the
    budget. Two misses of 42 are chance at a 5 % share; two of the two watched are not."""
    live = LiveMisses(make_config())
    for _ in range(40):
        e = live.sent("a", STREAM, 0.0, timed=False)
        assert e is not None
        live.observed(e, ok("a", STREAM, 0.4), 6.0)
    for _ in range(2):
        live.sent("a", STREAM, 5.0, timed=True)  # no first token by 6.0
    book = live.books[("a", STREAM)]
    assert not live.missing("a", STREAM, 5.9)
    assert live.missing("a", STREAM, 6.1)
    assert (book.k, book.m, book.wk, book.wm) == (2, 42, 2, 2)
    assert live.threshold(0.05, 42) > 2  # the whole book alone would not say so


def test_watched_hits_count_against_watched_misses() -> None:
    """Ten watched requests whose first token came in time (hits once their outcome
    comes) and two that missed: 2 of 12 at a 5 % share is chance (12 % likely)."""
    live = LiveMisses(make_config())
    for _ in range(10):
        e = live.sent("a", STREAM, 0.0, timed=True)
        assert e is not None
        LiveMisses.first_token(e, 0.3)
        live.observed(e, ok("a", STREAM, 0.3), 4.0)
    for _ in range(2):
        live.sent("a", STREAM, 4.0, timed=True)
    assert not live.missing("a", STREAM, 5.1)
    book = live.books[("a", STREAM)]
    assert (book.wk, book.wm) == (2, 12)


def test_a_timed_stream_in_time_is_a_hit_at_its_budget() -> None:
    """Its first token came in time: a hit at the budget, as a miss would be, not when
    its stream ends seconds later (and once: its outcome adds nothing)."""
    live = LiveMisses(make_config())
    e = live.sent("a", STREAM, 0.0, timed=True)
    assert e is not None
    LiveMisses.first_token(e, 0.3)
    assert not live.missing("a", STREAM, 1.1)
    book = live.books[("a", STREAM)]
    assert (book.k, book.m, book.wk, book.wm) == (0, 1, 0, 1)
    live.observed(e, ok("a", STREAM, 0.3), 6.0)
    assert (book.k, book.m, book.wk, book.wm) == (0, 1, 0, 1)


def test_watched_hits_date_from_their_budget_not_their_streams_end() -> None:
    """The route turns slow at 11 s: both watched streams sent since miss. The two
    watched before it got their first token in time at 0.3 s and stream until 12 s:
    hits of the route as it was 11 s ago, out of the 10 s horizon by then. Dated at
    their streams' end they were still in it, and 2 misses of 4 watched (1.4 % at a
    5 % share) were chance."""
    live = LiveMisses(make_config(live_horizon_s=10))
    before = [live.sent("a", STREAM, 0.0, timed=True) for _ in range(2)]
    for e in before:
        assert e is not None
        LiveMisses.first_token(e, 0.3)
    assert not live.missing("a", STREAM, 1.5)  # a decision after their budget
    for t in (11.0, 11.5):
        live.sent("a", STREAM, t, timed=True)  # no first token by the budget
    for e in before:
        assert e is not None
        live.observed(e, ok("a", STREAM, 0.3), 12.0)  # the long streams end
    assert live.missing("a", STREAM, 12.6)
    book = live.books[("a", STREAM)]
    assert (book.wk, book.wm) == (2, 2)


def test_misses_age_out_of_the_horizon() -> None:
    live = LiveMisses(make_config(live_horizon_s=10))
    for _ in range(3):
        live.sent("a", WHOLE, 0.0, timed=False)
    assert live.missing("a", WHOLE, 8.0)
    assert live.missing("a", WHOLE, 17.9)
    assert not live.missing("a", WHOLE, 18.1)


@pytest.mark.parametrize("slice_, health", [
    (SliceKey("m", "nosuch", "short", True), {}),
    (STREAM, {"live_horizon_s": 0}),
])
def test_untracked(slice_: SliceKey, health: dict[str, Any]) -> None:
    live = LiveMisses(make_config(**health))
    assert live.sent("a", slice_, 0.0, timed=True) is None
    assert not live.missing("a", slice_, 100.0)


def test_a_tpot_class_is_not_tracked() -> None:
    data = base_config_dict()
    data["classes"] = {"tpot": {"slo": {"metric": "tpot", "percentile": 95,
                                        "budget_ms": 50, "timeout_ms": 30000}}}
    live = LiveMisses(parse_config(data, "t.yaml"))
    assert live.sent("a", SliceKey("m", "tpot", "short", True), 0.0, timed=True) is None


def test_a_lab_entry_reads_its_answer_time() -> None:
    class Known(LiveEntry):
        __slots__ = ()

        def answer_at(self) -> float | None:
            return 0.5  # the lab knows it ahead; the book reads it after the budget

    live = LiveMisses(make_config())
    for _ in range(4):
        live.sent("a", WHOLE, 0.0, timed=False, make=Known)
    assert not live.missing("a", WHOLE, 9.0)


@given(st.lists(st.tuples(st.booleans(), st.floats(0, 30),
                          st.lists(st.floats(0.0, 5.0), max_size=8)), max_size=60))
def test_counts_stay_consistent(events: list[tuple[bool, float, list[float]]]) -> None:
    """Whatever arrives in whatever order -- sent requests, and batches of native
    successes -- ``0 <= k <= m`` and both equal the recent list's sums."""
    live = LiveMisses(make_config())
    now = 0.0
    for late, dt, batch in events:
        now += dt / 10
        e = live.sent("a", WHOLE, now, timed=False)
        assert e is not None
        if not late:
            LiveMisses.closed(e, now + 1.0)
        live.outcomes_ok("a", WHOLE, [(None, None, x, None) for x in batch], now)
        live.missing("a", WHOLE, now)
    book = live.books.get(("a", WHOLE))
    if book is not None:
        assert 0 <= book.k <= book.m == sum(m for _, m, _, _ in book.recent)
        assert book.k == sum(k for _, _, k, _ in book.recent)
        assert 0 <= book.wk <= book.wm <= book.m and book.wk <= book.k
        assert book.wm == sum(m for _, m, _, w in book.recent if w)


# ------------------------------------------------------------------ repeat offenders


def miss_at(live: LiveMisses, cluster: str, t: float) -> bool:
    """Three unanswered end-to-end requests sent at ``t - 8`` (the 8 s budget passes
    at ``t``): the route is missing at ``t``, a verdict that may begin an episode."""
    for _ in range(3):
        live.sent(cluster, WHOLE, t - 8.0, timed=False)
    return live.missing(cluster, WHOLE, t)


@pytest.mark.parametrize(("verdicts", "at", "expected"), [
    ([], 100.0, {}),
    ([10.0], 100.0, {}),  # one episode: a lone spike costs nothing
    ([10.0, 12.0, 25.0], 100.0, {}),  # verdicts seconds apart: one episode
    ([10.0, 100.0], 110.0, {"a": 0.5}),  # a second episode halves its weight
    ([10.0, 100.0, 250.0], 260.0, {"a": 0.25}),
    ([10.0, 100.0], 615.0, {}),  # the first episode is forgiven after 600 s
    ([10.0, 100.0, 250.0], 615.0, {"a": 0.5}),  # ... one at a time
])
def test_episodes_make_a_repeat_offender(verdicts: list[float], at: float,
                                         expected: dict[str, float]) -> None:
    live = LiveMisses(make_config())
    for t in verdicts:
        assert miss_at(live, "a", t)
    assert live.recurrence(("a", "b"), WHOLE, at) == expected


def test_an_episode_lasts_while_verdicts_come_within_the_gap() -> None:
    """Within an episode the verdict comes and goes as misses age out of the horizon
    and fresh requests miss again; only a quiet gap longer than EPISODE_GAP horizons
    separates two episodes."""
    live = LiveMisses(make_config(live_horizon_s=10))
    gap = EPISODE_GAP * 10
    assert miss_at(live, "a", 10.0)
    assert miss_at(live, "a", 10.0 + gap - 1)  # same episode
    assert live.recurrence(("a",), WHOLE, 50.0) == {}
    assert miss_at(live, "a", 10.0 + 2 * gap)  # quiet for more than the gap: a new one
    assert live.recurrence(("a",), WHOLE, 60.0) == {"a": 0.5}


def test_the_factor_is_the_configured_relapse_factor() -> None:
    live = LiveMisses(make_config(relapse_factor=0.8))
    for t in (10.0, 100.0, 200.0):
        miss_at(live, "a", t)
    assert live.recurrence(("a",), WHOLE, 210.0) == {"a": pytest.approx(0.64)}


@given(st.lists(st.floats(0.0, 200.0), max_size=30), st.floats(0.0, 2000.0))
def test_recurrence_is_bounded_and_monotone_in_episodes(gaps: list[float],
                                                        later: float) -> None:
    """Whatever the verdicts' timing: the factor is ``relapse_factor ** (n - 1)`` for
    ``n`` remembered episodes, in (0, 1) when listed (so it scales a route, never
    removes it), and one more episode never raises it."""
    live = LiveMisses(make_config())
    t = 10.0
    for g in gaps:
        t += g
        before = live.recurrence(("a",), WHOLE, t).get("a", 1.0)
        miss_at(live, "a", t)
        after = live.recurrence(("a",), WHOLE, t).get("a", 1.0)
        assert 0.0 < after <= before <= 1.0
    book = live.books.get(("a", WHOLE))
    factor = live.recurrence(("a",), WHOLE, t + later).get("a", 1.0)
    n = len(book.episodes) if book is not None else 0
    assert factor == (0.5 ** (n - 1) if n > 1 else 1.0)


# ------------------------------------------------------------------ the router


def request(slice_: SliceKey, rid: str) -> RequestInfo:
    return RequestInfo(api="chat", model="m", stream=slice_.streaming is True, max_tokens=None,
                       input_tokens=10, klass=slice_.klass, priority=5, tenant=None,
                       slice=slice_, request_id=rid)


def test_the_router_keeps_a_missing_route_out_while_another_serves() -> None:
    router = Router(make_config())
    rng = random.Random(3)
    for _ in range(3):
        router.live.sent("a", WHOLE, 0.0, timed=False)
    chosen = {router.decide(request(WHOLE, f"r{i}"), 9.0, rng).cluster for i in range(200)}
    assert "a" not in chosen and chosen == {"b", "c"}
    assert router.counters[("live_missing", "a")] == 200


def test_the_last_route_serves_even_when_missing() -> None:
    """Never leaves a class without a route: soft, like the failure run's hold."""
    router = Router(make_config())
    rng = random.Random(3)
    for c in ("a", "b", "c"):
        for _ in range(3):
            router.live.sent(c, WHOLE, 0.0, timed=False)
    d = router.decide(request(WHOLE, "r"), 9.0, rng)
    assert d.cluster in ("a", "b", "c") and d.reason != "no_candidate"
    assert d.admission == "admit"


def test_a_reload_starts_the_books_afresh() -> None:
    router = Router(make_config())
    old = [router.live.sent("a", WHOLE, 0.0, timed=False) for _ in range(3)]
    router.reload(make_config(live_horizon_s=20))
    assert not router.live.missing("a", WHOLE, 9.0)
    for e in old:  # requests sent before the reload still resolve, in the old book
        assert e is not None
        router.live.observed(e, ok("a", WHOLE, 9.0), 9.5)
    assert not router.live.suspects  # ... and leave the new books alone


@pytest.mark.parametrize(("edit", "factor"), [
    ({}, 0.5),  # the same file (a SIGHUP)
    ({"clusters": [{"name": "a", "address": "127.0.0.1:9001", "models": ["m"],
                    "max_concurrency": 7},
                   {"name": "b", "address": "127.0.0.1:9002", "models": ["m"]},
                   {"name": "c", "address": "127.0.0.1:9003", "models": ["m"]}]}, 0.5),
    ({"health": {"live_horizon_s": 20}}, 0.5),  # the books' outcomes restart; not the memory
    ({"health": {"relapse_factor": 0.8}}, 0.8),  # remembered episodes, the new factor
])
def test_a_reload_keeps_the_repeat_offender_memory(edit: dict[str, Any],
                                                   factor: float) -> None:
    """A reload of any field made new books and forgot every route's episodes: a route
    that had missed its budget twice in ten minutes got its full share back."""
    router = Router(make_config())
    for t in (10.0, 100.0):
        assert miss_at(router.live, "a", t)
    assert router.live.recurrence(("a", "b"), WHOLE, 110.0) == {"a": 0.5}
    router.reload(parse_config(base_config_dict(**edit), "t.yaml"))
    assert router.live.recurrence(("a", "b"), WHOLE, 110.0) == {"a": pytest.approx(factor)}


def test_an_episode_under_way_at_a_reload_stays_one_episode() -> None:
    router = Router(make_config())
    assert miss_at(router.live, "a", 10.0)
    router.reload(make_config())
    assert miss_at(router.live, "a", 15.0)  # still missing, seconds later: the same one
    assert router.live.recurrence(("a",), WHOLE, 20.0) == {}


def test_a_reload_forgets_the_episodes_of_a_cluster_it_removes() -> None:
    router = Router(make_config())
    for t in (10.0, 100.0):
        assert miss_at(router.live, "a", t)
    data = base_config_dict(default_cluster="b")
    data["clusters"] = data["clusters"][1:]
    data["models"][0]["candidates"] = ["b", "c"]
    router.reload(parse_config(data, "t.yaml"))
    assert ("a", WHOLE) not in router.live.books


def test_the_router_scales_a_repeat_offender() -> None:
    """Two episodes of missing its budget within ``forgive_after_s``: once its misses
    aged out, the route is back in the plan, its weight halved (the ``recurrence``
    score, shown by the explain)."""
    router = Router(make_config())
    rng = random.Random(3)
    for t in (10.0, 100.0):
        assert miss_at(router.live, "a", t)
    req = RequestInfo(api="chat", model="m", stream=False, max_tokens=None, input_tokens=10,
                      klass="agentic", priority=5, tenant=None, slice=WHOLE,
                      request_id="x", explain=True)
    d = router.decide(req, 130.0, rng)
    assert d.explain is not None
    by = {c.cluster: c for c in d.explain.candidates}
    assert by["a"].scores["recurrence"] == 0.5
    assert "recurrence" not in by["b"].scores and "recurrence" not in by["c"].scores
    assert by["a"].verdicts.get("live_misses") in (None, "pass")  # back in the plan


def test_state_shows_the_book_and_the_memory_without_judging() -> None:
    """``/state``'s ``live`` per route: the horizon's misses and outcomes, whether they
    make it missing, its episodes and factor; reading it begins no episode."""
    router = Router(make_config())
    for t in (10.0, 100.0):
        miss_at(router.live, "a", t)
    for _ in range(3):
        router.live.sent("a", WHOLE, 150.0, timed=False)  # misses at 158, not yet judged
    shown = router.live.summary("a", WHOLE, 158.5)
    assert shown == {"misses": 3, "outcomes": 3, "watched_misses": 3, "watched_outcomes": 3,
                     "missing": True, "episodes": 2, "recurrence": 0.5}
    assert len(router.live.books[("a", WHOLE)].episodes) == 2  # no third episode from a read
    assert router.live.summary("b", WHOLE, 158.5) is None
    assert router.live.summary("a", WHOLE, 800.0) == {
        "misses": 0, "outcomes": 0, "watched_misses": 0, "watched_outcomes": 0,
        "missing": False, "episodes": 0, "recurrence": 1.0}
