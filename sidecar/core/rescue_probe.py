"""Probe instead of refuse: a request refused for want of room probes a cooling route (pure).

A route whose circuit is open (quarantined, or probing outside the probe share)
learns that it recovered only from probes, and a quarantined one takes none
until its cooldown is over. That cooldown doubles with each failed probe
round (:mod:`sidecar.core.health`), so after an outage of a few minutes the
next probe can come long after the route is back, while the routes left are
full and admission refuses work. A request admission refuses for want of room
is already a failure to its caller; sent to the cooling route as a probe it
costs little more, and it finds the recovery early.

The rule, after the admission table (:mod:`sidecar.core.admission_rules`) chose
its row for a request::

    room_refusal = outcome in {defer, shed} and reason in {overload, yield, full}
                   and every usable route is full or reserved
                   (not for a deadline, a retry budget or an optional step: those
                   rows come first; nor for routes merely over budget)
    cooling(r)   = r is a candidate of the request that no hard filter dropped
                   (model served, region policy: never relaxed, not even for a probe)
                   whose circuit is open (quarantined or probing), r is not the
                   chosen route, and inflight(r) == 0 (at most one such probe at a time)
    rescue       = room_refusal and some cooling(r) and u < health.probe_share
                   (u uniform from the injected rng; probe_share 0.05 by default)
    route        = one cooling route, uniformly at random

A rescued request is admitted to ``route`` as a probe (reason ``probe``, admission
reason ``rescue``), under the class's timeout as any admitted request, and marked
(``Decision.is_rescue``, carried to its ``Observation`` by the shell and by the
lab). Its answer is probe evidence (:func:`counts_as_probe`): one that meets the
probe's criteria while the route is quarantined ends the cooldown and counts as
the first of ``health.probe_successes`` (RESCUE_OK, the health table's row
``quarantined -> probing`` with ``then=PROBE_OK``: the restore ladder proceeds as
after a normal probe); while probing or restricted it counts as any probe. A failed
one while quarantined changes nothing (no rule for PROBE_FAIL there): the cooldown
is not lengthened, and while probing it counts toward ``eject_consecutive`` as any
failed probe. Only a rescue sent after the route entered quarantine counts there: a
straggler sent before says nothing about the recovery. Any other probe answer
leaves a quarantined entry alone: a slice can be probed while quarantined when its
whole cluster's entry is probing (that entry's probe share reaches every slice),
and such an answer is the cluster entry's evidence, not a reason to cut the
slice's doubled cooldown short (before the mark, it did).

The cost bound: per refusal a chance of ``probe_share`` (what a probing route
gets of its slice's traffic), and one probe in flight per route, so a route
that hangs (a timeout) holds at most one caller at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from random import Random
from typing import Final

from sidecar.core.admission_rules import Rule
from sidecar.core.admission_verdict import RouteFacts
from sidecar.core.health import HealthState, RouteHealth
from sidecar.core.selection import PipelineResult, RouteView

RESCUE: Final = Rule(lambda s: False, "admit", "rescue")  # never matched in the table
ROOM_REASONS: Final = frozenset({"overload", "yield", "full"})
_COUNTED: Final = (HealthState.PROBING, HealthState.RESTRICTED)


def room_refusal(outcome: str, reason: str, facts: Sequence[RouteFacts]) -> bool:
    """Is this a refusal for want of room (module docstring, ``room_refusal``)?"""
    return (outcome in ("defer", "shed") and reason in ROOM_REASONS
            and all(f.full or f.reserved for f in facts if f.usable))


def rescue_route(
    rule: Rule, facts: Sequence[RouteFacts], result: PipelineResult | None, chosen: str,
    view: RouteView, share: float, rng: Random | None,
) -> str | None:
    """The cooling route a request ``rule`` refuses probes instead (None: refuse it)."""
    if (rng is None or result is None or share <= 0.0
            or not room_refusal(rule.outcome, rule.reason, facts)):
        return None
    # A result's candidates include those a hard filter dropped: a region policy's
    # routes outside the model's regions are no probe target for its requests.
    cooling = [c.name for c in result.candidates
               if c.health.quarantined and (c.dropped is None or c.soft_drop)
               and c.name != chosen and view.inflight(c.name) == 0]
    if not cooling or rng.random() >= share:
        return None
    return cooling[0] if len(cooling) == 1 else rng.choice(cooling)


def counts_as_probe(h: RouteHealth, rescue_sent: float | None) -> bool:
    """Does a probe's answer count for entry ``h``? ``rescue_sent``: when a rescue was
    sent, None for any other probe. Probing and restricted entries take every probe; a
    quarantined one only a rescue sent since it entered quarantine (module docstring)."""
    return h.state in _COUNTED or (h.state is HealthState.QUARANTINED
                                   and rescue_sent is not None and rescue_sent >= h.since)
