"""The admission decision table: plain data in, one row out (pure).

:class:`Situation` holds what :class:`~sidecar.core.admission.AdmissionControl`
measured (definitions in that module's docstring); :data:`RULES` is the table,
first matching row wins. Deadline rows apply only when the caller sent
``x-tailroute-deadline-ms``; ``optional`` means ``x-tailroute-step: optional``.

==  ==========================================  =======  =====================
#   when                                        outcome  reason
==  ==========================================  =======  =====================
1   admission disabled                          admit    disabled
2   optional and remaining <= 0                 skip     deadline_exhausted
3   remaining <= 0                              reject   deadline_exhausted
4   optional and need_tail > remaining          skip     optional_does_not_fit
5   need > remaining                            reject   deadline_unreachable
6   retry and no route has retry budget         reject   retry_budget
7   contended and optional                      skip     overload_optional
8   contended and not high and can_defer        defer    overload
9   contended and not high                      shed     overload
10  contended, waiting helps, may queue         queue    capacity
11  contended and yields and can_defer          defer    yield
12  contended and yields                        shed     yield
13  contended, all_full, shed_full, can_defer   defer    full
14  contended, all_full, shed_full              shed     full
15  contended and evidence                      admit    evidence
16  contended                                   admit    best_effort
17  otherwise                                   admit    ok
==  ==========================================  =======  =====================

"Evidence" = the router's probe or trial (not a retry): it comes with no pipeline
result, so it is judged on its one route, often over budget by design (that is why
it is probed). Row 15 admits it under its own name rather than as best effort, and
its one route does not mark its class saturated (toward pressed). A class that rows
8-9 would refuse carries no evidence to a route over its budget
(sidecar.core.plan_cache, "Evidence and admission").

"Yields" = a more important class is pressed on one of the request's usable
routes (:mod:`sidecar.core.admission_priority`): strict priority applies, so
once its wait in the (priority-ordered) queue is over the request gives way
instead of being served best effort on capacity the pressed class needs.

"Waiting helps" = a usable route within budget is merely full (or reserved for
a pressed class), or waiters are ahead. "May queue" = already waiting and not
expired, or: a queue ticket, room in the queue and a positive wait window
``min(queue_wait_ms, remaining - need)``.
HTTP status per outcome: :data:`STATUS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from sidecar.core.types import Admission, Step

STATUS: Final[dict[str, int]] = {"defer": 429, "shed": 503, "reject": 503, "skip": 412}


@dataclass(frozen=True, slots=True)
class Situation:
    """Everything the decision table reads; built by :meth:`AdmissionControl.assess`."""

    enabled: bool = True
    high: bool = True
    step: Step | None = None
    has_deadline: bool = False
    remaining_ms: float = 30000.0
    need_ms: float | None = None
    need_tail_ms: float | None = None
    is_retry: bool = False
    retry_blocked: bool = False
    saturated: bool = False
    capacity_bound: bool = False
    yields: bool = False
    contended: bool = False
    queued: bool = False
    wait_expired: bool = False
    queue_room: bool = True
    queue_window_ms: float = 0.0
    can_defer: bool = True
    # all_full: every usable route is at max_concurrency with work at or above
    # shed_below_priority (slots of less important work do not count)
    full: bool = False
    shed_full: bool = True  # admission.beyond_capacity is "shed"
    # a probe or trial the router sent (not a retry): judged on its one route, which is
    # over budget by design; a class the router may refuse never carries one there
    evidence: bool = False

    @property
    def optional(self) -> bool:
        return self.step == "optional"

    @property
    def may_queue(self) -> bool:
        if self.queued:
            return not self.wait_expired
        return self.queue_room and self.queue_window_ms > 0

    @property
    def deadline_over(self) -> bool:
        return self.has_deadline and self.remaining_ms <= 0


@dataclass(frozen=True, slots=True)
class Rule:
    """One row of the decision table."""

    when: Callable[[Situation], bool]
    outcome: Admission
    reason: str


def _exceeds(need: float | None, remaining: float) -> bool:
    return need is not None and need > remaining


RULES: Final[tuple[Rule, ...]] = (
    Rule(lambda s: not s.enabled, "admit", "disabled"),
    Rule(lambda s: s.deadline_over and s.optional, "skip", "deadline_exhausted"),
    Rule(lambda s: s.deadline_over, "reject", "deadline_exhausted"),
    Rule(lambda s: s.has_deadline and s.optional and _exceeds(s.need_tail_ms, s.remaining_ms),
         "skip", "optional_does_not_fit"),
    Rule(lambda s: s.has_deadline and _exceeds(s.need_ms, s.remaining_ms),
         "reject", "deadline_unreachable"),
    Rule(lambda s: s.is_retry and s.retry_blocked, "reject", "retry_budget"),
    Rule(lambda s: s.contended and s.optional, "skip", "overload_optional"),
    Rule(lambda s: s.contended and not s.high and s.can_defer, "defer", "overload"),
    Rule(lambda s: s.contended and not s.high, "shed", "overload"),
    Rule(lambda s: s.contended and s.capacity_bound and s.may_queue, "queue", "capacity"),
    Rule(lambda s: s.contended and s.yields and s.can_defer, "defer", "yield"),
    Rule(lambda s: s.contended and s.yields, "shed", "yield"),
    Rule(lambda s: s.contended and s.full and s.shed_full and s.can_defer, "defer", "full"),
    Rule(lambda s: s.contended and s.full and s.shed_full, "shed", "full"),
    Rule(lambda s: s.contended and s.evidence, "admit", "evidence"),
    Rule(lambda s: s.contended, "admit", "best_effort"),
    Rule(lambda s: True, "admit", "ok"),
)


def evaluate(s: Situation) -> Rule:
    """The first row of :data:`RULES` that matches ``s``."""
    return next(r for r in RULES if r.when(s))


def row_note(rule: Rule, s: Situation, ahead: int, free: int, choice: str,
             yields_to: str | None = None) -> str:
    """A short human explanation of the row that matched."""
    parts: list[str] = []
    if rule.reason in ("deadline_exhausted", "deadline_unreachable", "optional_does_not_fit"):
        need = s.need_tail_ms if rule.reason == "optional_does_not_fit" else s.need_ms
        parts.append(f"{s.remaining_ms:.0f}ms left"
                     + (f", best route needs {need:.0f}ms" if need is not None else ""))
    elif rule.reason == "retry_budget":
        parts.append(f"retry budget spent ({choice})")
        choice = ""
    elif rule.reason == "evidence":
        parts.append("a probe or trial, judged on its route alone")
    elif s.contended:
        why = "every eligible route is full or over budget" if s.saturated else (
            f"{ahead} waiter(s) ahead for {free} free slot(s)")
        parts.append(why)
        if rule.reason == "yield":
            parts.append(f"capacity held for pressed class {yields_to}")
        elif rule.reason == "full":
            parts.append("every usable route is at max_concurrency"
                         + ("; queue wait over" if s.queued else ""))
        if rule.outcome == "queue":
            parts.append("waiting" if s.queued else f"queued up to {s.queue_window_ms:.0f}ms")
        elif rule.reason == "best_effort":
            parts.append("queue wait over" if s.queued and s.wait_expired
                         else "waiting cannot help" if not s.capacity_bound
                         else "queue full" if not s.queue_room else "no time to wait")
    if choice and rule.outcome in ("admit", "queue"):
        parts.append(choice)
    return "; ".join(parts)
