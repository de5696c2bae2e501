"""Admission control: the decision table, then the Router driving it with virtual time."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

from sidecar.core.admission import Situation, evaluate
from sidecar.core.config import Config, parse_config
from sidecar.core.health import HealthState
from sidecar.core.router import Router
from sidecar.core.types import Observation, RequestInfo, SliceKey
from sidecar.ops.state import state_json
from tests.conftest import base_config_dict

# ---------------------------------------------------------------- the table

S = Situation
CONTENDED = {"contended": True, "saturated": True}
CAPACITY = {**CONTENDED, "capacity_bound": True, "queue_window_ms": 250.0}


@pytest.mark.parametrize(
    ("situation", "outcome", "reason"),
    [
        (S(), "admit", "ok"),
        (S(enabled=False, **CONTENDED, high=False), "admit", "disabled"),
        # deadline rows
        (S(has_deadline=True, remaining_ms=0, step="optional"), "skip", "deadline_exhausted"),
        (S(has_deadline=True, remaining_ms=0), "reject", "deadline_exhausted"),
        (S(has_deadline=True, remaining_ms=0, step="critical"), "reject", "deadline_exhausted"),
        (S(has_deadline=True, remaining_ms=500, need_tail_ms=900, need_ms=300,
           step="optional"), "skip", "optional_does_not_fit"),
        (S(has_deadline=True, remaining_ms=500, need_tail_ms=900, need_ms=300,
           step="critical"), "admit", "ok"),  # critical: only the median must fit
        (S(has_deadline=True, remaining_ms=500, need_ms=600), "reject", "deadline_unreachable"),
        (S(has_deadline=True, remaining_ms=500, need_ms=None), "admit", "ok"),  # no evidence
        (S(has_deadline=False, remaining_ms=500, need_ms=600), "admit", "ok"),  # no deadline
        # retries
        (S(is_retry=True, retry_blocked=True), "reject", "retry_budget"),
        (S(is_retry=True, retry_blocked=False), "admit", "ok"),
        # overload by priority
        (S(**CONTENDED, step="optional"), "skip", "overload_optional"),
        (S(**CONTENDED, high=False, can_defer=True), "defer", "overload"),
        (S(**CONTENDED, high=False, can_defer=False), "shed", "overload"),
        (S(**CAPACITY), "queue", "capacity"),
        (S(**CAPACITY, queued=True), "queue", "capacity"),
        (S(**CAPACITY, queued=True, wait_expired=True), "admit", "best_effort"),
        (S(**CAPACITY, queue_room=False), "admit", "best_effort"),
        (S(**{**CAPACITY, "queue_window_ms": 0.0}), "admit", "best_effort"),
        (S(**CONTENDED, capacity_bound=False), "admit", "best_effort"),  # over budget only
        # a probe or trial, judged on its one route (over budget by design)
        (S(**CONTENDED, capacity_bound=False, evidence=True), "admit", "evidence"),
        (S(**CONTENDED, evidence=True, high=False), "defer", "overload"),
        (S(**CONTENDED, evidence=True, yields=True), "defer", "yield"),
        (S(evidence=True), "admit", "ok"),
        # beyond capacity: every usable route full once the queue cannot help
        (S(**CAPACITY, full=True, queued=True, wait_expired=True), "defer", "full"),
        (S(**CAPACITY, full=True, queue_room=False, can_defer=False), "shed", "full"),
        (S(**CAPACITY, full=True, queued=True), "queue", "capacity"),  # waiting first
        (S(**CAPACITY, full=True, queued=True, wait_expired=True, shed_full=False),
         "admit", "best_effort"),
        (S(**CONTENDED, full=True, yields=True), "defer", "yield"),
    ],
)
def test_decision_table(situation: Situation, outcome: str, reason: str) -> None:
    rule = evaluate(situation)
    assert (rule.outcome, rule.reason) == (outcome, reason)


# ---------------------------------------------------------------- the router

SLICE = SliceKey("m", "interactive", "short", True)
RNG = random.Random(7)


def make_router(conc: int = 4, **overrides: Any) -> Router:
    data = base_config_dict(stats={"min_samples": 5})
    for c in data["clusters"]:
        c["max_concurrency"] = conc
    data.update(overrides)
    return Router(parse_config(data, "t.yaml"))


def request(klass: str = "interactive", **kw: Any) -> RequestInfo:
    cfg: Config = parse_config(base_config_dict(), "t.yaml")
    k = cfg.workload_class(klass)
    assert k is not None
    base = RequestInfo(api="chat", model="m", stream=True, max_tokens=None, input_tokens=10,
                       klass=klass, priority=k.priority, tenant=None,
                       slice=SliceKey("m", klass, "short", True), request_id=kw.pop("rid", None))
    return replace(base, **kw)


def feed(router: Router, cluster: str, e2e_s: float, now: float = 1.0, n: int = 10,
         klass: str = "interactive") -> None:
    sl = SliceKey("m", klass, "short", True)
    for _ in range(n):
        router.observe(Observation(cluster, sl, "ok", 200, ttft_s=e2e_s / 4, e2e_s=e2e_s), now)


def fill(router: Router, conc: int) -> None:
    for c in ("a", "b", "c"):
        for _ in range(conc):
            router.started(c)


def unary(**kw: Any) -> RequestInfo:
    return request(stream=False, slice=SliceKey("m", "interactive", "short", False), **kw)


def test_timeout_is_the_remaining_budget() -> None:
    """An unstreamed answer's whole-answer timeout is the class timeout, shortened by a
    caller's deadline."""
    r = make_router()
    assert r.decide(unary(), 0.0, RNG).timeout_ms == 30000  # class timeout
    d = r.decide(unary(deadline_ms=1234.4), 0.0, RNG)
    assert (d.admission, d.timeout_ms) == ("admit", 1235)
    assert r.decide(unary(deadline_ms=99999999), 0.0, RNG).timeout_ms == 30000


