"""Admission control and deadline-aware routing, run after selection (pure).

Inputs per request: the pipeline's candidates, the route view (in-flight,
percentiles) as of ``now``, the request's class/priority/deadline/step/retry.
The answer is a verdict (:class:`~sidecar.core.admission_verdict.Verdict`): admit
(possibly on another route), queue, defer, shed, reject or skip, with a
machine-readable reason and a note. The decision table itself is
:mod:`sidecar.core.admission_rules`.

Definitions (ms; ``pXX`` are the route's e2e percentiles for the request's slice)::

    remaining   = min(class slo.timeout_ms, x-tailroute-deadline-ms)   unstreamed answer
                = x-tailroute-deadline-ms (infinite without one)      stream: the class
                  timeout bounds its silences (Envoy's route idle_timeout), not its length
    timeout     = max(1, ceil(remaining))       -> x-envoy-upstream-rq-timeout-ms
                  (none for a stream without a deadline: nothing caps its whole length)
    usable(r)   = passed hard filters and health filters for this class (capacity aside)
    full(r)     = inflight(r) >= max_concurrency(r)
    over(r)     = violation(r) n(r) significantly above a n(r)   (a = 1 - percentile / 100;
                  violation and n the attainment scorer's share of failed or
                  over-budget requests and the outcomes behind it; the one-sided
                  binomial test at health.confidence, as health escalation uses;
                  without the score: tail(r, class metric, class percentile) >
                  class budget_ms)
    ok(r)       = usable and not full and not over
    saturated   = no ok route
    ahead       = queued waiters served before this request (FIFO per priority)
    contended   = saturated or (ahead > 0 and free slots on ok routes <= ahead)
    need        = min over usable routes of p50 e2e        (None without data)
    need_tail   = min over usable routes of e2e at the class percentile
    high        = priority >= admission.shed_below_priority
    all_full    = every usable route is full of work at or above shed_below_priority
                  (inflight(r) - low(r) >= max_concurrency(r), low(r): the requests of
                  lower priorities in flight on r)
    can_defer   = no deadline or remaining >= defer_retry_after_s * 1000 + need
    reserved(r) = high, a more important class is pressed on r, free(r) <= its reserve
                  (:mod:`sidecar.core.admission_priority`; ok(r) also needs not reserved)
    yields      = high and a more important class is pressed on one of the usable routes

Route choice on admit (critical or unmarked step with a deadline): if the chosen
route's e2e tail does not fit ``remaining``, switch to the highest weight survivor
whose tail fits, else to the survivor with the lowest tail. A route degraded for a
higher class is *not* over budget for a tolerant one (the graduated policy keeps it
there). A retry avoids its previous attempt's route when another survivor has retry
budget, and only goes to routes whose budget allows it; a deferral's comeback is a
first attempt (:mod:`sidecar.core.retry_budget`). A refusal for want of room may
probe a cooling route instead (``rng``; :mod:`sidecar.core.rescue_probe`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from random import Random
from typing import Final

from sidecar.core.admission_priority import PriorityPressure
from sidecar.core.admission_queue import AdmissionQueue, Waiter
from sidecar.core.admission_rules import RULES, Situation, evaluate, row_note
from sidecar.core.admission_verdict import RouteFacts, Verdict
from sidecar.core.config import ClassConfig, Config
from sidecar.core.evidence import significant
from sidecar.core.request_lane import LanePick, full_result
from sidecar.core.rescue_probe import RESCUE, rescue_route
from sidecar.core.retry_budget import RetryBudget, RetryMemory
from sidecar.core.scorers import SLO_TAIL
from sidecar.core.selection import Candidate, LatencyValue, PipelineResult, RouteView
from sidecar.core.types import Decision, RequestInfo

__all__ = ["RULES", "AdmissionControl", "RouteFacts", "Situation", "Verdict", "evaluate"]

RETRY_TAU_SUBWINDOWS: Final = 6  # retry budgets decay over this many sub-windows (60 s by default)

# The over-budget test per request reads plan-fixed shares: the same few arguments
# again and again, and the exact binomial tail is a loop (a pure function: cached).
_significant = functools.lru_cache(maxsize=1024)(significant)


# A stream's length is capped only as a safety net, by default at this many class timeouts
# (Envoy's route max_stream_duration; the lab alike): a provider that never ends a stream
# -- keep-alive comments reset the idle timeout -- would hold it, and its slot, for ever.
# Interactive's 30 s gives 10 min (30,000 tokens at 50/s); slo.max_stream_ms overrides.
STREAM_CAP_TIMEOUTS: Final = 20


def stream_cap_s(klass: ClassConfig) -> float:
    """The longest a stream of ``klass`` may last, in seconds: ``slo.max_stream_ms``, or
    :data:`STREAM_CAP_TIMEOUTS` class timeouts."""
    cap = klass.slo.max_stream_ms
    return (STREAM_CAP_TIMEOUTS * klass.slo.timeout_ms if cap is None else cap) / 1000.0


def remaining_ms(req: RequestInfo, klass: ClassConfig) -> float:
    """What is left for the whole answer, in ms: the caller's deadline and, for an
    unstreamed answer, the class timeout. A stream's class timeout is its longest
    silence (the route's ``idle_timeout``), never its length: a steady answer of
    ``max_tokens`` may outlast it, so without a deadline nothing is left to count."""
    if req.stream:
        return math.inf if req.deadline_ms is None else req.deadline_ms
    t = klass.slo.timeout_ms
    return t if req.deadline_ms is None else min(t, req.deadline_ms)


def whole_answer_timeout(left: float) -> float | None:
    """The per-request upstream timeout for ``left`` ms (whole ms, at least 1; float
    noise ignored), or None when nothing caps the whole answer."""
    return None if math.isinf(left) else float(max(1, math.ceil(left - 1e-6)))


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1000.0


def _e2e_ms(name: str, req: RequestInfo, klass: ClassConfig, view: RouteView,
            now: float) -> tuple[float | None, float | None]:
    """Route ``name``'s e2e median and class-percentile tail for ``req``'s slice, ms."""
    p50 = view.latency(name, req.slice, "e2e", 50.0, now).value
    tail = view.latency(name, req.slice, "e2e", klass.slo.percentile, now).value
    return _ms(p50), _ms(tail)


def _min(values: Iterable[float | None]) -> float | None:
    return min((v for v in values if v is not None), default=None)


class AdmissionControl:
    """Admission state of one router: the queue, retry memory and budgets."""

    def __init__(self, config: Config, low_inflight: Mapping[str, int] | None = None,
                 peer_low: Mapping[str, int] | None = None) -> None:
        # In flight per cluster below shed_below_priority (Decision.low): the slots "beyond
        # capacity" may take; in fleet mode also the peers' (in inflight() too).
        self.low_inflight: Mapping[str, int] = {} if low_inflight is None else low_inflight
        self.peer_low: Mapping[str, int] = {} if peer_low is None else peer_low
        self.queue = AdmissionQueue(config.admission.queue_max)
        self.memory = RetryMemory()
        self.budget = RetryBudget(config.admission.retry_budget_ratio, 1.0)
        adm = config.admission
        self.pressure = PriorityPressure(adm.yield_hold_s, adm.yield_reserve, adm.yield_after_s)
        self._plain: dict[tuple[str, float | None], Verdict] = {}  # the fast path's answers, reused
        self.reconfigure(config)

    def reconfigure(self, config: Config) -> None:
        self.config = config
        self.cfg = config.admission
        self.queue.max_live = self.cfg.queue_max
        self.budget.configure(self.cfg.retry_budget_ratio, config.stats.subwindow_s
                              * RETRY_TAU_SUBWINDOWS, self.cfg.defer_retry_after_s)
        self.pressure.hold_s = self.cfg.yield_hold_s
        self.pressure.reserve = self.cfg.yield_reserve
        self.pressure.after_s = self.cfg.yield_after_s

    # ------------------------------------------------------------ facts

    def _facts(
        self, req: RequestInfo, klass: ClassConfig, decision: Decision,
        result: PipelineResult | None, view: RouteView, now: float,
        held: dict[str, str],
    ) -> list[RouteFacts]:
        rows: list[tuple[str, bool, bool, float]] = []  # name, usable, selectable, weight
        if result is None:
            rows.append((decision.cluster, True, True, 1.0))
        else:
            for c in result.candidates:
                if c.dropped is not None and not c.soft_drop:
                    continue  # hard policy: not eligible at all
                chosen = c is result.chosen
                rows.append((c.name, c.dropped in (None, "capacity"),
                             c.dropped is None or chosen, c.weight))
        deadline = req.deadline_ms is not None
        cands = {} if result is None else {c.name: c for c in result.candidates}
        out = []
        for name, usable, selectable, weight in rows:
            n, cap = view.inflight(name), self.config.cluster(name).max_concurrency
            over = usable and self._over(cands.get(name), name, req, klass, view, now)
            p50, tail_e2e = _e2e_ms(name, req, klass, view, now) if deadline and usable \
                else (None, None)
            free = max(cap - n, 0)
            tight = free <= self.pressure.reserve_slots(cap)
            held_for = held.get(name)
            packed = n - self.low_inflight.get(name, 0) - self.peer_low.get(name, 0) >= cap
            out.append(RouteFacts(name, usable, selectable, weight, n >= cap, free, over,
                                  p50, tail_e2e, tight, held_for, held_for is not None and tight,
                                  packed))
        return out

    def _tail_ms(
        self, cand_latency: dict[str, LatencyValue] | None, name: str, req: RequestInfo,
        klass: ClassConfig, view: RouteView, now: float,
    ) -> float | None:
        """The route's SLO-metric tail (looked up when the plan was built, if it was)."""
        slo = klass.slo
        known = None if cand_latency is None else cand_latency.get(SLO_TAIL)
        if known is None:
            known = view.latency(name, req.slice, slo.metric, slo.percentile, now)
        return _ms(known.value)

    def _over(
        self, cand: Candidate | None, name: str, req: RequestInfo, klass: ClassConfig,
        view: RouteView, now: float,
    ) -> bool:
        """Over budget: the route's violation share (failures and slow answers, from the
        attainment score) exceeds what the class allows *with confidence* (a point
        estimate reads two slow answers in ~100 as 2 %, noise that would defer a whole
        p99 class); without that score, its SLO-metric tail exceeds the budget."""
        if cand is not None and (v := cand.scores.get("violation")) is not None:
            n = cand.scores.get("violation_n", 0.0)
            allowed = max(1.0 - klass.slo.percentile / 100.0, 1e-4)
            if n <= 0.0:
                return v > allowed
            return _significant(round(v * n), round(n), allowed,
                                1.0 - self.config.health.confidence)
        tail = self._tail_ms(None if cand is None else cand.latency, name, req, klass, view, now)
        return tail is not None and tail > klass.slo.budget_ms

    def over(self, name: str, req: RequestInfo, klass: ClassConfig, view: RouteView,
             now: float) -> bool:
        """Is route ``name`` over ``klass``'s budget as admission judges a route offered
        without a pipeline result (its tail)? Asked before a refusable request carries
        a probe or trial there (sidecar.core.plan_cache, "Evidence and admission")."""
        return self._over(None, name, req, klass, view, now)

    def fits(self, name: str, req: RequestInfo, klass: ClassConfig, view: RouteView,
             now: float) -> bool:
        """Does route ``name`` fit ``req``'s deadline, judged there alone: its e2e median
        and tail (the class percentile) within what is left (unknown ones fit)? On a
        route that does not, admission would reject or skip the request (rows 3-5)
        instead of moving it (sidecar.core.plan_cache, "Evidence and admission")."""
        left = remaining_ms(req, klass)
        return left > 0 and all(need is None or need <= left
                                for need in _e2e_ms(name, req, klass, view, now))

    def _some_route_ok(
        self, req: RequestInfo, klass: ClassConfig, decision: Decision,
        result: PipelineResult | LanePick | None, view: RouteView, now: float,
    ) -> bool:
        """Is some usable candidate below capacity and within budget (``not saturated``)?
        Then, without a deadline, a retry or waiters, only the last row (ok) can match."""
        if isinstance(result, LanePick):
            # Every route the lane kept is below capacity; whether one is over budget
            # reads only the plan's scores: computed once per plan (and class).
            lane = result.lane
            hit = lane.over
            if hit is not None and hit[0] is klass:
                over = hit[1]
            else:
                cands = [c for c in lane.plan.candidates if c.dropped is None]
                over = tuple(self._over(c, c.name, req, klass, view, now) for c in cands)
                if all("violation" in c.scores for c in cands):
                    lane.over = (klass, over)  # else a tail lookup moves with time
            for i in result.kept:  # noqa: SIM110 -- a loop, not any(genexpr): per decision
                if not over[i]:
                    return True
            return False
        if result is None or result.panic or result.chosen.dropped is not None:
            return False
        for c in (result.chosen, *result.candidates):
            if c.dropped not in (None, "capacity"):
                continue
            if view.inflight(c.name) >= self.config.cluster(c.name).max_concurrency:
                continue
            if not self._over(c, c.name, req, klass, view, now):
                return True
        return False

    # ------------------------------------------------------------ route choice

    def _choose(
        self, req: RequestInfo, facts: list[RouteFacts], chosen: str, remaining: float,
        is_retry: bool, previous: str | None, now: float,
    ) -> tuple[str | None, str]:
        """Final route for an admitted request (None: retry budget exhausted everywhere)."""
        sel = [f for f in facts if f.selectable]
        by_name = {f.name: f for f in facts}
        cand, note = chosen, ""
        cur = by_name.get(chosen)
        if (req.deadline_ms is not None and req.step != "optional" and cur is not None
                and cur.tail_ms is not None and cur.tail_ms > remaining):
            fit = [f for f in sel if f.tail_ms is not None and f.tail_ms <= remaining]
            timed = [f for f in sel if f.tail_ms is not None]
            best = (max(fit, key=lambda f: f.weight) if fit
                    else min(timed, key=lambda f: f.tail_ms or 0.0) if timed else cur)
            if best.name != chosen and (best.tail_ms or 0.0) < cur.tail_ms:
                cand = best.name
                why = "fits" if fit else "strongest tail, none fits"
                note = (f"deadline_fit: {chosen} e2e tail {cur.tail_ms:.0f}ms > "
                        f"{remaining:.0f}ms left -> {cand} ({why})")
        if not is_retry:
            return cand, note
        if not self.budget.tenant_allows(req.tenant, now):
            return None, self.budget.describe_tenant(req.tenant or "", now)
        allowed = [f for f in sel if self.budget.allows(f.name, now)]
        if not allowed:
            return None, self.budget.describe(cand, now)
        names = {f.name for f in allowed}
        if cand not in names or (cand == previous and len(allowed) > 1):
            pool = [f for f in allowed if f.name != previous] or allowed
            new = max(pool, key=lambda f: f.weight).name
            note = (note + "; " if note else "") + f"retry moved {cand} -> {new}"
            cand = new
        return cand, note

    # ------------------------------------------------------------ assess

    def assess(
        self, req: RequestInfo, klass: ClassConfig, decision: Decision,
        result: PipelineResult | LanePick | None, view: RouteView, now: float,
        ticket: str | None, rng: Random | None = None,
    ) -> Verdict:
        """Decide admission for ``req`` and record it (queue, retry memory, budgets)."""
        cfg = self.cfg
        self.queue.prune(now)
        left = remaining_ms(req, klass)
        timeout = whole_answer_timeout(left)
        seen = self.memory.lookup(req.request_id, now)
        waiter = self.queue.get(ticket)
        is_retry = req.retry_attempt > 0 or seen is not None
        if not cfg.enabled:
            return Verdict("admit", "disabled", decision.cluster, timeout, is_retry)
        # A deferral's comeback: a retry, but the budget's first attempt (retry_budget).
        comeback = is_retry and self.budget.owes(req.tenant, now)
        pressure = self.pressure
        pressure.prune(now)
        high = cfg.high(req.priority)
        yielding = high and pressure.above(req.priority, now)
        if (req.deadline_ms is None and not is_retry and not len(self.queue) and not yielding
                and self._some_route_ok(req, klass, decision, result, view, now)):
            # Fast path (the common case): only the last row (ok) can match.
            self.memory.remember(req.request_id, decision.cluster, now)
            self.budget.record(decision.cluster, now, False, req.tenant)
            key = (decision.cluster, timeout)
            v = self._plain.get(key)
            if v is None:
                if len(self._plain) > 1024:
                    self._plain.clear()
                v = self._plain[key] = Verdict("admit", "ok", decision.cluster, timeout, False)
            return v
        result = full_result(result)
        held = pressure.held_routes(req.priority, now) if yielding else {}
        facts = self._facts(req, klass, decision, result, view, now, held)
        usable = [f for f in facts if f.usable]
        evidence = decision.reason in ("probe", "trial") and not is_retry
        if usable and not evidence and all(f.tight and (f.full or f.over) for f in usable):
            # Saturated on this class's own terms (reserves aside) with every route near
            # its capacity: pressed. Others yielding cannot help routes merely slow.
            pressure.mark(klass.name, req.priority, frozenset(f.name for f in usable), now)
        yields_to = next((f.held_for for f in usable if f.held_for is not None), None)
        need = _min(f.p50_ms for f in usable)
        ok = [f for f in facts if f.ok]
        free = sum(f.free for f in ok)
        ahead = self.queue.ahead(req.priority, waiter, now)
        saturated = not ok
        contended = saturated or (ahead > 0 and free <= ahead)
        waits_help = any(f.usable and (f.full or f.reserved) and not f.over for f in facts) or (
            not saturated and contended)
        has_deadline = req.deadline_ms is not None
        window = cfg.queue_wait_ms if ticket is not None else 0.0
        if has_deadline:
            window = min(window, left - (need or 0.0))
        cluster, choice_note = self._choose(req, facts, decision.cluster, left,
                                            is_retry and not comeback,
                                            seen.cluster if seen else None, now)
        s = Situation(
            enabled=True, high=high, step=req.step, has_deadline=has_deadline, remaining_ms=left,
            need_ms=need, need_tail_ms=_min(f.tail_ms for f in usable), is_retry=is_retry,
            retry_blocked=cluster is None, saturated=saturated, capacity_bound=waits_help,
            yields=yields_to is not None, contended=contended, queued=waiter is not None,
            wait_expired=waiter is not None and waiter.expired(now),
            queue_room=self.queue.has_room(now), queue_window_ms=window,
            can_defer=not has_deadline or left >= cfg.defer_retry_after_s * 1000.0 + (need or 0.0),
            full=bool(usable) and all(f.packed for f in usable),
            shed_full=cfg.beyond_capacity == "shed", evidence=evidence,
        )
        rule = evaluate(s)
        if (probe := rescue_route(rule, facts, result, decision.cluster, view,
                                  self.config.health.probe_share, rng)) is not None:
            rule, cluster, choice_note = RESCUE, probe, f"probe to cooling {probe}"
        note = row_note(rule, s, ahead, free, choice_note, yields_to)
        final = cluster or decision.cluster
        if rule.outcome == "queue":
            if waiter is None:
                assert ticket is not None  # window > 0 requires a ticket
                waiter = self.queue.join(ticket, req.priority, now, now + window / 1000.0)
                return Verdict("queue", rule.reason, final, None, is_retry, note)
            return Verdict("queue", rule.reason, final, None, is_retry, note, requeued=True)
        self.queue.leave(ticket if waiter is not None else None)
        self.memory.remember(req.request_id, final, now)
        if comeback != (rule.outcome == "defer"):  # owed by a defer, settled by the rest
            self.budget.owe(req.tenant, now, -1.0 if comeback else 1.0)
        if rule.outcome != "admit":
            return Verdict(rule.outcome, rule.reason, final, None, is_retry, note)
        self.budget.record(final, now, is_retry and not comeback, req.tenant)
        return Verdict("admit", rule.reason, final, timeout, is_retry, note)

    def wait_until(self, ticket: str) -> float | None:
        """When the shell should re-ask at the latest for a queued ``ticket``."""
        w: Waiter | None = self.queue.get(ticket)
        return None if w is None else w.until

