"""`serve --workers N` starts its workers on the supervisor's own code: a `sidecar/`
package in the caller's working directory (an old checkout, a backup) is not what
they import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import sidecar
from sidecar.fleet.workers import _worker_env


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
