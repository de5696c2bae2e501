"""`tailroute serve --workers N`: N processes on one gRPC port sharing state through a
real redis-server, behind the real Envoy; misuse is a one-line config error."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.devtools.harness import Stack, free_port, http_json
from sidecar.devtools.redis_server import RedisServer
from tests.ops_stack import MODEL, drive, ops_config, start_providers, wait_for

pytestmark = [pytest.mark.envoy, pytest.mark.usefixtures("redis_tool")]


def _worker_states(stack: Stack) -> list[dict[str, object]]:
    ports = (stack.workdir / "sidecar.port.workers").read_text().split()
    return [http_json(f"http://127.0.0.1:{p}/state") for p in ports]


def _samples(state: dict[str, object]) -> int:
    return sum(r["latency"]["ttft"]["samples"] for r in state["routes"]  # type: ignore[index,union-attr]
               if r["narrow"])  # type: ignore[index]


def test_workers_share_one_port_and_one_fleet_state() -> None:
    with Stack() as stack, RedisServer() as redis_srv:
        ports = start_providers(stack)
        path = stack.write_config(ops_config(
            ports, fleet={"url": redis_srv.url, "push_interval_s": 0.2, "lease_ttl_s": 1.0}))
        stack.start_sidecar(path, extra=["--workers", "2"])
        stack.start_envoy(envoy_concurrency=2)
        assert len(drive(stack, n=80, concurrency=8)) == 80
        states = _worker_states(stack)
        assert len(states) == 2
        # Each worker counts only what it decided, but both see the fleet's evidence.
        decided = [sum(v for k, v in s["counters"].items()  # type: ignore[attr-defined]
                       if k.startswith("decision:")) for s in states]
        assert sum(decided) >= 80
        deadline = time.monotonic() + 10
        while _samples(states[0]) != _samples(states[1]) and time.monotonic() < deadline:
            time.sleep(0.2)
            states = _worker_states(stack)
        assert _samples(states[0]) == _samples(states[1]) > 0
        # An entry that reached the other worker is observed there (orphan) and its id
        # goes back through the store: its decider stops waiting (elsewhere), none lost.
        env = [s["envoy"] for s in states]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (
                sum(e["elsewhere"] for e in env) != sum(e["orphan"] for e in env)  # type: ignore[index]
                or any(e["pending"] for e in env)):  # type: ignore[index]
            time.sleep(0.2)
            env = [s["envoy"] for s in _worker_states(stack)]
        assert sum(e["elsewhere"] for e in env) == sum(e["orphan"] for e in env)  # type: ignore[index]
        assert [(e["pending"], e["lost"]) for e in env] == [(0, 0), (0, 0)]  # type: ignore[index]
        sup = stack.procs["sidecar"]
        # The supervisor keeps its workers' ready files beside its own ready file,
        # in the directory of whoever started it (removed with it even after a SIGKILL).
        assert len(list(stack.workdir.glob("tailroute-workers-*"))) == 1
        stack.stop_sidecar()  # SIGTERM to the supervisor's group: every worker drains
        assert sup.returncode == 0
        assert list(stack.workdir.glob("tailroute-workers-*")) == []  # removed on its way out


@pytest.mark.parametrize(("fleet", "extra", "message"), [
    (False, [], "fleet: --workers 2 needs a fleet: section"),
    (True, ["--unix", "/tmp/x.sock", "--grpc", ""], "listen: --workers needs TCP gRPC"),
])
def test_workers_misuse_is_a_config_error(tmp_path: Path, fleet: bool, extra: list[str],
                                          message: str) -> None:
    data = ops_config({"provider-a": 1, "provider-b": 2, "provider-c": 3})
    if fleet:
        data["fleet"] = {"url": "redis://127.0.0.1:1/0"}
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(data))
    out = subprocess.run([sys.executable, "-m", "sidecar.cli", "serve", "--config", str(path),
                          "--workers", "2", *extra], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert message in out.stderr and str(path) in out.stderr


def _restarts(metrics: str, reason: str = "exited") -> dict[str, float]:
    """``tailroute_worker_restarts_total{worker, reason}`` of one reason, by worker."""
    out = {}
    for line in metrics.splitlines():
        if line.startswith("tailroute_worker_restarts_total{") and f'reason="{reason}"' in line:
            labels, _, value = line.rpartition(" ")
            out[labels.split('worker="')[1].split('"')[0]] = float(value)
    return out


def test_a_dead_worker_is_restarted_counted_and_found_on_its_new_admin_port() -> None:
    """With admin port 0 a restarted worker serves on a new port: the supervisor lists it
    in <ready-file>.workers again, and every worker shows the restart (/state, /metrics)
    -- the supervisor's log was the only place it showed."""
    import os
    import signal
    import urllib.request

    from tests.ops_stack import wait_for

    with Stack() as stack, RedisServer() as redis_srv:
        path = stack.write_config(ops_config(
            {"provider-a": 1, "provider-b": 2, "provider-c": 3},  # no traffic is sent
            fleet={"url": redis_srv.url, "push_interval_s": 0.2, "lease_ttl_s": 1.0}))
        stack.start_sidecar(path, extra=["--workers", "2"])  # Stack: --admin 127.0.0.1:0
        before = _worker_states(stack)
        assert [s["workers"]["index"] for s in before] == [0, 1]  # type: ignore[index]
        records = before[0]["workers"]["workers"]  # type: ignore[index]
        assert [(w["restarts"], w["last_exit"]) for w in records] == [(0, None), (0, None)]
        old_ports = (stack.workdir / "sidecar.port.workers").read_text().split()
        assert [str(w["admin_port"]) for w in records] == old_ports

        os.kill(records[1]["pid"], signal.SIGKILL)

        def relisted() -> list[str] | None:
            ports = (stack.workdir / "sidecar.port.workers").read_text().split()
            return ports if ports[1] != old_ports[1] else None

        ports = wait_for(relisted, "the restarted worker to be listed", timeout_s=60)
        assert ports[0] == old_ports[0]
        after = _worker_states(stack)  # both listed ports answer
        assert [s["workers"]["index"] for s in after] == [0, 1]  # type: ignore[index]
        for state in after:
            rec = state["workers"]["workers"]  # type: ignore[index]
            assert [(w["restarts"], w["last_exit"]) for w in rec] == [
                (0, None), (1, -signal.SIGKILL)]
            assert [str(w["admin_port"]) for w in rec] == ports
        for port in ports:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
            assert _restarts(text) == {"0": 0.0, "1": 1.0}
            assert _restarts(text, "hung") == {"0": 0.0, "1": 0.0}  # it died: not a hang
        assert "worker 1 exited -9; restarting it" in stack.log("sidecar")
        stack.stop_sidecar()


