"""Envoy: round-robin load balancing with outlier detection (consecutive 5xx), defaults.

The model's candidates are the hosts of one Envoy cluster. Facts followed
(``config.cluster.v3.OutlierDetection`` defaults and the architecture overview):

* ``consecutive_5xx = 5``: five 5xx answers in a row eject the host. With
  ``split_external_local_origin_errors`` off (the default), locally
  originated failures -- here the route timeout, answered 504 -- count as
  5xx. Any other answer (2xx, 429, 4xx) resets the run; a downstream cancel is
  neither.
* ejection time = ``base_ejection_time`` (30 s) x the host's ejection count,
  capped at ``max_ejection_time`` (300 s);
* ``max_ejection_percent = 10``: a host is ejected only if no host is ejected
  yet, or the ejected share stays below 10 % -- so at least one host can always
  be ejected;
* ejected hosts return at the ``interval`` sweep (10 s) after their time is up;
  a host that stays un-ejected through a sweep has its ejection count
  decremented (so the multiplier decays);
* ``healthy_panic_threshold = 50 %``: if fewer than half of the hosts are
  healthy, the load balancer ignores health and uses all of them.

No latency signal at all: a slow but answering host is never ejected.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Final

from sidecar.core.types import Decision
from sidecar.sim.policies import BasePolicy, PolicyContext
from sidecar.sim.records import ROUTE, Attempt

CONSECUTIVE_5XX: Final = 5
BASE_EJECTION_S: Final = 30.0
MAX_EJECTION_S: Final = 300.0
MAX_EJECTION_PERCENT: Final = 10.0
INTERVAL_S: Final = 10.0
PANIC_THRESHOLD: Final = 50.0


class EnvoyOutlier(BasePolicy):
    name = "envoy_outlier"
    needs_tick = True

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self.consecutive: Counter[str] = Counter()
        self.ejections: Counter[str] = Counter()  # the multiplier
        self.ejected_until: dict[str, float] = {}  # ejected hosts -> earliest return
        self.rr: Counter[str] = Counter()
        self.hosts = ctx.config.cluster_names
        self._next_sweep: float | None = None
        self.total_ejections = 0

    def choose(self, att: Attempt, now: float, rng: random.Random) -> str | Decision:
        call = att.call
        cands = call.candidates
        healthy = [c for c in cands if c not in self.ejected_until]
        if not healthy or len(healthy) * 100.0 < PANIC_THRESHOLD * len(cands):
            healthy = list(cands)  # panic: ignore health
        i = self.rr[call.model]
        self.rr[call.model] = i + 1
        return healthy[i % len(healthy)]

    def on_result(self, att: Attempt, now: float) -> None:
        if self._next_sweep is None:
            self._next_sweep = (int(now / INTERVAL_S) + 1) * INTERVAL_S
        host = att.cluster
        is_5xx = (att.outcome == "error" and (att.status or 0) >= 500) or (
            att.outcome == "timeout" and att.deadline_kind == ROUTE
        )
        if att.outcome == "cancel":
            return
        if not is_5xx:
            self.consecutive[host] = 0
            return
        self.consecutive[host] += 1
        if self.consecutive[host] >= CONSECUTIVE_5XX and host not in self.ejected_until:
            self._maybe_eject(host, now)

    def _maybe_eject(self, host: str, now: float) -> None:
        n_ejected = len(self.ejected_until)
        if n_ejected and (n_ejected + 1) * 100.0 / len(self.hosts) > MAX_EJECTION_PERCENT:
            return
        self.ejections[host] += 1
        self.total_ejections += 1
        self.ejected_until[host] = now + min(BASE_EJECTION_S * self.ejections[host],
                                             MAX_EJECTION_S)
        self.consecutive[host] = 0

    def next_deadline(self) -> float | None:
        return self._next_sweep

    def tick(self, now: float) -> None:
        if self._next_sweep is None or now < self._next_sweep:
            return
        for host in self.hosts:
            until = self.ejected_until.get(host)
            if until is None:
                if self.ejections[host] > 0:
                    self.ejections[host] -= 1
            elif now >= until:
                del self.ejected_until[host]
        self._next_sweep = now + INTERVAL_S

    def stats(self) -> dict[str, int]:
        return {"ejections": self.total_ejections}
