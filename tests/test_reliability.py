"""Reliability under load through the real Envoy: the sidecar killed, terminated and
restarted, Envoy restarted, and no Redis anywhere.

Every load is bounded (a rate, a request cap and a stop); every process is the
Stack's and stopped by PID. The figure that matters is the number of client
requests that failed while the sidecar or Envoy went away: the sidecar is never
on the failure path (Envoy fails open to the default route), so it must be 0 for
the sidecar cases. Envoy restarting drops its own connections, which clients see;
that case asserts the sidecar's side instead: nothing leaks, the new Envoy is
routed at once.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest

from sidecar.devtools.harness import Stack
from sidecar.devtools.openai_load import ClientLoad
from tests.blackhole_proxy import BlackholeProxy
from tests.ops_stack import (
    MODEL,
    admin_get,
    drive,
    e2e_samples,
    ops_config,
    start_providers,
    start_stack,
    wait_for,
)

pytestmark = pytest.mark.envoy

RATE, CONCURRENCY = 40.0, 8


def _load(stack: Stack) -> ClientLoad:
    return ClientLoad(stack.base_url, MODEL, rate=RATE, concurrency=CONCURRENCY,
                      max_tokens=6, max_requests=4000).start()


def _metric(stack: Stack, name: str, labels: str) -> float:
    for line in admin_get(stack, "/metrics").splitlines():
        if line.startswith(f"{name}{{{labels}}}"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _remote_ports(pid: int) -> set[int]:
    """Remote TCP ports of a process's sockets (via /proc, for the no-Redis check)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = str(fd.readlink())
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            cols = line.split()
            if cols[9] in inodes:
                ports.add(int(cols[2].rsplit(":", 1)[1], 16))
    return ports


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_sidecar_killed_under_load_then_restarted_warm(tmp_path: Path, how: str) -> None:
    snap = tmp_path / "snap.json"
    with Stack() as stack:
        path = start_stack(stack, extra_args=["--snapshot", str(snap), "--snapshot-every", "0.5"])
        load = _load(stack)
        try:
            load.wait_sent(60)
            wait_for(lambda: snap.exists(), "a periodic snapshot")
            before = sum(e2e_samples(stack.sidecar_state()).values())
            proc = stack.procs["sidecar"]
            sidecar_pid = proc.pid
            assert 6379 not in _remote_ports(sidecar_pid)  # no Redis without fleet config
            proc.send_signal(getattr(signal, how))
            assert proc.wait(timeout=30) == (-9 if how == "SIGKILL" else 0)
            if how == "SIGTERM":  # a clean shutdown ends Envoy's streams without errors
                assert "Traceback" not in stack.log("sidecar")
            stack.stop_sidecar()
            down_from = load.sent()
            load.wait_sent(down_from + 60)  # served while no sidecar runs: default route
            stack.start_sidecar(path, extra=["--snapshot", str(snap)])
            log = stack.log("sidecar")
            up_from = load.sent()
            load.wait_sent(up_from + 60)
        finally:
            counts = load.stop()
        print(f"\n{how}: {counts.snapshot()} (sidecar down from request {down_from} "
              f"to {up_from})", end="; ")
        assert counts.failed == 0, counts.snapshot()
        assert "warm start from snapshot" in log
        after = stack.sidecar_state()
        assert sum(e2e_samples(after).values()) > 0 and before > 0
        outcomes = {o: _metric(stack, "tailroute_outcomes_total", f'outcome="{o}"')
                    for o in ("ok", "error", "timeout", "cancel")}
        # Stage 2 (accounting on the new data path) reconciles these; printed for now.
        print(f"restarted sidecar's outcomes: {outcomes}")
        assert _metric(stack, "tailroute_errors_total", 'kind="handler_exception"') == 0


def _explained(stack: Stack) -> str:
    client = openai.OpenAI(base_url=stack.base_url, api_key="t", max_retries=0, timeout=20)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
        extra_headers={"x-tailroute-explain": "1"})
    return str(json.loads(raw.headers["x-tailroute-explain-result"])["cluster"])


def _envoy_stat(stack: Stack, name: str) -> int:
    url = f"http://127.0.0.1:{stack.ports['envoy_admin']}/stats?filter=^{name}$&format=json"
    with urllib.request.urlopen(url, timeout=5) as r:
        stats: list[dict[str, Any]] = json.loads(r.read())["stats"]
    return int(stats[0]["value"]) if stats else 0


def test_envoy_restarted_under_load_leaves_nothing_behind_in_the_sidecar() -> None:
    with Stack() as stack:
        start_stack(stack)
        load = _load(stack)
        try:
            load.wait_sent(60)
        finally:
            first = load.stop()
        load2 = None
        try:
            load2 = _load(stack)  # in flight while Envoy goes away
            load2.wait_sent(20)
            stack.stop_envoy()
            time.sleep(0.5)
        finally:
            cut = load2.stop() if load2 else None
        # The old Envoy's streams closed: nothing stays in flight or pending.
        wait_for(lambda: all(c["inflight"] == 0
                             for c in stack.sidecar_state()["clusters"].values()),
                 "in-flight counts to return to zero")
        stack.start_envoy()
        assert _explained(stack) in {"provider-a", "provider-b", "provider-c"}
        load3 = _load(stack)
        try:
            load3.wait_sent(60)
        finally:
            after = load3.stop()
        assert _envoy_stat(stack, "cluster.tailroute_sidecar.upstream_rq_active_overflow") == 0
        assert _metric(stack, "tailroute_errors_total", 'kind="handler_exception"') == 0
        # The new Envoy's entries flow: its requests all become outcomes, and the
        # access log is not "silent" although the cut requests' entries never come
        # (they are counted lost after the grace).
        wait_for(lambda: _metric(stack, "tailroute_outcomes_total", 'outcome="ok"')
                 >= first.ok + after.ok, "the new Envoy's outcomes")
        view = stack.sidecar_state()["envoy"]
        assert view["access_log"] == "ok" and view["log_streams_open"] >= 1
    print(f"\nEnvoy restart: before {first.snapshot()}, cut by the restart "
          f"{cut.snapshot() if cut else None}, after {after.snapshot()}")
    assert first.failed == 0 and after.failed == 0


