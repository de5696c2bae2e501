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
