"""Outcome metrics of one run (one scenario x one policy), recorded on the fly.

Recording is cheap on purpose (it runs per request): an attempt increments one
counter of its (slice, cluster, time bucket); a scored call appends one tuple to
a log. Everything else -- per class, per workload, per slice and token profile,
percentiles, time series, route flips -- is computed once at the end by
:mod:`sidecar.sim.metrics_summary` (definitions there and in docs/policy-lab.md).

All figures are over calls/attempts that *start* in ``[warmup, duration)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Final, Protocol

from sidecar.core.config import Config
from sidecar.core.types import SliceKey
from sidecar.sim.records import Attempt, Call, Workflow

OUTCOMES: Final = ("ok", "timeout", "error", "rejected", "cancelled", "skipped")
KIND_INDEX: Final = {k: i for i, k in enumerate(OUTCOMES)}
NAN: Final = math.nan

#: One scored call: (group, outcome index, SLO metric ms, TTFT ms, e2e ms, start s, cost).
LogRow = tuple[int, int, float, float, float, float, float]


class Group:
    """What a call is counted under: its class, workload, slice, and its workload's
    class (cost and completions count there)."""

    __slots__ = ("budget_ms", "klass", "slice", "wl_klass", "wl_name", "workflow_call")

    def __init__(self, call: Call) -> None:
        self.klass = call.klass
        self.wl_name = call.wl.name
        self.wl_klass = call.wl.klass
        self.slice = call.slice
        self.workflow_call = call.workflow is not None
        self.budget_ms = call.cls.slo.budget_ms


class StateSource(Protocol):
    """A policy that can say how it sees a route (tailroute: health state and weight)."""

    def route_state(self, cluster: str, slice: SliceKey) -> tuple[str, float] | None: ...


class Metrics:
    def __init__(self, config: Config, warmup: float, duration: float, bucket: float,
                 horizon: float, workloads: Sequence[str] = ()) -> None:
        self.config = config
        self.warmup = warmup
        self.duration = duration
        self.bucket = bucket
        self.n_buckets = math.ceil(horizon / bucket) + 1
        self.workload_names = tuple(workloads)
        # attempts sent per slice, cluster and time bucket
        self.rows: dict[SliceKey, dict[str, list[int]]] = {}
        self.groups: list[Group] = []
        self._group_ids: dict[tuple[str, str, SliceKey, bool], int] = {}
        self.call_log: list[LogRow] = []
        self.wf_started: dict[str, int] = {}
        self.wf_class: dict[str, str] = {}  # workflow workload -> its class
        self.wf_done: dict[str, list[float]] = {}  # e2e ms of completed workflows
        # per (slice, cluster): (bucket, state, weight) samples of the policy's view
        self.states: dict[tuple[SliceKey, str], list[tuple[int, str, float]]] = {}
        self.attempts = 0
        self.off_primary = 0
        self.degraded = 0
        self.calls = 0

    # ------------------------------------------------------------ recording

    def sent(self, att: Attempt, now: float) -> None:
        b = int(now / self.bucket)
        if b >= self.n_buckets:
            b = self.n_buckets - 1
        c = att.call
        rows = c.rows
        if rows is None:
            rows = self.rows.get(c.slice)
            if rows is None:
                rows = self.rows[c.slice] = {}
            c.rows = rows
        row = rows.get(att.cluster)
        if row is None:  # a route outside the model's candidates (default route) included
            row = rows[att.cluster] = [0] * self.n_buckets
        row[b] += 1
        if self.warmup <= now < self.duration:
            self.attempts += 1
            if att.cluster != c.candidates[0]:
                self.off_primary += 1

    def attempt_done(self, att: Attempt) -> None:
        if att.degraded and self.warmup <= att.sent_at < self.duration:
            self.degraded += 1

    def call_done(self, call: Call, kind: str, metric: float | None, now: float) -> None:
        """Record a finished call; ``metric`` is its SLO metric in seconds (ok calls)."""
        if not call.scored:
            return
        self.calls += 1
        g = call.group
        if g < 0:
            g = call.group = self._group(call)
        if kind == "ok":
            s = call.start
            ft, end = call.first_token_at, call.end_at
            self.call_log.append((
                g, 0, NAN if metric is None else metric * 1000.0,
                NAN if ft is None else (ft - s) * 1000.0,
                NAN if end is None else (end - s) * 1000.0, s, call.cost))
        else:
            self.call_log.append((g, KIND_INDEX[kind], NAN, NAN, NAN, call.start, call.cost))

    def _group(self, call: Call) -> int:
        key = (call.klass, call.wl.name, call.slice, call.workflow is not None)
        g = self._group_ids.get(key)
        if g is None:
            g = self._group_ids[key] = len(self.groups)
            self.groups.append(Group(call))
        return g

    def workflow_started(self, wf: Workflow) -> None:
        if wf.scored:
            self.wf_started[wf.wl.name] = self.wf_started.get(wf.wl.name, 0) + 1
            self.wf_class[wf.wl.name] = wf.wl.klass

    def workflow_done(self, wf: Workflow, completed: bool, now: float) -> None:
        if wf.scored and completed:
            self.wf_done.setdefault(wf.wl.name, []).append((now - wf.start) * 1000.0)

    def sample_states(self, now: float, policy: StateSource) -> None:
        """The policy's view of every route of every slice seen so far (series)."""
        b = min(int(now / self.bucket), self.n_buckets - 1)
        for sk in self.rows:
            model = self.config.model(sk.model)
            clusters = model.candidates if model is not None else tuple(self.rows[sk])
            for c in clusters:
                st = policy.route_state(c, sk)
                if st is not None:
                    self.states.setdefault((sk, c), []).append((b, st[0], st[1]))

    # ------------------------------------------------------------ summary

    def summary(self, peaks: dict[str, float]) -> dict[str, Any]:
        """JSON-ready outcome of the run (see docs/policy-lab.md for the schema)."""
        from sidecar.sim.metrics_summary import summarize

        return summarize(self, peaks)


def slo_value(call: Call) -> float | None:
    """The class's SLO metric of a finished ok call, as its client saw it (seconds)."""
    metric = call.cls.slo.metric
    if metric == "ttft":
        return None if call.first_token_at is None else call.first_token_at - call.start
    if metric == "e2e":
        return None if call.end_at is None else call.end_at - call.start
    if call.tpot_s is not None:
        return call.tpot_s
    if call.end_at is None:
        return None
    return (call.end_at - call.start) / max(call.output_tokens, 1)
