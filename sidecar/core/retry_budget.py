"""Retry recognition and per-route retry budgets (pure: every method takes ``now``).

Retries are recognised three ways (any one suffices):

* ``x-envoy-attempt-count`` > 1 or ``x-stainless-retry-count`` > 0 (already in
  :attr:`RequestInfo.retry_attempt`);
* the same ``x-request-id`` reached a final admission decision less than
  :data:`RETRY_MEMORY_S` ago (:class:`RetryMemory`, a bounded LRU).

A recognised retry is flagged on the decision (``Decision.is_retry``) so its
latency is counted but never used as evidence twice (``StatsStore.observe``).

**Retry budget** (:class:`RetryBudget`), per route, after Finagle's and Envoy's
retry budgets: first attempts and retries sent to the route are counted with
exponential decay (time constant ``tau`` = six sub-windows, 60 s by default), and a retry
may go to the route only while

    retries + 1 <= ratio * first_attempts + RETRY_FLOOR

so retries can add at most ``ratio`` (``admission.retry_budget_ratio``) on top
of the route's recent first-attempt load, plus a small floor so a quiet route
can still retry at all. A local tail event therefore cannot snowball into a
retry storm: once the budget is spent, retries go to another route or are
rejected with 503 ``retry_budget``.

**Per tenant as well** (requests with ``x-tailroute-tenant``): the same rule on the
tenant's own counts over all routes, so a retry needs both budgets. Why: the retry
marks are the client's word, and a client that marks every request a retry spent
each route's budget for everyone, so other tenants' real retries were refused.
Now it spends only its own (``floor`` retries per ``tau`` when it sends nothing
else). Untenanted requests have no identity to tell apart and share the route
budgets as before; the tenant counts are kept for the last
:data:`TENANT_MEMORY_SIZE` tenants (LRU: a tenant seen again after that starts
afresh, so one rotating names gets a floor per name, still within every route's
budget).

**A deferred request's comeback is a first attempt.** A ``defer`` (429 with
``Retry-After`` and ``x-should-retry: true``) asks the client to come back, and the
OpenAI SDKs do, marked as a retry (``x-stainless-retry-count: 1``). Its first attempt
never reached a route, so the comeback adds no load a retry budget guards against;
counted as a retry, a burst of deferrals that came back as told to routes with room
found the budget spent and got ``503 retry_budget`` with ``x-should-retry: false``
(8 deferred batch requests through the real Envoy: 2 refused,
tests/test_integration_deferred_comeback.py). So each deferral is owed one comeback
(:meth:`RetryBudget.owe`), the tenant's own or, without a tenant, one shared pool;
decayed like the counts, it is kept while above one half (``tau ln 2``, about 42 s by
default; a lone one at least twice the longest wait a deferral tells,
:meth:`RetryBudget.configure`). A retry that finds one owed is a first attempt to the
budgets: none asked, counted as a first attempt (otherwise still a retry: its latency
is no evidence). No client can send more than before: each one stands for a request
that went nowhere, and a client may leave any request unmarked.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final, NamedTuple

RETRY_MEMORY_S: Final = 120.0  # a repeated request id within this long is a retry
RETRY_MEMORY_SIZE: Final = 4096  # request ids remembered (LRU)
RETRY_FLOOR: Final = 3.0  # retries always allowed per tau, even on an idle route
TENANT_MEMORY_SIZE: Final = 4096  # tenants whose retry counts are kept (LRU)


class Seen(NamedTuple):
    """The last final decision for one request id (a tuple: one is made per request)."""

    at: float
    cluster: str


class RetryMemory:
    """Bounded LRU of request ids that reached a final admission decision."""

    def __init__(self, size: int = RETRY_MEMORY_SIZE, ttl_s: float = RETRY_MEMORY_S) -> None:
        self.size = size
        self.ttl_s = ttl_s
        self._seen: OrderedDict[str, Seen] = OrderedDict()

    def lookup(self, request_id: str | None, now: float) -> Seen | None:
        """The earlier decision for this id if it is recent enough to make this a retry."""
        if request_id is None:
            return None
        seen = self._seen.get(request_id)
        if seen is None or now - seen.at > self.ttl_s:
            return None
        return seen

    def remember(self, request_id: str | None, cluster: str, now: float) -> None:
        if request_id is None:
            return
        # tuple.__new__ is Seen(now, cluster) without the generated Python __new__ (per request).
        self._seen[request_id] = tuple.__new__(Seen, (now, cluster))
        self._seen.move_to_end(request_id)
        while len(self._seen) > self.size:
            self._seen.popitem(last=False)

    def __len__(self) -> int:
        return len(self._seen)


@dataclass(slots=True)
class _Counts:
    firsts: float = 0.0
    retries: float = 0.0
    at: float = 0.0
    owed: float = 0.0  # deferrals whose comeback is still owed a first attempt


def _count(c: _Counts, retry: bool) -> None:
    if retry:
        c.retries += 1.0
    else:
        c.firsts += 1.0


class RetryBudget:
    """Decayed first-attempt and retry counts per route; see the module docstring."""

    def __init__(self, ratio: float, tau_s: float, floor: float = RETRY_FLOOR) -> None:
        self.ratio = ratio
        self.tau_s = max(tau_s, 1e-3)
        self.floor = floor
        self._routes: dict[str, _Counts] = {}
        self._tenants: OrderedDict[str, _Counts] = OrderedDict()
        self._untenanted = _Counts()  # deferrals owed to requests without a tenant
        self.owed_tau_s = self.tau_s

    def configure(self, ratio: float, tau_s: float, defer_s: float) -> None:
        """Set the ratio and ``tau``; ``defer_s`` (``defer_retry_after_s``) sets how long
        an owed comeback lasts: a lone one at least twice the longest wait a deferral
        tells (``retry-after-ms`` spreads it up to ``2 x defer_s``). Decayed with ``tau``
        alone, a short sub-window (``tau`` = six of them) let it lapse before the
        comeback came as told: 4.2 s with ``subwindow_s: 1`` for a wait of 5-10 s."""
        self.ratio, self.tau_s = ratio, max(tau_s, 1e-3)
        self.owed_tau_s = max(self.tau_s, 2.0 * (2.0 * defer_s) / math.log(2.0))

    def _decayed(self, c: _Counts, now: float) -> _Counts:
        if now > c.at:
            k = math.exp(-(now - c.at) / self.tau_s)
            c.firsts *= k
            c.retries *= k
            if c.owed:
                c.owed *= k if self.owed_tau_s == self.tau_s else math.exp(
                    -(now - c.at) / self.owed_tau_s)
            c.at = now
        return c

    def _at(self, cluster: str, now: float) -> _Counts:
        c = self._routes.get(cluster)
        if c is None:
            c = self._routes[cluster] = _Counts(at=now)
        return self._decayed(c, now)

    def _of(self, tenant: str, now: float) -> _Counts:
        c = self._tenants.get(tenant)
        if c is None:
            c = self._tenants[tenant] = _Counts(at=now)
            while len(self._tenants) > TENANT_MEMORY_SIZE:
                self._tenants.popitem(last=False)
            return c
        self._tenants.move_to_end(tenant)
        return self._decayed(c, now)

    def _room(self, c: _Counts) -> bool:
        return c.retries + 1.0 <= self.ratio * c.firsts + self.floor

    def allows(self, cluster: str, now: float) -> bool:
        """May one more retry go to ``cluster`` now (its route budget)?"""
        return self._room(self._at(cluster, now))

    def tenant_allows(self, tenant: str | None, now: float) -> bool:
        """May ``tenant`` retry at all now (its own budget; always for no tenant)?"""
        return tenant is None or self._room(self._of(tenant, now))

    def record(self, cluster: str, now: float, retry: bool, tenant: str | None = None) -> None:
        """A request was sent to ``cluster`` (a retry or a first attempt), for ``tenant``."""
        _count(self._at(cluster, now), retry)
        if tenant is not None:
            _count(self._of(tenant, now), retry)

    def _owing(self, tenant: str | None, now: float) -> _Counts:
        return self._decayed(self._untenanted, now) if tenant is None else self._of(tenant, now)

    def owes(self, tenant: str | None, now: float) -> bool:
        """Is a deferral of ``tenant``'s (or of any untenanted request) still owed its
        comeback? A retry that finds one is taken as that comeback (module docstring)."""
        return self._owing(tenant, now).owed >= 0.5

    def owe(self, tenant: str | None, now: float, change: float) -> None:
        """One more deferral owed a comeback (``change`` 1), or one comeback settled (-1)."""
        c = self._owing(tenant, now)
        c.owed = max(c.owed + change, 0.0)

    def describe(self, cluster: str, now: float) -> str:
        return f"{cluster}: {self._line(self._at(cluster, now))}"

    def describe_tenant(self, tenant: str, now: float) -> str:
        return f"tenant {tenant}: {self._line(self._of(tenant, now))}"

    def _line(self, c: _Counts) -> str:
        return (f"{c.retries:.1f} recent retries vs "
                f"{self.ratio:g} x {c.firsts:.1f} first attempts + {self.floor:g}")

    @property
    def tenants(self) -> int:
        """Tenants whose counts are kept (at most :data:`TENANT_MEMORY_SIZE`)."""
        return len(self._tenants)

    def snapshot(self, now: float) -> dict[str, dict[str, float]]:
        out = {}
        for name in list(self._routes):
            c = self._at(name, now)
            out[name] = {"first_attempts": round(c.firsts, 3), "retries": round(c.retries, 3)}
        return out
