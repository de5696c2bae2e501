"""JSON views of the router's state, shared by /state, /explain and `tailroute status`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any, Final

from sidecar.core.health_board import CLUSTER_SLICE
from sidecar.core.router import Router
from sidecar.core.series import RouteStats
from sidecar.core.stats import METRICS
from sidecar.core.types import Decision, Explain
from sidecar.ops.cooperative import STEP_ROUTES, Steps, run_steps, run_steps_async

QUANTILES: Final = (0.5, 0.95, 0.99)  # what the views show of each window


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000.0, 3)


def state_json(router: Router, now: float) -> dict[str, Any]:
    """Per cluster x slice: percentiles, sample counts, requests and their share of the
    slice's, state, weight, last transition."""
    return run_steps(state_steps(router, lambda: now))


async def state_json_async(router: Router, clock: Callable[[], float]) -> dict[str, Any]:
    """:func:`state_json` at ``clock()``, giving the event loop a turn every
    :data:`~sidecar.ops.cooperative.STEP_ROUTES` routes (sidecar.ops.cooperative)."""
    return await run_steps_async(state_steps(router, clock))


def route_latency(rs: RouteStats, now: float) -> dict[str, Any]:
    """Samples and p50/p95/p99 (ms) of each metric of one route's window."""
    lat: dict[str, Any] = {}
    for metric in METRICS:
        values, n = rs.quantiles(metric, QUANTILES, now)
        lat[metric] = {"samples": n, **{f"p{int(q * 100)}_ms": _ms(v)
                                        for q, v in zip(QUANTILES, values, strict=True)}}
    return lat


def state_steps(router: Router, clock: Callable[[], float]) -> Steps[dict[str, Any]]:
    """:func:`state_json` as steps (sidecar.ops.cooperative): the routes in slices."""
    now = start = clock()
    routes: list[dict[str, Any]] = []
    health = {key: h for key, h in router.board.items()}
    for i, ((cluster, slice), rs) in enumerate(list(router.stats.items())):
        if i and not i % STEP_ROUTES:
            yield
            now = clock()
        lat = route_latency(rs, now)
        h = health.get((cluster, slice))
        routes.append({
            "cluster": cluster,
            "slice": slice.label(),
            "narrow": router.stats.is_narrow(cluster, slice),
            "latency": lat,
            "requests": rs.requests(now),
            "error_rate": rs.error_rate(now),
            "timeout_rate": rs.timeout_rate(now),
            "state": h.state.value if h else "healthy",
            "weight": h.weight if h else 1.0,
            "since": h.since if h else None,
            # live misses (sidecar.core.live_misses): the book of the last
            # health.live_horizon_s and the repeat-offender memory; None if untracked
            "live": router.live.summary(cluster, slice, now),
        })
    yield
    now = clock()
    _add_shares(routes)
    last: dict[tuple[str, str], dict[str, Any]] = {}
    for e in router.transitions:
        last[(e.cluster, e.slice)] = {"at": e.at, "from": e.old, "to": e.new, "reason": e.reason}
    for r in routes:
        r["last_transition"] = last.get((r["cluster"], r["slice"]))
    clusters: dict[str, Any] = {}
    held = router.pushback.held()
    for c in router.config.cluster_names:
        # The cluster-wide entry (fast ejection of the whole cluster) has no series of
        # its own, so it is shown here rather than among the routes.
        hc = health.get((c, CLUSTER_SLICE))
        narrow, overflow = router.stats.slice_counts(c)
        clusters[c] = {
            # slices tracked, and overflow slices in use: further ones fold into those
            "slices": {"narrow": narrow, "max": router.config.stats.max_slices,
                       "overflow": overflow},
            "inflight": router.held(c),
            "max_concurrency": router.config.cluster(c).max_concurrency,
            # learned from 429s or from queueing (sidecar.core.pushback, queue_signs);
            # max_concurrency when neither lowered it
            "concurrency_limit": router.pushback.limit(c),
            # what lowered it: "429", "queueing" (a cap: full at it), or None
            "limit_source": router.pushback.source(c),
            # end of a hold (a 429's or 503's Retry-After, or a quota's backoff): full until
            # then; None if not held
            "held_until": held.get(c),
            # its 429s read as a quota's: one came back with nothing else in flight, so
            # they hold it with a growing backoff instead of lowering its limit
            "quota_429": router.pushback.quota(c, now),
            "state": hc.state.value if hc else "healthy",
            "weight": hc.weight if hc else 1.0,
            "since": hc.since if hc else None,
            "last_transition": last.get((c, CLUSTER_SLICE.label())),
        }
    return {
        "now": start,
        "clusters": clusters,
        "routes": routes,
        "transitions": [asdict(e) for e in list(router.transitions)[-50:]],
        # classes others yield to under overload (sidecar.core.admission_priority)
        "admission": {"pressed": router.admission.pressure.snapshot(now),
                      # marks dropped or entries evicted at the table's cap
                      "pressed_overflow": router.admission.pressure.overflow,
                      # decayed first attempts and retries per route; tenants counted
                      "retry_budget": {"routes": router.admission.budget.snapshot(now),
                                       "tenants": router.admission.budget.tenants}},
        "counters": {f"{k}:{label}": v for (k, label), v in sorted(router.counters.items())},
    }


