"""`serve --workers N` starts its workers on the supervisor's own code: a `sidecar/`
package in the caller's working directory (an old checkout, a backup) is not what
they import; more workers than CPUs are warned about."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import sidecar
from sidecar.core.config import parse_config
from sidecar.fleet.workers import Supervisor, _worker_env
from tests.conftest import base_config_dict


def test_a_worker_imports_the_supervisors_package_not_the_working_directorys(
        tmp_path: Path) -> None:
    planted = tmp_path / "sidecar"
    planted.mkdir()
    (planted / "__init__.py").write_text("raise SystemExit('the planted copy was imported')\n")
    # The interpreter flags a worker is started with (Supervisor.argv): -P, then -m.
    out = subprocess.run(
        [sys.executable, "-P", "-c", "import sidecar; print(sidecar.__file__)"],
        cwd=tmp_path, env=_worker_env(), capture_output=True, text=True, timeout=60,
        check=False)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).resolve() == Path(sidecar.__file__).resolve()


@pytest.mark.parametrize(("extra", "warned"), [(0, False), (1, True)])
def test_more_workers_than_cpus_is_warned_about(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, extra: int, warned: bool) -> None:
    """Allowed (the bound is fixed, a config checked elsewhere must pass the same way),
    but said: the extra processes only contend for the cores. No process is started."""
    cfg = parse_config(base_config_dict(fleet={"url": "redis://127.0.0.1:6379/0"}), "t.yaml")
    n = min((os.cpu_count() or 1) + extra, 64)
    ns = argparse.Namespace(grpc="127.0.0.1:0", unix=None, admin="127.0.0.1:0",
                            ready_file=str(tmp_path / "ready"))
    caplog.set_level(logging.WARNING, logger="tailroute.workers")
    sup = Supervisor(ns, cfg, n)
    shutil.rmtree(sup.dir)
    assert sup.dir.parent == tmp_path and not sup.procs
    said = [r.getMessage() for r in caplog.records]
    assert said == ([f"--workers {n} on {os.cpu_count()} CPUs: each worker is a process "
                     "deciding on one core, so the extra ones only contend"] if warned else [])


# A stand-in worker: ready at once, exits 0 on SIGTERM (the supervisor's loop is what
# is under test, not serve).
_FAKE_WORKER = """
import pathlib, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
pathlib.Path(sys.argv[1]).write_text("1 2\\n")
while True:
    time.sleep(0.05)
"""

_SUPERVISOR = """
import argparse, logging, sys
from sidecar.core.config import parse_config
from sidecar.fleet.workers import Supervisor
from tests.conftest import base_config_dict

class Fake(Supervisor):
    def argv(self, i):
        return [sys.executable, "-c", sys.argv[2], str(self.ready(i))]

logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
cfg = parse_config(base_config_dict(fleet={"url": "redis://127.0.0.1:1/0"}), "t.yaml")
ns = argparse.Namespace(grpc="127.0.0.1:0", unix=None, admin="127.0.0.1:0",
                        ready_file=sys.argv[1], verbose=False, config="t.yaml",
                        snapshot=None, snapshot_every=30.0, seed=None)
sys.exit(Fake(ns, cfg, 2).run())
"""


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def test_a_stop_while_a_dead_worker_waits_for_its_restart_stops_everything(
        tmp_path: Path) -> None:
    """SIGTERM to the supervisor alone (as Kubernetes sends it to PID 1) in the second
    between a worker's death and its restart: no worker is started after the stop
    (it would never be told to stop, and the supervisor would wait for it forever)."""
    import signal
    import time

    ready = tmp_path / "ready"
    root = str(Path(sidecar.__file__).resolve().parents[1])
    sup = subprocess.Popen([sys.executable, "-c", _SUPERVISOR, str(ready), _FAKE_WORKER],
                           cwd=root, env={**os.environ, "PYTHONPATH": root},
                           stderr=subprocess.PIPE, text=True)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 30  # bounds a broken run; not a timing assertion
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists()
        workers = _children(sup.pid)
        assert len(workers) == 2
        os.kill(workers[1], signal.SIGKILL)
        assert sup.stderr is not None
        for line in sup.stderr:  # the supervisor says it is restarting, then sleeps 1 s
            if "restarting it" in line:
                break
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(timeout=30) == 1  # a worker had died: not a clean stop
        assert all(not Path(f"/proc/{w}").exists() for w in workers)
    finally:
        late = _children(sup.pid)
        if sup.poll() is None:
            for w in late:
                os.kill(w, signal.SIGKILL)
            sup.kill()
            sup.wait()
        for w in workers:
            if Path(f"/proc/{w}").exists():
                os.kill(w, signal.SIGKILL)
