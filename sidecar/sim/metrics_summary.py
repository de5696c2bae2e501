"""The summary of one run from what :class:`~sidecar.sim.metrics.Metrics` recorded.

Definitions (all over calls/attempts that *start* in ``[warmup, duration)``):

* A **call** is one logical request of the application (retries included).
  Its outcome is ``ok``, ``timeout`` (route timeout, client timeout or workflow
  deadline), ``error`` (5xx/429 after the client's retries), ``rejected`` (the
  router refused it: admission shed/defer/reject), ``cancelled`` (the user
  abandoned it) or ``skipped`` (an optional workflow step skipped for lack of
  budget). Cancelled and skipped calls are not scored.
* **SLO met**: outcome ``ok`` and the class's SLO metric, as the *client* sees
  it from the call's start (so retries and queueing count), within
  ``budget_ms``. TTFT of a non-streaming call is its end-to-end time. Each
  call is judged by its own class, whatever it is grouped under.
  **Violations** = scored calls - SLO met; **attainment** = SLO met / scored.
* Groupings: per **class** (with ``slo_ok``: attainment >= its percentile),
  per **workload**, per **slice** (``model|class|profile|stream``: the token
  profile as tailroute classifies the request) and per token **profile**.
* **Route flips**: per slice, between consecutive buckets that each hold at
  least 20 of its attempts, the traffic split over clusters moved: total
  variation distance ``1/2 sum_c |p_c - q_c| >= 0.25`` (a quarter of the
  slice's traffic re-pointed) *and* significant (some cluster's share changed
  by at least 3.29 standard errors of a two-proportion test: a policy that
  splits at random does not flip by chance). ``majority_flips`` keeps the
  earlier count: changes of the strict-majority (> 50 %) cluster per model.
* **Fallback saturation**: peak (in service + queued) / capacity over the
  clusters that are never a model's first candidate.
* **Off-primary share**: attempts not sent to the model's first candidate.
  **Degraded share**: attempts served while a degradation event matched them.
* **Cost per completed**: cost of every attempt (``cost_per_1k_tokens`` x
  (input + generated tokens) / 1000; errors are free) of the class's calls,
  divided by completed workflows (workflow workloads) or ok calls (others).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt

from sidecar.sim.metrics import OUTCOMES
from sidecar.sim.run_percentiles import percentile_of_runs

if TYPE_CHECKING:
    from sidecar.sim.metrics import Metrics

FArr = npt.NDArray[np.float64]
IArr = npt.NDArray[np.int64]
BArr = npt.NDArray[np.bool_]

MIN_FLIP_ATTEMPTS: Final = 20
FLIP_DISTANCE: Final = 0.25
FLIP_Z: Final = 3.29  # two-sided p = 0.001
_SCORED: Final = np.array([k not in ("cancelled", "skipped") for k in OUTCOMES])


class _Log:
    """The call log as arrays, plus per-group attributes."""

    def __init__(self, m: Metrics) -> None:
        log = m.call_log
        # fromiter over the flattened rows: the same float64s as np.array(log), without
        # its per-row shape discovery (half the time for a long run's log)
        arr = np.fromiter(itertools.chain.from_iterable(log), dtype=np.float64,
                          count=7 * len(log)).reshape(len(log), 7)
        self.group: IArr = arr[:, 0].astype(np.int64)
        self.kind: IArr = arr[:, 1].astype(np.int64)
        self.metric: FArr = arr[:, 2]
        self.ttft: FArr = arr[:, 3]
        self.e2e: FArr = arr[:, 4]
        self.start: FArr = arr[:, 5]
        self.cost: FArr = arr[:, 6]
        budget = np.array([g.budget_ms for g in m.groups] or [0.0])
        with np.errstate(invalid="ignore"):
            self.met: BArr = (self.kind == 0) & (self.metric <= budget[self.group])
        self.scored: BArr = _SCORED[self.kind]
        self.bucket: IArr = np.minimum((self.start / m.bucket).astype(np.int64),
                                       m.n_buckets - 1)
        self.n_groups = max(len(m.groups), 1)

    def where(self, groups: Iterable[int]) -> BArr:
        member = np.zeros(self.n_groups, dtype=np.bool_)
        member[np.fromiter(groups, dtype=np.int64)] = True
        return member[self.group]


def summarize(m: Metrics, peaks: dict[str, float]) -> dict[str, Any]:
    first_b = int(m.warmup / m.bucket)
    last_b = max(math.ceil(m.duration / m.bucket), first_b + 1)
    share = {c: [0] * m.n_buckets for c in m.config.cluster_names}
    for rows in m.rows.values():
        for c, row in rows.items():
            acc = share.setdefault(c, [0] * m.n_buckets)
            for b, n in enumerate(row):
                if n:
                    acc[b] += n
    totals = {c: sum(v[first_b:last_b]) for c, v in share.items()}
    all_sent = sum(totals.values()) or 1
    primaries = {mm.candidates[0] for mm in m.config.models}
    non_primary = [c for c in m.config.cluster_names if c not in primaries]
    lg = _Log(m)
    groups = m.groups
    by_class = {c.name: [i for i, g in enumerate(groups) if g.klass == c.name]
                for c in m.config.classes}
    wl_names = list(m.workload_names) or list(dict.fromkeys(g.wl_name for g in groups))
    out: dict[str, Any] = {
        "calls": m.calls,
        "attempts": m.attempts,
        "classes": {n: _class_block(m, lg, n, gs) for n, gs in by_class.items()
                    if gs or any(m.wf_started.get(w, 0) for w, k in m.wf_class.items()
                                 if k == n)},
        "workloads": {w: _workload_block(m, lg, w) for w in wl_names
                      if any(g.wl_name == w for g in groups) or m.wf_started.get(w)},
        "slices": {sk.label(): _block(lg, lg.where(i for i, g in enumerate(groups)
                                                    if g.slice == sk))
                   for sk in dict.fromkeys(g.slice for g in groups)},
        "profiles": {p: _block(lg, lg.where(i for i, g in enumerate(groups)
                                             if g.slice.profile == p))
                     for p in ("short", "medium", "long")
                     if any(g.slice.profile == p for g in groups)},
        "route_flips": route_flips(m, first_b, last_b),
        "majority_flips": _majority_flips(m, first_b, last_b),
        "fallback_saturation": _r(max((peaks[c] for c in non_primary), default=0.0)),
        "off_primary_share": _r(m.off_primary / max(m.attempts, 1)),
        "degraded_share": _r(m.degraded / max(m.attempts, 1)),
        "traffic_share": {c: _r(n / all_sent) for c, n in totals.items()},
        "slice_traffic_share": _slice_shares(m, first_b, last_b),
        "series": _series(m, lg, share, by_class, first_b, last_b),
    }
    return out


# ---------------------------------------------------------------- blocks


def _block(lg: _Log, sel: BArr) -> dict[str, Any]:
    """Counts, rates and percentiles of the calls ``sel`` selects."""
    counts = np.bincount(lg.kind[sel], minlength=len(OUTCOMES))
    n = int(counts.sum())
    scored = int(lg.scored[sel].sum())
    met = int(lg.met[sel].sum())
    ok = sel & (lg.kind == 0)
    return {
        "calls": n,
        "scored": scored,
        "slo_met": met,
        "violations": scored - met,
        "violation_rate": _r((scored - met) / scored) if scored else 0.0,
        "attainment": _r(met / scored) if scored else None,
        "outcomes": {k: int(v) for k, v in zip(OUTCOMES, counts, strict=True)},
        "timeout_rate": _r(counts[1] / scored) if scored else 0.0,
        "error_rate": _r((counts[2] + counts[3]) / scored) if scored else 0.0,
        "ttft_ms": _pcts(lg.ttft[ok]),
        "e2e_ms": _pcts(lg.e2e[ok]),
    }


def _class_block(m: Metrics, lg: _Log, name: str, gs: list[int]) -> dict[str, Any]:
    slo = m.config.workload_class(name).slo  # type: ignore[union-attr]
    b = _block(lg, lg.where(gs))
    # cost and completed units count under the class of the call's workload
    own = [i for i, g in enumerate(m.groups) if g.wl_klass == name]
    single = lg.where(i for i in own if not m.groups[i].workflow_call)
    wls = sorted(w for w, k in m.wf_class.items() if k == name)
    done = [e for w in wls for e in m.wf_done.get(w, [])]
    units = int((single & (lg.kind == 0)).sum()) + len(done)
    cost = float(lg.cost[lg.where(own)].sum())
    d: dict[str, Any] = {
        "calls": b["calls"], "scored": b["scored"],
        "slo": {"metric": slo.metric, "percentile": slo.percentile, "budget_ms": slo.budget_ms},
        "slo_met": b["slo_met"], "violations": b["violations"],
        "violation_rate": b["violation_rate"], "attainment": b["attainment"],
        "slo_ok": bool(b["scored"] and b["slo_met"] / b["scored"] * 100.0 >= slo.percentile),
        "outcomes": b["outcomes"], "timeout_rate": b["timeout_rate"],
        "error_rate": b["error_rate"], "ttft_ms": b["ttft_ms"], "e2e_ms": b["e2e_ms"],
        "cost_per_completed": _r(cost / units) if units else None,
    }
    started = sum(m.wf_started.get(w, 0) for w in wls)
    if started:
        d["workflows"] = _workflows(started, done)
    return d


def _workload_block(m: Metrics, lg: _Log, w: str) -> dict[str, Any]:
    d = _block(lg, lg.where(i for i, g in enumerate(m.groups) if g.wl_name == w))
    started = m.wf_started.get(w, 0)
    if started:
        d["workflows"] = _workflows(started, m.wf_done.get(w, []))
    return d


def _workflows(started: int, done: list[float]) -> dict[str, Any]:
    return {"started": started, "completed": len(done),
            "completion_rate": _r(len(done) / started), "e2e_ms": _pcts(np.asarray(done))}


def _slice_shares(m: Metrics, first_b: int, last_b: int) -> dict[str, dict[str, float]]:
    """Per slice, each cluster's share of the attempts sent in the scored window."""
    out: dict[str, dict[str, float]] = {}
    for sk in sorted(m.rows, key=lambda s: s.label()):
        rows = m.rows[sk]
        sent = {c: sum(rows[c][first_b:last_b]) for c in sorted(rows)}
        total = sum(sent.values())
        if total:
            out[sk.label()] = {c: _r(n / total) for c, n in sent.items()}
    return out


