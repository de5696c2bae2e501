"""Every per-request and per-key structure stays bounded, whatever the traffic varies in.

The soak benchmark (`tailroute bench soak`) measures RSS; this pins the logic:
requests with distinct tenants, request ids, unknown models and unknown classes,
routed and closed through the handlers, leave containers whose sizes do not
grow with the number of requests.
"""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import CollectorRegistry

from sidecar.core.config import parse_config
from sidecar.core.types import Observation, SliceKey
from sidecar.ops.admin import HISTORY_POINTS, HISTORY_ROUTES, AdminServer
from sidecar.shell.app import App
from tests.conftest import base_config_dict
from tests.streamharness import POST_CHAT, body_msg, chat_request, headers_msg, open_stream


def _sizes(app: App) -> dict[str, int]:
    r = app.router
    return {
        "pending": len(app.pending), "errors": len(app.errors), "counters": len(r.counters),
        "decisions": len(r.decisions), "recent": len(r.recent),
        "transitions": len(r.transitions), "retry_memory": len(r.admission.memory),
        "series": sum(1 for _ in r.stats.items()), "board": sum(1 for _ in r.board.items()),
    }


def _drive(app: App, start: int, n: int, now: float) -> float:
    for i in range(start, start + n):
        headers = {**POST_CHAT, "x-tailroute-tenant": f"tenant-{i}", "x-request-id": f"id-{i}",
                   "x-tailroute-class": f"class-{i % 7}" if i % 3 else "batch"}
        model = "m" if i % 2 else f"model-{i}"
        s = open_stream(app, headers_msg(headers))
        s.on_message(headers_msg(headers), now)
        s.on_message(body_msg(chat_request(model=model, stream=bool(i % 4))), now)
        s.close(now + 0.01, cancelled=bool(i % 5 == 0))
        now += 0.002
        if i % 500 == 0:
            app.tick(now)
    return now


def test_distinct_tenants_ids_models_and_classes_do_not_grow_state() -> None:
    app = App.create(parse_config(base_config_dict(), "t.yaml"), seed=1)
    now = _drive(app, 0, 1_500, 100.0)
    first = _sizes(app)
    now = _drive(app, 1_500, 4_500, now)  # past the 4096 ids the retry memory keeps
    # Pending requests end with their access-log entry (none here) or at their deadline.
    app.tick(now + 1_000.0)
    later = _sizes(app)
    assert later["pending"] == 0
    # RetryMemory is an LRU of 4096 ids; every other container has a bound unrelated to
    # the number of requests (config names, closed reason sets, rings).
    assert later["retry_memory"] <= 4096
    for key in ("errors", "counters", "decisions", "recent", "transitions", "series", "board"):
        assert later[key] <= max(first[key], 1) + 4, (key, first, later)


def test_status_page_history_is_bounded_per_point_and_in_points() -> None:
    data = base_config_dict(models=[{"name": f"m{i}", "candidates": ["a", "b"]} for i in range(30)])
    for c in data["clusters"][:2]:
        c["models"] = [f"m{i}" for i in range(30)]
    data["clusters"] = data["clusters"][:2]
    app = App.create(parse_config(data, "t.yaml"), seed=1)
    for i in range(30):
        for cluster in ("a", "b"):
            app.router.observe(Observation(cluster, SliceKey(f"m{i}", "interactive", "short", True),
                                           "ok", 200, 0.1, 0.01, 0.2, 10), 1.0)

    async def sample(n: int) -> AdminServer:
        admin = AdminServer(app, CollectorRegistry(), ready=lambda: True)
        for _ in range(n):
            await admin.sample()
        return admin

    admin = asyncio.run(sample(HISTORY_POINTS + 10))
    points: Any = admin.history
    assert len(points) == HISTORY_POINTS
    assert all(len(p["routes"]) <= HISTORY_ROUTES for p in points)
    assert len(points[-1]["routes"]) == HISTORY_ROUTES  # 60 routed slices, capped


def test_an_open_routing_stream_keeps_only_the_headers_it_reads() -> None:
    """A routing stream lives as long as its request (a streamed answer included): what
    it keeps of 50 KiB of headers it never reads (cookies, tokens) was kept that long,
    59 MB for 1,000 open rich-path streams. The headers it does read still count."""
    from sidecar.shell.extproc import RouteStream

    data = base_config_dict(envoy={"route_buffer_bytes": 1 << 20})
    app = App.create(parse_config(data, "t.yaml"), seed=1)
    unread = {f"x-{kind}pad-{i}": "v" * 200 for i in range(125)
              for kind in ("", "tailroute-")}  # tailroute's prefix, no name it reads
    hints = {"x-tailroute-priority": "1000", "x-tailroute-class": "batch",
             "x-tailroute-explain": "1", "x-request-id": "id-1",
             "x-tailroute-deadline-ms": "20000", "content-length": str(2 << 20)}
    s = RouteStream(app)
    answer = s.on_message(headers_msg({**POST_CHAT, **unread, **hints}), 1.0)
    assert answer.HasField("mode_override")  # type: ignore[union-attr]  # explain: read
    s.on_message(body_msg(chat_request()), 1.0)
    assert sum(len(k) + len(v) for k, v in s.headers.items()) < 1024
    assert s.info is not None and (s.info.priority, s.info.klass, s.info.request_id,
                                   s.info.deadline_ms, s.info.api) == (
        1000, "batch", "id-1", 20000.0, "chat")
    # the declared length is kept: a body over Envoy's buffer is Envoy's 413, no fail-open
    s2 = RouteStream(app)
    s2.on_message(headers_msg({**POST_CHAT, **unread, **hints}), 1.0)
    s2.close(1.1, cancelled=False)
    assert app.errors["stream_ended_before_body"] == 0
