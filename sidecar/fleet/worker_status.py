"""What the ``serve --workers N`` supervisor knows about its workers, shown by the workers.

Only the supervisor sees a worker die and come back, and it has no admin port of
its own. So it keeps one record per worker -- pid, admin port, restarts, how the
last one ended -- and rewrites ``workers.json`` in its directory (atomically)
whenever a record changes. Every worker is told that path (``--workers-status``)
and reads the file when /state or /metrics is asked for, so any worker's admin
port shows the whole set: ``/state`` ``workers`` and
``tailroute_worker_restarts_total{worker,reason}`` (the same numbers on every worker;
a restarted worker starts a new process, but the count is the supervisor's, so it
does not fall back to 0 with it). ``reason`` is ``hung`` for a worker the supervisor
killed because its event loop stopped beating (:mod:`sidecar.fleet.liveness`),
``exited`` for one that died on its own.

A file that cannot be read (not written yet, or the supervisor is gone) gives
``workers: null`` in the view and no restart samples: never an error on the
admin endpoint.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeGuard

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from sidecar.ops.metric_families import counter
from sidecar.ops.snapshot import write_text_atomic

WORKER_METRIC_NAMES = ("tailroute_worker_restarts_total",)


@dataclass(slots=True)
class WorkerRecord:
    """One worker as the supervisor sees it. ``admin_port`` is None from the worker's
    death until its successor's ready file names the new port; ``last_exit`` is the
    exit status of its last death (negative: the signal that killed it);
    ``hung_restarts``: how many of ``restarts`` replaced a worker killed for hanging;
    ``most_missed``: the most heartbeat probes in a row this worker process missed
    (how close a busy worker came to ``workers.probe_misses``; 0 again after a restart);
    ``failed_starts``: its deaths in a row, each within a minute of its start (0 once a
    process of it has run a minute); ``backoff_s``: how long the supervisor waits before
    starting it again after such a streak (0: the usual second)."""

    pid: int | None = None
    admin_port: int | None = None
    restarts: int = 0
    last_exit: int | None = None
    hung_restarts: int = 0
    most_missed: int = 0
    failed_starts: int = 0
    backoff_s: float = 0.0


def write_status(path: Path, records: Sequence[WorkerRecord]) -> None:
    write_text_atomic(path, json.dumps({"workers": [asdict(r) for r in records]}) + "\n")


def read_status(path: Path) -> list[dict[str, Any]] | None:
    """The supervisor's records, or None when the file is missing or not what it writes."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    workers = data.get("workers") if isinstance(data, dict) else None
    if not isinstance(workers, list) or not all(isinstance(w, dict) for w in workers):
        return None
    return workers


class WorkerStatus:
    """A worker's view of the supervisor's records (module docstring)."""

    def __init__(self, path: Path, index: int) -> None:
        self.path = path
        self.index = index

    def view(self, _now: float = 0.0) -> dict[str, Any]:
        """The ``workers`` section of /state."""
        return {"index": self.index, "workers": read_status(self.path)}

    def restarts(self) -> list[tuple[str, str, int]]:
        """``(worker index, reason, restarts)``, ``exited`` and ``hung`` for every record
        whose counts are whole numbers (a record without ``hung_restarts`` has none)."""
        out = []
        for i, w in enumerate(read_status(self.path) or []):
            n, hung = w.get("restarts"), w.get("hung_restarts", 0)
            if _count(n) and _count(hung) and hung <= n:
                out += [(str(i), "exited", n - hung), (str(i), "hung", hung)]
        return out


def _count(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


class WorkerStatusCollector(Collector):
    """``tailroute_worker_restarts_total{worker,reason}``, read at scrape time."""

    def __init__(self, status: WorkerStatus) -> None:
        self.status = status

    def collect(self) -> Iterator[Metric]:
        yield counter("tailroute_worker_restarts",
                      "serve --workers: times the supervisor restarted each worker, after "
                      "it died (reason exited) or after it killed it for hanging (hung); "
                      "the same on every worker",
                      [([i, why], n) for i, why, n in self.status.restarts()],
                      labels=["worker", "reason"])
