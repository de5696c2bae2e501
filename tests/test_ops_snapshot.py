"""Warm restart: the snapshot round-trips statistics and health states; a missing,
stale or corrupt snapshot means a logged cold start, never a crash."""

from __future__ import annotations

import asyncio
import collections
import copy
import itertools
import json
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core.config import Config, parse_config
from sidecar.core.health import HealthState
from sidecar.core.health_board import CLUSTER_SLICE
from sidecar.core.router import Router
from sidecar.core.types import Observation, SliceKey
from sidecar.devtools.harness import Stack
from sidecar.ops import snapshot
from sidecar.ops.state import state_json
from tests.conftest import base_config_dict
from tests.loop_turns import while_ticking
from tests.ops_stack import PROVIDERS, admin_get, drive, e2e_samples, start_stack, wait_for

SL = SliceKey("m", "interactive", "short", True)
T0, WALL = 1000.0, 1_700_000_000.0


def _config(**stats: Any) -> Config:
    return parse_config(base_config_dict(stats={"subwindow_s": 10, "subwindows": 6,
                                                "min_samples": 5, **stats}), "t.yaml")


def _busy_router(cfg: Config) -> tuple[Router, float]:
    """a: slow (over the 1 s TTFT budget), b: failing in the last window (so its
    cooldown is still running), c: fast; four evaluated windows."""
    r = Router(cfg)
    now = T0
    for w in range(4):
        for i in range(10):
            now = T0 + w * 10 + i * 0.5
            r.observe(Observation("a", SL, "ok", ttft_s=1.5 + i / 100, e2e_s=2.0), now)
            if w == 3:
                r.observe(Observation("b", SL, "error", status=500), now)
            else:
                r.observe(Observation("b", SL, "ok", ttft_s=0.3, e2e_s=0.6), now)
            r.observe(Observation("c", SL, "ok", ttft_s=0.2 + i / 100, e2e_s=0.5), now)
        now = T0 + (w + 1) * 10 + 0.01
        r.tick(now)
    return r, now + 3.0


def _view(router: Router, now: float) -> dict[tuple[str, str], Any]:
    """/state rows with times made relative to ``now`` (loop clocks differ per process)."""
    out = {}
    for row in state_json(router, now)["routes"]:
        row = dict(row)
        row["since"] = None if row["since"] is None else round(now - row["since"], 6)
        if row["last_transition"]:
            row["last_transition"] = {**row["last_transition"],
                                      "at": round(now - row["last_transition"]["at"], 6)}
        out[(row["cluster"], row["slice"])] = row
    return out


def test_round_trip_restores_statistics_and_states(tmp_path: Path) -> None:
    cfg = _config()
    old, now = _busy_router(cfg)
    states = {c: old.health(c, SL).state for c in "abc"}  # b's cluster-wide circuit opened
    assert states["b"] == HealthState.QUARANTINED and states["a"] != HealthState.HEALTHY
    path = tmp_path / "snap.json"
    snapshot.save(old, path, now, wall=WALL)

    new = Router(cfg)
    new_now = 5.0  # another process: another monotonic base
    assert snapshot.load(new, path, new_now, wall=WALL)
    assert _view(new, new_now) == _view(old, now)
    assert {c: new.health(c, SL).state for c in "abc"} == states
    cooldown_left = (old.board.next_deadline() or 0) - now
    assert new.board.next_deadline() == pytest.approx(new_now + cooldown_left)
    a_slow = new.latency("a", SL, "ttft", 95, new_now)
    assert a_slow.value == old.latency("a", SL, "ttft", 95, now).value


def test_time_on_disk_counts_towards_ages(tmp_path: Path) -> None:
    cfg = _config()
    old, now = _busy_router(cfg)
    path = tmp_path / "snap.json"
    snapshot.save(old, path, now, wall=WALL)
    new = Router(cfg)
    assert snapshot.load(new, path, 0.0, wall=WALL + 7.0)
    b_old, b_new = old.board.get("b", CLUSTER_SLICE), new.board.get("b", CLUSTER_SLICE)
    assert b_old.cooldown_until is not None and b_new.cooldown_until is not None
    assert b_new.cooldown_until - 0.0 == pytest.approx(b_old.cooldown_until - now - 7.0)
    c_old, c_new = old.stats.series("c", SL), new.stats.series("c", SL)
    assert c_old is not None and c_new is not None
    assert c_old.last_seen is not None and c_new.last_seen is not None
    assert c_new.last_seen == pytest.approx(c_old.last_seen - now - 7.0)


