"""Is a worker of ``serve --workers N`` alive, or hung? (pure: beats and ``now`` in, an action out)

A worker proves that its *event loop* runs by beating from a task on that loop
several times a probe period (:mod:`sidecar.fleet.heartbeat`); a process that is
alive but stuck -- a blocking call, a deadlock, a CPU-bound bug, SIGSTOP -- sends
nothing. The supervisor hands each worker's :class:`Liveness` the beats it read
and the monotonic time, and does what it answers:

* Probes are at least ``probe_interval_s`` apart, counted from the previous probe
  *as it happened*. A supervisor that was away itself (sleeping before another
  worker's restart, starved of CPU) probes late and finds the beats sent
  meanwhile waiting for it: its own delay never makes a miss.
* A miss is a probe that finds no beat since the previous one; ``probe_misses``
  misses in a row make the worker hung. So a worker is never killed unless its
  loop went at least ``probe_interval_s x probe_misses`` without running a beat.
  A busy loop lags by a fraction of a second and still beats; that is why the
  config refuses a product under :data:`~sidecar.core.workers_config.MIN_HUNG_AFTER_S`.
* Until its first beat a worker is starting (imports, config, the fleet store's
  warm start): misses do not count then, but no beat within ``start_timeout_s``
  of its spawn is a hang too.
* Hung: ``term`` once, ``kill`` once ``kill_grace_s`` later (a loop stuck for good
  never runs its SIGTERM handler), then nothing: the worker's death goes through
  the supervisor's ordinary restart path, which asks :attr:`Liveness.hung` why.
"""

from __future__ import annotations

from typing import Literal

from sidecar.core.workers_config import WorkersConfig

Action = Literal["wait", "term", "kill"]


class Liveness:
    """One worker process's liveness, from its spawn to its death (module docstring)."""

    def __init__(self, cfg: WorkersConfig, now: float) -> None:
        self.cfg = cfg
        self.spawned = now
        self.last_probe = now
        self.last_beat: float | None = None  # when a probe last found beats
        self.pending = 0  # beats read since the last probe
        self.missed = 0  # probes in a row that found none
        self.hung_at: float | None = None
        self.reason = ""  # why it counts as hung, for the supervisor's log
        self.killed = False

    @property
    def hung(self) -> bool:
        return self.hung_at is not None

    def step(self, now: float, beats: int) -> Action:
        """``beats``: how many the worker sent since the previous call."""
        cfg = self.cfg
        if not cfg.enabled:
            return "wait"
        if self.hung_at is not None:
            if not self.killed and now - self.hung_at >= cfg.kill_grace_s:
                self.killed = True
                return "kill"
            return "wait"
        self.pending += beats
        if now - self.last_probe < cfg.probe_interval_s:
            return "wait"
        found, self.pending, self.last_probe = self.pending, 0, now
        if found:
            self.missed, self.last_beat = 0, now
            return "wait"
        if self.last_beat is None:  # still starting
            if now - self.spawned < cfg.start_timeout_s:
                return "wait"
            return self._hang(now, f"no heartbeat within start_timeout_s "
                                   f"({cfg.start_timeout_s:g} s) of its start")
        self.missed += 1
        if self.missed < cfg.probe_misses:
            return "wait"
        return self._hang(now, f"no heartbeat in {self.missed} probes in a row, none for "
                               f"{now - self.last_beat:.1f} s")

    def _hang(self, now: float, reason: str) -> Action:
        self.hung_at, self.reason = now, reason
        return "term"
