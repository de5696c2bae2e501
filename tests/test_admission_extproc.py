"""Admission answers as the routing stream gives them to Envoy (in memory, no gRPC)."""

from __future__ import annotations

import json

import pytest

from sidecar.core.config import parse_config
from sidecar.core.types import RequestInfo, SliceKey
from sidecar.pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from sidecar.shell.admission import Hold, retry_after_ms
from sidecar.shell.app import App
from sidecar.shell.extproc import Phase, RouteStream
from tests.conftest import base_config_dict
from tests.streamharness import (
    POST_CHAT,
    body_msg,
    chat_request,
    headers_msg,
    routed_cluster,
    set_headers,
)


def make_app(conc: int = 64) -> App:
    data = base_config_dict()
    for c in data["clusters"]:
        c["max_concurrency"] = conc
    return App.create(parse_config(data, "t.yaml"), seed=1)


def send(app: App, headers: dict[str, str], now: float = 0.0, body: bytes | None = None,
         ) -> tuple[RouteStream, pb.ProcessingResponse | Hold | None]:
    s = RouteStream(app)
    s.on_message(headers_msg({**POST_CHAT, **headers}), now)
    return s, s.on_message(body_msg(chat_request() if body is None else body), now)


def immediate_of(resp: object) -> tuple[int, dict[str, str], dict[str, object]]:
    assert isinstance(resp, pb.ProcessingResponse)
    assert resp.WhichOneof("response") == "immediate_response"
    ir = resp.immediate_response
    hdrs = {h.header.key: h.header.raw_value.decode() for h in ir.headers.set_headers}
    return ir.status.code, hdrs, json.loads(ir.body)["error"]


def fill(app: App) -> None:
    for c in app.config.cluster_names:
        for _ in range(app.config.cluster(c).max_concurrency):
            app.router.started(c)


def test_optional_step_out_of_budget_gets_the_documented_skip() -> None:
    app = make_app()
    _, resp = send(app, {"x-tailroute-deadline-ms": "0", "x-tailroute-step": "optional"})
    status, hdrs, err = immediate_of(resp)
    assert status == 412
    assert hdrs["x-tailroute-skipped"] == "optional-step"
    assert hdrs["x-tailroute-admission"] == "skip"
    assert hdrs["x-should-retry"] == "false"
    assert err["type"] == "tailroute_skipped" and err["code"] == "deadline_exhausted"
    assert not app.pending


def test_admitted_request_carries_its_remaining_budget_as_upstream_timeout() -> None:
    app = make_app()
    _, resp = send(app, {"x-tailroute-deadline-ms": "750"})
    assert isinstance(resp, pb.ProcessingResponse)
    assert set_headers(resp)["x-envoy-upstream-rq-timeout-ms"] == "750"
    _, resp = send(app, {"x-tailroute-class": "batch"}, body=chat_request(stream=False))
    assert isinstance(resp, pb.ProcessingResponse)
    assert set_headers(resp)["x-envoy-upstream-rq-timeout-ms"] == "300000"
    # A stream without a deadline: no whole-answer timeout (the route's idle timeout
    # bounds its silences), so a steady answer longer than the class timeout is not cut.
    _, resp = send(app, {"x-tailroute-class": "batch"})
    assert isinstance(resp, pb.ProcessingResponse)
    assert "x-envoy-upstream-rq-timeout-ms" not in set_headers(resp)
    _, resp = send(app, {"x-tailroute-deadline-ms": "400000"})  # longer than the class's
    assert isinstance(resp, pb.ProcessingResponse)
    assert set_headers(resp)["x-envoy-upstream-rq-timeout-ms"] == "400000"


def test_low_priority_under_overload_is_deferred_with_retry_after() -> None:
    app = make_app(conc=1)
    fill(app)
    _, resp = send(app, {"x-tailroute-class": "batch"})
    status, hdrs, err = immediate_of(resp)
    assert (status, hdrs["retry-after"], hdrs["x-should-retry"]) == (429, "2", "true")
    assert err["type"] == "tailroute_deferred" and err["code"] == "overload"
    assert err["tailroute"] == {"admission": "defer", "reason": "overload", "class": "batch",
                                "priority": 1, "step": None, "deadline_ms": None,
                                "retry_after_s": int(hdrs["retry-after-ms"]) / 1000}
    _, resp = send(app, {"x-tailroute-class": "batch", "x-tailroute-deadline-ms": "1000"})
    status, hdrs, err = immediate_of(resp)
    assert (status, err["type"], hdrs["x-should-retry"]) == (503, "tailroute_shed", "false")