def test_removed_clusters_are_dropped(tmp_path: Path) -> None:
    old, now = _busy_router(_config())
    path = tmp_path / "snap.json"
    snapshot.save(old, path, now, wall=WALL)
    data = base_config_dict(stats={"subwindow_s": 10, "subwindows": 6, "min_samples": 5})
    data["clusters"] = [c for c in data["clusters"] if c["name"] != "b"]
    data["models"][0]["candidates"] = ["a", "c"]
    new = Router(parse_config(data, "t.yaml"))
    assert snapshot.load(new, path, 0.0, wall=WALL)
    assert {c for (c, _), _ in new.stats.items()} == {"a", "c"}
    assert all(c != "b" for (c, _), _ in new.board.items())


@pytest.mark.parametrize(("max_concurrency", "restored"), [
    (None, 3),  # the learned limit, not the configured 64
    (2, 2),  # the configured maximum dropped below it since: clamped (and untracked)
])
def test_learned_concurrency_limits_survive_a_restart_with_their_age(
    tmp_path: Path, max_concurrency: int | None, restored: int,
) -> None:
    """A provider's quota learned from its 429s is not forgotten by a restart (which
    would send the whole configured concurrency into the refusals again), and its
    quiet spell keeps running from the last refusal, time on disk included."""
    old, now = _busy_router(_config())
    for _ in range(5):
        old.started("a")  # five in flight when the provider answers 429
    old.observe(Observation("a", SL, "error", status=429), now - 12.0)
    assert old.pushback.limit("a") == 5
    old.pushback.refused("a", 3, now - 12.0)  # a later refusal with three held
    path = tmp_path / "snap.json"
    snapshot.save(old, path, now, wall=WALL)
    assert json.loads(path.read_text())["pushback"] == [
        {"cluster": "a", "limit": 3.0, "age": pytest.approx(12.0)}]

    data = base_config_dict(stats={"subwindow_s": 10, "subwindows": 6, "min_samples": 5})
    data["clusters"][0]["max_concurrency"] = max_concurrency or 64
    new = Router(parse_config(data, "t.yaml"))
    assert snapshot.load(new, path, 5.0, wall=WALL + 7.0)
    assert new.pushback.limit("a") == restored and new.pushback.limit("b") == 64
    if max_concurrency is None:  # (at or above the maximum a cluster is not tracked)
        _, refused_at = new.pushback.learned()["a"]
        assert refused_at == pytest.approx(5.0 - 12.0 - 7.0)
    assert state_json(new, 5.0)["clusters"]["a"]["concurrency_limit"] == restored


def _missed(router: Router, cluster: str, at: float) -> None:
    """Three timed streams sent 1.5 s before ``at`` and no first token by then (the TTFT
    budget is 1 s): the route misses its budget at ``at``, which may begin an episode."""
    for _ in range(3):
        router.live.sent(cluster, SL, at - 1.5, timed=True)
    assert router.live.missing(cluster, SL, at)


def test_live_miss_episodes_survive_a_restart_with_their_age(tmp_path: Path) -> None:
    """The repeat-offender memory (two episodes of missing the budget within
    health.forgive_after_s halve a route's share) was not in the snapshot: a restart gave
    the route its full share back. Restored, each episode is forgiven when it would
    have been had the process stayed up, time on disk included."""
    old, now = _busy_router(_config())
    _missed(old, "a", now - 200.0)
    _missed(old, "a", now - 100.0)  # a second episode (apart by more than the gap)
    assert old.live.recurrence(("a", "b"), SL, now) == {"a": 0.5}
    path = tmp_path / "snap.json"
    snapshot.save(old, path, now, wall=WALL)
    new = Router(_config())
    assert snapshot.load(new, path, 5.0, wall=WALL + 7.0)
    assert new.live.recurrence(("a", "b"), SL, 5.0) == {"a": 0.5}
    forgiven = 5.0 + new.config.health.forgive_after_s - 207.0  # the first, 207 s old
    assert new.live.recurrence(("a",), SL, forgiven - 1.0) == {"a": 0.5}
    assert new.live.recurrence(("a",), SL, forgiven + 1.0) == {}
    # A snapshot from before this field restores none, as before.
    data = json.loads(path.read_text())
    del data["live"]
    older = Router(_config())
    snapshot.restore(older, data, 5.0, wall=WALL + 7.0)
    assert older.live.recurrence(("a",), SL, 5.0) == {}