def test_a_streams_length_is_capped_only_by_a_callers_deadline() -> None:
    """A stream's class timeout is its route's idle timeout (the longest silence), so
    without a deadline nothing caps the whole answer; a deadline does, even one longer
    than the class timeout (a steady 60 s answer within a 90 s deadline is not cut)."""
    r = make_router()
    assert r.decide(request(), 0.0, RNG).timeout_ms is None
    assert r.decide(request(deadline_ms=1234.4), 0.0, RNG).timeout_ms == 1235
    assert r.decide(request(deadline_ms=90000), 0.0, RNG).timeout_ms == 90000


def test_optional_step_with_exhausted_budget_is_skipped() -> None:
    r = make_router()
    d = r.decide(request(deadline_ms=0, step="optional"), 0.0, RNG)
    assert (d.admission, d.status, d.reason) == ("skip", 412, "admission")
    assert d.detail.startswith("deadline_exhausted:")
    assert r.counters[("admission", "skip")] == 1
    assert r.counters[("admission_reason", "deadline_exhausted")] == 1
    assert r.inflight("a") + r.inflight("b") + r.inflight("c") == 0


def test_request_that_cannot_finish_is_rejected_before_sending() -> None:
    r = make_router()
    for c in ("a", "b", "c"):
        feed(r, c, 2.0)
    d = r.decide(request(deadline_ms=1000, step="critical"), 1.0, RNG)
    assert (d.admission, d.status) == ("reject", 503)
    assert d.detail.startswith("deadline_unreachable:") and "best route needs 20" in d.detail
    assert r.decide(request(deadline_ms=3000), 1.0, RNG).admission == "admit"


def test_optional_step_is_skipped_when_its_tail_does_not_fit() -> None:
    r = make_router()
    for c in ("a", "b", "c"):
        feed(r, c, 1.0)
    d = r.decide(request(deadline_ms=900, step="optional"), 1.0, RNG)
    assert d.admission == "skip" and d.detail.startswith("optional_does_not_fit")
    assert r.decide(request(deadline_ms=1500, step="optional"), 1.0, RNG).admission == "admit"


