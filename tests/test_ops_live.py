"""Operations against one live stack (3 providers, the sidecar, Envoy) after real traffic:
Prometheus metrics, the admin endpoints, `tailroute status`, and the HTML status
page rendered in headless Chromium."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.devtools.harness import Stack, free_port
from sidecar.ops.metrics import METRIC_NAMES
from tests.ops_stack import PROVIDERS, admin_get, drive, e2e_samples, start_stack, wait_for

pytestmark = pytest.mark.envoy
N_REQUESTS = 40
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with Stack() as s:
        start_stack(s)
        served = drive(s, N_REQUESTS)
        assert len(served) == N_REQUESTS
        # Observations land with Envoy's (batched) access-log entries; wait for all of them.
        wait_for(lambda: sum(e2e_samples(s.sidecar_state()).values()) == N_REQUESTS,
                 f"{N_REQUESTS} observations in /state")
        yield s


def _families(stack: Stack) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(admin_get(stack, "/metrics"))}


def _value(fam: Any, name: str, **labels: str) -> float:
    return sum(float(s.value) for s in fam.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def test_metrics_exposed_after_traffic(stack: Stack) -> None:
    fams = _families(stack)
    for name in METRIC_NAMES:  # counters are parsed under their name without _total
        assert name in fams or name.removesuffix("_total") in fams, name
    assert _value(fams["tailroute_decisions"], "tailroute_decisions_total") == N_REQUESTS
    assert _value(fams["tailroute_outcomes"], "tailroute_outcomes_total",
                  outcome="ok") == N_REQUESTS
    phase = fams["tailroute_extproc_phase_seconds"]
    assert _value(phase, "tailroute_extproc_phase_seconds_count",
                  phase="request_body") >= N_REQUESTS  # the one-message path
    ttft = fams["gen_ai_server_time_to_first_token_seconds"]
    served = {s.labels["cluster"] for s in ttft.samples}
    assert served and served <= set(PROVIDERS)
    assert {s.labels["quantile"] for s in ttft.samples} == {"0.5", "0.95", "0.99"}
    assert all(s.value > 0 for s in ttft.samples)
    e2e = fams["gen_ai_server_request_duration_seconds"]
    assert {s.labels["cluster"] for s in e2e.samples} == served
    states = fams["tailroute_route_state"]  # every routed cluster x slice, healthy ones too
    routes = e2e_samples(stack.sidecar_state())
    assert {(s.labels["cluster"], s.labels["slice"]) for s in states.samples} == set(routes)
    assert all(s.labels["state"] == "healthy" and s.value == 1 for s in states.samples)
    assert _value(fams["tailroute_config_last_reload_ok"],
                  "tailroute_config_last_reload_ok") == 1


def test_admin_endpoints(stack: Stack) -> None:
    assert admin_get(stack, "/healthz") == "ok\n"
    assert admin_get(stack, "/readyz") == "ready\n"
    recent = json.loads(admin_get(stack, "/explain?limit=3"))
    assert len(recent) == 3 and all(d["cluster"] in PROVIDERS for d in recent)
    with pytest.raises(urllib.error.HTTPError) as exc:
        admin_get(stack, "/nope")
    assert exc.value.code == 404


def _status(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sidecar.cli", "status", *args],
                          capture_output=True, text=True, timeout=30, check=False)


def test_status_cli_shows_routes(stack: Stack) -> None:
    out = _status("--admin", f"127.0.0.1:{stack.ports['sidecar_admin']}")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    header = next(ln for ln in lines if ln.startswith("CLUSTER"))
    for col in ("STATE", "WEIGHT", "SAMPLES", "TTFT p50", "TTFT p95", "TTFT p99", "E2E p95",
                "ERR", "LAST TRANSITION"):
        assert col in header
    rows = [ln.split() for ln in lines if ln.split() and ln.split()[0] in PROVIDERS]
    state = stack.sidecar_state()
    assert len(rows) == len(e2e_samples(state))
    total = sum(int(r[4]) for r in rows)  # SAMPLES column
    assert total == N_REQUESTS
    assert all(r[2] == "healthy" for r in rows)


def test_status_cli_unreachable_admin_exits_nonzero() -> None:
    out = _status("--admin", f"127.0.0.1:{free_port()}")
    assert out.returncode == 1
    assert "cannot read state" in out.stderr


# ------------------------------------------------------------------ Chromium


def _chromium(tmp: Path, url: str, *mode: str) -> str:
    """Run headless Chromium once; returns stdout. Its whole process group is killed after."""
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--disable-breakpad", f"--user-data-dir={tmp / 'profile'}",
            "--virtual-time-budget=5000", "--window-size=1200,1200", *mode, url]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, cwd=tmp)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # renderer/zygote children, if any linger
        proc.wait()
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    return out.decode(errors="replace")


def _rgb(png: Path) -> np.ndarray[Any, np.dtype[np.uint8]]:
    import matplotlib.image as mpimg

    img = mpimg.imread(str(png))
    return np.asarray(np.round(img[..., :3] * 255), dtype=np.uint8)


@pytest.mark.skipif(not os.path.exists(CHROMIUM),
                    reason=f"{CHROMIUM} missing (apt-get install -y chromium)")
def test_status_page_renders_data_in_chromium(stack: Stack, tmp_path: Path) -> None:
    def history_points() -> int | None:
        st = json.loads(admin_get(stack, "/state?history=1"))
        n = sum(1 for p in st["history"] if any(r["p95"] is not None
                                                 for r in p["routes"].values()))
        return n if n >= 2 else None

    wait_for(history_points, "two chart points with a p95")
    url = f"http://127.0.0.1:{stack.ports['sidecar_admin']}/"
    dom = _chromium(tmp_path, url, "--dump-dom")
    assert 'data-ready="1"' in dom
    routed = {c for c, _ in e2e_samples(stack.sidecar_state())}
    for cluster in routed:
        assert f'class="route" data-cluster="{cluster}"' in dom
    points = int(dom.split('data-chart-points="', 1)[1].split('"', 1)[0])
    assert points >= 2

    png = tmp_path / "status.png"
    _chromium(tmp_path, url, f"--screenshot={png}")
    rgb = _rgb(png)
    # The latency chart is the only area painted #f6f8fa: find it, then look inside.
    bg = np.all(rgb == (0xF6, 0xF8, 0xFA), axis=-1)
    rows, cols = np.where(bg.sum(axis=1) > 200)[0], np.where(bg.sum(axis=0) > 100)[0]
    assert rows.size and cols.size, "latency chart not visible in the screenshot"
    chart = rgb[rows.min():rows.max() + 1, cols.min():cols.max() + 1].astype(int)
    saturated = (chart.max(axis=-1) - chart.min(axis=-1)) > 80  # series colours, not greys
    assert saturated.sum() > 100, "chart has no data lines"
    assert len(np.unique(chart.reshape(-1, 3), axis=0)) > 20
    assert shutil.which(CHROMIUM)