def _many_series(routes: int, start: float = T0) -> tuple[Router, float]:
    """A router with ``routes`` narrow routes (models m0.. on a and b), each observed
    from ``start`` on; and a time after."""
    names = [f"m{i}" for i in range(routes // 2)]
    data = base_config_dict(models=[{"name": m, "candidates": ["a", "b"]} for m in names],
                            stats={"subwindow_s": 10, "subwindows": 6, "min_samples": 5})
    data["clusters"] = data["clusters"][:2]
    for c in data["clusters"]:
        c["models"] = names
    router = Router(parse_config(data, "t.yaml"))
    for i, m in enumerate(names):
        for cluster in ("a", "b"):
            for k in range(3):
                router.observe(Observation(cluster, SliceKey(m, "interactive", "short", True),
                                           "ok", ttft_s=0.2 + 0.01 * (i + k), e2e_s=0.5),
                               start + 10.0 * k)
    return router, start + 25.0


def test_the_snapshot_in_steps_is_the_snapshot_at_once_byte_for_byte() -> None:
    router, now = _busy_router(_config())
    _missed(router, "a", now - 1.0)
    router.pushback.adopt("c", 3.0, now - 2.0)
    for r, t in ((router, now), _many_series(40)):
        at_once = json.dumps(snapshot.build(r, t, WALL), separators=(",", ":"))
        assert "".join(snapshot.run_steps(snapshot.encode_steps(r, t, WALL))) == at_once
        assert json.loads(at_once)["stats"]["series"]  # (something to encode)


def test_a_snapshot_lets_the_event_loop_run_between_series(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Built at once and encoded by json.dumps in a thread (which keeps the GIL for the
    whole document), the periodic snapshot stopped the event loop for 8-12 s at 4,800
    routes: every ext_proc message then went unanswered past Envoy's 500 ms and failed
    open. Now the loop serves what is ready between every few series."""
    from sidecar.core import stats as stats_module
    from sidecar.serve import Snapshotter
    from sidecar.shell.app import App

    trace: list[str] = []
    real = stats_module.series_to_dict

    def noted(rs: Any, at: float) -> dict[str, Any]:
        trace.append("series")
        return real(rs, at)

    monkeypatch.setattr(stats_module, "series_to_dict", noted)
    path = tmp_path / "snap.json"

    async def save() -> Router:
        # The serve loop's clock: a route not observed for stats.stale_after_s is not saved.
        router, _ = _many_series(64, asyncio.get_running_loop().time() - 25.0)
        app = App.create(router.config)
        app.router = router
        await Snapshotter(app, str(path), collections.Counter()).save()
        return router

    router = while_ticking(trace, save())
    series = [i for i, x in enumerate(trace) if x == "series"]
    assert len(series) == len(router.stats)  # every route, narrow and blended, is saved
    turns = sum("tick" in trace[a:b] for a, b in itertools.pairwise(series))
    assert turns > 0  # (built at once: none)
    assert turns == (len(series) - 1) // snapshot.SERIES_PER_STEP  # one after every step
    assert snapshot.load(Router(router.config), path, 0.0)  # and the file is whole


def _valid(tmp_path: Path) -> dict[str, Any]:
    old, now = _busy_router(_config())
    path = tmp_path / "valid.json"
    snapshot.save(old, path, now, wall=WALL)
    data: dict[str, Any] = json.loads(path.read_text())
    return data


CORRUPT: dict[str, Callable[[dict[str, Any]], bytes]] = {
    "empty": lambda d: b"",
    "not json": lambda d: b"{not json",
    "binary": lambda d: b"\x00\xff\xfe garbage",
    "truncated": lambda d: json.dumps(d).encode()[:200],
    "not an object": lambda d: b"[1, 2, 3]",
    "foreign format": lambda d: json.dumps({**d, "format": "other"}).encode(),
    "newer version": lambda d: json.dumps({**d, "version": 99}).encode(),
    "no timestamp": lambda d: json.dumps({k: v for k, v in d.items()
                                          if k != "written_at"}).encode(),
    "stale": lambda d: json.dumps({**d, "written_at": WALL - 10_000}).encode(),
    "future": lambda d: json.dumps({**d, "written_at": WALL + 3600}).encode(),
    "bad series": lambda d: json.dumps({**d, "stats": {**d["stats"], "series": [
        {"cluster": "a", "slice": "m|x"}]}}).encode(),
    "bad health": lambda d: json.dumps({**d, "health": {"routes": [
        {"cluster": "a", "slice": "m|interactive|short|stream", "health": {"state": "?"}}]}}
    ).encode(),
    "other sub-window": lambda d: json.dumps({**d, "stats": {**d["stats"],
                                                             "subwindow_s": 3.0}}).encode(),
    "bad transitions": lambda d: json.dumps({**d, "transitions": [{"age": "x"}]}).encode(),
    "transitions not a list": lambda d: json.dumps({**d, "transitions": {"a": 1}}).encode(),
    # A non-finite transition age was restored and /state served a bare NaN (not JSON).
    "NaN transition age": lambda d: _transition(d, math.nan),
    "'nan' transition age": lambda d: _transition(d, "nan"),
    "infinite transition age": lambda d: _transition(d, math.inf),
    "transition from the future": lambda d: _transition(d, -5),
    "transition age as text": lambda d: _transition(d, "3"),
    "NaN written_at": lambda d: json.dumps({**d, "written_at": math.nan}).encode(),
    "written_at as text": lambda d: json.dumps({**d, "written_at": "yesterday"}).encode(),
    "written_at of 400 digits": lambda d: json.dumps({**d, "written_at": 10**400}).encode(),
    # Values of the right type that no running sidecar writes (a NaN cooldown crashed
    # every tick after a "warm start", and the shutdown snapshot wrote it back).
    "NaN cooldown": lambda d: _route_field(d, "cooldown_until", math.nan),
    "infinite since": lambda d: _route_field(d, "since", math.inf),
    # A null time the health machine reads: restored as a warm start, every tick died on
    # it (exit 1), and the shutdown snapshot wrote it back: a restart loop.
    "null last_evidence": lambda d: _route_field(d, "last_evidence", None),
    "null since": lambda d: _route_field(d, "since", None),
    "null healthy_since": lambda d: _route_field(d, "healthy_since", None),
    "negative offences": lambda d: _route_field(d, "offences", -2),
    "fail_rate above 1": lambda d: _route_field(d, "fail_rate", 3.0),
    "NaN history": lambda d: _route_field(d, "history", {"windows": 1, "watch": math.nan,
                                                         "recover": 0.0}),
    # Integers beyond a float, or an accuracy that divides by zero, raised arithmetic
    # errors deep in restore, logged as "unexpected" as if the sidecar had a bug.
    "restore_base of 400 digits": lambda d: _route_field(d, "restore_base", 10**400),
    "last_seen_age of 400 digits": lambda d: _series_field(d, "last_seen_age", 10**400),
    "accuracy 1e-300": lambda d: _hist_field(d, "relative_accuracy", 1e-300),
    "negative count": lambda d: _subwindow_field(d, "ok", -3),
    "huge count": lambda d: _subwindow_field(d, "ok", 10**30),
    "sub-window from the future": lambda d: _subwindow_field(d, "age", -1),
    # Learned concurrency limits (sidecar.core.pushback) are checked as strictly.
    "pushback not a list": lambda d: json.dumps({**d, "pushback": {"a": 3}}).encode(),
    "pushback entry not an object": lambda d: json.dumps({**d, "pushback": [3]}).encode(),
    "pushback without age": lambda d: _pushback(d, {"cluster": "a", "limit": 3}),
    "NaN pushback limit": lambda d: _pushback(d, {"cluster": "a", "limit": math.nan, "age": 1}),
    "pushback limit 0": lambda d: _pushback(d, {"cluster": "a", "limit": 0, "age": 1}),
    "pushback from the future": lambda d: _pushback(d, {"cluster": "a", "limit": 3, "age": -5}),
    "pushback limit as text": lambda d: _pushback(d, {"cluster": "a", "limit": "3", "age": 1}),
    "pushback cluster as number": lambda d: _pushback(d, {"cluster": 1, "limit": 3, "age": 1}),
    # ... and so are the live-miss episodes.
    "live not a list": lambda d: json.dumps({**d, "live": {"a": 1}}).encode(),
    "NaN live episode": lambda d: _live(d, episodes=[math.nan]),
    "live episode from the future": lambda d: _live(d, episodes=[-3]),
    "live episodes as text": lambda d: _live(d, episodes="12"),
    "live without last_missing": lambda d: _live(d, last_missing=None),
    "live slice of two parts": lambda d: _live(d, slice="m|x"),
    "live slice as number": lambda d: _live(d, slice=7),
}


def _live(d: dict[str, Any], **edit: Any) -> bytes:
    entry = {"cluster": "a", "slice": "m|interactive|short|stream", "episodes": [30.0, 5.0],
             "last_missing": 5.0, **edit}
    return json.dumps({**d, "live": [entry]}).encode()


def _pushback(d: dict[str, Any], entry: dict[str, Any]) -> bytes:
    return json.dumps({**d, "pushback": [{"cluster": "b", "limit": 2, "age": 1}, entry]}).encode()


def _transition(d: dict[str, Any], age: Any) -> bytes:
    entry = {"age": age, "cluster": "a", "slice": "m|interactive|short|stream",
             "old": "healthy", "new": "quarantined", "reason": "x"}
    return json.dumps({**d, "transitions": [entry]}).encode()


def _route_field(d: dict[str, Any], field: str, value: Any) -> bytes:
    d = copy.deepcopy(d)
    route = d["health"]["routes"][0]["health"]
    route[field] = value
    return json.dumps(d).encode()  # NaN and Infinity as Python's json writes them


def _series_field(d: dict[str, Any], field: str, value: Any) -> bytes:
    d = copy.deepcopy(d)
    d["stats"]["series"][0]["stats"][field] = value
    return json.dumps(d).encode()


def _hist_field(d: dict[str, Any], field: str, value: Any) -> bytes:
    d = copy.deepcopy(d)
    d["stats"]["series"][0]["stats"]["subwindows"][0]["hists"]["ttft"][field] = value
    return json.dumps(d).encode()


def _subwindow_field(d: dict[str, Any], field: str, value: Any) -> bytes:
    d = copy.deepcopy(d)
    d["stats"]["series"][0]["stats"]["subwindows"][0][field] = value
    return json.dumps(d).encode()


@pytest.mark.parametrize("kind", sorted(CORRUPT))
def test_unusable_snapshot_means_cold_start_and_one_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    path = tmp_path / "snap.json"
    path.write_bytes(CORRUPT[kind](_valid(tmp_path)))
    router = Router(_config())
    with caplog.at_level(logging.INFO, logger="tailroute.snapshot"):
        assert not snapshot.load(router, path, 50.0, wall=WALL)
    assert len(router.stats) == 0 and not router.board.items() and not router.transitions
    assert not router.pushback.learned()
    lines = [r for r in caplog.records if r.name == "tailroute.snapshot"]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    msg = lines[0].getMessage()
    assert str(path) in msg and "ignored" in msg and "starting cold" in msg
    assert "unexpected" not in msg  # what a corrupt file says, not a sidecar bug


def _leaves(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _leaves(v, (*path, k))]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _leaves(v, (*path, i))]
    return [path]


_BUSY, _BUSY_NOW = _busy_router(_config())
for _at in (_BUSY_NOW - 30.0, _BUSY_NOW - 5.0):  # live-miss episodes, to be fuzzed too
    _missed(_BUSY, "c", _at)
_BUSY_DATA = snapshot.build(_BUSY, _BUSY_NOW, WALL)
_ODD = [None, 0, -1, 0.5, 1e20, -1e20, 10**40, True, "x", "healthy", [], {}]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_leaves(_BUSY_DATA)), st.sampled_from(_ODD)),
                min_size=1, max_size=3))
def test_a_snapshot_the_loader_takes_leaves_a_router_that_runs(
        edits: list[tuple[tuple[Any, ...], Any]]) -> None:
    """Whatever one value of a real snapshot becomes, the loader refuses the file or the
    router it restored ticks, serves /state as JSON and snapshots again: a restored
    value that crashed a tick restarted the sidecar onto the same file."""
    data = copy.deepcopy(_BUSY_DATA)
    for path, value in edits:
        node = data
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
    router = Router(_config())
    try:
        snapshot.restore(router, json.loads(json.dumps(data)), _BUSY_NOW + 1, wall=WALL + 1)
    except Exception:  # load() turns any of these into a cold start
        return
    for i in range(4):
        router.tick(_BUSY_NOW + 2 + 10 * i)
    json.dumps(state_json(router, _BUSY_NOW + 50), allow_nan=False)
    json.dumps(snapshot.build(router, _BUSY_NOW + 51, WALL + 60), allow_nan=False)


def test_missing_snapshot_is_a_quiet_cold_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    router = Router(_config())
    with caplog.at_level(logging.INFO, logger="tailroute.snapshot"):
        assert not snapshot.load(router, tmp_path / "none.json", 0.0)
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert "no snapshot" in caplog.records[0].getMessage()


def test_a_snapshot_path_that_is_no_regular_file_is_a_cold_start_not_a_hang(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A FIFO at the snapshot path: `tailroute serve` blocked reading it before its first
    log line and never became ready (SIGTERM was all that ended it)."""
    fifo = tmp_path / "snap.json"
    os.mkfifo(fifo)
    done: list[bool] = []
    with caplog.at_level(logging.INFO, logger="tailroute.snapshot"):
        reader = threading.Thread(target=lambda: done.append(
            snapshot.load(Router(_config()), fifo, 0.0)), daemon=True)
        reader.start()
        reader.join(10)
        if reader.is_alive():  # the old loader: give it an end of file, then fail
            with open(fifo, "wb"):
                pass
            reader.join(10)
            pytest.fail("loading a FIFO snapshot blocked")
    assert done == [False]
    assert [r.getMessage() for r in caplog.records] == [
        f"snapshot {fifo} ignored (not a regular file); starting cold"]


def test_write_is_atomic_and_leaves_no_temp_files(tmp_path: Path) -> None:
    old, now = _busy_router(_config())
    path = tmp_path / "sub" / "snap.json"
    snapshot.save(old, path, now)
    snapshot.save(old, path, now + 1)
    assert [p.name for p in path.parent.iterdir()] == ["snap.json"]
    assert json.loads(path.read_text())["version"] == snapshot.VERSION


_DIES_AT_RENAME = """
import os, signal, sys
os.replace = lambda src, dst: os.kill(os.getpid(), signal.SIGKILL)
from sidecar.cli import main
sys.argv[0] = "tailroute"
main()
"""


def test_a_writer_killed_before_its_rename_leaves_a_temp_file_the_next_start_removes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A real `tailroute serve` SIGKILLed between writing its snapshot's temp file and
    renaming it, twice: each left `.snap.json.<pid>.tmp`, which no later start removed
    (a crash loop filled the directory). The next load removes the dead writers'
    files and keeps a live writer's (this process's) and any it cannot read a pid from."""
    cfg = tmp_path / "t.yaml"
    cfg.write_text(json.dumps(base_config_dict()))
    path = tmp_path / "snap.json"
    busy, now = _busy_router(_config())
    snapshot.save(busy, path, now, wall=time.time())
    for _ in range(2):
        proc = subprocess.Popen(
            [sys.executable, "-c", _DIES_AT_RENAME, "serve", "--config", str(cfg),
             "--grpc", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--snapshot", str(path),
             "--snapshot-every", "0.1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        try:
            assert proc.wait(timeout=60) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        # Each start removes what the one before it left: the last crash's file only.
        left = [p.name for p in tmp_path.glob(".snap.json.*.tmp")]
        assert len(left) == 1 and left[0].startswith(f".snap.json.{proc.pid}."), left
    mine = tmp_path / f".snap.json.{os.getpid()}.7.tmp"
    other = tmp_path / ".snap.json.x.tmp"
    older_build = tmp_path / f".snap.json.{proc.pid}.tmp"  # no write number yet: still swept
    for p in (mine, other, older_build):
        p.write_text("{}")
    with caplog.at_level(logging.INFO, logger="tailroute.snapshot"):
        assert snapshot.load(Router(_config()), path, now)  # the snapshot is still good
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["snap.json", "t.yaml", mine.name, other.name])
    assert any("removed 2 temp file(s)" in r.getMessage() for r in caplog.records)


def test_two_overlapping_writes_of_one_process_each_land_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The serve loop's shutdown snapshot starts while a periodic one may still be in its
    writer thread. Both wrote one temp file per process: the second opened (truncated) it
    under the first, and one rename then failed (FileNotFoundError, counted as a failed
    snapshot write) or the file kept one write's bytes and the tail of the longer other."""
    path = tmp_path / "snap.json"
    both_written = threading.Barrier(2, timeout=30)  # the timeout only guards a hang
    real_fsync = os.fsync

    def fsync(fd: int) -> None:  # each writer waits here until the other has written
        both_written.wait()
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    texts = [json.dumps({"writer": "periodic", "pad": "x" * 50_000}), json.dumps({"writer": "x"})]
    failed: list[BaseException] = []

    def write(text: str) -> None:
        try:
            snapshot.write_text_atomic(path, text)
        except BaseException as exc:  # the assertion below shows it
            failed.append(exc)

    threads = [threading.Thread(target=write, args=(t,)) for t in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert failed == []
    assert path.read_text() in texts
    assert [p.name for p in tmp_path.iterdir()] == ["snap.json"]


# ------------------------------------------------------------------ process level


def _terminate_sidecar(stack: Stack, during_drain: Callable[[], None] | None = None) -> None:
    """SIGTERM and wait for a clean exit: the drain may take its full grace period
    (Envoy holds observing streams open a while), longer than Stack's stop timeout.
    ``during_drain`` runs once the sidecar has said it is draining."""
    proc = stack.procs["sidecar"]
    proc.send_signal(signal.SIGTERM)
    if during_drain is not None:
        wait_for(lambda: "shutting down" in stack.log("sidecar"), "the drain to begin")
        during_drain()
    assert proc.wait(timeout=30) == 0
    stack.stop_sidecar()  # forget the exited process


@pytest.mark.envoy
def test_restarted_sidecar_starts_warm_then_cold_on_corrupt_snapshot(tmp_path: Path) -> None:
    snap = tmp_path / "tailroute.snapshot.json"
    with Stack() as stack:
        path = start_stack(stack, extra_args=["--snapshot", str(snap)])
        n = 24
        drive(stack, n)
        before = wait_for(lambda: (s := e2e_samples(stack.sidecar_state())) and
                          sum(s.values()) == n and s, f"{n} observations")
        _terminate_sidecar(stack)
        assert "shutting down" in stack.log("sidecar")
        assert json.loads(snap.read_text())["format"] == snapshot.FORMAT

        stack.start_sidecar(path, extra=["--snapshot", str(snap)])
        assert "warm start from snapshot" in stack.log("sidecar")
        after = stack.sidecar_state()
        assert e2e_samples(after) == before
        assert {r["state"] for r in after["routes"]} == {"healthy"}

        _terminate_sidecar(stack)
        snap.write_bytes(b"\x00 this is not a snapshot")
        stack.start_sidecar(path, extra=["--snapshot", str(snap)])
        log = stack.log("sidecar")
        assert f"snapshot {snap} ignored" in log and "starting cold" in log
        assert admin_get(stack, "/readyz") == "ready\n"
        assert stack.sidecar_state()["routes"] == []
        metrics = admin_get(stack, "/metrics")
        assert 'tailroute_errors_total{kind="snapshot_load"} 1.0' in metrics


@pytest.mark.envoy
def test_shutdown_drains_in_flight_request_into_the_final_snapshot(tmp_path: Path) -> None:
    """The request is routed before SIGTERM and its response starts only during the
    drain (the providers hold it until then), so the observing stream that times its
    first token opens while the sidecar drains: it must be served, not refused (a
    refused one left the request waiting for its first-token time until the drain
    ended, and the final snapshot without it)."""
    snap = tmp_path / "tailroute.snapshot.json"
    with Stack() as stack:
        start_stack(stack, extra_args=["--snapshot", str(snap)])
        for name in PROVIDERS:  # held at arrival, then ~1 s of tokens
            stack.control(name, {"tpot_ms": 120, "hold": True})
        served: list[list[str]] = []
        client = threading.Thread(target=lambda: served.append(drive(stack, 1)))
        client.start()

        def release() -> None:
            for name in PROVIDERS:
                stack.control(name, {"hold": False})
        try:
            wait_for(lambda: any(c["inflight"] for c in stack.sidecar_state()["clusters"].values()),
                     "the request to be in flight")
            _terminate_sidecar(stack, during_drain=release)
        finally:
            release()
            client.join(timeout=30)
        assert served and served[0][0] in PROVIDERS
        assert "1 requests in flight" in stack.log("sidecar")
        assert stack.config is not None
        router = Router(stack.config)
        assert snapshot.load(router, snap, 0.0)
        assert sum(e2e_samples(state_json(router, 0.0)).values()) == 1