def _decided(state: dict[str, object]) -> int:
    return sum(v for k, v in state["counters"].items()  # type: ignore[attr-defined]
               if k.startswith("decision:"))


def test_a_hung_worker_is_killed_and_replaced_while_the_other_keeps_serving() -> None:
    """A worker whose event loop stops (SIGSTOP: the whole process, a genuine hang) is
    alive to the kernel, so only its missing heartbeats tell: the supervisor kills it
    and restarts it through the restart path; the other worker is left alone."""
    import os
    import signal
    import urllib.request

    from tests.ops_stack import wait_for

    with Stack() as stack, RedisServer() as redis_srv:
        ports = start_providers(stack)
        path = stack.write_config(ops_config(
            ports, fleet={"url": redis_srv.url, "push_interval_s": 0.2, "lease_ttl_s": 1.0},
            workers={"probe_interval_s": 0.25, "probe_misses": 8, "kill_grace_s": 1.0}))
        stack.start_sidecar(path, extra=["--workers", "2"])
        stack.start_envoy(envoy_concurrency=2)
        assert len(drive(stack, n=20, concurrency=4)) == 20
        admin = (stack.workdir / "sidecar.port.workers").read_text().split()
        records = _worker_states(stack)[0]["workers"]["workers"]  # type: ignore[index]
        kept, hung = records[0]["pid"], records[1]["pid"]

        def state0() -> dict[str, object]:  # the worker left alone answers throughout
            return http_json(f"http://127.0.0.1:{admin[0]}/state")

        os.kill(hung, signal.SIGSTOP)
        try:
            def replaced() -> list[dict[str, object]] | None:
                rec = state0()["workers"]["workers"]  # type: ignore[index]
                return rec if rec[1]["pid"] not in (hung, None) and rec[1]["admin_port"] \
                    else None

            rec = wait_for(replaced, "the hung worker to be replaced", timeout_s=60)
        finally:
            if os.path.exists(f"/proc/{hung}"):  # not killed (a failed run): end it here
                os.kill(hung, signal.SIGCONT)
                os.kill(hung, signal.SIGKILL)
        # SIGTERM waits in a stopped process; the SIGKILL after the grace ended it.
        assert [(w["pid"], w["restarts"], w["hung_restarts"], w["last_exit"]) for w in rec] \
            == [(kept, 0, 0, None), (rec[1]["pid"], 1, 1, -signal.SIGKILL)]
        log = stack.log("sidecar")
        assert f"worker 1 (pid {hung}) hung: no heartbeat in 8 probes in a row" in log
        assert "worker 1 killed after it hung, exited -9; restarting it" in log
        assert "worker 0 (pid" not in log  # never judged hung
        listed = wait_for(lambda: (p := (stack.workdir / "sidecar.port.workers").read_text()
                                   .split()) != admin and p, "the new worker to be listed")
        assert listed[0] == admin[0]
        for port in listed:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
            assert _restarts(text, "hung") == {"0": 0.0, "1": 1.0}
            assert _restarts(text) == {"0": 0.0, "1": 0.0}

        # Both serve again: every request through Envoy answered, and decided.
        before = [_decided(s) for s in _worker_states(stack)]
        assert len(drive(stack, n=40, concurrency=4)) == 40
        after = _worker_states(stack)
        assert sum(_decided(s) for s in after) - sum(before) >= 40
        assert after[0]["workers"]["workers"][0]["pid"] == kept  # type: ignore[index]
        stack.stop_sidecar()


