"""The admin views over every route (/metrics, /state, the status page's samples) are
built a slice of routes at a time, giving the event loop a turn between slices, and
say exactly what the same view built at once says (sidecar.ops.cooperative)."""

from __future__ import annotations

import asyncio
import json
from itertools import pairwise
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from sidecar.core.config_parse import parse_config
from sidecar.core.types import Observation, SliceKey
from sidecar.ops.admin import HISTORY_ROUTES, AdminServer
from sidecar.ops.cooperative import STEP_ROUTES, json_steps, run_steps
from sidecar.ops.metrics import build_registry
from sidecar.ops.state import state_json
from sidecar.shell.app import App
from tests.conftest import base_config_dict
from tests.loop_turns import while_ticking

MODELS = 3 * STEP_ROUTES // 2  # x 2 clusters: three slices of narrow routes
NOW = 1000.0
MIN_SAMPLES = 20  # stats.min_samples: the window percentiles exist from here


def _app() -> App:
    names = [f"m{i}" for i in range(MODELS)]
    data = base_config_dict(models=[{"name": m, "candidates": ["a", "b"]} for m in names])
    data["clusters"] = data["clusters"][:2]
    for c in data["clusters"]:
        c["models"] = names
    app = App.create(parse_config(data, "t.yaml"), seed=1)
    for i, m in enumerate(names):
        for cluster in ("a", "b"):
            for k in range(MIN_SAMPLES + i % 7):  # sizes differ: "busiest" means something
                app.router.observe(Observation(cluster, SliceKey(m, "interactive", "short", True),
                                               "ok", 200, 0.1 + 0.01 * k, 0.01, 0.5, 10), NOW - 5)
    return app


class _Admin(AdminServer):
    """An admin server whose clock notes each reading in ``trace``."""

    def __init__(self, app: App, trace: list[str], at: float = NOW) -> None:
        self.trace, self.at = trace, at
        built = build_registry(lambda: app.router, self._now, app.shell_counters)
        super().__init__(app, built.registry, ready=lambda: True, router_metrics=built.router)

    def _now(self) -> float:
        self.trace.append("clock")
        return self.at


async def _get(port: int, path: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    raw = await reader.read()
    writer.close()
    return raw.split(b"\r\n\r\n", 1)[1]


def _interleaved(trace: list[str]) -> int:
    """How many times the clock was read again after another task had run."""
    reads = [i for i, x in enumerate(trace) if x == "clock"]
    return sum("tick" in trace[a:b] for a, b in pairwise(reads))


def test_a_metrics_scrape_lets_the_loop_run_between_slices_of_routes() -> None:
    trace: list[str] = []
    app = _app()
    admin = _Admin(app, trace)
    while_ticking(trace, admin.router_metrics.prepare())  # type: ignore[union-attr]
    assert _interleaved(trace) >= 2  # the window percentiles: three slices of routes


def test_state_and_samples_let_the_loop_run_between_slices_of_routes() -> None:
    trace: list[str] = []
    admin = _Admin(_app(), trace)
    while_ticking(trace, admin._state({}))
    assert _interleaved(trace) >= 2
    trace.clear()
    while_ticking(trace, admin.sample())
    assert "tick" in trace[trace.index("clock"):]


def test_the_views_in_steps_say_what_the_views_at_once_say() -> None:
    app = _app()

    async def main() -> tuple[bytes, bytes]:
        admin = _Admin(app, [])
        port = await admin.start("127.0.0.1:0")
        try:
            return await _get(port, "/metrics"), await _get(port, "/state")
        finally:
            await admin.stop()

    metrics, state = asyncio.run(main())
    built = build_registry(lambda: app.router, lambda: NOW, app.shell_counters)
    assert metrics == generate_latest(built.registry)
    assert b"tailroute_route_ttft_seconds{" in metrics
    at_once = json.loads(json.dumps(state_json(app.router, NOW)))
    got = json.loads(state)
    assert {k: got[k] for k in at_once} == at_once
    assert len(got["routes"]) > 2 * STEP_ROUTES


def test_samples_chart_the_busiest_routes_as_before() -> None:
    app = _app()
    admin = _Admin(app, [])
    asyncio.run(admin.sample())
    (point,) = admin.history
    narrow = [r for r in state_json(app.router, NOW)["routes"] if r["narrow"]]
    narrow.sort(key=lambda r: -r["requests"])  # what sample() did: the whole view, sorted
    expected = {f"{r['cluster']} {r['slice']}": r["latency"]["ttft"]["p95_ms"]
                for r in narrow[:HISTORY_ROUTES]}
    assert {k: v["p95"] for k, v in point["routes"].items()} == expected


_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
_JSON = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(), inner, max_size=4), max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["routes", "history", "now", "x", "é\""]),
                       st.lists(_JSON, max_size=3 * STEP_ROUTES) | _JSON))
def test_json_in_steps_is_json_dumps_byte_for_byte(data: dict[str, Any]) -> None:
    assert run_steps(json_steps(data, ("routes", "history"))) == json.dumps(data).encode()
