"""Graduated health state machine per (cluster, slice).

Once per completed sub-window (an *evaluation window*) the caller turns the
route's :class:`~sidecar.core.series.WindowSummary` and the class SLO into a
:class:`WindowVerdict` (``ratio = tail_s * 1000 / budget_ms``), which is
classified into one :class:`Signal`, in this priority::

    BURST                (errors + timeouts) / requests >= error_rate_quarantine,
                         with requests >= error_min_samples
    INSUFFICIENT_ERRORS  no tail (samples < min_samples) but some failures
    STALE                no tail, no failures, no tail for >= stats.stale_after_s
    INSUFFICIENT         no tail, no failures
    THREATENING          ratio >= restrict_ratio
    ELEVATED             ratio >= watch_ratio
    BAND                 recover_ratio <= ratio < watch_ratio (hysteresis band)
    OK                   ratio < recover_ratio

plus COOLDOWN_OVER (time, :meth:`RouteHealth.tick`) and PROBE_OK / PROBE_FAIL
(:meth:`RouteHealth.record_probe`). Probes go to probing routes and, for
latency-sensitive classes, to restricted ones: a restricted route receives no
such traffic, so without probes it could never show that it recovered.
:data:`TRANSITIONS` maps ``(state, signal)`` to a :class:`Rule`; absent pairs
keep the state and its vote streaks.
A counted rule ``Rule(target, after=N)`` moves once N consecutive windows voted
for ``target`` (a window voting for another target restarts the count; a
``reset`` rule clears it; neutral signals keep it).

Weight (share of selection weight for latency-sensitive classes; tolerant
classes see 1.0 except while the circuit is open or restoring from it)::

    healthy, watching  1.0          quarantined, probing  0.0 (probes: probe_share)
    degraded           degraded_weight
    restricted         0.0 (excluded_for_sensitive)
    restoring          min(1, w0 + n * restore_step) after n clean windows;
                       w0 = min(restore_step, 0.5) from probing,
                       max(degraded_weight, that) from degraded

Cooldown on the k-th offence: ``min(cooldown_s * 2**(k-1), cooldown_max_s)``;
every ``10 x cooldown_max_s`` spent healthy forgives one offence.

Invariants:

1. Only BURST, a counted THREATENING in restricted, or PROBE_FAIL enter
   quarantined; only COOLDOWN_OVER leaves it; only probe results leave probing.
2. Insufficient-sample windows (INSUFFICIENT*, STALE) never escalate: a
   sparse route's lone spike cannot degrade or quarantine it.
3. No jump to full weight after an open circuit: probing -> restoring at w0 <=
   0.5, then at most ``restore_step`` per window; restricted returns via
   degraded and restoring, never straight to healthy.
4. ``may_quarantine=False`` (last viable route): an evaluation that would
   quarantine enters/stays restricted instead, reason "panic: last viable route".
5. Every state change yields exactly one TransitionEvent with a reason; an
   evaluation window is applied at most once (indices must increase).
6. Votes are cleared on every state change except a move to ``meanwhile``
   (healthy -> watching: the first elevated window counts toward degraded).

:class:`~sidecar.core.health_board.HealthBoard` keeps every route's
:class:`RouteHealth` (importable from here too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from sidecar.core.config import HealthConfig, SloConfig, StatsConfig
from sidecar.core.series import WindowSummary
from sidecar.core.types import SliceKey, TransitionEvent

if TYPE_CHECKING:
    from sidecar.core.health_board import HealthBoard as HealthBoard

FORGIVE_AFTER_COOLDOWNS = 10  # healthy for this many cooldown_max_s forgives one offence


class HealthState(StrEnum):
    HEALTHY = "healthy"
    WATCHING = "watching"
    DEGRADED = "degraded"
    RESTRICTED = "restricted"
    QUARANTINED = "quarantined"
    PROBING = "probing"
    RESTORING = "restoring"


class Signal(StrEnum):
    OK = "ok"
    BAND = "band"
    ELEVATED = "elevated"
    THREATENING = "threatening"
    INSUFFICIENT = "insufficient"
    INSUFFICIENT_ERRORS = "insufficient_errors"
    STALE = "stale"
    BURST = "burst"
    COOLDOWN_OVER = "cooldown_over"
    PROBE_OK = "probe_ok"
    PROBE_FAIL = "probe_fail"


@dataclass(frozen=True, slots=True)
class Rule:
    """``target`` None: stay (``reset`` clears vote streaks). ``after``: name of the
    vote count needed (a HealthConfig field or "restore_steps"); None = at once."""

    target: HealthState | None
    after: str | None = None
    meanwhile: HealthState | None = None  # state to hold while votes accumulate
    reset: bool = False


S, G = HealthState, Signal
_RESET = Rule(None, reset=True)
TRANSITIONS: dict[tuple[HealthState, Signal], Rule] = {
    (S.HEALTHY, G.ELEVATED): Rule(S.DEGRADED, "degrade_windows", meanwhile=S.WATCHING),
    (S.HEALTHY, G.THREATENING): Rule(S.DEGRADED, "degrade_windows", meanwhile=S.WATCHING),
    (S.HEALTHY, G.BURST): Rule(S.QUARANTINED),
    (S.WATCHING, G.OK): Rule(S.HEALTHY, "recover_windows"),
    (S.WATCHING, G.BAND): _RESET,
    (S.WATCHING, G.ELEVATED): Rule(S.DEGRADED, "degrade_windows"),
    (S.WATCHING, G.THREATENING): Rule(S.DEGRADED, "degrade_windows"),
    (S.WATCHING, G.STALE): Rule(S.HEALTHY),
    (S.WATCHING, G.BURST): Rule(S.QUARANTINED),
    (S.DEGRADED, G.OK): Rule(S.RESTORING, "recover_windows"),
    (S.DEGRADED, G.BAND): _RESET,
    (S.DEGRADED, G.ELEVATED): _RESET,
    (S.DEGRADED, G.THREATENING): Rule(S.RESTRICTED, "restrict_windows"),
    (S.DEGRADED, G.STALE): Rule(S.WATCHING),
    (S.DEGRADED, G.BURST): Rule(S.QUARANTINED),
    (S.RESTRICTED, G.OK): Rule(S.DEGRADED, "recover_windows"),
    (S.RESTRICTED, G.BAND): _RESET,
    (S.RESTRICTED, G.ELEVATED): _RESET,
    (S.RESTRICTED, G.THREATENING): Rule(S.QUARANTINED, "restricted_windows_to_quarantine"),
    (S.RESTRICTED, G.STALE): Rule(S.WATCHING),
    (S.RESTRICTED, G.BURST): Rule(S.QUARANTINED),
    # Restricted routes get no latency-sensitive traffic, so evidence of recovery comes
    # from the probe trickle the router sends them (probes must finish within budget).
    (S.RESTRICTED, G.PROBE_OK): Rule(S.DEGRADED, "probe_successes"),
    (S.RESTRICTED, G.PROBE_FAIL): _RESET,
    (S.QUARANTINED, G.COOLDOWN_OVER): Rule(S.PROBING),
    (S.PROBING, G.PROBE_OK): Rule(S.RESTORING, "probe_successes"),
    (S.PROBING, G.PROBE_FAIL): Rule(S.QUARANTINED),
    (S.RESTORING, G.OK): Rule(S.HEALTHY, "restore_steps"),
    (S.RESTORING, G.INSUFFICIENT): Rule(S.HEALTHY, "restore_steps"),
    (S.RESTORING, G.STALE): Rule(S.HEALTHY, "restore_steps"),
    (S.RESTORING, G.ELEVATED): Rule(S.DEGRADED),
    (S.RESTORING, G.THREATENING): Rule(S.DEGRADED),
    (S.RESTORING, G.BURST): Rule(S.QUARANTINED),
}
_STAY = Rule(None)
_WINDOW_SIGNALS = frozenset(G) - {G.COOLDOWN_OVER, G.PROBE_OK, G.PROBE_FAIL}


@dataclass(frozen=True, slots=True)
class WindowVerdict:
    """One evaluation window judged against a class SLO."""

    index: int  # sub-window index (WindowSummary.index)
    metric: str
    percentile: float  # 1..100
    tail_s: float | None  # None: too few samples
    ratio: float | None  # tail_s * 1000 / budget_ms
    samples: int
    requests: int  # ok + error + timeout
    failures: int  # error + timeout

    @classmethod
    def of(cls, summary: WindowSummary, slo: SloConfig) -> WindowVerdict:
        """Judge ``summary`` (which must be of ``slo.metric`` at ``slo.percentile``)."""
        if summary.metric != slo.metric or abs(summary.q * 100.0 - slo.percentile) > 1e-6:
            raise ValueError(
                f"summary is p{summary.q * 100:g} {summary.metric}, "
                f"SLO is p{slo.percentile:g} {slo.metric}"
            )
        tail = summary.quantile
        ratio = None if tail is None else tail * 1000.0 / slo.budget_ms
        return cls(summary.index, summary.metric, slo.percentile, tail, ratio, summary.samples,
                   summary.requests, summary.errors + summary.timeouts)  # fmt: skip

    def describe(self) -> str:
        if self.ratio is None:
            return f"{self.samples} {self.metric} samples (too few)"
        return f"p{self.percentile:g} {self.metric} {self.ratio:.2f}x budget"


def classify(v: WindowVerdict, cfg: HealthConfig, stale: bool) -> Signal:
    """The window's signal (priority order in the module docstring)."""
    if v.requests >= cfg.error_min_samples and v.failures >= cfg.error_rate_quarantine * v.requests:
        return G.BURST
    if v.ratio is None:
        return G.INSUFFICIENT_ERRORS if v.failures else G.STALE if stale else G.INSUFFICIENT
    if v.ratio >= cfg.restrict_ratio:
        return G.THREATENING
    if v.ratio >= cfg.watch_ratio:
        return G.ELEVATED
    return G.BAND if v.ratio >= cfg.recover_ratio else G.OK


