"""The admission building blocks: queue, retry memory, retry budget, config checks."""

from __future__ import annotations

import pytest

from sidecar.core.admission_queue import AdmissionQueue
from sidecar.core.config import ConfigError, parse_config
from sidecar.core.retry_budget import RetryBudget, RetryMemory
from tests.conftest import base_config_dict


def test_queue_orders_by_priority_then_arrival() -> None:
    q = AdmissionQueue(max_live=10)
    a = q.join("a", 5, 0.0, 1.0)
    b = q.join("b", 9, 0.1, 1.1)
    c = q.join("c", 5, 0.2, 1.2)
    assert [w.ticket for w in q.live(0.5)] == ["b", "a", "c"]
    assert (q.ahead(9, b, 0.5), q.ahead(5, a, 0.5), q.ahead(5, c, 0.5)) == (0, 1, 2)
    assert q.ahead(5, None, 0.5) == 3  # a newcomer of equal priority goes last
    assert q.ahead(10, None, 0.5) == 0  # a more important newcomer goes first
    assert q.next_deadline(0.5) == 1.0


def test_queue_expiry_room_and_pruning() -> None:
    q = AdmissionQueue(max_live=2)
    q.join("a", 5, 0.0, 0.25)
    q.join("b", 5, 0.0, 0.5)
    assert not q.has_room(0.1)
    assert q.has_room(0.3)  # a's wait is over: it no longer holds a place ...
    w = q.get("a")
    assert w is not None and w.expired(0.25)
    assert q.ahead(5, q.get("b"), 0.3) == 0  # ... nor blocks anyone
    assert q.prune(0.5) == 0  # ... but is remembered for its own final re-ask
    assert q.prune(1.3) == 1 and q.get("a") is None
    assert q.leave("b") is not None and len(q) == 0


def test_retry_memory_is_bounded_and_expires() -> None:
    m = RetryMemory(size=2, ttl_s=10.0)
    m.remember("x", "a", 0.0)
    m.remember("y", "b", 1.0)
    seen = m.lookup("x", 5.0)
    assert seen is not None and seen.cluster == "a"
    assert m.lookup("x", 10.5) is None  # too old to be a retry
    m.remember("z", "c", 2.0)
    assert m.lookup("x", 3.0) is None and len(m) == 2  # least recently used dropped
    assert m.lookup(None, 0.0) is None


@pytest.mark.parametrize(
    ("ratio", "firsts", "retries_allowed"),
    [
        (0.0, 0, 3),  # the floor alone
        (0.2, 10, 5),  # 0.2 x 10 + 3
        (1.0, 4, 7),
    ],
)
def test_retry_budget_ratio_plus_floor(ratio: float, firsts: int, retries_allowed: int) -> None:
    b = RetryBudget(ratio, tau_s=1e9)  # no decay within the test
    for _ in range(firsts):
        b.record("a", 0.0, retry=False)
    n = 0
    while b.allows("a", 0.0) and n < 100:
        b.record("a", 0.0, retry=True)
        n += 1
    assert n == retries_allowed


def test_retry_budget_recovers_as_counts_decay() -> None:
    b = RetryBudget(0.0, tau_s=10.0)
    for _ in range(3):
        b.record("a", 0.0, retry=True)
    assert not b.allows("a", 0.0)
    assert b.allows("a", 10.0)  # 3 * e^-1 = 1.1 retries left in the window
    assert b.snapshot(10.0)["a"]["retries"] == pytest.approx(1.104, abs=1e-3)


def test_tenant_retry_budget_is_its_own_and_bounded_in_memory() -> None:
    from sidecar.core import retry_budget

    b = RetryBudget(0.5, tau_s=1e9)
    for _ in range(4):
        b.record("a", 0.0, retry=False, tenant="t1")
    assert b.tenant_allows(None, 0.0)  # no tenant: no tenant rule
    n = 0
    while b.tenant_allows("t1", 0.0) and n < 100:
        b.record("b", 0.0, retry=True, tenant="t1")
        n += 1
    assert n == 5  # 0.5 x 4 firsts + 3, over all routes
    assert b.tenant_allows("t2", 0.0)  # another tenant's budget is untouched
    assert b.describe_tenant("t1", 0.0) == (
        "tenant t1: 5.0 recent retries vs 0.5 x 4.0 first attempts + 3")
    for i in range(retry_budget.TENANT_MEMORY_SIZE + 10):
        b.record("a", 0.0, retry=False, tenant=f"x{i}")
    assert b.tenants == retry_budget.TENANT_MEMORY_SIZE
    assert b.tenant_allows("t1", 0.0)  # forgotten (least recently used): starts afresh


def test_queue_wait_must_fit_in_envoys_decision_timeout() -> None:
    ok = base_config_dict(limits={"decision_timeout_ms": 300}, admission={"queue_wait_ms": 250})
    assert parse_config(ok, "t.yaml").admission.queue_wait_ms == 250
    bad = base_config_dict(limits={"decision_timeout_ms": 280})
    with pytest.raises(ConfigError, match=r"t\.yaml: admission\.queue_wait_ms: must be <= "):
        parse_config(bad, "t.yaml")
    # No queueing, no constraint.
    for adm in ({"queue_max": 0}, {"enabled": False}, {"queue_wait_ms": 0}):
        parse_config(base_config_dict(limits={"decision_timeout_ms": 100}, admission=adm), "t")


@pytest.mark.parametrize(
    ("violation", "n", "over"),
    [
        (0.018, 110.0, False),  # two slow answers in ~110 on a p99 class: noise
        (0.01, 100.0, False),  # exactly the allowance (the prior alone)
        (0.06, 100.0, True),  # six in a hundred: over with confidence
        (0.02, 2000.0, True),  # twice the allowance on plenty of evidence
    ],
)
def test_over_budget_needs_confidence(violation: float, n: float, over: bool) -> None:
    """A route is over its class budget only when its violation share exceeds the
    allowed share with confidence (the binomial test health escalation uses)."""
    from sidecar.core.admission import AdmissionControl
    from sidecar.core.selection import Candidate, HealthView

    cfg = parse_config(base_config_dict(), "test.yaml")
    cand = Candidate(cfg.cluster("a"), HealthView("healthy", 1.0, False, False))
    cand.scores.update(violation=violation, violation_n=n)
    klass = next(k for k in cfg.classes if k.name == "batch")  # p99: 1 % allowed
    # With the attainment score present, neither the request nor the route view is read.
    got = AdmissionControl(cfg)._over(cand, "a", None, klass, None, 0.0)  # type: ignore[arg-type]
    assert got is over
