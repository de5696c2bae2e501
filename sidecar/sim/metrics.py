"""Outcome metrics of one run (one scenario x one policy), collected on the fly.

Definitions (all over calls/attempts that *start* in ``[warmup, duration)``):

* A **call** is one logical request of the application (retries included).
  Its outcome is ``ok``, ``timeout`` (route timeout, client timeout or workflow
  deadline), ``error`` (5xx/429 after the client's retries), ``rejected`` (the
  router refused it: admission shed/defer/reject), ``cancelled`` (the user
  abandoned it) or ``skipped`` (an optional workflow step skipped for lack of
  budget). Cancelled and skipped calls are not scored.
* **SLO met**: outcome ``ok`` and the class's SLO metric, as the *client* sees
  it from the call's start (so retries and queueing count), within
  ``budget_ms``. TTFT of a non-streaming call is its end-to-end time (the first
  token arrives with the body). **Violations** = scored calls - SLO met;
  **attainment** = SLO met / scored. The class meets its SLO when attainment
  >= its percentile.
* **Route flips**: per model and time bucket, the cluster that got a strict
  majority (> 50 %) of the attempts, if any; a flip is a change of that
  majority cluster from one majority bucket to the next (buckets with fewer
  than 20 attempts or no strict majority are skipped, so evenly spreading
  policies do not count as oscillating). Oscillating policies flip often.
* **Fallback saturation**: peak (in service + queued) / capacity over the
  clusters that are never a model's first candidate.
* **Off-primary share**: attempts not sent to the model's first candidate.
  **Degraded share**: attempts served while a degradation event matched them.
* **Cost per completed**: cost of every attempt (``cost_per_1k_tokens`` x
  (input + generated tokens) / 1000; errors are free) of the class's calls,
  divided by completed workflows (workflow workloads) or ok calls (others).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from sidecar.core.config import Config
from sidecar.sim.records import Attempt, Call, Workflow

OUTCOMES = ("ok", "timeout", "error", "rejected", "cancelled", "skipped")
_MIN_FLIP_ATTEMPTS = 20


class ClassAcc:
    """Accumulator for one workload class."""

    __slots__ = ("b", "cost", "counts", "e2e", "met", "metric_v", "ttft", "units",
                 "wf_completed", "wf_e2e", "wf_started")

    def __init__(self) -> None:
        self.counts = dict.fromkeys(OUTCOMES, 0)
        self.met = 0
        self.ttft: list[float] = []
        self.e2e: list[float] = []
        self.b: list[int] = []  # bucket of each ok call (for p99 over time)
        self.metric_v: list[float] = []
        self.wf_started = 0
        self.wf_completed = 0
        self.wf_e2e: list[float] = []
        self.cost = 0.0
        self.units = 0


class Metrics:
    def __init__(self, config: Config, warmup: float, duration: float, bucket: float,
                 horizon: float) -> None:
        self.config = config
        self.warmup = warmup
        self.duration = duration
        self.bucket = bucket
        self.n_buckets = math.ceil(horizon / bucket) + 1
        self.classes: dict[str, ClassAcc] = {c.name: ClassAcc() for c in config.classes}
        self.primary = {m.name: m.candidates[0] for m in config.models}
        # attempts sent per (model, cluster) and time bucket
        self.by_model: dict[tuple[str, str], list[int]] = {
            (m.name, c): [0] * self.n_buckets for m in config.models for c in m.candidates
        }
        self.share: dict[str, list[int]] = {}  # per cluster, filled by summary()
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
        key = (c.model, att.cluster)
        row = self.by_model.get(key)
        if row is None:  # a route outside the model's candidates (default route)
            row = self.by_model[key] = [0] * self.n_buckets
        row[b] += 1
        if self.warmup <= now < self.duration:
            self.attempts += 1
            if att.cluster != self.primary[c.model]:
                self.off_primary += 1

    def attempt_done(self, att: Attempt) -> None:
        if att.degraded and self.warmup <= att.sent_at < self.duration:
            self.degraded += 1

    def call_done(self, call: Call, kind: str, metric: float | None, now: float) -> None:
        """Record a finished call; ``metric`` is its SLO metric in seconds (ok calls)."""
        if not call.scored:
            return
        self.calls += 1
        acc = self.classes[call.klass]
        acc.counts[kind] += 1
        wl_acc = self.classes[call.wl.klass]
        wl_acc.cost += call.cost
        if kind != "ok":
            return
        if call.workflow is None:
            wl_acc.units += 1
        if call.first_token_at is not None:
            acc.ttft.append((call.first_token_at - call.start) * 1000.0)
        if call.end_at is not None:
            acc.e2e.append((call.end_at - call.start) * 1000.0)
        if metric is not None:
            if metric * 1000.0 <= call.cls.slo.budget_ms:
                acc.met += 1
            acc.b.append(min(int(call.start / self.bucket), self.n_buckets - 1))
            acc.metric_v.append(metric * 1000.0)

    def workflow_started(self, wf: Workflow) -> None:
        if wf.scored:
            self.classes[wf.wl.klass].wf_started += 1

    def workflow_done(self, wf: Workflow, completed: bool, now: float) -> None:
        if not wf.scored:
            return
        acc = self.classes[wf.wl.klass]
        if completed:
            acc.wf_completed += 1
            acc.units += 1
            acc.wf_e2e.append((now - wf.start) * 1000.0)

    # ------------------------------------------------------------ summary

    def summary(self, peaks: dict[str, float]) -> dict[str, Any]:
        """JSON-ready outcome of the run (see docs/policy-lab.md for the schema)."""
        first_b = int(self.warmup / self.bucket)
        last_b = max(math.ceil(self.duration / self.bucket), first_b + 1)
        self.share = {c: [0] * self.n_buckets for c in self.config.cluster_names}
        for (_, c), row in self.by_model.items():
            self.share[c] = [a + b for a, b in zip(self.share[c], row, strict=True)]
        totals = {c: sum(v[first_b:last_b]) for c, v in self.share.items()}
        all_sent = sum(totals.values()) or 1
        non_primary = [c for c in self.config.cluster_names if c not in self.primary.values()]
        out: dict[str, Any] = {
            "calls": self.calls,
            "attempts": self.attempts,
            "classes": {n: self._class(n, a, first_b, last_b) for n, a in self.classes.items()
                        if sum(a.counts.values()) or a.wf_started},
            "route_flips": self._flips(first_b, last_b),
            "fallback_saturation": _r(max((peaks[c] for c in non_primary), default=0.0)),
            "off_primary_share": _r(self.off_primary / max(self.attempts, 1)),
            "degraded_share": _r(self.degraded / max(self.attempts, 1)),
            "traffic_share": {c: _r(n / all_sent) for c, n in totals.items()},
            "series": self._series(first_b, last_b),
        }
        return out

    def _class(self, name: str, a: ClassAcc, first_b: int, last_b: int) -> dict[str, Any]:
        slo = self.config.workload_class(name).slo  # type: ignore[union-attr]
        n = sum(a.counts.values())
        scored = n - a.counts["cancelled"] - a.counts["skipped"]
        d: dict[str, Any] = {
            "calls": n,
            "scored": scored,
            "slo": {"metric": slo.metric, "percentile": slo.percentile,
                    "budget_ms": slo.budget_ms},
            "slo_met": a.met,
            "violations": scored - a.met,
            "violation_rate": _r((scored - a.met) / scored) if scored else 0.0,
            "attainment": _r(a.met / scored) if scored else None,
            "slo_ok": bool(scored and a.met / scored * 100.0 >= slo.percentile),
            "outcomes": dict(a.counts),
            "timeout_rate": _r(a.counts["timeout"] / scored) if scored else 0.0,
            "error_rate": _r((a.counts["error"] + a.counts["rejected"]) / scored)
            if scored else 0.0,
            "ttft_ms": _pcts(a.ttft),
            "e2e_ms": _pcts(a.e2e),
            "cost_per_completed": _r(a.cost / a.units) if a.units else None,
        }
        if a.wf_started:
            d["workflows"] = {
                "started": a.wf_started,
                "completed": a.wf_completed,
                "completion_rate": _r(a.wf_completed / a.wf_started),
                "e2e_ms": _pcts(a.wf_e2e),
            }
        return d

    def _flips(self, first_b: int, last_b: int) -> int:
        flips = 0
        models = sorted({m for m, _ in self.by_model})
        for m in models:
            rows = [(c, v) for (mm, c), v in sorted(self.by_model.items()) if mm == m]
            prev: str | None = None
            for b in range(first_b, last_b):
                counts = [(v[b], c) for c, v in rows]
                total = sum(n for n, _ in counts)
                if total < _MIN_FLIP_ATTEMPTS:
                    continue
                n_top, top = max(counts)
                if 2 * n_top <= total:
                    continue  # no strict majority: traffic is spread, not pointed somewhere
                if prev is not None and top != prev:
                    flips += 1
                prev = top
        return flips

    def _series(self, first_b: int, last_b: int) -> dict[str, Any]:
        rng = range(first_b, last_b)
        share: dict[str, list[float]] = {c: [] for c in self.share}
        for b in rng:
            tot = sum(v[b] for v in self.share.values())
            for c, v in self.share.items():
                share[c].append(_r(v[b] / tot) if tot else 0.0)
        p99: dict[str, list[float | None]] = {}
        for name, a in self.classes.items():
            if not a.b:
                continue
            bs = np.asarray(a.b)
            vs = np.asarray(a.metric_v)
            row: list[float | None] = []
            for b in rng:
                sel = vs[bs == b]
                row.append(_r(float(np.percentile(sel, 99))) if sel.size else None)
            p99[name] = row
        return {"bucket_s": self.bucket, "t": [b * self.bucket for b in rng], "share": share,
                "p99_ms": p99}


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


def _r(x: float) -> float:
    return round(float(x), 4)


def _pcts(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "p99": None}
    p = np.percentile(np.asarray(values), [50, 95, 99])
    return {"p50": _r(p[0]), "p95": _r(p[1]), "p99": _r(p[2])}