# ---------------------------------------------------------------- flips


def route_flips(m: Metrics, first_b: int, last_b: int) -> int:
    """Significant re-pointings of a slice's traffic between consecutive populated
    buckets (module docstring)."""
    flips = 0
    for sk in sorted(m.rows, key=lambda s: s.label()):
        rows = m.rows[sk]
        clusters = sorted(rows)
        mat = np.array([rows[c][first_b:last_b] for c in clusters], dtype=np.float64)
        tot = mat.sum(axis=0)
        idx = np.flatnonzero(tot >= MIN_FLIP_ATTEMPTS)
        for a, b in itertools.pairwise(idx):
            n1, n2 = tot[a], tot[b]
            p, q = mat[:, a] / n1, mat[:, b] / n2
            if 0.5 * np.abs(p - q).sum() < FLIP_DISTANCE:
                continue
            pooled = (mat[:, a] + mat[:, b]) / (n1 + n2)
            se = np.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
            with np.errstate(divide="ignore", invalid="ignore"):
                z = np.where(se > 0, np.abs(p - q) / se, 0.0)
            if z.max() >= FLIP_Z:
                flips += 1
    return flips


def _majority_flips(m: Metrics, first_b: int, last_b: int) -> int:
    """Changes of the strict-majority cluster per model (the schema-1 ``route_flips``)."""
    by_model: dict[tuple[str, str], list[int]] = {
        (mm.name, c): [0] * m.n_buckets for mm in m.config.models for c in mm.candidates}
    for sk, rows in m.rows.items():
        for c, row in rows.items():
            acc = by_model.setdefault((sk.model, c), [0] * m.n_buckets)
            for b, n in enumerate(row):
                acc[b] += n
    flips = 0
    for model in sorted({mm for mm, _ in by_model}):
        rows_m = [(c, v) for (mm, c), v in sorted(by_model.items()) if mm == model]
        prev: str | None = None
        for b in range(first_b, last_b):
            counts = [(v[b], c) for c, v in rows_m]
            total = sum(n for n, _ in counts)
            if total < MIN_FLIP_ATTEMPTS:
                continue
            n_top, top = max(counts)
            if 2 * n_top <= total:
                continue
            if prev is not None and top != prev:
                flips += 1
            prev = top
    return flips


