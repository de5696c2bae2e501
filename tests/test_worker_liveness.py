"""Telling a hung worker of ``serve --workers N`` from a busy one: the pure state machine
(:mod:`sidecar.fleet.liveness`) over beats and ``now``, the ``workers:`` config
section, and the heartbeat pipe's two ends. The real supervisor killing a SIGSTOPped
worker is in tests/test_integration_workers.py."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import sidecar
from sidecar.core.config import ConfigError, parse_config
from sidecar.core.workers_config import WorkersConfig
from sidecar.fleet import heartbeat
from sidecar.fleet.liveness import Action, Liveness
from tests.conftest import base_config_dict
from tests.ops_stack import wait_for

CFG = WorkersConfig(probe_interval_s=1.0, probe_misses=3, kill_grace_s=2.0,
                    start_timeout_s=10.0)


def _run(steps: list[tuple[float, int]], cfg: WorkersConfig = CFG) -> list[tuple[float, Action]]:
    """Feed ``(now, beats)`` steps to a worker spawned at 0; the non-wait actions."""
    live = Liveness(cfg, 0.0)
    return [(now, act) for now, beats in steps if (act := live.step(now, beats)) != "wait"]


def _every(start: float, stop: float, dt: float = 0.1, beats: int = 0) -> list[tuple[float, int]]:
    n = round((stop - start) / dt)
    return [(round(start + k * dt, 6), beats) for k in range(n)]


OFF = WorkersConfig(probe_interval_s=0.0)


@pytest.mark.parametrize(("cfg", "steps", "expected"), [
    # Beating at every look, for a minute: alive.
    (CFG, _every(0.0, 60.0, beats=1), []),
    # Beats until 5 s, then none: probes at 6, 7, 8 find nothing; 3 in a row at 8.
    # SIGKILL kill_grace_s later, then nothing more (its death goes the restart path).
    (CFG, _every(0.0, 5.0, beats=1) + _every(5.0, 20.0), [(8.0, "term"), (10.0, "kill")]),
    # Two misses, then a beat: the run starts over; it never reaches three.
    (CFG, _every(0.0, 2.0, beats=1) + _every(2.0, 4.5) + [(4.5, 1)] + _every(4.6, 6.5)
     + [(6.5, 1)] + _every(6.6, 8.5) + [(8.5, 1)], []),
    # The supervisor itself was away 30 s (restarting another worker, starved): its
    # next look finds the beats the worker sent meanwhile, and that is no miss.
    (CFG, [(0.5, 1), (1.0, 1), (31.0, 120), (32.0, 4), (33.0, 4)], []),
    # ... and away again with nothing waiting: one late probe is one miss, not thirty.
    (CFG, [(1.0, 1), (31.0, 0), (32.0, 0)], []),
    # Never a beat: starting until start_timeout_s, then hung.
    (CFG, _every(0.0, 15.0), [(10.0, "term"), (12.0, "kill")]),
    # A slow start (first beat at 9 s) is not a hang.
    (CFG, _every(0.0, 9.0) + _every(9.0, 30.0, beats=1), []),
    # Off: never a verdict.
    (OFF, _every(0.0, 100.0, dt=1.0), []),
])
def test_liveness_verdicts(cfg: WorkersConfig, steps: list[tuple[float, int]],
                           expected: list[tuple[float, Action]]) -> None:
    assert _run(steps, cfg) == expected


def test_the_hang_reason_says_how_long() -> None:
    live = Liveness(CFG, 0.0)
    for now, beats in _every(0.0, 2.0, beats=1) + _every(2.0, 6.0):
        live.step(now, beats)
    assert live.hung and live.reason == "no heartbeat in 3 probes in a row, none for 3.0 s"


_gaps = st.lists(st.tuples(st.floats(0.0, 3.0), st.integers(0, 3)), min_size=1, max_size=200)


@settings(max_examples=300, deadline=None)
@given(_gaps)
def test_never_hung_unless_no_beat_for_misses_times_interval(
        gaps: list[tuple[float, int]]) -> None:
    """Whatever the supervisor's timing: a verdict at T means no step in the last
    probe_interval_s x probe_misses before T brought a beat (or none ever came and
    start_timeout_s passed)."""
    live, now, beat_at = Liveness(CFG, 0.0), 0.0, None
    for gap, beats in gaps:
        now += gap
        if live.step(now, beats) == "term":
            if beat_at is None:
                assert now >= CFG.start_timeout_s
            else:
                assert now - beat_at >= CFG.hung_after_s
            return
        if beats:
            beat_at = now


@settings(max_examples=200, deadline=None)
@given(st.floats(0.0, 30.0), st.floats(0.01, 0.3))
def test_a_worker_that_stops_beating_is_hung_soon_after(stop: float, dt: float) -> None:
    """Looked at every ``dt``: within (misses + 1) probes of its last beat."""
    live, now, beat_at = Liveness(CFG, 0.0), 0.0, 0.0
    while True:
        beats = int(now < stop or now == 0.0)  # at least one beat: past the start
        now += dt
        beat_at = now if beats else beat_at
        if live.step(now, beats) == "term":
            break
        assert now <= beat_at + (CFG.probe_misses + 1) * (CFG.probe_interval_s + dt)


@pytest.mark.parametrize(("section", "field", "message"), [
    ({"probe_interval_s": -1}, "workers.probe_interval_s", "must be >= 0"),
    ({"probe_interval_s": 0.05}, "workers.probe_interval_s", "must be 0 (off) or >= 0.1"),
    ({"probe_misses": 1}, "workers.probe_misses", "must be >= 2"),
    ({"probe_misses": 2.5}, "workers.probe_misses", "must be an integer"),
    ({"probe_interval_s": 0.1, "probe_misses": 5}, "workers.probe_misses",
     "probe_interval_s x probe_misses must be >= 1 s"),
    ({"kill_grace_s": 0}, "workers.kill_grace_s", "must be >= 0.1"),
    ({"start_timeout_s": "soon"}, "workers.start_timeout_s", "must be a number"),
    ({"probe_interval": 1}, "workers", "unknown field(s): probe_interval"),
])
def test_a_bad_workers_section_names_file_and_field(section: dict[str, object], field: str,
                                                    message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(base_config_dict(workers=section), "t.yaml")
    (problem,) = err.value.problems
    assert problem.startswith(f"t.yaml: {field}: ") and message in problem


def test_every_problem_of_the_workers_section_is_named() -> None:
    """A bad grace does not hide a product that is too short (nor the reverse)."""
    with pytest.raises(ConfigError) as err:
        parse_config(base_config_dict(workers={"probe_interval_s": 0.1, "probe_misses": 3,
                                               "kill_grace_s": 0}), "t.yaml")
    assert [p.split(": ")[1] for p in err.value.problems] == [
        "workers.kill_grace_s", "workers.probe_misses"]


@pytest.mark.parametrize(("section", "expected"), [
    (None, WorkersConfig()),
    ({}, WorkersConfig()),
    ({"probe_interval_s": 0}, WorkersConfig(probe_interval_s=0.0)),
    ({"probe_interval_s": 0.25, "probe_misses": 8, "kill_grace_s": 1, "start_timeout_s": 30},
     WorkersConfig(0.25, 8, 1.0, 30.0)),
])
def test_the_workers_section(section: dict[str, object] | None, expected: WorkersConfig) -> None:
    data = base_config_dict() if section is None else base_config_dict(workers=section)
    assert parse_config(data, "t.yaml").workers == expected


def test_beats_cross_the_pipe_and_a_gone_supervisor_ends_them() -> None:
    r, w = heartbeat.open_pipe()
    assert heartbeat.read_beats(r) == 0  # nothing yet, and the read does not block

    async def beat_a_while() -> None:
        task = asyncio.create_task(heartbeat.beat(w, 0.01))
        await asyncio.sleep(0.2)
        task.cancel()

    asyncio.run(beat_a_while())
    assert heartbeat.read_beats(r) >= 2
    os.close(r)  # the supervisor gone: the next write fails (EPIPE), the task ends
    r, w = heartbeat.open_pipe()
    os.close(r)
    asyncio.run(asyncio.wait_for(heartbeat.beat(w, 0.01), timeout=10))


def test_a_worker_whose_supervisor_is_gone_drains_and_exits(tmp_path: Path) -> None:
    """A SIGKILLed supervisor forwards no SIGTERM and restarts nothing, and a new one
    would share the gRPC port (SO_REUSEPORT) with the old workers: each worker read the
    broken heartbeat pipe as that, logged it, and went on serving for good. Now it
    drains and exits 0, as on SIGTERM."""
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(base_config_dict()))
    ready = tmp_path / "ready"
    r, w = heartbeat.open_pipe()
    root = str(Path(sidecar.__file__).resolve().parents[1])
    try:
        with open(tmp_path / "log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "sidecar.cli", "serve", "--config", str(path),
                 "--grpc", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--ready-file",
                 str(ready), "--heartbeat-fd", str(w), "--heartbeat-every", "0.05"],
                cwd=tmp_path, env={**os.environ, "PYTHONPATH": root}, pass_fds=(w,),
                stderr=log)
    finally:
        os.close(w)
    try:
        wait_for(lambda: ready.exists() or proc.poll() is not None, "the worker to serve",
                 timeout_s=60)
        assert proc.poll() is None
        wait_for(lambda: heartbeat.read_beats(r) or None, "a beat")
        os.close(r)  # the supervisor's end: gone with it
        r = -1
        assert proc.wait(timeout=60) == 0
        assert "(the supervisor is gone); shutting down" in (tmp_path / "log").read_text()
    finally:
        heartbeat.close(r if r >= 0 else None)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
