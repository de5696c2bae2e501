"""Graduated health state machine per (cluster, slice).

Two time scales feed it. **Windows** (latency and outcome evidence): once per
evaluation window the route's summary and the class SLO become a
:class:`~sidecar.core.health_signals.WindowVerdict`, classified into one
:class:`~sidecar.core.health_signals.Signal` (BURST, INSUFFICIENT_ERRORS,
STALE, INSUFFICIENT, THREATENING, ELEVATED, OK or BAND; the rules, in their
priority, and the route's own history are in :mod:`sidecar.core.health_signals`).

**Hard failures** (the fast path, :meth:`RouteHealth.note_outcome`): runs of
hard failures eject a route at once (FAST_FAIL) or, when such a run is likely
by chance on a partly failing route, restrict it (PARTIAL_FAIL); the run, its
trials and the failure episode are :class:`~sidecar.core.failure_run.FailureRun`'s
(the rules and their formulas are in :mod:`sidecar.core.failure_run`).

Other signals: COOLDOWN_OVER (time, :meth:`RouteHealth.tick`) and the probe results PROBE_OK,
PROBE_FAIL and RESCUE_OK (:meth:`RouteHealth.record_probe`; RESCUE_OK: a rescue's ok answer,
the only one that ends a cooldown early, :mod:`sidecar.core.rescue_probe`); a probing route
returns to quarantine on ``eject_consecutive`` failed probes in a row, not on one. Probes go
to probing routes and, for latency-sensitive classes, to restricted ones: a restricted route
receives no such traffic, so without probes it could never show that it recovered.
:data:`TRANSITIONS` maps ``(state, signal)`` to a :class:`Rule`; absent pairs keep the state
and its vote streaks. A counted rule ``Rule(target, after=N)`` moves once N consecutive
windows voted for ``target`` (a window voting for another target restarts the count; a
``reset`` rule clears it; neutral signals keep it); ``then`` applies the same input again, as
that signal, in the state moved to.

Weight (share of selection weight for latency-sensitive classes; tolerant
classes see 1.0 except while the circuit is open or restoring from it)::

    healthy, watching  1.0          quarantined, probing  0.0 (probes: probe_share * m)
    degraded           degraded_weight
    restricted         0.0 (excluded_for_sensitive)
    restoring          min(1, w0 + n * restore_step * m) after n clean windows;
                       w0 = min(restore_step * m, 0.5) from probing,
                       max(degraded_weight, that) from degraded
    m = relapse_factor ** relapses     (repeat-offender memory)

A **relapse** is an escalation to degraded or quarantined while restoring, or
within ``forgive_after_s`` of having been restored. Cooldown on the k-th
offence (entry into quarantine): ``min(cooldown_s * 2**(k-1), cooldown_max_s)``.
Every ``forgive_after_s`` spent healthy forgives one offence and one relapse.

Invariants:

1. Only BURST, FAST_FAIL, a counted THREATENING in restricted, or PROBE_FAIL enter
   quarantined; only COOLDOWN_OVER or RESCUE_OK leaves it; only probe results leave probing.
2. Insufficient-sample windows (INSUFFICIENT*, STALE) never escalate: a
   sparse route's lone spike cannot degrade or quarantine it. A window
   escalates only on evidence significant at ``confidence``.
3. No jump to full weight after an open circuit: probing -> restoring at w0 <=
   0.5, then at most ``restore_step`` per window; restricted returns via
   degraded and restoring, never straight to healthy. Each relapse shrinks
   the restore steps and the probe share by ``relapse_factor``.
4. ``may_quarantine=False`` (last viable route): an evaluation or a fast
   ejection that would quarantine enters/stays restricted instead, reason
   "panic: last viable route". The caller answers for failures (a fast
   ejection; ``may_quarantine_failing`` for a BURST window) by whether another
   route still serves, for latency by whether another is viable
   (:mod:`sidecar.core.viability`).
5. Every state change yields exactly one TransitionEvent with a reason; an
   evaluation window is applied at most once (indices must increase).
6. Votes are cleared on every state change except a move to ``meanwhile``
   (healthy -> watching: the first elevated window counts toward degraded).

:class:`~sidecar.core.health_board.HealthBoard` keeps every route's
:class:`RouteHealth`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from sidecar.core.config import HealthConfig, StatsConfig
from sidecar.core.failure_run import FailureRun
from sidecar.core.health_signals import History, Signal, WindowVerdict, classify
from sidecar.core.types import SliceKey, TransitionEvent


class HealthState(StrEnum):
    HEALTHY = "healthy"
    WATCHING = "watching"
    DEGRADED = "degraded"
    RESTRICTED = "restricted"
    QUARANTINED = "quarantined"
    PROBING = "probing"
    RESTORING = "restoring"


@dataclass(frozen=True, slots=True)
class Rule:
    """``target`` None: stay (``reset`` clears vote streaks). ``after``: name of the
    vote count needed (a HealthConfig field or "restore_steps"); None = at once."""

    target: HealthState | None
    after: str | None = None
    meanwhile: HealthState | None = None  # state to hold while votes accumulate
    reset: bool = False
    then: Signal | None = None  # what the same input then is, in the state moved to


S, G = HealthState, Signal
_RESET: Final = Rule(None, reset=True)
_EJECT: Final = Rule(S.QUARANTINED)
TRANSITIONS: Final[dict[tuple[HealthState, Signal], Rule]] = {
    (S.HEALTHY, G.ELEVATED): Rule(S.DEGRADED, "degrade_windows", meanwhile=S.WATCHING),
    (S.HEALTHY, G.THREATENING): Rule(S.DEGRADED, "degrade_windows", meanwhile=S.WATCHING),
    (S.HEALTHY, G.BURST): _EJECT,
    (S.HEALTHY, G.FAST_FAIL): _EJECT,
    (S.HEALTHY, G.PARTIAL_FAIL): Rule(S.RESTRICTED),
    (S.WATCHING, G.OK): Rule(S.HEALTHY, "recover_windows"),
    (S.WATCHING, G.BAND): _RESET,
    (S.WATCHING, G.ELEVATED): Rule(S.DEGRADED, "degrade_windows"),
    (S.WATCHING, G.THREATENING): Rule(S.DEGRADED, "degrade_windows"),
    (S.WATCHING, G.STALE): Rule(S.HEALTHY),
    (S.WATCHING, G.BURST): _EJECT,
    (S.WATCHING, G.FAST_FAIL): _EJECT,
    (S.WATCHING, G.PARTIAL_FAIL): Rule(S.RESTRICTED),
    (S.DEGRADED, G.OK): Rule(S.RESTORING, "recover_windows"),
    (S.DEGRADED, G.BAND): _RESET,
    (S.DEGRADED, G.ELEVATED): _RESET,
    (S.DEGRADED, G.THREATENING): Rule(S.RESTRICTED, "restrict_windows"),
    (S.DEGRADED, G.STALE): Rule(S.WATCHING),
    (S.DEGRADED, G.BURST): _EJECT,
    (S.DEGRADED, G.FAST_FAIL): _EJECT,
    (S.DEGRADED, G.PARTIAL_FAIL): Rule(S.RESTRICTED),
    (S.RESTRICTED, G.OK): Rule(S.DEGRADED, "recover_windows"),
    (S.RESTRICTED, G.BAND): _RESET,
    (S.RESTRICTED, G.ELEVATED): _RESET,
    (S.RESTRICTED, G.THREATENING): Rule(S.QUARANTINED, "restricted_windows_to_quarantine"),
    (S.RESTRICTED, G.STALE): Rule(S.WATCHING),
    (S.RESTRICTED, G.BURST): _EJECT,
    (S.RESTRICTED, G.FAST_FAIL): _EJECT,
    # Restricted routes get no latency-sensitive traffic, so evidence of recovery comes
    # from the probe trickle the router sends them (probes must finish within budget),
    # a longer run than the circuit's: a route still missing a quarter of its requests
    # passes five in a row about once in 13 probes.
    (S.RESTRICTED, G.PROBE_OK): Rule(S.DEGRADED, "restricted_probe_successes"),
    (S.RESTRICTED, G.RESCUE_OK): Rule(S.DEGRADED, "restricted_probe_successes"),
    (S.RESTRICTED, G.PROBE_FAIL): _RESET,
    (S.QUARANTINED, G.COOLDOWN_OVER): Rule(S.PROBING),
    # An ok rescue ends the cooldown early and is the first of probe_successes (then); any
    # other probe answer (not a rescue, or failed) leaves the cooldown alone (absent pairs).
    (S.QUARANTINED, G.RESCUE_OK): Rule(S.PROBING, then=G.PROBE_OK),
    (S.PROBING, G.PROBE_OK): Rule(S.RESTORING, "probe_successes"),
    (S.PROBING, G.RESCUE_OK): Rule(S.RESTORING, "probe_successes"),  # votes are per target
    # One failed probe says little about a partly failing route (30 % failures fail a
    # probe in three): the circuit closes again only on eject_consecutive failed
    # probes in a row, the fast path's own rule, so a hard outage is still re-ejected
    # within a few probes while a partial failure gets to restoring and is then
    # judged by its windows (down-weighted or restricted, kept while others lack room).
    (S.PROBING, G.PROBE_FAIL): Rule(S.QUARANTINED, "eject_consecutive"),
    (S.RESTORING, G.OK): Rule(S.HEALTHY, "restore_steps"),
    (S.RESTORING, G.INSUFFICIENT): Rule(S.HEALTHY, "restore_steps"),
    (S.RESTORING, G.STALE): Rule(S.HEALTHY, "restore_steps"),
    (S.RESTORING, G.ELEVATED): Rule(S.DEGRADED),
    (S.RESTORING, G.THREATENING): Rule(S.DEGRADED),
    (S.RESTORING, G.BURST): _EJECT,
    (S.RESTORING, G.FAST_FAIL): _EJECT,
    (S.RESTORING, G.PARTIAL_FAIL): Rule(S.RESTRICTED),
}
_STAY: Final = Rule(None)
_PROBE_DETAIL: Final = {G.PROBE_OK: "probe ok", G.PROBE_FAIL: "probe failed",
                         G.RESCUE_OK: "rescue probe ok during cooldown"}
# Signals whose quarantine respects may_quarantine (the last viable route is kept).
_GUARDED_SIGNALS: Final = frozenset(G) - {G.COOLDOWN_OVER, *_PROBE_DETAIL}
_ESCALATIONS: Final = (S.DEGRADED, S.QUARANTINED)
# The members the per-request views test, as module constants: compiled, a lookup on
# the enum class costs more than the rest of such a test.
_HEALTHY: Final = S.HEALTHY
_DEGRADED: Final = S.DEGRADED
_RESTRICTED: Final = S.RESTRICTED
_QUARANTINED: Final = S.QUARANTINED
_PROBING: Final = S.PROBING
_RESTORING: Final = S.RESTORING
_FULL_WEIGHT: Final = (S.HEALTHY, S.WATCHING)
_EXCLUDED: Final = (S.RESTRICTED, S.QUARANTINED, S.PROBING)
_OPEN: Final = (S.QUARANTINED, S.PROBING)


class RouteHealth(FailureRun):
    """Health of one (cluster, slice); all methods take ``now`` and return events."""

    def __init__(
        self, cluster: str, slice: SliceKey, cfg: HealthConfig, stats_cfg: StatsConfig, now: float
    ) -> None:
        self.cluster, self.slice, self.cfg, self.stats_cfg = cluster, slice, cfg, stats_cfg
        self.state = S.HEALTHY
        self.since = now  # when the current state was entered
        self.offences = 0  # entries into quarantine (cooldown doubling)
        self.relapses = 0  # escalations soon after a restore (restore/probe shrink)
        self.cooldown_until: float | None = None
        self.panic = False  # held restricted instead of quarantined (last viable route)
        self.votes: dict[HealthState, int] = {}
        self.last_index: int | None = None  # newest evaluation window applied
        self.last_evidence = now  # newest window with a tail (or state entry)
        self.healthy_since = now
        self.restored_at: float | None = None  # last return to healthy from restoring
        self.restore_base = 0.0
        self.restore_from_circuit = False
        self.history = History()
        self._init_run(now)

    # ------------------------------------------------------------ views

    @property
    def memory(self) -> float:
        """Repeat-offender multiplier ``relapse_factor ** relapses`` (module docstring)."""
        return self.cfg.relapse_factor ** min(self.relapses, 30)

    @property
    def restore_step(self) -> float:
        return self.cfg.restore_step * self.memory

    @property
    def weight(self) -> float:
        """Selection weight for latency-sensitive classes (table in the module docstring)."""
        if self.state in _FULL_WEIGHT:
            return 1.0
        if self.state is _DEGRADED:
            return self.cfg.degraded_weight
        if self.state is _RESTORING:
            steps = self.votes.get(_HEALTHY, 0)
            return min(1.0, self.restore_base + steps * self.restore_step)
        return 0.0

    def weight_for(self, latency_sensitive: bool) -> float:
        """Tolerant classes ignore latency states but not an open or restoring circuit."""
        if latency_sensitive or self.circuit_open:
            return self.weight
        return self.weight if self.state is _RESTORING and self.restore_from_circuit else 1.0

    @property
    def excluded_for_sensitive(self) -> bool:
        return self.state in _EXCLUDED

    @property
    def circuit_open(self) -> bool:
        return self.state in _OPEN

    @property
    def probe_share(self) -> float:
        """Share of the slice's traffic to send as probes (0 unless probing)."""
        return self.cfg.probe_share * self.memory if self.state is _PROBING else 0.0

    def next_deadline(self) -> float | None:
        return self.cooldown_until if self.state is _QUARANTINED else None

    @property
    def is_default(self) -> bool:
        """Indistinguishable from a fresh route (the board need not keep it)."""
        return self.state is _HEALTHY and not (
            self.offences or self.relapses or self.votes or self.panic or self.streak
            or self.history.windows or self.fail_rate > 1e-3)

    # ------------------------------------------------------------ inputs

    def tick(self, now: float) -> list[TransitionEvent]:
        """Time-driven transitions: cooldown expiry; forgiveness of old offences."""
        if (self.state is _HEALTHY and (self.offences or self.relapses)
                and now - self.healthy_since >= self.cfg.forgive_after_s):
            self.offences = max(0, self.offences - 1)
            self.relapses = max(0, self.relapses - 1)
            self.healthy_since = now
        deadline = self.next_deadline()
        if deadline is not None and now >= deadline:
            return self._apply(G.COOLDOWN_OVER, now, "cooldown over")
        return []

    def evaluate(
        self, v: WindowVerdict, now: float, may_quarantine: bool = True,
        may_quarantine_failing: bool | None = None,
    ) -> list[TransitionEvent]:
        """Apply one evaluation window (ignored if not newer than the last applied);
        a BURST window asks ``may_quarantine_failing`` (None: ``may_quarantine``)."""
        events = self.tick(now)
        if self.last_index is not None and v.index <= self.last_index:
            return events
        self.last_index = v.index
        stale = now - self.last_evidence >= self.stats_cfg.stale_after_s
        signal = classify(v, self.cfg, stale, self.history)
        if v.ratio is not None:
            self.last_evidence = now
            if self.state in (S.HEALTHY, S.WATCHING) and signal in (G.OK, G.BAND, G.ELEVATED):
                self.history.update(v, self.cfg)
        if signal is G.BURST:
            detail = f"error+timeout {v.failures / v.requests:.0%} of {v.requests} requests"
            if may_quarantine_failing is not None:
                may_quarantine = may_quarantine_failing
        elif signal is G.STALE:
            detail = f"no {v.metric} verdict for {now - self.last_evidence:.0f}s"
        else:
            detail = v.describe()
        return events + self._apply(signal, now, detail, may_quarantine)

    def record_probe(self, ok: bool, now: float, rescue: bool = False) -> list[TransitionEvent]:
        """A probe request finished (ok: succeeded within the caller's criteria; rescue:
        sent instead of a refusal, whose ok answer alone ends a cooldown: RESCUE_OK)."""
        events = self.tick(now)
        signal = (G.RESCUE_OK if rescue else G.PROBE_OK) if ok else G.PROBE_FAIL
        return events + self._apply(signal, now, _PROBE_DETAIL[signal])

    def eject(self, now: float, may_quarantine: bool = True) -> list[TransitionEvent]:
        """The run of hard failures reached its threshold: open the circuit now, or,
        when the run is likely by chance on a partly failing route, restrict it."""
        run = self.streak
        self.end_run()
        if self.run_by_chance(run):
            detail = (f"{run} consecutive hard failures, likely by chance at "
                      f"{self.episode_fail} of {self.episode_ok + self.episode_fail} failed")
            return self._apply(G.PARTIAL_FAIL, now, detail, may_quarantine)
        return self._apply(G.FAST_FAIL, now, f"{run} consecutive hard failures", may_quarantine)

    # ------------------------------------------------------------ machinery

    def _threshold(self, name: str) -> int:
        if name == "restore_steps":
            return max(1, math.ceil((1.0 - self.restore_base) / self.restore_step - 1e-9))
        return int(getattr(self.cfg, name))

    def _apply(
        self, signal: Signal, now: float, detail: str, may_quarantine: bool = True
    ) -> list[TransitionEvent]:
        rule = TRANSITIONS.get((self.state, signal), _STAY)
        was_panic, self.panic = self.panic, False
        if rule.target is None:
            if rule.reset:
                self.votes.clear()
            return []
        n = 1
        if rule.after is not None:
            n = self.votes.get(rule.target, 0) + 1
            self.votes = {rule.target: n}  # a vote for one target breaks other streaks
            if n < self._threshold(rule.after):
                if rule.meanwhile is None or rule.meanwhile is self.state:
                    return []
                return [self._move(rule.meanwhile, now, detail, keep_votes=True)]
        reason = _reason(signal, n, detail, self.cfg, rule.after)
        if rule.target is S.QUARANTINED and not may_quarantine and signal in _GUARDED_SIGNALS:
            self.panic = True
            reason = f"panic: last viable route ({reason})"
            if self.state is S.RESTRICTED:
                self.votes.clear()
                return [] if was_panic else [self._event(now, S.RESTRICTED, reason)]
            return [self._move(S.RESTRICTED, now, reason)]
        moved = [self._move(rule.target, now, reason)]
        return moved if rule.then is None else moved + self._apply(rule.then, now, detail)

    def _move(
        self, new: HealthState, now: float, reason: str, keep_votes: bool = False
    ) -> TransitionEvent:
        old, self.state, self.since, self.last_evidence = self.state, new, now, now
        if not keep_votes:
            self.votes = {}
        self.cooldown_until = None
        if new in _ESCALATIONS and old not in (S.QUARANTINED, S.PROBING, S.RESTRICTED) and (
            old is S.RESTORING or (self.restored_at is not None
                                   and now - self.restored_at < self.cfg.forgive_after_s)
        ):
            self.relapses += 1
            reason = f"{reason}; relapse {self.relapses}"
        if new is S.QUARANTINED:
            self.offences += 1
            self.end_run()
            self._end_episode()  # the circuit's own probes judge it from here
            cooldown = min(self.cfg.cooldown_s * 2.0 ** min(self.offences - 1, 60),
                           self.cfg.cooldown_max_s)
            self.cooldown_until = now + cooldown
            reason = f"{reason}; cooldown {cooldown:g}s (offence {self.offences})"
        elif new is S.RESTORING:
            self.restore_from_circuit = old is S.PROBING
            first = min(self.restore_step, 0.5)
            self.restore_base = first if old is S.PROBING else max(self.cfg.degraded_weight, first)
            reason = f"{reason}; weight {self.weight:.2f}"
        elif new is S.HEALTHY:
            self.healthy_since = now
            if old is S.RESTORING:
                self.restored_at = now
        return self._event(now, old, reason, new)

    def _event(
        self, now: float, old: HealthState, reason: str, new: HealthState | None = None
    ) -> TransitionEvent:
        new = self.state if new is None else new
        return TransitionEvent(now, self.cluster, self.slice.label(), old.value, new.value, reason)


def _reason(signal: Signal, n: int, detail: str, cfg: HealthConfig, after: str | None) -> str:
    """Human reason for a completed transition caused by ``n`` consecutive ``signal``s."""
    windows = f"{n} window" + ("s" if n != 1 else "")
    if after == "restore_steps":
        return f"{windows} clean while restoring ({detail}); weight back to 1.0"
    if signal is G.OK or (signal in (G.ELEVATED, G.THREATENING) and n > 1):
        return f"{detail} for {windows}"
    if signal in (G.PROBE_OK, G.RESCUE_OK) and after is not None:
        return f"{n} consecutive probes ok"
    return detail
