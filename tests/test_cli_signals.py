"""SIGTERM (``timeout``, ``kill``, a CI cancel) to ``tailroute demo`` stops everything it
started, as Ctrl-C does: its Envoy, sidecar and providers run in sessions of their own
and never see the signal, so the command must stop them itself. Ctrl-C in the policy
lab ends it at once, quietly, with its worker processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest


def _children(pid: int) -> set[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True,
                         check=False).stdout
    return {int(x) for x in out.split()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its new parent) is not running.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ", 1)[1].startswith("Z"))


def _kill_all(proc: subprocess.Popen[bytes], kids: set[int]) -> None:
    """Whatever the test saw start, stopped by PID (a failed run must not leave it)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for pid in kids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.envoy
def test_sigterm_stops_the_demo_and_everything_it_started(tmp_path: Path) -> None:
    # The demo keeps its work directory (its logs) on purpose: here, inside tmp_path.
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "sidecar.cli", "demo", "--duration", "120"],
                            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    kids: set[int] = set()
    try:
        deadline = time.monotonic() + 60  # bounds a broken run only
        while len(kids) < 4 and time.monotonic() < deadline:  # providers, sidecar, Envoy
            time.sleep(0.2)
            kids = _children(proc.pid)
        assert len(kids) >= 4, "the demo did not start its processes"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 130
        assert proc.stderr is not None and b"Traceback" not in proc.stderr.read()
        left = set()
        for pid in kids:
            for _ in range(50):
                if not _alive(pid):
                    break
                time.sleep(0.1)
            else:
                left.add(pid)
        assert not left, f"still running after SIGTERM: {left}"
    finally:  # a failed run must not leave them either
        _kill_all(proc, kids)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_parallel_lab_run_ends_quietly_with_its_workers(
        tmp_path: Path, sig: signal.Signals) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sidecar.cli", "simulate", "--generate", "8", "--family-seed", "3",
         "--jobs", "2", "--policy", "tailroute"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    kids: set[int] = set()
    try:
        deadline = time.monotonic() + 60  # bounds a broken run only
        while len(kids) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
            kids = _children(proc.pid) - {proc.pid}
        assert len(kids) >= 2, "the run did not start its workers"
        os.killpg(proc.pid, sig)  # a terminal sends SIGINT to the whole group
        assert proc.wait(timeout=60) == 130
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
        assert "Traceback" not in err and "interrupted" in err
        for _ in range(50):
            if not any(_alive(pid) for pid in kids):
                break
            time.sleep(0.1)
        assert not [pid for pid in kids if _alive(pid)]
    finally:
        _kill_all(proc, kids)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_lab_workers_start_is_raised_once_they_have(
        monkeypatch: pytest.MonkeyPatch, sig: signal.Signals) -> None:
    """The parallel run above, its signal arriving inside the pool's start (where the
    test above sends it only sometimes): it was lost (SIGINT, ignored there) or cut the
    start short (the workers left half-started printed tracebacks). Now it is raised as
    its handler has it once the pool is whole, and the pool is stopped."""
    import multiprocessing

    from sidecar.sim import gen_run

    spawn = multiprocessing.get_context("spawn")
    made: list[Any] = []

    class SignalledWhileStarting:
        def Pool(self, jobs: int) -> Any:
            os.kill(os.getpid(), sig)
            made.append(spawn.Pool(jobs))
            return made[-1]

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")  # as the CLI does for SIGTERM

    monkeypatch.setattr(gen_run.multiprocessing, "get_context",
                        lambda kind: SignalledWhileStarting())
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            gen_run._pool_leaving_signals_here(2)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert len(made) == 1  # the start ran to its end
    for w in made[0]._pool:  # stopped by the pool (terminate joins them)
        assert not w.is_alive()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