def test_critical_step_prefers_the_route_whose_tail_fits() -> None:
    r = make_router()
    feed(r, "a", 0.3)
    feed(r, "b", 3.0)
    feed(r, "c", 3.0)
    rng = random.Random(1)
    # Without a deadline the weighted picker spreads traffic (b and c still get some).
    plain = {r.decide(request(), 1.0, rng).cluster for _ in range(200)}
    assert plain != {"a"}
    for _ in range(50):
        d = r.decide(request(deadline_ms=1000, step="critical"), 1.0, rng)
        assert d.cluster == "a" and d.admission == "admit" and d.timeout_ms == 1000


def test_low_priority_is_deferred_or_shed_when_every_route_is_full() -> None:
    r = make_router(conc=1)
    fill(r, 1)
    d = r.decide(request("batch"), 1.0, RNG)
    assert (d.admission, d.status, d.retry_after_s) == ("defer", 429, 2)
    d = r.decide(request("batch", deadline_ms=1500), 1.0, RNG)  # cannot wait 2 s
    assert (d.admission, d.status) == ("shed", 503)
    d = r.decide(request("batch", step="optional"), 1.0, RNG)
    assert d.admission == "skip" and d.detail.startswith("overload_optional")
    assert r.counters[("admission", "defer")] == 1 and r.counters[("admission", "shed")] == 1


def test_high_priority_queues_fifo_then_is_admitted_when_capacity_frees() -> None:
    r = make_router(conc=1)
    fill(r, 1)
    d1 = r.decide(request(), 1.0, RNG, ticket="t1")
    d2 = r.decide(request(), 1.01, RNG, ticket="t2")
    assert d1.admission == d2.admission == "queue"
    assert r.queue_until("t1") == pytest.approx(1.25)
    assert r.counters[("admission", "queue")] == 2
    # Re-asking while still full: still queued, not counted again.
    assert r.decide(request(), 1.05, RNG, ticket="t1").admission == "queue"
    assert r.counters[("admission", "queue")] == 2
    # A low-priority newcomer cannot take the slot the waiters are owed.
    r.finished("b")
    assert r.decide(request("batch"), 1.06, RNG).admission == "defer"
    # The second waiter is behind the first: one free slot is the first's.
    assert r.decide(request(), 1.06, RNG, ticket="t2").admission == "queue"
    d = r.decide(request(), 1.07, RNG, ticket="t1")
    assert (d.admission, d.cluster) == ("admit", "b")
    r.started("b")
    # The wait is bounded: after it, with every route still full, the waiter is
    # deferred (beyond_capacity: shed, the default), not sent beyond max_concurrency.
    d = r.decide(request(), 1.3, RNG, ticket="t2")
    assert (d.admission, d.status, d.retry_after_s) == ("defer", 429, 2)
    assert d.detail.startswith("full") and "queue wait over" in d.detail
    assert len(r.admission.queue) == 0


def test_priority_orders_the_queue() -> None:
    r = make_router(conc=1)
    fill(r, 1)
    assert r.decide(request(), 1.0, RNG, ticket="low").admission == "queue"
    assert r.decide(request(priority=50), 1.01, RNG, ticket="vip").admission == "queue"
    r.finished("a")
    assert r.decide(request(), 1.02, RNG, ticket="low").admission == "queue"
    assert r.decide(request(priority=50), 1.02, RNG, ticket="vip").admission == "admit"


@pytest.mark.parametrize(
    ("beyond", "outcome"), [("shed", "defer"), ("best_effort", "admit")])
