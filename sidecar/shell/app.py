"""Shell-side state shared by all ext_proc streams: the router, the RNG and the
requests in flight between the routing stream and the observing stream.

Lives on the asyncio loop thread; nothing here blocks.
"""

from __future__ import annotations

import itertools
import logging
import random
from collections import Counter
from dataclasses import dataclass, field

from sidecar.core.config import Config
from sidecar.core.router import Router
from sidecar.core.timing import ResponseTimer
from sidecar.core.types import Decision, TransitionEvent

log = logging.getLogger("tailroute")

# A request whose streams never closed (Envoy crashed mid-request) is swept after this.
_PENDING_GRACE_S = 60.0
# How long after the routing stream closes the observing stream may still deliver the end.
_OBSERVER_GRACE_S = 2.0


@dataclass(slots=True)
class Pending:
    """One routed request between decision and final observation."""

    rid: str
    decision: Decision
    timer: ResponseTimer
    deadline: float
    observed: bool = True  # an observing stream was asked for (sampled)
    observer_attached: bool = False
    released: bool = False  # in-flight slot given back (the routing stream closed)


@dataclass(slots=True)
class App:
    """The sidecar's live state. ``observe_mode`` mirrors the rendered Envoy config."""

    config: Config
    router: Router
    rng: random.Random = field(default_factory=random.Random)
    observe_mode: str = "observability"
    pending: dict[str, Pending] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    _prefix: str = field(default_factory=lambda: f"{random.getrandbits(32):08x}")

    @classmethod
    def create(cls, config: Config, seed: int | None = None) -> App:
        return cls(config, Router(config), random.Random(seed), config.envoy.observe_mode)

    def shell_counters(self) -> dict[str, int]:
        """Shell-side counters for metrics: ``error:<kind>`` and ``failopen:<reason>``."""
        out = {f"error:{k}": v for k, v in self.errors.items()}
        # Requests the sidecar itself sent to the default route without a decision.
        for reason in ("body_too_large", "handler_exception", "stream_ended_before_body"):
            if self.errors[reason]:
                out[f"failopen:{reason}"] = self.errors[reason]
        for reason in ("unknown_model", "no_candidate"):
            n = self.router.counters[("decision", reason)]
            if n:
                out[f"failopen:{reason}"] = n
        return out

    def new_rid(self) -> str:
        return f"{self._prefix}-{next(self._ids)}"

    def register(self, pending: Pending) -> None:
        self.pending[pending.rid] = pending
        self.router.started(pending.decision.cluster)

    def route_closed(self, rid: str, now: float, cancelled: bool) -> None:
        """The routing stream ended, which Envoy does when the HTTP request is over.

        Unobserved requests end here. An observed one is normally finalized by
        its observing stream at end of body; the two gRPC streams are not
        ordered, so a missing end gets a short grace before it counts as cancel.
        """
        p = self.pending.get(rid)
        if p is None:
            return
        self.release_pending(p)  # over for capacity purposes, measured or not
        if not p.observer_attached or p.timer.ended_at is not None:
            self.finalize(rid, now, cancelled=cancelled or p.timer.status is None)
        else:
            p.deadline = min(p.deadline, now + _OBSERVER_GRACE_S)

    def finalize(self, rid: str, now: float, cancelled: bool) -> None:
        """Turn a request's timer into an observation; idempotent (pops the request)."""
        p = self.pending.pop(rid, None)
        if p is None:
            return
        self.release_pending(p)
        if not p.observed and p.timer.status is None:
            return  # not sampled for timing: nothing was measured
        obs = p.timer.observation(now, cancelled=cancelled)
        if obs is not None:
            self._log_events(self.router.observe(obs, now))

    def release_pending(self, p: Pending) -> None:
        """Give the request's in-flight slot back once."""
        if not p.released:
            p.released = True
            self.router.finished(p.decision.cluster)

    def tick(self, now: float) -> None:
        """Periodic work: health evaluation and sweeping abandoned requests."""
        self._log_events(self.router.tick(now))
        stale = [rid for rid, p in self.pending.items() if now > p.deadline]
        for rid in stale:
            self.errors["abandoned"] += 1
            self.finalize(rid, now, cancelled=True)

    def deadline_for(self, decision: Decision, now: float) -> float:
        timeout_s = (decision.timeout_ms or 300_000) / 1000.0
        return now + timeout_s + _PENDING_GRACE_S

    @staticmethod
    def _log_events(events: list[TransitionEvent]) -> None:
        for e in events:
            log.info(
                "health %s %s: %s -> %s (%s)", e.cluster, e.slice, e.old, e.new, e.reason
            )