# ---------------------------------------------------------------- series


def _series(m: Metrics, lg: _Log, share: dict[str, list[int]],
            by_class: dict[str, list[int]], first_b: int, last_b: int) -> dict[str, Any]:
    rng = range(first_b, last_b)
    out_share: dict[str, list[float]] = {c: [] for c in share}
    for b in rng:
        tot = sum(v[b] for v in share.values())
        for c, v in share.items():
            out_share[c].append(_r(v[b] / tot) if tot else 0.0)
    p99: dict[str, list[float | None]] = {}
    viol: dict[str, list[float | None]] = {}
    for name, gs in by_class.items():
        sel = lg.where(gs)
        if not sel.any():
            continue
        has_metric = sel & (lg.kind == 0) & ~np.isnan(lg.metric)
        bs, vs = lg.bucket[has_metric], lg.metric[has_metric]
        if bs.size:
            order = np.lexsort((vs, bs))  # by bucket, and by value within a bucket
            bs, vs = bs[order], vs[order]
            edges = np.searchsorted(bs, [first_b, *[b + 1 for b in rng]])
            lo, hi = edges[:-1], edges[1:]
            p = percentile_of_runs(vs, lo, hi, 99)
            p99[name] = [_r(float(x)) if n else None
                         for x, n in zip(p, hi - lo, strict=True)]
        sb = lg.bucket[sel & lg.scored]
        mb = lg.bucket[sel & lg.met]
        n_sc = np.bincount(sb, minlength=m.n_buckets)
        n_met = np.bincount(mb, minlength=m.n_buckets)
        viol[name] = [_r((n_sc[b] - n_met[b]) / n_sc[b]) if n_sc[b] else None for b in rng]
    slices: dict[str, Any] = {}
    for sk in sorted(m.rows, key=lambda s: s.label()):
        rows = m.rows[sk]
        per_b = [sum(rows[c][b] for c in rows) for b in rng]
        slices[sk.label()] = {
            "attempts": per_b,
            "share": {c: [_r(rows[c][b] / n) if n else 0.0
                          for b, n in zip(rng, per_b, strict=True)]
                      for c in sorted(rows)},
        }
    out: dict[str, Any] = {"bucket_s": m.bucket, "t": [b * m.bucket for b in rng],
                           "share": out_share, "p99_ms": p99, "violation_rate": viol,
                           "slices": slices}
    if m.states:
        states: dict[str, dict[str, Any]] = {}
        for (sk, c), samples in sorted(m.states.items(), key=lambda kv: (kv[0][0].label(),
                                                                         kv[0][1])):
            st: list[str | None] = [None] * len(rng)
            wt: list[float | None] = [None] * len(rng)
            for b, state, weight in samples:
                if first_b <= b < last_b:
                    st[b - first_b], wt[b - first_b] = state, _r(weight)
            states.setdefault(sk.label(), {})[c] = {"state": st, "weight": wt}
        out["route_state"] = states
    return out


def _r(x: float) -> float:
    return round(float(x), 4)


def _pcts(values: FArr) -> dict[str, float | None]:
    if not values.size:
        return {"p50": None, "p95": None, "p99": None}
    p = np.percentile(values, [50, 95, 99])
    return {"p50": _r(p[0]), "p95": _r(p[1]), "p99": _r(p[2])}