def test_wait_over_at_full_capacity_defers_unless_best_effort(beyond: str, outcome: str) -> None:
    r = make_router(conc=1, admission={"beyond_capacity": beyond})
    fill(r, 1)
    assert r.decide(request(), 1.0, RNG, ticket="t1").admission == "queue"
    d = r.decide(request(), 1.3, RNG, ticket="t1")  # the wait is over, still full
    assert d.admission == outcome
    assert d.detail.startswith("full" if beyond == "shed" else "best_effort")
    # A deadline too short for Retry-After: shed (503), not deferred.
    d = r.decide(request(deadline_ms=1500), 1.3, RNG)
    assert d.admission == ("shed" if beyond == "shed" else "admit")


@pytest.mark.parametrize(("low_slots", "outcome"), [(0, "defer"), (1, "admit")])
def test_slots_held_by_less_important_work_do_not_make_a_route_full(
    low_slots: int, outcome: str,
) -> None:
    """beyond_capacity: shed defers a more important request only when the routes are
    full of work at or above shed_below_priority; slots that batch holds (its
    Decision.low, counted apart by started/finished) it may take beyond the limit."""
    r = make_router(conc=2)
    for c in ("a", "b", "c"):
        for i in range(2):
            r.started(c, low=i < low_slots)
    assert r.decide(request(), 1.0, RNG, ticket="t").admission == "queue"
    d = r.decide(request(), 1.3, RNG, ticket="t")  # the wait is over, every route full
    assert d.admission == outcome
    # Batch itself is deferred there either way (rows 8-9), and its slots come back.
    assert r.decide(request("batch"), 1.3, RNG).admission == "defer"
    for c in ("a", "b", "c"):
        for i in range(2):
            r.finished(c, low=i < low_slots)
    assert r.admission.low_inflight.get("a", 0) == 0


@pytest.mark.parametrize(("peer_low", "outcome"), [(0, "defer"), (1, "admit")])
def test_a_peers_low_priority_slots_count_as_ours_do(peer_low: int, outcome: str) -> None:
    """Fleet mode: every route is full of a peer's requests (its in-flight counts);
    those it marked low (published beside them) may be taken beyond the limit."""
    r = make_router(conc=2)
    r.peer_inflight.update({c: 2 for c in ("a", "b", "c")})
    r.peer_low.update({c: peer_low for c in ("a", "b", "c")})
    assert r.decide(request(), 1.0, RNG, ticket="t").admission == "queue"
    assert r.decide(request(), 1.3, RNG, ticket="t").admission == outcome


def test_a_low_priority_decision_is_marked_low() -> None:
    r = make_router()
    assert r.decide(request("batch"), 1.0, RNG).low
    assert not r.decide(request(), 1.0, RNG).low


def test_room_over_budget_is_still_served_best_effort_when_shedding_beyond_capacity() -> None:
    """Only capacity is shed: a route with room but over budget gets the request."""
    r = make_router(conc=1)
    for c in ("a", "b", "c"):
        feed(r, c, 4.4)  # interactive: TTFT 1.1 s, over its 1000 ms budget everywhere
    r.started("a")
    r.started("b")  # c has room
    d = r.decide(request(), 1.0, RNG)
    assert d.admission == "admit" and d.detail.startswith("best_effort")


def test_queue_full_or_no_ticket_serves_high_priority_best_effort() -> None:
    r = make_router(conc=1, admission={"queue_max": 1, "beyond_capacity": "best_effort"})
    fill(r, 1)
    assert r.decide(request(), 1.0, RNG, ticket="t1").admission == "queue"
    d = r.decide(request(), 1.0, RNG, ticket="t2")
    assert d.admission == "admit" and "queue full" in d.detail
    d = r.decide(request(), 1.0, RNG)  # no ticket, no request id: cannot be held
    assert d.admission == "admit" and d.detail.startswith("best_effort")


def test_withdrawn_waiter_leaves_the_queue() -> None:
    r = make_router(conc=1)
    fill(r, 1)
    r.decide(request(), 1.0, RNG, ticket="t1")
    r.withdraw("t1")
    assert r.queue_until("t1") is None
    assert r.counters[("admission_reason", "queue_abandoned")] == 1