class RouteHealth:
    """Health of one (cluster, slice); all methods take ``now`` and return events."""

    def __init__(
        self, cluster: str, slice: SliceKey, cfg: HealthConfig, stats_cfg: StatsConfig, now: float
    ) -> None:
        self.cluster, self.slice, self.cfg, self.stats_cfg = cluster, slice, cfg, stats_cfg
        self.state = S.HEALTHY
        self.since = now  # when the current state was entered
        self.offences = 0
        self.cooldown_until: float | None = None
        self.panic = False  # held restricted instead of quarantined (last viable route)
        self.votes: dict[HealthState, int] = {}
        self.last_index: int | None = None  # newest evaluation window applied
        self.last_evidence = now  # newest window with a tail (or state entry)
        self.healthy_since = now
        self.restore_base = 0.0
        self.restore_from_circuit = False

    # ------------------------------------------------------------ views

    @property
    def weight(self) -> float:
        """Selection weight for latency-sensitive classes (table in the module docstring)."""
        if self.state in (S.HEALTHY, S.WATCHING):
            return 1.0
        if self.state is S.DEGRADED:
            return self.cfg.degraded_weight
        if self.state is S.RESTORING:
            steps = self.votes.get(S.HEALTHY, 0)
            return min(1.0, self.restore_base + steps * self.cfg.restore_step)
        return 0.0

    def weight_for(self, latency_sensitive: bool) -> float:
        """Tolerant classes ignore latency states but not an open or restoring circuit."""
        if latency_sensitive or self.circuit_open:
            return self.weight
        return self.weight if self.state is S.RESTORING and self.restore_from_circuit else 1.0

    @property
    def excluded_for_sensitive(self) -> bool:
        return self.state in (S.RESTRICTED, S.QUARANTINED, S.PROBING)

    @property
    def circuit_open(self) -> bool:
        return self.state in (S.QUARANTINED, S.PROBING)

    @property
    def probe_share(self) -> float:
        """Share of the slice's traffic to send as probes (0 unless probing)."""
        return self.cfg.probe_share if self.state is S.PROBING else 0.0

    def next_deadline(self) -> float | None:
        return self.cooldown_until if self.state is S.QUARANTINED else None

    @property
    def is_default(self) -> bool:
        """Indistinguishable from a fresh route (the board need not keep it)."""
        return self.state is S.HEALTHY and not (self.offences or self.votes or self.panic)

    # ------------------------------------------------------------ inputs

    def tick(self, now: float) -> list[TransitionEvent]:
        """Time-driven transitions: cooldown expiry; offence forgiveness."""
        forgive_s = FORGIVE_AFTER_COOLDOWNS * self.cfg.cooldown_max_s
        if self.state is S.HEALTHY and self.offences and now - self.healthy_since >= forgive_s:
            self.offences -= 1
            self.healthy_since = now
        deadline = self.next_deadline()
        if deadline is not None and now >= deadline:
            return self._apply(G.COOLDOWN_OVER, now, "cooldown over")
        return []

    def evaluate(
        self, v: WindowVerdict, now: float, may_quarantine: bool = True
    ) -> list[TransitionEvent]:
        """Apply one evaluation window (ignored if not newer than the last applied)."""
        events = self.tick(now)
        if self.last_index is not None and v.index <= self.last_index:
            return events
        self.last_index = v.index
        stale = now - self.last_evidence >= self.stats_cfg.stale_after_s
        signal = classify(v, self.cfg, stale)
        if v.ratio is not None:
            self.last_evidence = now
        if signal is G.BURST:
            detail = f"error+timeout {v.failures / v.requests:.0%} of {v.requests} requests"
        elif signal is G.STALE:
            detail = f"no {v.metric} verdict for {now - self.last_evidence:.0f}s"
        else:
            detail = v.describe()
        return events + self._apply(signal, now, detail, may_quarantine)

    def record_probe(self, ok: bool, now: float) -> list[TransitionEvent]:
        """A probe request finished (ok: succeeded within the caller's criteria)."""
        events = self.tick(now)
        signal = G.PROBE_OK if ok else G.PROBE_FAIL
        return events + self._apply(signal, now, "probe ok" if ok else "probe failed")

    # ------------------------------------------------------------ machinery

    def _threshold(self, name: str) -> int:
        if name == "restore_steps":
            return max(1, math.ceil((1.0 - self.restore_base) / self.cfg.restore_step - 1e-9))
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
                reason = f"{detail} (watch at {self.cfg.watch_ratio:g}x budget)"
                return [self._move(rule.meanwhile, now, reason, keep_votes=True)]
        reason = _reason(signal, n, detail, self.cfg, rule.after)
        if rule.target is S.QUARANTINED and not may_quarantine and signal in _WINDOW_SIGNALS:
            self.panic = True
            reason = f"panic: last viable route ({reason})"
            if self.state is S.RESTRICTED:
                self.votes.clear()
                return [] if was_panic else [self._event(now, S.RESTRICTED, reason)]
            return [self._move(S.RESTRICTED, now, reason)]
        return [self._move(rule.target, now, reason)]

    def _move(
        self, new: HealthState, now: float, reason: str, keep_votes: bool = False
    ) -> TransitionEvent:
        old, self.state, self.since, self.last_evidence = self.state, new, now, now
        if not keep_votes:
            self.votes = {}
        self.cooldown_until = None
        if new is S.QUARANTINED:
            self.offences += 1
            cooldown = min(
                self.cfg.cooldown_s * 2.0 ** min(self.offences - 1, 60), self.cfg.cooldown_max_s
            )
            self.cooldown_until = now + cooldown
            reason = f"{reason}; cooldown {cooldown:g}s (offence {self.offences})"
        elif new is S.RESTORING:
            self.restore_from_circuit = old is S.PROBING
            first = min(self.cfg.restore_step, 0.5)
            self.restore_base = first if old is S.PROBING else max(self.cfg.degraded_weight, first)
            reason = f"{reason}; weight {self.weight:.2f}"
        elif new is S.HEALTHY:
            self.healthy_since = now
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
    if signal in (G.ELEVATED, G.THREATENING) and n > 1:
        return f"{detail} for {windows}"
    if signal is G.OK:
        return f"{detail} (< {cfg.recover_ratio:g}x) for {windows}"
    if signal is G.PROBE_OK:
        return f"{n} consecutive probes ok"
    return detail


def __getattr__(name: str) -> Any:
    """``HealthBoard`` is re-exported lazily: :mod:`sidecar.core.health_board` imports
    this module, so importing it here at load time would be circular."""
    if name == "HealthBoard":
        from sidecar.core.health_board import HealthBoard

        return HealthBoard
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
