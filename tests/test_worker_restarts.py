"""`serve --workers N` after a worker died and was restarted: where the new worker's
admin port is (``<ready-file>.workers``, rewritten) and how many restarts there were
(the supervisor's ``workers.json``, which every worker shows on /state and /metrics).

The supervisor is the real one; its workers are stand-ins that write their ready file
with their own pid as the "admin port" (so a restarted worker has a new one, as with
``--admin HOST:0``) -- the supervisor's bookkeeping is what is under test here; the
real workers are in tests/test_integration_workers.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import sidecar
from sidecar.fleet.worker_status import (
    WorkerRecord,
    WorkerStatus,
    WorkerStatusCollector,
    write_status,
)
from tests.ops_stack import wait_for
from tests.test_workers_env import _SUPERVISOR, _children

_PID_WORKER = """
import os, pathlib, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
pathlib.Path(sys.argv[1]).write_text(f"1 {os.getpid()}\\n")
while True:
    time.sleep(0.05)
"""


def _ready(probe: Callable[[], Any], what: str) -> Any:
    """A readiness wait on the supervisor's files (``tests.ops_stack.wait_for``; an empty
    listing is not ready yet)."""
    return wait_for(lambda: probe() or None, what, timeout_s=30.0)


def _listed(path: Path) -> list[int] | None:
    try:
        return [int(p) for p in path.read_text().split()]
    except (OSError, ValueError):
        return None


def test_a_restarted_worker_is_listed_and_counted(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    listing = tmp_path / "ready.workers"
    root = str(Path(sidecar.__file__).resolve().parents[1])
    sup = subprocess.Popen([sys.executable, "-c", _SUPERVISOR, str(ready), _PID_WORKER],
                           cwd=root, env={**os.environ, "PYTHONPATH": root},
                           stderr=subprocess.DEVNULL)
    try:
        _ready(ready.exists, "the workers to be ready")
        first = _children(sup.pid)
        assert _listed(listing) == first  # stand-ins: "admin port" = pid, in index order
        grpc_port, admin_port = ready.read_text().split()  # gRPC: the supervisor's choice
        assert admin_port == str(first[0])
        status_file = next(tmp_path.glob("tailroute-workers-*")) / "workers.json"
        status = json.loads(status_file.read_text())
        assert [w["restarts"] for w in status["workers"]] == [0, 0]

        os.kill(first[1], signal.SIGKILL)
        now = _ready(lambda: (ps := _listed(listing)) and ps[1] != first[1] and ps,
                     "the listing to show the restarted worker")
        assert now[0] == first[0] and Path(f"/proc/{now[1]}").exists()
        status = json.loads(status_file.read_text())
        assert [(w["restarts"], w["last_exit"]) for w in status["workers"]] == [
            (0, None), (1, -signal.SIGKILL)]
        assert [w["pid"] for w in status["workers"]] == now
        assert [w["admin_port"] for w in status["workers"]] == now

        os.kill(first[0], signal.SIGKILL)  # worker 0: the ready file names its port too
        _ready(lambda: ready.read_text().split() not in ([], [grpc_port, admin_port]),
               "the ready file to name the new worker 0")
        assert ready.read_text().split() == [grpc_port, str(_listed(listing)[0])]  # type: ignore[index]
    finally:
        late = _children(sup.pid)
        if sup.poll() is None:
            sup.send_signal(signal.SIGTERM)
            try:
                sup.wait(timeout=30)
            except subprocess.TimeoutExpired:
                for w in late:
                    os.kill(w, signal.SIGKILL)
                sup.kill()
                sup.wait()


@pytest.mark.parametrize("content", [
    None,  # not written (yet), or the supervisor's directory is gone
    "", "{", "[]", '{"workers": 3}', '{"workers": [1, 2]}',
])
def test_a_status_file_that_cannot_be_read_is_no_workers_and_no_samples(
        tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "workers.json"
    if content is not None:
        path.write_text(content)
    status = WorkerStatus(path, 1)
    assert status.view() == {"index": 1, "workers": None}
    (family,) = WorkerStatusCollector(status).collect()
    assert family.samples == []


def test_the_status_file_round_trips_and_a_non_integer_count_is_skipped(
        tmp_path: Path) -> None:
    path = tmp_path / "workers.json"
    write_status(path, [WorkerRecord(11, 9001), WorkerRecord(12, None, 3, -9, 1)])
    status = WorkerStatus(path, 0)
    assert status.view()["workers"] == [
        {"pid": 11, "admin_port": 9001, "restarts": 0, "last_exit": None, "hung_restarts": 0,
         "most_missed": 0, "failed_starts": 0, "backoff_s": 0.0},
        {"pid": 12, "admin_port": None, "restarts": 3, "last_exit": -9, "hung_restarts": 1,
         "most_missed": 0, "failed_starts": 0, "backoff_s": 0.0}]
    assert [(s.labels, s.value) for s in next(iter(WorkerStatusCollector(status).collect()))
            .samples] == [({"worker": "0", "reason": "exited"}, 0.0),
                          ({"worker": "0", "reason": "hung"}, 0.0),
                          ({"worker": "1", "reason": "exited"}, 2.0),
                          ({"worker": "1", "reason": "hung"}, 1.0)]
    # Not whole counts, more hung than all, or negative: skipped. No hung_restarts (a
    # file from before them): none of the restarts were for a hang.
    path.write_text('{"workers": [{"restarts": true}, {"restarts": "3"}, {"restarts": 4}, '
                    '{"restarts": 1, "hung_restarts": 2}, {"restarts": -1}, '
                    '{"restarts": 2, "hung_restarts": 2}]}')
    assert status.restarts() == [("2", "exited", 4), ("2", "hung", 0),
                                 ("5", "exited", 0), ("5", "hung", 2)]
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind
