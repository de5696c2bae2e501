"""What admission knows about each candidate route, and what it answers.

:class:`RouteFacts` is one eligible candidate as admission control
(:class:`~sidecar.core.admission.AdmissionControl`) sees it: usable, full, over
budget, reserved for a more important class (the definitions are in
:mod:`sidecar.core.admission`'s docstring). :class:`Verdict` is its answer for one
request: admit (possibly on another route), queue, defer, shed, reject or skip,
with a machine-readable reason, the route timeout and a note. Both are frozen;
``Verdict``'s ``__init__`` is written out so that the compiled lab builds it as a
native class (:mod:`sidecar.core.frozen`).
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.core.admission_rules import STATUS
from sidecar.core.frozen import fast_init
from sidecar.core.types import Admission


@fast_init
@dataclass(frozen=True, slots=True)
class RouteFacts:
    """What admission knows about one eligible candidate."""

    name: str
    usable: bool
    selectable: bool  # survived selection (has a weight); the panic choice counts
    weight: float
    full: bool
    free: int
    over: bool
    p50_ms: float | None = None
    tail_ms: float | None = None
    tight: bool = False  # no free slot beyond the reserve (admission.yield_reserve)
    held_for: str | None = None  # a more important pressed class shares this route
    reserved: bool = False  # held_for and tight
    # Full of work at or above shed_below_priority (less important work holds no slot a
    # more important request could take beyond max_concurrency instead).
    packed: bool = False

    @property
    def ok(self) -> bool:
        return self.usable and not self.full and not self.over and not self.reserved


@dataclass(frozen=True, slots=True)
class Verdict:
    """The admission answer for one request."""

    outcome: Admission
    reason: str
    cluster: str
    timeout_ms: float | None
    is_retry: bool
    note: str = ""
    requeued: bool = False  # already waiting and still waiting: not a new event

    # Written out for the compiled lab (read once or more per request; sidecar.core.frozen).
    def __init__(
        self, outcome: Admission, reason: str, cluster: str, timeout_ms: float | None,
        is_retry: bool, note: str = "", requeued: bool = False,
    ) -> None:
        object.__setattr__(self, "outcome", outcome)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "cluster", cluster)
        object.__setattr__(self, "timeout_ms", timeout_ms)
        object.__setattr__(self, "is_retry", is_retry)
        object.__setattr__(self, "note", note)
        object.__setattr__(self, "requeued", requeued)

    @property
    def status(self) -> int | None:
        return STATUS.get(self.outcome)


fast_init(Verdict)
