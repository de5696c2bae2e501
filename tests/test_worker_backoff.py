"""`serve --workers N` when a worker keeps dying, when SIGHUP comes while workers start,
and when a worker's admin port is taken.

The supervisor is the real one; its workers are stand-ins (as in
tests/test_worker_restarts.py), so what is under test is the supervisor's policy: a
worker that dies at every start (a port it cannot bind, a config file a restart can
no longer read) is restarted ever more slowly while the others keep serving -- it
used to take the whole fleet down after its sixth death in a minute -- and a
SIGHUP reaches a starting worker only once it serves (its default action used to
end the worker)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import sidecar
from sidecar.devtools.harness import free_port
from sidecar.fleet.workers import restart_delay
from tests.ops_stack import ops_config, wait_for
from tests.test_workers_env import _SUPERVISOR, _children

# Worker 1 dies at every start; worker 0 serves ("admin port": its pid).
_ONE_DIES = """
import os, pathlib, signal, sys, time
if "worker-1." in sys.argv[1]:
    sys.exit(3)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
pathlib.Path(sys.argv[1]).write_text(f"1 {os.getpid()}\\n")
while True:
    time.sleep(0.05)
"""
_ALL_DIE = "import sys; sys.exit(3)"
# Starts as serve does: SIGHUP's default action until its loop takes the signal over
# (here: once the test creates "go"), then ready; it notes every SIGHUP it handles.
_SLOW_START = """
import os, pathlib, signal, sys, time
ready = pathlib.Path(sys.argv[1])
top = ready.parent.parent
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while not (top / "go").exists():
    time.sleep(0.02)
def hup(*_):
    with open(top / f"hup-{os.getpid()}", "a") as f:
        f.write(".")
signal.signal(signal.SIGHUP, hup)
ready.write_text(f"1 {os.getpid()}\\n")
while True:
    time.sleep(0.05)
"""


@pytest.mark.parametrize(("failed_starts", "delay"), [
    (0, 1.0), (1, 1.0), (5, 1.0), (6, 2.0), (7, 4.0), (10, 32.0), (11, 60.0), (500, 60.0)])
def test_restart_delay(failed_starts: int, delay: float) -> None:
    assert restart_delay(failed_starts) == delay


class Supervisors:
    """The real supervisor over stand-in workers, each stopped (and every worker it
    was seen to start killed) by pid at the end of the test."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[subprocess.Popen[bytes]] = []
        self.seen: set[int] = set()

    def start(self, worker: str) -> subprocess.Popen[bytes]:
        root = str(Path(sidecar.__file__).resolve().parents[1])
        with open(self.tmp_path / "log", "wb") as log:
            sup = subprocess.Popen(
                [sys.executable, "-c", _SUPERVISOR, str(self.tmp_path / "ready"), worker],
                cwd=root, env={**os.environ, "PYTHONPATH": root}, stderr=log)
        self.started.append(sup)
        return sup

    def children(self, sup: subprocess.Popen[bytes]) -> list[int]:
        kids = _children(sup.pid)
        self.seen.update(kids)
        return kids

    def close(self) -> None:
        for sup in self.started:
            self.children(sup)
            if sup.poll() is None:
                sup.send_signal(signal.SIGTERM)
                try:
                    sup.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    sup.kill()
                    sup.wait()
        for pid in self.seen:
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def supervise(tmp_path: Path) -> Iterator[Supervisors]:
    sups = Supervisors(tmp_path)
    yield sups
    sups.close()


def _records(tmp_path: Path) -> list[dict[str, Any]] | None:
    try:
        status = next(tmp_path.glob("tailroute-workers-*")) / "workers.json"
        return json.loads(status.read_text())["workers"]  # type: ignore[no-any-return]
    except (StopIteration, OSError, ValueError):
        return None