def test_routes_over_budget_shed_low_priority_but_serve_high() -> None:
    r = make_router()
    for c in ("a", "b", "c"):
        feed(r, c, 4.4, klass="batch")  # batch: e2e 4.4 s, budget 60 s
        feed(r, c, 4.4)  # interactive: TTFT 1.1 s, over its 1000 ms budget everywhere
    d = r.decide(request(), 1.0, RNG)
    assert d.admission == "admit" and d.detail.startswith("best_effort")
    assert "waiting cannot help" in d.detail
    # batch's own routes are within budget: admitted
    assert r.decide(request("batch"), 1.0, RNG).admission == "admit"


def test_tolerant_class_is_not_deferred_because_a_higher_class_is_degraded() -> None:
    """Interactive degraded everywhere: batch still has budget and capacity, so it is served."""
    r = make_router()
    for c in ("a", "b", "c"):
        r.board.get(c, request("interactive").slice).state = HealthState.DEGRADED
    assert r.decide(request("batch"), 1.0, RNG).admission == "admit"


def test_retries_are_recognised_and_budgeted() -> None:
    r = make_router(admission={"retry_budget_ratio": 0.0})
    d = r.decide(request(rid="req-1"), 1.0, RNG)
    assert not d.is_retry
    first = d.cluster
    d2 = r.decide(request(rid="req-1"), 2.0, RNG)  # same x-request-id again: a retry
    assert d2.is_retry and d2.cluster != first
    # ratio 0: only the floor (3 per route per window) is allowed, on any route
    outcomes = [r.decide(request(retry_attempt=1), 3.0, RNG).admission for _ in range(12)]
    assert outcomes.count("admit") == 8  # 9 floor slots over 3 routes, one used above
    last = r.decide(request(retry_attempt=1), 3.0, RNG)
    assert (last.admission, last.status) == ("reject", 503)
    assert last.detail.startswith("retry_budget")
    assert r.counters[("admission_reason", "retry_budget")] == 5


def test_a_tenant_marking_every_request_a_retry_spends_only_its_own_budget() -> None:
    """The retry marks are the client's word: one tenant sending nothing but "retries"
    is refused once its own floor is spent, and another tenant's real retries still
    find the routes' budgets (before, the first tenant had spent them)."""
    r = make_router(admission={"retry_budget_ratio": 0.2})
    for i in range(30):  # tenant good: 30 first attempts, 10 per route
        r.decide(request(tenant="good", rid=f"g{i}"), 1.0, RNG)
    noisy = [r.decide(request(tenant="noisy", retry_attempt=1), 1.0, RNG) for _ in range(20)]
    assert [d.admission for d in noisy].count("admit") == 3  # its floor, nothing more
    refused = noisy[-1]
    assert (refused.admission, refused.status) == ("reject", 503)
    assert refused.detail.startswith("retry_budget") and "tenant noisy: 3.0 recent retries" in (
        refused.detail)
    good = [r.decide(request(tenant="good", retry_attempt=1), 1.0, RNG) for _ in range(6)]
    assert all(d.admission == "admit" for d in good)  # 0.2 x 30 + 3 of its own; routes have room
    budget = state_json(r, 1.0)["admission"]["retry_budget"]  # what /state shows
    assert budget["tenants"] == 2
    assert sum(v["retries"] for v in budget["routes"].values()) == 9  # 3 noisy + 6 good


def test_untenanted_requests_share_the_route_budgets_as_before() -> None:
    r = make_router(admission={"retry_budget_ratio": 0.0})
    outcomes = [r.decide(request(retry_attempt=1), 1.0, RNG).admission for _ in range(12)]
    assert outcomes.count("admit") == 9  # 3 per route over 3 routes: no tenant rule


