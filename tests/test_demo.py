"""`make demo` stays readable: progress and the final table only (a short run here)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.devtools.demo import PROVIDERS

pytestmark = pytest.mark.envoy


def test_demo_prints_progress_and_the_table_only() -> None:
    out = subprocess.run([sys.executable, "-m", "sidecar.cli", "demo", "--duration", "6"],
                         capture_output=True, text=True, timeout=180, check=False)
    lines = (out.stdout + out.stderr).splitlines()
    # The demo keeps its work directory for the reader of its output; a passing test
    # does not leave it behind (a failing one does, for the post-mortem).
    workdir = next((Path(ln.rsplit("logs in ", 1)[1]) for ln in lines if "logs in " in ln), None)
    assert out.returncode == 0, out.stderr[-2000:]
    assert workdir is not None and (workdir / "sidecar.log").exists()
    assert len(lines) <= 60, "\n".join(lines)
    assert not [ln for ln in lines if "HTTP Request:" in ln]  # client request logs are off
    header = next(ln for ln in lines if ln.lstrip().startswith("window"))
    assert all(name in header for name in PROVIDERS) and "p99 ms" in header
    assert any(ln.startswith("p50/p99: ") for ln in lines)  # what the percentiles cover
    assert lines[-1] == "all processes stopped."
    shutil.rmtree(workdir)
