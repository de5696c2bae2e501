"""Operations against one live stack (3 providers, the sidecar, Envoy) after real traffic:
Prometheus metrics, the admin endpoints, `tailroute status`, and the HTML status
page rendered in headless Chromium."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
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
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families

from sidecar.devtools.harness import Stack, free_port
from sidecar.fleet.metrics import FLEET_METRIC_NAMES
from sidecar.fleet.worker_status import WORKER_METRIC_NAMES
from sidecar.ops.metrics import METRIC_NAMES
from tests.conftest import need_tool
from tests.ops_stack import (
    MODEL,
    PROVIDERS,
    admin_get,
    drive,
    e2e_samples,
    start_stack,
    wait_for,
)

pytestmark = pytest.mark.envoy
N_REQUESTS = 40


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
        if name in FLEET_METRIC_NAMES or name in WORKER_METRIC_NAMES:
            continue  # only with a fleet: section / under serve --workers (their own tests)
        assert name in fams or name.removesuffix("_total") in fams, name
    assert _value(fams["tailroute_decisions"], "tailroute_decisions_total") == N_REQUESTS
    assert _value(fams["tailroute_outcomes"], "tailroute_outcomes_total",
                  outcome="ok") == N_REQUESTS
    phase = fams["tailroute_extproc_phase_seconds"]
    assert _value(phase, "tailroute_extproc_phase_seconds_count",
                  phase="request_body") >= N_REQUESTS  # the one-message path
    ttft = fams["tailroute_route_ttft_seconds"]
    served = {s.labels["cluster"] for s in ttft.samples}
    assert served and served <= set(PROVIDERS)
    assert {s.labels["window_quantile"] for s in ttft.samples} == {"0.5", "0.95", "0.99"}
    assert all(s.value > 0 for s in ttft.samples)
    e2e = fams["tailroute_route_e2e_seconds"]
    assert {s.labels["cluster"] for s in e2e.samples} == served
    # The GenAI client histograms saw every streamed response, per serving cluster.
    first = fams["gen_ai_client_operation_time_to_first_chunk_seconds"]
    assert first.type == "histogram"
    counts = {s.labels["cluster"]: s.value for s in first.samples if s.name.endswith("_count")}
    assert set(counts) == served and sum(counts.values()) == N_REQUESTS
    dur = fams["gen_ai_client_operation_duration_seconds"]
    assert _value(dur, "gen_ai_client_operation_duration_seconds_count") == N_REQUESTS
    states = fams["tailroute_route_state"]  # every routed cluster x slice, healthy ones too
    routes = e2e_samples(stack.sidecar_state())
    assert {(s.labels["cluster"], s.labels["slice"]) for s in states.samples} == set(routes)
    assert all(s.labels["state"] == "healthy" and s.value == 1 for s in states.samples)
    assert _value(fams["tailroute_config_last_reload_ok"],
                  "tailroute_config_last_reload_ok") == 1


def test_metrics_negotiate_openmetrics_with_units(stack: Stack) -> None:
    url = f"http://127.0.0.1:{stack.ports['sidecar_admin']}/metrics"
    req = urllib.request.Request(url, headers={  # what Prometheus 2.x sends
        "Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"})
    with urllib.request.urlopen(req, timeout=5) as r:
        assert r.headers["content-type"].startswith("application/openmetrics-text")
        text = r.read().decode()
    fams = {f.name: f for f in parse_openmetrics(text)}
    first = fams["gen_ai_client_operation_time_to_first_chunk_seconds"]
    assert (first.type, first.unit) == ("histogram", "seconds")
    labels = next(s.labels for s in first.samples if s.name.endswith("_count"))
    assert labels["gen_ai_operation_name"] == "chat" and labels["gen_ai_provider_name"]
    assert labels["gen_ai_request_model"] and labels["server_address"] == "127.0.0.1"
    assert fams["tailroute_decisions"].type == "counter"


def test_metrics_pass_promtool_lint(stack: Stack) -> None:
    """The scrape, with every family populated by traffic, passes Prometheus's own
    linter (``promtool check metrics``: names, units, reserved labels)."""
    promtool = need_tool("promtool")
    text = admin_get(stack, "/metrics")
    assert "tailroute_route_ttft_seconds{" in text  # the windowed percentiles are there
    out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


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
    for col in ("STATE", "WEIGHT", "SHARE", "SAMPLES", "TTFT p50", "TTFT p95", "TTFT p99",
                "E2E p95", "ERR", "LAST TRANSITION"):
        assert col in header
    rows = [ln.split() for ln in lines if ln.split() and ln.split()[0] in PROVIDERS]
    state = stack.sidecar_state()
    assert len(rows) == len(e2e_samples(state))
    total = sum(int(r[5]) for r in rows)  # SAMPLES column
    assert total == N_REQUESTS
    by_slice: dict[str, int] = {}
    for r in rows:  # SHARE column: each slice's shares add up (to rounding)
        by_slice[r[1]] = by_slice.get(r[1], 0) + int(r[4].rstrip("%"))
    assert all(98 <= v <= 102 for v in by_slice.values()), by_slice
    assert all(r[2] == "healthy" for r in rows)


def test_status_cli_unreachable_admin_exits_nonzero() -> None:
    out = _status("--admin", f"127.0.0.1:{free_port()}")
    assert out.returncode == 1
    assert "cannot read state" in out.stderr


# ------------------------------------------------------------------ Chromium

VIEWPORT = (1280, 900)  # the fold the charts must sit above
CLASSES = ("interactive", "agentic", "batch")


def _chromium(tmp: Path, url: str, *mode: str) -> str:
    """Run headless Chromium once; returns stdout. Its whole process group is killed after."""
    argv = [need_tool("chromium"), "--headless", "--no-sandbox", "--disable-gpu",
            "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--disable-breakpad",
            "--hide-scrollbars", f"--user-data-dir={tmp / 'profile'}",
            "--virtual-time-budget=5000", f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}", *mode,
            url]
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


def _bbox(mask: np.ndarray[Any, Any]) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) of the rows/columns where ``mask`` is mostly set."""
    rows, cols = np.where(mask.sum(axis=1) > 200)[0], np.where(mask.sum(axis=0) > 20)[0]
    assert rows.size and cols.size, "region not visible in the screenshot"
    return int(rows.min()), int(rows.max()), int(cols.min()), int(cols.max())