def busiest_steps(router: Router, clock: Callable[[], float], n: int
                  ) -> Steps[list[dict[str, Any]]]:
    """The ``n`` narrow routes with the most requests in their window (most first):
    cluster, slice, requests, state and latency -- the status page's chart points.
    Only these ``n`` have their percentiles computed; counting requests is cheaper."""
    narrow = []
    now = clock()
    for i, (key, rs) in enumerate(list(router.stats.items())):
        if i and not i % (4 * STEP_ROUTES):
            yield
            now = clock()
        if router.stats.is_narrow(*key):
            narrow.append((rs.requests(now), i, key, rs))
    narrow.sort(key=lambda x: (-x[0], x[1]))  # ties in the store's order, as before
    health = {key: h for key, h in router.board.items()}
    out = []
    for requests, _, (cluster, slice), rs in narrow[:n]:
        h = health.get((cluster, slice))
        out.append({"cluster": cluster, "slice": slice.label(), "requests": requests,
                    "state": h.state.value if h else "healthy",
                    "latency": route_latency(rs, now)})
    return out


def _add_shares(routes: list[dict[str, Any]]) -> None:
    """``share``: each route's part of its slice's requests over the window (None while
    the slice has none). A route can stay ``healthy`` at weight 1 while the scores move
    its traffic elsewhere (slower, failing, holding more than its share in flight); the
    share is where an operator sees that."""
    totals: dict[tuple[bool, str], int] = {}
    for r in routes:
        key = (r["narrow"], r["slice"])
        totals[key] = totals.get(key, 0) + r["requests"]
    for r in routes:
        total = totals[(r["narrow"], r["slice"])]
        r["share"] = round(r["requests"] / total, 4) if total else None


def decision_json(at: float, decision: Decision, request: dict[str, Any],
                  explain: Explain | None) -> dict[str, Any]:
    out: dict[str, Any] = {"at": at, "request": request, "cluster": decision.cluster,
                           "reason": decision.reason, "admission": decision.admission,
                           "is_probe": decision.is_probe, "detail": decision.detail}
    if explain is not None:
        out["explain"] = asdict(explain)
    return out


def explain_recent(router: Router, limit: int = 20) -> list[dict[str, Any]]:
    """The most recent decisions with their reasons, newest first."""
    out = []
    for rd in list(router.recent)[-limit:][::-1]:
        req = {"model": rd.request.model, "class": rd.request.klass,
               "slice": rd.request.slice.label(), "stream": rd.request.stream,
               "priority": rd.request.priority, "retry_attempt": rd.request.retry_attempt}
        out.append(decision_json(rd.at, rd.decision, req, rd.explain()))
    return out