def test_a_worker_that_keeps_dying_backs_off_while_the_other_serves(
        tmp_path: Path, supervise: Supervisors) -> None:
    sup = supervise.start(_ONE_DIES)
    def backing_off() -> bool:
        recs = _records(tmp_path) or []
        return sup.poll() is not None or any(r.get("backoff_s") for r in recs)

    wait_for(backing_off, "worker 1's back-off", timeout_s=60)
    assert sup.poll() is None, "the supervisor stopped worker 0 with worker 1"
    recs = _records(tmp_path)
    assert recs is not None
    serving = recs[0]["pid"]  # served all along: its "admin port" (its pid) was read
    assert (recs[0]["admin_port"], recs[0]["restarts"]) == (serving, 0)
    assert serving in supervise.children(sup)
    # The first back-off (2 s) or, on a slow machine, a later one: never the whole fleet.
    n = recs[1]["failed_starts"]
    assert n >= 6 and recs[1]["backoff_s"] == restart_delay(n)
    assert recs[1]["last_exit"] == 3 and recs[1]["restarts"] in (n - 1, n)
    log = (tmp_path / "log").read_text()
    assert log.count("6 times in a row within a minute of its start; restarting it in "
                     "2 s") == 1


@pytest.mark.parametrize(("worker", "code"), [
    (_ALL_DIE, 3),
    # Killed by a signal (status -9): the supervisor's own status is 1, not 256 - 9.
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 1),
])
def test_when_every_worker_keeps_dying_the_supervisor_stops(
        tmp_path: Path, supervise: Supervisors, worker: str, code: int) -> None:
    sup = supervise.start(worker)
    assert sup.wait(timeout=60) == code
    assert "6 times in a row, and no other worker serves; stopping" in (
        tmp_path / "log").read_text()


def test_a_sighup_while_the_workers_start_reloads_each_once_and_ends_none(
        tmp_path: Path, supervise: Supervisors) -> None:
    sup = supervise.start(_SLOW_START)
    first = wait_for(lambda: kids if len(kids := supervise.children(sup)) == 2 else None,
                     "both workers to be started")
    sup.send_signal(signal.SIGHUP)  # both are still starting: no handler of their own yet
    (tmp_path / "go").touch()
    wait_for(lambda: (tmp_path / "ready").exists() or sup.poll() is not None,
             "the workers to serve")

    def settled() -> list[dict[str, Any]] | None:
        recs = _records(tmp_path) or []
        done = all((tmp_path / f"hup-{pid}").exists() for pid in first)
        return recs if done or any(r["restarts"] for r in recs) else None

    recs = wait_for(settled, "each worker to reload, or one to be restarted")
    assert sorted((r["pid"], r["restarts"]) for r in recs) == sorted((p, 0) for p in first)
    assert [(tmp_path / f"hup-{pid}").read_text() for pid in first] == [".", "."]


def test_a_taken_admin_port_of_a_worker_is_one_line_and_no_worker(tmp_path: Path) -> None:
    """Worker 1's admin port (listen.admin's + 1) is another process's: said at once,
    naming it, instead of a worker failing at every start."""
    with socket.socket() as held:
        for _ in range(20):  # a port p whose p + 1 this test can hold
            port = free_port()
            try:
                held.bind(("127.0.0.1", port + 1))
                break
            except OSError:
                continue
        held.listen()
        data = ops_config({"provider-a": 1, "provider-b": 2, "provider-c": 3})
        data["fleet"] = {"url": "redis://127.0.0.1:1/0"}
        path = tmp_path / "t.yaml"
        path.write_text(yaml.safe_dump(data))
        out = subprocess.run(
            [sys.executable, "-m", "sidecar.cli", "serve", "--config", str(path), "--workers",
             "2", "--grpc", "127.0.0.1:0", "--admin", f"127.0.0.1:{port}",
             "--ready-file", str(tmp_path / "ready")],
            capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1] == (
        f"tailroute serve: cannot listen for worker 1's admin server on 127.0.0.1:{port + 1} "
        "(--admin + 1): address already in use (another process listens there)")
    assert "Traceback" not in out.stderr and not (tmp_path / "ready").exists()