def test_every_worker_counts_the_requests_envoy_routed_elsewhere() -> None:
    """Envoy runs a bootstrap rendered before provider-c was added, so a decision for
    provider-c matches no route of its and goes down the default route (provider-b).
    Every such request is ``misrouted`` and evidence about neither cluster, whichever
    worker received its entry: the one that received another worker's entry (``orphan``)
    read it as provider-c's (uncounted), and the fleet then shared provider-b's timings
    as provider-c's."""
    with Stack() as stack, RedisServer() as redis_srv:
        ports = start_providers(stack)
        old = ops_config(ports)
        old["clusters"] = [c for c in old["clusters"] if c["name"] != "provider-c"]
        old["models"] = [{"name": MODEL, "candidates": ["provider-a", "provider-b"]}]
        stack.write_config(old, name="before-c")
        stack.ports["sidecar"] = free_port()  # the sidecar starts there, after Envoy
        stack.start_envoy(envoy_concurrency=2)
        path = stack.write_config(ops_config(
            ports, fleet={"url": redis_srv.url, "push_interval_s": 0.2, "lease_ttl_s": 1.0},
            models=[{"name": MODEL, "candidates": ["provider-c"]}]))
        stack.start_sidecar(path, extra=["--workers", "2"])
        # An Envoy worker's ext_proc and access-log streams share its connection to the
        # sidecar, so an entry reaches another worker only once that connection has been
        # aged out (--workers: grpc.max_connection_age_ms, 5 s) and the access-log stream
        # lingers on the old one: rounds until some have (bounded).
        n = 0
        for _ in range(60):
            assert drive(stack, n=8, concurrency=4) == ["provider-b"] * 8
            n += 8
            if sum(s["envoy"]["orphan"] for s in _worker_states(stack)):  # type: ignore[index]
                break
            time.sleep(0.25)

        def settled() -> list[dict[str, Any]] | None:
            env = [s["envoy"] for s in _worker_states(stack)]
            done = sum(e["decided"] for e in env) == n and not any(e["pending"] for e in env)
            return env if done else None

        env = wait_for(settled, "every entry to reach a worker", timeout_s=30)
        assert sum(e["orphan"] for e in env) > 0
        assert sum(e["misrouted"] for e in env) == n
        for state in _worker_states(stack):
            assert not [r for r in state["routes"]  # type: ignore[attr-defined]
                        if r["latency"]["ttft"]["samples"]], "misrouted timings observed"
        stack.stop_sidecar()