def _sum_metric(stack: Stack, name: str) -> float:
    """The sum of a metric family over all its label sets."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in admin_get(stack, "/metrics").splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def test_outcomes_resume_after_the_sidecar_restarts() -> None:
    """Envoy reopens its access-log stream to the restarted sidecar (same address) at
    its next flush, and the new process accounts for every request it decided: each
    decision, and each entry of a request the old process decided (``orphan``), is
    exactly one outcome; all clients got complete 200s, so all of them are ``ok``."""
    with Stack() as stack:
        path = start_stack(stack)
        load = _load(stack)
        try:
            load.wait_sent(20)
            proc = stack.procs["sidecar"]
            proc.kill()
            proc.wait(timeout=30)
            stack.stop_sidecar()
            stack.start_sidecar(path)
            after = load.sent()
            load.wait_sent(after + 40)
        finally:
            counts = load.stop()
        wait_for(lambda: stack.sidecar_state()["envoy"]["pending"] == 0,
                 "every decided request's access-log entry")
        envoy = stack.sidecar_state()["envoy"]
        decisions = _sum_metric(stack, "tailroute_decisions_total")
        outcomes = {o: _metric(stack, "tailroute_outcomes_total", f'outcome="{o}"')
                    for o in ("ok", "error", "timeout", "cancel", "lost")}
    print(f"\nrestarted: client {counts.snapshot()}, decisions {decisions}, "
          f"outcomes {outcomes}, access log {envoy}")
    assert counts.failed == 0
    assert envoy["log_streams_open"] >= 1 and decisions >= 30
    assert outcomes["ok"] == decisions + envoy["orphan"]
    assert sum(outcomes.values()) == outcomes["ok"]


def test_a_sidecar_connection_gone_silent_is_closed_by_keepalive_and_outcomes_resume() -> None:
    """The sidecar's host vanishes from under Envoy's connection (no FIN, no RST; a
    proxy stops forwarding): Envoy's HTTP/2 keepalive closes it, the next requests
    and the next access-log flush open new streams, and decisions and outcomes resume.
    Without keepalive the access-log stream would stay on the dead connection for good."""
    with Stack() as stack:
        ports = start_providers(stack)
        path = stack.write_config(ops_config(
            ports, envoy={"sidecar_keepalive_s": 1, "sidecar_health_interval_s": 0}))
        stack.start_sidecar(path)
        with BlackholeProxy(stack.ports["sidecar"]) as proxy:
            stack.start_envoy(sidecar_port=proxy.port)
            drive(stack, 8, 2)
            wait_for(lambda: _metric(stack, "tailroute_outcomes_total", 'outcome="ok"') == 8,
                     "the first outcomes")
            proxy.blackhole()
            sent = 0
            while sent < 200 and _metric(stack, "tailroute_outcomes_total",
                                         'outcome="ok"') < 8 + 4:
                assert len(drive(stack, 4, 2)) == 4  # fail-open or routed: always served
                sent += 4
            timeouts = _envoy_stat(stack, "cluster.tailroute_sidecar.http2.keepalive_timeout")
            outcomes = _metric(stack, "tailroute_outcomes_total", 'outcome="ok"')
    print(f"\nsilent connection: {sent} requests until outcomes resumed; "
          f"keepalive timeouts {timeouts}, ok outcomes {outcomes}")
    assert timeouts >= 1 and outcomes >= 12


def _without_access_log(boot: dict[str, Any]) -> None:
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    del hcm["typed_config"]["access_log"]


def test_decisions_without_access_log_are_reported_silent() -> None:
    """A hand-written bootstrap without tailroute's access log: the sidecar decides but
    learns nothing, and says so (/state, the wait gauge and the stream gauge that
    TailrouteAccessLogSilent reads)."""
    with Stack() as stack:
        ports = start_providers(stack)
        stack.start_sidecar(stack.write_config(ops_config(ports)))
        stack.start_envoy(edit=_without_access_log)
        drive(stack, 10, 2)
        view = wait_for(lambda: (v := stack.sidecar_state()["envoy"])["access_log"] == "silent"
                        and v, "the access log to be reported silent")
        wait = _sum_metric(stack, "tailroute_access_log_wait_seconds")
        streams = _sum_metric(stack, "tailroute_access_log_streams")
        decisions = _sum_metric(stack, "tailroute_decisions_total")
        ok = _metric(stack, "tailroute_outcomes_total", 'outcome="ok"')
    assert view["awaiting_entry"] == 10 and view["log_streams_open"] == 0
    assert decisions == 10 and ok == 0 and streams == 0 and wait > 0