def test_retry_avoids_previous_route_and_first_attempts_refill_budget() -> None:
    r = make_router(admission={"retry_budget_ratio": 1.0})
    for i in range(30):
        d = r.decide(request(rid=f"id{i}"), 1.0, RNG)
        r2 = r.decide(request(rid=f"id{i}"), 1.5, RNG)
        assert r2.is_retry and r2.cluster != d.cluster and r2.admission == "admit"


def test_disabled_admission_admits_everything_but_keeps_the_timeout() -> None:
    r = make_router(conc=1, admission={"enabled": False})
    fill(r, 1)
    d = r.decide(request("batch", deadline_ms=0, step="optional"), 1.0, RNG)
    assert d.admission == "admit" and d.timeout_ms == 1


def test_admission_counts_once_per_event() -> None:
    r = make_router(conc=1)
    fill(r, 1)
    r.decide(request("batch"), 1.0, RNG)
    r.decide(request(), 1.0, RNG, ticket="q")
    r.decide(request(), 1.1, RNG, ticket="q")
    r.decide(request(), 1.3, RNG, ticket="q")
    adm = {k[1]: v for k, v in r.counters.items() if k[0] == "admission"}
    assert adm == {"defer": 2, "queue": 1}  # the waiter's wait ended at full capacity
    assert sum(v for k, v in r.counters.items() if k[0] == "decision") == 3


def test_a_waiter_whose_model_a_reload_removed_leaves_the_queue() -> None:
    """Its re-ask is an unknown model (the default route, no admission): it must not
    stay queued, ahead of newcomers, until its wait runs out."""
    r = make_router(conc=1)
    fill(r, 1)
    assert r.decide(request(), 1.0, RNG, ticket="t1").admission == "queue"
    data = base_config_dict(models=[{"name": "m2", "candidates": ["b"]}])
    for c in data["clusters"]:
        c["max_concurrency"], c["models"] = 1, ["m2"]
    r.reload(parse_config(data, "t.yaml"))
    d = r.decide(request(), 1.01, RNG, ticket="t1")
    assert (d.cluster, d.reason, d.admission) == ("a", "unknown_model", "admit")
    assert len(r.admission.queue) == 0 and r.queue_until("t1") is None
    r.finished("b")  # the slot is the newcomer's: nobody is waiting any more
    m2 = request(model="m2", slice=SliceKey("m2", "interactive", "short", True))
    d = r.decide(m2, 1.02, RNG, ticket="t2")
    assert (d.cluster, d.admission) == ("b", "admit")


# ---------------------------------------------------------------- a deferral's comeback


def _defer_then_free(r: Router, n: int, tenant: str | None, now: float = 1.0) -> None:
    """``n`` batch requests deferred with every route full, then the routes emptied."""
    fill(r, 1)
    for _ in range(n):
        d = r.decide(request("batch", tenant=tenant), now, RNG)
        assert (d.admission, d.status, d.retry_after_s) == ("defer", 429, 2)
    for c in ("a", "b", "c"):
        r.finished(c)


@pytest.mark.parametrize("tenant", [None, "acme"])
def test_a_deferred_request_coming_back_as_told_is_a_first_attempt(tenant: str | None) -> None:
    """A 429 defer tells the client to retry after Retry-After, and the OpenAI SDKs do,
    marked as a retry (x-stainless-retry-count: 1). The deferred attempt never reached
    a route, so the comeback is no retry load: the budgets take it as a first attempt.
    Before, 12 such comebacks to idle routes found the retry budget spent: 9 served (3
    per route; with a tenant: 3), the rest 503 retry_budget."""
    r = make_router(conc=1, admission={"retry_budget_ratio": 0.0})
    _defer_then_free(r, 12, tenant)
    back = [r.decide(request("batch", tenant=tenant, retry_attempt=1), 3.0, RNG)
            for _ in range(12)]
    assert [d.admission for d in back] == ["admit"] * 12
    assert r.counters[("admission_reason", "retry_budget")] == 0
    budget = r.admission.budget.snapshot(3.0)
    assert sum(v["retries"] for v in budget.values()) == 0


