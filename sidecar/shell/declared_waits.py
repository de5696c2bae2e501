"""What providers declared with their 429s and 503s, per upstream cluster: how often
and how long.

A rate-limited or unavailable provider says when to come back (``retry-after-ms`` /
``Retry-After``, read from the access-log entry by
:func:`sidecar.shell.access_log.declared_wait`). Every such entry is counted here,
observed or not (``stats.observe_share``), so an operator sees which route is under a
time-based quota (or down for a declared while) and for how long:
``tailroute_retry_after_total{cluster}``, ``tailroute_retry_after_seconds_total{cluster}``
(their ratio is the mean declared wait) and ``/state`` ``envoy.retry_after``. A 429 or
503 whose header is there but unreadable is
``tailroute_errors_total{kind="retry_after_unreadable"}`` instead (counted by the app).
Clusters come from Envoy's entries, whose clusters are the rendered config's: the label
set is bounded by the config.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class _Waits:
    count: int = 0
    total_s: float = 0.0
    last_s: float = 0.0
    max_s: float = 0.0


@dataclass(slots=True)
class DeclaredWaits:
    """Declared waits per upstream cluster (module docstring)."""

    by_cluster: dict[str, _Waits] = field(default_factory=dict)

    def note(self, cluster: str, wait_s: float) -> None:
        w = self.by_cluster.get(cluster)
        if w is None:
            w = self.by_cluster[cluster] = _Waits()
        w.count += 1
        w.total_s += wait_s
        w.last_s = wait_s
        w.max_s = max(w.max_s, wait_s)

    def counters(self) -> dict[str, int]:
        """Shell counters for the metrics: ``retry_after:<cluster>`` (429s / 503s that declared
        a wait) and ``retry_after_ms:<cluster>`` (the declared waits' sum, ms)."""
        out: dict[str, int] = {}
        for cluster, w in self.by_cluster.items():
            out[f"retry_after:{cluster}"] = w.count
            out[f"retry_after_ms:{cluster}"] = round(w.total_s * 1000)
        return out

    def view(self) -> dict[str, dict[str, float]]:
        """``/state`` ``envoy.retry_after``: per cluster, how many, the last, the longest
        and the mean declared wait (seconds)."""
        return {cluster: {"count": w.count, "last_s": round(w.last_s, 3),
                          "max_s": round(w.max_s, 3),
                          "mean_s": round(w.total_s / w.count, 3)}
                for cluster, w in sorted(self.by_cluster.items())}
