"""Hot reload: a valid file takes effect, an invalid one keeps the last good config
and says so in the log and in the metrics."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.core.config import Config, parse_config
from sidecar.core.health import HealthState
from sidecar.core.router import Router
from sidecar.core.types import Observation, SliceKey
from sidecar.devtools.harness import Stack
from sidecar.ops.reload import ConfigReloader
from sidecar.shell.app import App
from tests.conftest import base_config_dict
from tests.ops_stack import PROVIDERS, admin_get, drive, start_stack, wait_for


def _write(path: Path, data: dict[str, Any]) -> None:
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def _reloader(tmp_path: Path) -> tuple[ConfigReloader, App, Path, dict[str, Any]]:
    path = tmp_path / "tailroute.yaml"
    data = base_config_dict()
    _write(path, data)
    app = App.create(parse_config(data, str(path)))
    return ConfigReloader(app, path), app, path, data


def test_valid_reload_swaps_config_and_keeps_router(tmp_path: Path) -> None:
    rl, app, path, data = _reloader(tmp_path)
    router = app.router
    data["clusters"][1]["max_concurrency"] = 7
    _write(path, data)
    assert rl.reload("test")
    assert app.config.cluster("b").max_concurrency == 7
    assert app.router is router and router.config is app.config
    assert rl.counters() == {"reload:ok": 1, "reload:invalid": 0, "reload:last_ok": 1,
                             "reload:stats_reset": 0}
    assert rl.view() == {"path": str(path), "reloads_ok": 1, "reloads_invalid": 0,
                         "last_reload_ok": True, "last_error": None, "stats_resets": 0}


_SLICE = SliceKey("m", "interactive", "short", True)
_UPTIME = 3 * 86400.0  # the loop clock is monotonic: about the host's uptime


def _windows(router: Router, start: float, step: float, n: int, ttft_a: float) -> float:
    """``n`` sub-windows of ``step`` s from ``start``, ten requests on each cluster per
    window, a's at ``ttft_a`` s (the TTFT budget is 1 s); returns the time after."""
    now = start
    for w in range(n):
        for i in range(10):
            now = start + w * step + i * step / 10
            for cluster, ttft in (("a", ttft_a), ("b", 0.3), ("c", 0.2)):
                router.observe(Observation(cluster, _SLICE, "ok", ttft_s=ttft, e2e_s=ttft + 0.3),
                               now)
        now = start + (w + 1) * step + 0.01
        router.tick(now)
    return now


@pytest.mark.parametrize(("old_s", "new_s"), [(10, 20), (10, 30), (20, 10), (10, 15)])
def test_a_route_is_still_judged_after_a_reload_changes_the_sub_window_length(
    old_s: int, new_s: int
) -> None:
    def config(subwindow_s: int) -> Config:
        return parse_config(base_config_dict(stats={"subwindow_s": subwindow_s,
                                                    "min_samples": 5}), "t.yaml")

    router = Router(config(old_s))
    now = _windows(router, _UPTIME, old_s, 4, ttft_a=1.5)
    assert router.board.get("a", _SLICE).state is HealthState.DEGRADED
    router.reload(config(new_s))
    # Fast again: judged on the new windows, a recovers as it would without the reload
    # (sub-windows are numbered floor(t / subwindow_s): a longer one made every new
    # window look older than the one judged last, so each verdict was dropped).
    _windows(router, now, new_s, 8, ttft_a=0.2)
    assert router.board.get("a", _SLICE).state is HealthState.HEALTHY
    assert [(e.old, e.new) for e in router.transitions if e.cluster == "a"][-2:] == [
        ("degraded", "restoring"), ("restoring", "healthy")]