def _hex(c: str) -> tuple[int, int, int]:
    return int(c[1:3], 16), int(c[3:5], 16), int(c[5:7], 16)


async def _mixed(base_url: str, n: int) -> None:
    """Streamed and unary requests of every default class: many routes (cluster x slice)."""
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key="test", max_retries=0, timeout=20.0)
    sem = asyncio.Semaphore(8)

    async def one(i: int) -> None:
        async with sem:
            stream = i % 2 == 0
            kw: dict[str, Any] = dict(
                model=MODEL, messages=[{"role": "user", "content": f"hi {i}"}], max_tokens=8,
                extra_headers={"x-tailroute-class": CLASSES[(i // 2) % len(CLASSES)]})
            if stream:
                async for _ in await client.chat.completions.create(stream=True, **kw):
                    pass
            else:
                await client.chat.completions.create(**kw)

    await asyncio.gather(*(one(i) for i in range(n)))
    await client.close()


def test_status_page_in_chromium_at_1280x900(tmp_path: Path) -> None:
    """Many routes (3 clusters x 6 slices): charts above the fold, one distinct colour per
    route, labelled state rows, no wrapped names, latency columns with units."""
    with Stack() as s:
        start_stack(s)
        asyncio.run(_mixed(s.base_url, 180))

        def history() -> list[dict[str, Any]] | None:
            st = json.loads(admin_get(s, "/state?history=1"))
            keys = {k for p in st["history"] for k in p["routes"]}
            with_p95 = {k for p in st["history"] for k, r in p["routes"].items()
                        if r["p95"] is not None}
            return st["history"] if len(keys) >= 10 and len(with_p95) >= 10 else None

        hist = wait_for(history, "10 routes with a p95 on the chart")
        url = f"http://127.0.0.1:{s.ports['sidecar_admin']}/"
        dom = _chromium(tmp_path, url, "--dump-dom")
        png = tmp_path / "status.png"
        _chromium(tmp_path, url, f"--screenshot={png}")

    body = dom.split("<body", 1)[1].split(">", 1)[0]
    attr = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', body))
    assert attr["ready"] == "1" and int(attr["chart-points"]) >= 10
    routes, colours = int(attr["chart-routes"]), attr["route-colours"].split()
    assert routes >= 10 and len(colours) == routes and len(set(colours)) == routes
    assert int(attr["charts-bottom"]) <= VIEWPORT[1], "charts below the fold"
    assert attr["wrapped"] == "0", "a name or header wrapped onto a second line"
    assert int(attr["overflow-x"]) <= 0, "the page is wider than the window"
    for unit_header in ("TTFT p50 (ms)", "TTFT p95 (ms)", "TTFT p99 (ms)", "e2e p95 (ms)"):
        assert f"<th>{unit_header}</th>" in dom
    for cluster in {k.split(" ", 1)[0] for p in hist for k in p["routes"]}:
        assert f'class="route" data-cluster="{cluster}"' in dom

    rgb = _rgb(png)
    assert rgb.shape[:2] == (VIEWPORT[1], VIEWPORT[0])
    # The latency chart is the only area painted #f6f8fa, the state bands #fafbfc.
    top, bottom, left, right = _bbox(np.all(rgb == (0xF6, 0xF8, 0xFA), axis=-1))
    chart = rgb[top:bottom + 1, left:right + 1].reshape(-1, 3)
    drawn = {c for c in colours if np.all(chart == _hex(c), axis=-1).any()}
    assert len(drawn) >= 10, f"only {len(drawn)} of {routes} route colours visible"
    s_top, s_bottom, s_left, _ = _bbox(np.all(rgb == (0xFA, 0xFB, 0xFC), axis=-1))
    assert s_bottom < VIEWPORT[1] - 2, "state bands cut off by the fold"
    band = int(attr["state-band"])
    for i in range(routes):  # every band has its label: dark text in the left gutter
        y = s_top + 6 + i * (band + 4)
        gutter = rgb[y:y + band, s_left + 16:s_left + 200].astype(int)
        assert (gutter.max(axis=-1) < 110).sum() > 5, f"state row {i} has no label"