def test_each_deferral_is_owed_one_comeback_then_the_budget_applies() -> None:
    """The credit is one per deferral: a tenant deferred twice gets two retries taken as
    first attempts, then its own retry budget (the floor, 3), then 503 retry_budget."""
    r = make_router(conc=1, admission={"retry_budget_ratio": 0.0})
    _defer_then_free(r, 2, "acme")
    out = [r.decide(request("batch", tenant="acme", retry_attempt=1), 3.0, RNG)
           for _ in range(6)]
    assert [d.admission for d in out] == ["admit"] * 5 + ["reject"]
    assert out[-1].detail.startswith("retry_budget") and "tenant acme: 3.0 recent" in (
        out[-1].detail)
    routes = r.admission.budget.snapshot(3.0).values()
    assert sum(v["retries"] for v in routes) == 3  # the floor's; the comebacks are firsts
    # Another tenant's retries never spend acme's credit.
    _defer_then_free(r, 1, "acme", now=4.0)
    other = [r.decide(request("batch", tenant="other", retry_attempt=1), 4.0, RNG)
             for _ in range(4)]
    assert [d.admission for d in other].count("admit") == 3
    assert r.admission.budget.owes("acme", 4.0)


def test_a_comeback_deferred_again_keeps_one_credit() -> None:
    """A comeback that is deferred again (still overloaded) is owed one comeback, not
    two: its next return uses it, and nothing is left over for a real retry."""
    r = make_router(conc=1, admission={"retry_budget_ratio": 0.0})
    fill(r, 1)
    assert r.decide(request("batch", tenant="t"), 1.0, RNG).admission == "defer"
    again = r.decide(request("batch", tenant="t", retry_attempt=1), 3.0, RNG)
    assert again.admission == "defer"
    for c in ("a", "b", "c"):
        r.finished(c)
    last = r.decide(request("batch", tenant="t", retry_attempt=2), 5.0, RNG)
    assert last.admission == "admit"
    assert not r.admission.budget.owes("t", 5.0)
    assert sum(v["retries"] for v in r.admission.budget.snapshot(5.0).values()) == 0


def test_an_owed_comeback_expires_with_the_budget_window() -> None:
    """Owed comebacks decay like the budget's counts (tau = 6 sub-windows, 60 s): one
    that never came is forgotten after tau ln 2, about 42 s."""
    r = make_router(conc=1)
    _defer_then_free(r, 1, "t")
    assert r.admission.budget.owes("t", 1.0 + 41.0)
    assert not r.admission.budget.owes("t", 1.0 + 43.0)


@pytest.mark.parametrize(("subwindow_s", "defer_s", "back_after_s"), [
    (1.0, 5, 10.0),  # told 5-10 s (retry-after-ms spread); tau 6 s kept it 4.2 s
    (0.5, 2, 4.0),  # told 2-4 s; tau 3 s kept it 2.1 s
    (10.0, 2, 41.0),  # the default: tau 60 s already keeps it longer
])
def test_an_owed_comeback_outlives_the_longest_wait_its_deferral_told(
    subwindow_s: float, defer_s: int, back_after_s: float,
) -> None:
    """A deferral tells a wait of up to twice defer_retry_after_s (retry-after-ms).
    The credit decayed with the retry budget's tau (six sub-windows) alone, so with
    a short sub-window it was gone before the comeback the deferral asked for, which
    then met the retry budget as a retry again (503 retry_budget once it was spent)."""
    r = make_router(conc=1, stats={"subwindow_s": subwindow_s, "min_samples": 5},
                    admission={"defer_retry_after_s": defer_s})
    fill(r, 1)
    d = r.decide(request("batch", tenant="t"), 1.0, RNG)
    assert (d.admission, d.retry_after_s) == ("defer", defer_s)
    assert r.admission.budget.owes("t", 1.0 + back_after_s)