def test_deferrals_spread_their_retry_after_ms() -> None:
    """The SDKs wait exactly the retry-after-ms they are told: one fixed value brought a
    burst of deferrals back in one instant, to be deferred again together. Each answer
    draws its own wait in [Retry-After, 2 x Retry-After); retry-after stays the minimum.
    The body's retry_after_s says the same wait as retry-after-ms: it said the minimum,
    so clients that read the body all came back in one instant still."""
    app = make_app(conc=1)
    fill(app)
    waits = []
    for _ in range(40):
        _, resp = send(app, {"x-tailroute-class": "batch"})
        status, hdrs, err = immediate_of(resp)
        assert (status, hdrs["retry-after"]) == (429, "2")
        waits.append(int(hdrs["retry-after-ms"]))
        assert err["tailroute"]["retry_after_s"] == waits[-1] / 1000
    assert all(2000 <= w < 4000 for w in waits)
    assert len(set(waits)) >= 30  # spread, not one instant
    assert min(waits) < 2500 and max(waits) >= 3500  # over the whole range
    # A call with a deadline was deferred because it can wait Retry-After, not longer.
    _, resp = send(app, {"x-tailroute-class": "batch", "x-tailroute-deadline-ms": "60000"})
    status, hdrs, err = immediate_of(resp)
    assert (status, hdrs["retry-after"], hdrs["retry-after-ms"]) == (429, "2", "2000")
    assert err["tailroute"]["retry_after_s"] == 2.0


@pytest.mark.parametrize(("seconds", "spread", "deadline", "ms"), [
    (2, 0.0, None, 2000), (2, 0.5, None, 3000), (2, 0.9999, None, 3998),
    (2, 1.0, None, 3998), (2, -1.0, None, 2000), (2, 0.5, 5000.0, 2000),
    # never spread past 60 s (the openai SDK does not retry a wait over 120 s)...
    (40, 0.9, None, 60000), (40, 0.2, None, 48000),
    # ...nor shortened: a longer Retry-After is said as it is
    (90, 0.9, None, 90000)])
def test_retry_after_ms_stays_within_its_range(seconds: int, spread: float,
                                               deadline: float | None, ms: int) -> None:
    info = RequestInfo(api="chat", model="m", stream=True, max_tokens=None, input_tokens=1,
                       klass="batch", priority=1, tenant=None,
                       slice=SliceKey("m", "batch", "short", True), deadline_ms=deadline)
    assert retry_after_ms(seconds, info, spread) == ms


def test_queued_request_is_held_then_routed_when_capacity_frees() -> None:
    app = make_app(conc=1)
    fill(app)
    s, resp = send(app, {"x-tailroute-deadline-ms": "5000"}, now=10.0)
    assert isinstance(resp, Hold) and resp.until == 10.25
    assert s.phase is Phase.QUEUED and not app.pending
    assert isinstance(s.resume(10.1), Hold)  # still full
    app.router.finished("b")
    out = s.resume(10.2)
    assert isinstance(out, pb.ProcessingResponse)
    hdrs = set_headers(out)
    assert routed_cluster(out) == "b"
    # 200 ms of the 5000 ms budget were spent waiting.
    assert hdrs["x-envoy-upstream-rq-timeout-ms"] == "4800"
    assert app.router.inflight("b") == 1 and len(app.pending) == 1


def test_queued_stream_closed_by_envoy_leaves_the_queue() -> None:
    app = make_app(conc=1)
    fill(app)
    s, resp = send(app, {})
    assert isinstance(resp, Hold) and len(app.router.admission.queue) == 1
    s.close(0.1, cancelled=True)
    assert len(app.router.admission.queue) == 0
    assert app.router.counters[("admission_reason", "queue_abandoned")] == 1