def test_invalid_reload_keeps_last_good_config(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rl, app, path, data = _reloader(tmp_path)
    good = app.config
    data["clusters"][1]["max_concurrency"] = 0
    _write(path, data)
    with caplog.at_level(logging.ERROR, logger="tailroute.reload"):
        assert not rl.reload("test")
    assert app.config is good and app.router.config is good
    assert rl.counters() == {"reload:ok": 0, "reload:invalid": 1, "reload:last_ok": 0,
                             "reload:stats_reset": 0}
    msg = caplog.records[0].getMessage()
    assert f"{path}: clusters[1].max_concurrency: must be >= 1, got 0" in msg
    assert "keeping the last good config" in msg
    # /state shows it too, until a later reload succeeds.
    assert rl.view() == {"path": str(path), "reloads_ok": 0, "reloads_invalid": 1,
                         "last_reload_ok": False,
                         "last_error": f"{path}: clusters[1].max_concurrency: must be >= 1, "
                                       "got 0 (line 11)", "stats_resets": 0}
    data["clusters"][1]["max_concurrency"] = 5
    _write(path, data)
    assert rl.reload("test") and rl.view()["last_error"] is None


@pytest.mark.parametrize(
    "content",
    [
        b"# caf\xe9 (latin-1, not UTF-8)\nclusters: []\n",  # not UTF-8
        b"clusters: [",  # not YAML
        b"\x00\x01\x02",  # binary
        b"models:\n- name: m\n  candidates: [[a, b]]\n",  # a list where names go
    ],
)
def test_a_reload_of_any_bad_file_is_one_logged_line_and_the_watcher_lives_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes
) -> None:
    rl, app, path, data = _reloader(tmp_path)
    good = app.config
    path.write_bytes(content)
    with caplog.at_level(logging.ERROR, logger="tailroute.reload"):
        assert rl.reload("test") is False  # never raises
    assert app.config is good
    assert rl.counters() == {"reload:ok": 0, "reload:invalid": 1, "reload:last_ok": 0,
                             "reload:stats_reset": 0}
    (record,) = caplog.records
    assert "\n" not in record.getMessage() and str(path) in record.getMessage()
    error = rl.view()["last_error"]
    assert isinstance(error, str) and error in record.getMessage() and str(path) in error
    data["clusters"][0]["max_concurrency"] = 11  # the next good file still applies
    _write(path, data)
    rl.poll()
    assert rl.poll() is True and app.config.cluster("a").max_concurrency == 11


def _add_class(d: dict[str, Any]) -> None:
    d["classes"] = {**d.get("classes", {}), "chat": {
        "slo": {"metric": "ttft", "percentile": 95, "budget_ms": 900, "timeout_ms": 20000}}}


def _add_cluster(d: dict[str, Any]) -> None:
    d["clusters"].append({"name": "d", "address": "127.0.0.1:9004", "models": ["m"]})
    d["models"][0]["candidates"].append("d")


def _drop_cluster(d: dict[str, Any]) -> None:
    d["clusters"] = [c for c in d["clusters"] if c["name"] != "c"]
    d["models"][0]["candidates"].remove("c")


def _longer_timeout(d: dict[str, Any]) -> None:
    d["classes"] = {"interactive": {
        "slo": {"metric": "ttft", "percentile": 95, "budget_ms": 800, "timeout_ms": 45000}}}


def _longer_stream_net(d: dict[str, Any]) -> None:
    d["classes"] = {"interactive": {"slo": {  # the default class, with its own net
        "metric": "ttft", "percentile": 95, "budget_ms": 1000, "timeout_ms": 30000,
        "max_stream_ms": 3_600_000}}}


def _default_b(d: dict[str, Any]) -> None:
    d["default_cluster"] = "b"


def _trust_a_header(d: dict[str, Any]) -> None:
    d["hints"] = {"class": {"header": "x-auth-class"}}


@pytest.mark.parametrize(
    ("edit", "says"),
    [(_add_class, "routes added"), (_add_cluster, "routes added"),
     (_drop_cluster, "routes removed"), (_longer_timeout, "routes changed"),
     (_longer_stream_net, "routes changed"), (_default_b, "routes changed"),
     # the running Envoy lets a caller's x-auth-class through: a forged class believed
     (_trust_a_header, "hints would trust x-auth-class, which the running Envoy")],
)
def test_a_reload_that_envoys_routes_cannot_follow_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, edit: Any, says: str
) -> None:
    """Envoy routes a decision by the route named after it in the bootstrap it started
    with: a new class or cluster would go down its default route while the sidecar
    counted it against its choice."""
    rl, app, path, data = _reloader(tmp_path)
    good = app.config
    edit(data)
    _write(path, data)
    with caplog.at_level(logging.ERROR, logger="tailroute.reload"):
        assert rl.reload("test") is False
    assert app.config is good
    assert rl.counters()["reload:invalid"] == 1
    msg = caplog.records[0].getMessage()
    assert says in msg and "tailroute envoy-config" in msg and str(path) in msg
    error = rl.view()["last_error"]
    assert isinstance(error, str) and says in error and error in msg


@pytest.mark.parametrize(("hints", "warned"), [
    ({"priority": "ignore"}, False),  # the sidecar alone drops it: Envoy renders the same
    ({"tenant": {"header": "x-t", "set_by": "front"}}, True),  # sent to it once re-rendered
])
def test_a_reload_that_believes_fewer_hints_applies(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, hints: dict[str, Any], warned: bool
) -> None:
    """Believing less, or a header a proxy in front guards, is safe with the old Envoy."""
    rl, app, path, data = _reloader(tmp_path)
    data["hints"] = hints
    _write(path, data)
    with caplog.at_level(logging.WARNING, logger="tailroute.reload"):
        assert rl.reload("test") is True
    assert app.config.hints.sources
    assert warned == any("headers hints: reads or removes" in r.getMessage()
                         for r in caplog.records)


def test_a_reload_that_moves_only_an_address_applies_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rl, app, path, data = _reloader(tmp_path)
    data["clusters"][1]["address"] = "127.0.0.1:9102"
    _write(path, data)
    with caplog.at_level(logging.WARNING, logger="tailroute.reload"):
        assert rl.reload("test") is True
    assert app.config.cluster("b").address == "127.0.0.1:9102"
    assert any("Envoy-side settings" in r.getMessage() and "circuit breaker): b)" in
               r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(("tail", "expect"), [
    (b"# caf\xe9\n", "is not UTF-8"),  # a Latin-1 editor's comment
    (b"clusters: [\n", "invalid YAML"),
])
def test_a_file_that_cannot_be_read_as_yaml_is_an_invalid_reload(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, tail: bytes, expect: str
) -> None:
    rl, app, path, _ = _reloader(tmp_path)
    good = app.config
    path.write_bytes(path.read_bytes() + tail)
    with caplog.at_level(logging.ERROR, logger="tailroute.reload"):
        assert rl.reload("test") is False  # counted, never raised into the watcher
    assert app.config is good
    assert rl.counters() == {"reload:ok": 0, "reload:invalid": 1, "reload:last_ok": 0,
                             "reload:stats_reset": 0}
    assert expect in caplog.records[0].getMessage()


def test_every_rejected_reload_is_logged_past_the_throttle(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The serving loggers' throttle lets five lines of one template through per ten
    seconds; an operator fixing a file step by step must see each rejection."""
    from sidecar.ops.log_throttle import LogThrottle

    rl, _app, path, data = _reloader(tmp_path)
    throttle = LogThrottle(burst=5, every_s=10.0, clock=lambda: 0.0)
    for i in range(8):
        data["clusters"][1]["max_concurrency"] = -i
        _write(path, data)
        with caplog.at_level(logging.ERROR, logger="tailroute.reload"):
            assert rl.reload("test") is False
    records = [r for r in caplog.records if "rejected" in r.getMessage()]
    assert len(records) == 8 and all(throttle.filter(r) for r in records)
    assert rl.counters()["reload:invalid"] == 8


@pytest.mark.parametrize(("limits", "warned"), [
    ({"max_json_depth": 8}, None),  # read per request: applies at once, nothing to warn
    ({"max_header_value_bytes": 64}, None),
    ({"max_body_bytes": 64 * 1024 * 1024}, "takes messages of at most"),
])
def test_limits_apply_at_once_but_for_the_grpc_receive_limit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, limits: dict[str, int],
    warned: str | None
) -> None:
    rl, app, path, data = _reloader(tmp_path)
    data["limits"] = limits
    _write(path, data)
    with caplog.at_level(logging.WARNING, logger="tailroute.reload"):
        assert rl.reload("test") is True
    for key, value in limits.items():
        assert getattr(app.config.limits, key) == value
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not any("take effect on restart" in m for m in messages), messages
    assert any(warned in m for m in messages) if warned else not messages, messages


def test_the_watch_loop_parses_the_file_off_the_event_loop(tmp_path: Path) -> None:
    """Parsing a large config took most of a second; on the loop, every decision
    waited for it. The watcher loads in a worker thread and applies on the loop."""
    rl, app, path, data = _reloader(tmp_path)
    threads: list[threading.Thread] = []
    load = rl.load

    def spy() -> Any:
        threads.append(threading.current_thread())
        return load()

    rl.load = spy  # type: ignore[method-assign]
    data["clusters"][0]["max_concurrency"] = 11
    _write(path, data)

    loop_thread = _reload_on_hup(rl)
    assert app.config.cluster("a").max_concurrency == 11
    assert len(threads) == 1 and threads[0] is not loop_thread


@pytest.mark.parametrize("mode", ["extproc", "hybrid", "native"])
def test_the_watch_loop_compares_the_bootstraps_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """Rendering the old and the new Envoy bootstrap took 0.6-0.7 s with 100 models in
    hybrid or native mode, on the loop: every decision asked meanwhile failed open."""
    from sidecar.ops import reload as reload_module

    path = tmp_path / "tailroute.yaml"
    data = base_config_dict(routing={"mode": mode})
    data["clusters"][2]["models"] = ["m"]  # (native routing cannot rename a model)
    _write(path, data)
    app = App.create(parse_config(data, str(path)))
    rl = ConfigReloader(app, path)
    threads: list[threading.Thread] = []
    compare = reload_module.envoy_drift

    def spy(old: Config, new: Config) -> tuple[list[str], list[str]]:
        threads.append(threading.current_thread())
        return compare(old, new)

    monkeypatch.setattr(reload_module, "envoy_drift", spy)
    data["clusters"][0]["max_concurrency"] = 11
    _write(path, data)

    loop_thread = _reload_on_hup(rl)
    assert app.config.cluster("a").max_concurrency == 11
    assert len(threads) == 1 and threads[0] is not loop_thread


def test_a_bootstrap_compared_with_a_config_since_replaced_is_compared_again(
    tmp_path: Path
) -> None:
    """What the worker thread compared with is the running config of that moment; if
    another reload applied meanwhile, the loop compares again, so a class the file
    drops relative to that newer config is still refused."""
    rl, app, path, data = _reloader(tmp_path)
    data["clusters"][0]["max_concurrency"] = 11
    _write(path, data)
    loaded = rl.load()  # compared with the config that had no class "chat"
    newer = dict(data, classes={"chat": {"slo": {"metric": "ttft", "percentile": 95,
                                                 "budget_ms": 900, "timeout_ms": 20000}}})
    app.reload(parse_config(newer, str(path)))  # (as if applied meanwhile)
    assert not rl.apply("test", loaded)
    assert "routes removed" in str(rl.last_error)


def test_poll_acts_once_the_file_has_settled(tmp_path: Path) -> None:
    rl, app, path, data = _reloader(tmp_path)
    assert rl.poll() is None  # unchanged
    data["clusters"][0]["max_concurrency"] = 9
    _write(path, data)
    assert rl.poll() is None  # changed since the last poll: maybe still being written
    assert rl.poll() is True  # same content twice: reload
    assert app.config.cluster("a").max_concurrency == 9
    assert rl.poll() is None  # applied content is not reloaded again
    path.write_text("clusters: [")
    rl.poll()
    assert rl.poll() is False and app.config.cluster("a").max_concurrency == 9
    assert rl.poll() is None  # a bad file is reported once, not every second


def test_check_config_exits_nonzero_naming_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    data = base_config_dict()
    data["stats"] = {"subwindows": 0}
    _write(path, data)
    out = subprocess.run([sys.executable, "-m", "sidecar.cli", "check-config", str(path)],
                         capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 2
    assert f"{path}: stats.subwindows: must be >= 1" in out.stderr
    _write(path, base_config_dict())
    out = subprocess.run([sys.executable, "-m", "sidecar.cli", "check-config", str(path)],
                         capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 0 and "OK" in out.stdout


def _metric(stack: Stack, line_start: str) -> float | None:
    for line in admin_get(stack, "/metrics").splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return None


def _max_conc(stack: Stack, cluster: str) -> int:
    return int(stack.sidecar_state()["clusters"][cluster]["max_concurrency"])


@pytest.mark.envoy
def test_sighup_and_file_change_reload_a_running_sidecar() -> None:
    with Stack() as stack:
        path = start_stack(stack)
        data = yaml.safe_load(path.read_text())
        invalid = 'tailroute_config_reloads_total{result="invalid"}'
        ok = 'tailroute_config_reloads_total{result="ok"}'

        data["clusters"][1]["max_concurrency"] = 0
        _write(path, data)
        os.kill(stack.procs["sidecar"].pid, signal.SIGHUP)
        wait_for(lambda: _metric(stack, invalid) == 1, "the invalid reload to be counted")
        assert _metric(stack, "tailroute_config_last_reload_ok") == 0
        log = stack.log("sidecar")
        assert f"{path}: clusters[1].max_concurrency: must be >= 1, got 0" in log
        assert "keeping the last good config" in log
        assert _max_conc(stack, "provider-b") == 32  # the old config still serves
        shown = stack.sidecar_state()["config"]
        assert (shown["last_reload_ok"], shown["reloads_invalid"]) == (False, 1)
        assert f"{path}: clusters[1].max_concurrency: must be >= 1" in shown["last_error"]
        assert set(drive(stack, 6)) <= set(PROVIDERS)  # and still routes

        data["clusters"][1]["max_concurrency"] = 7
        _write(path, data)  # no signal: the file watcher notices
        wait_for(lambda: _max_conc(stack, "provider-b") == 7, "the valid change to apply")
        assert _metric(stack, ok) == 1 and _metric(stack, invalid) == 1
        assert _metric(stack, "tailroute_config_last_reload_ok") == 1
        assert stack.sidecar_state()["config"]["last_error"] is None
        assert "config reloaded from" in stack.log("sidecar")
        assert set(drive(stack, 6)) <= set(PROVIDERS)


# `tailroute serve` with a hook in its start-up, after the config was read and before the
# serve loop handles SIGHUP: a SIGHUP comes, or the file is edited, right then.
_DURING_START = """
import os, signal, sys
import yaml
from sidecar.shell import app
create = app.App.create.__func__

def hooked(cls, *args, **kwargs):
    if {what!r} == "sighup":
        os.kill(os.getpid(), signal.SIGHUP)
    else:
        path = sys.argv[sys.argv.index("--config") + 1]
        data = yaml.safe_load(open(path))
        data["clusters"][1]["max_concurrency"] = 7
        open(path, "w").write(yaml.safe_dump(data))
    return create(cls, *args, **kwargs)

app.App.create = classmethod(hooked)
from sidecar.cli import main
sys.exit(main())
"""


@pytest.mark.parametrize(("what", "why"), [("sighup", "SIGHUP"), ("edit", "file changed")])
def test_a_sighup_or_an_edit_while_the_sidecar_starts_is_one_reload_once_serving(
    what: str, why: str
) -> None:
    """SIGHUP's default action ends a process: one before the serve loop took it over
    (seconds, with a slow fleet store) killed the starting sidecar without a log line.
    And the file watcher's first fingerprint was taken after the config was read, so an
    edit in between counted as already applied and was never loaded."""
    with Stack() as stack:
        data = base_config_dict()
        path = stack.write_config(data)
        stack.start_sidecar(path, launcher=[sys.executable, "-c", _DURING_START.format(
            what=what)])
        wait_for(lambda: stack.sidecar_state()["config"]["reloads_ok"] == 1 or None,
                 "the reload")
        assert f"config reloaded from {path} ({why})" in stack.log("sidecar")
        if what == "edit":
            assert _max_conc(stack, "b") == 7
        # Exactly once: the next checks of the file find nothing new.
        os.kill(stack.procs["sidecar"].pid, signal.SIGHUP)
        wait_for(lambda: stack.sidecar_state()["config"]["reloads_ok"] == 2 or None,
                 "the explicit reload")
        assert stack.log("sidecar").count("config reloaded from") == 2


def test_rapid_successive_reloads_grow_no_tasks_and_no_memory(tmp_path: Path) -> None:
    """Hundreds of SIGHUP-style reloads through the real watch loop, deciding between
    them, some changing the statistics layout (a fresh store): the loop's task count
    stays put and what stays allocated does not grow with the number of reloads."""
    import asyncio
    import gc
    import random
    import tracemalloc

    from sidecar.core.types import RequestInfo, SliceKey
    from sidecar.ops.reload import watch_loop

    rl, app, path, data = _reloader(tmp_path)
    req = RequestInfo(api="chat", model="m", stream=True, max_tokens=None, input_tokens=10,
                      klass="interactive", priority=10, tenant=None,
                      slice=SliceKey("m", "interactive", "short", True), request_id=None)
    rng = random.Random(1)

    async def run() -> tuple[list[int], list[int]]:
        stop, hup = asyncio.Event(), asyncio.Event()
        watcher = asyncio.create_task(watch_loop(rl, stop, hup, every_s=60.0))
        tasks, traced = [], []

        async def burst(n: int, t0: float) -> None:
            for i in range(n):  # bounded: n reloads, each awaited to completion
                data["clusters"][0]["max_concurrency"] = 5 + i % 7
                data["stats"] = {"subwindow_s": 1.0 + (i // 10 % 3) / 10}
                _write(path, data)
                want = rl.counts["ok"] + 1
                hup.set()
                for _ in range(10_000):  # the file is parsed in a worker thread: wait for it
                    if rl.counts["ok"] >= want:
                        break
                    await asyncio.sleep(0.001)
                assert rl.counts["ok"] == want
                app.router.decide(req, t0 + i * 0.01, rng)

        tracemalloc.start()
        try:
            await burst(50, 0.0)  # warm-up: caches, interned strings, the first plans
            for k in range(3):
                await burst(60, 10.0 * (k + 1))
                gc.collect()
                tasks.append(len(asyncio.all_tasks()))
                traced.append(tracemalloc.get_traced_memory()[0])
        finally:
            tracemalloc.stop()
            stop.set()
            await watcher
        return tasks, traced

    tasks, traced = asyncio.run(run())
    assert rl.counts["invalid"] == 0 and tasks == [tasks[0]] * 3
    # One config kept per reload (tried) comes to about 3 KiB each, some 360 KiB over
    # these 120 reloads; what is left is noise of a few KiB.
    assert traced[2] - traced[0] < 64 * 1024, traced


def _inflight(stack: Stack) -> dict[str, int]:
    return {c: v["inflight"] for c, v in stack.sidecar_state()["clusters"].items()}


@pytest.mark.envoy
def test_a_reload_under_requests_in_flight_lets_them_finish_and_accounts_them() -> None:
    """Twelve slow streams in flight; a reload drops one of their clusters from the
    model's candidates and lowers another's max_concurrency below its in-flight count.
    Every stream finishes, each outcome is accounted on the cluster it ran on, the
    in-flight counts return to 0, and the dropped cluster takes no new request."""
    import asyncio
    import threading

    from tests.ops_stack import _drive

    with Stack() as stack:
        path = start_stack(stack)
        for name in PROVIDERS:  # ~3 s a stream: long enough to reload under them
            stack.control(name, {"tpot_ms": "100:100"})
        data = yaml.safe_load(path.read_text())
        done: list[list[str]] = []

        def slow() -> None:
            done.append(asyncio.run(_drive(stack.base_url, 12, 12, max_tokens=30)))

        client = threading.Thread(target=slow)
        client.start()
        try:
            held = wait_for(lambda: (n := _inflight(stack)) and sum(n.values()) == 12 and n,
                            "all twelve streams to be in flight")
            busiest = max(held, key=lambda c: held[c])
            dropped = next(c for c in PROVIDERS if c != busiest and held[c] > 0)
            for c in data["clusters"]:
                if c["name"] == busiest:
                    c["max_concurrency"] = 1
            model = data["models"][0]
            model["candidates"] = [c for c in model["candidates"] if c != dropped]
            _write(path, data)
            os.kill(stack.procs["sidecar"].pid, signal.SIGHUP)
            wait_for(lambda: _max_conc(stack, busiest) == 1, "the reload to apply")
            assert _inflight(stack)[busiest] == held[busiest] >= 4  # nothing cut
        finally:
            client.join(timeout=60)
        assert not client.is_alive()
        (served,) = done
        assert sorted(served) == sorted(c for c, n in held.items() for _ in range(n))
        wait_for(lambda: sum(_inflight(stack).values()) == 0 or None, "in-flight counts to drain")
        # Outcomes come with Envoy's access-log entries, flushed a moment after.
        state = wait_for(lambda: (s := stack.sidecar_state())["counters"].get("outcome:ok") == 12
                         and not s["envoy"]["awaiting_entry"] and s, "the twelve outcomes")
        assert (state["envoy"]["pending"], state["envoy"]["lost"]) == (0, 0)
        assert state["config"]["reloads_ok"] == 1 and state["config"]["last_error"] is None
        assert dropped not in drive(stack, 12, 4)  # cached plans went with the old config
        assert "Traceback" not in stack.log("sidecar")


def _reload_on_hup(rl: ConfigReloader) -> threading.Thread:
    """One reload through the watch loop (a SIGHUP), waited for boundedly; returns the
    event loop's thread."""
    import asyncio

    from sidecar.ops.reload import watch_loop

    async def run() -> threading.Thread:
        stop, hup = asyncio.Event(), asyncio.Event()
        watcher = asyncio.create_task(watch_loop(rl, stop, hup, every_s=60.0))
        hup.set()
        for _ in range(10_000):  # bounded wait for the worker thread
            if rl.counts["ok"]:
                break
            await asyncio.sleep(0.001)
        stop.set()
        await watcher
        return threading.current_thread()

    return asyncio.run(run())
