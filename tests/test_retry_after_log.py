"""A 429's or 503's declared wait, from Envoy's access-log entry to the observation: read
from the logged response headers (upstream 429s and 503s only), carried by the observation
on both the per-request and the native path, counted per cluster, rendered into both
bootstraps."""

from __future__ import annotations

import calendar
from typing import Any

import pytest
from prometheus_client import generate_latest

from sidecar.core.config import parse_config
from sidecar.core.envoy_log import LogRecord, observation_from_log
from sidecar.core.types import Observation, SliceKey
from sidecar.ops.metrics import build_registry
from sidecar.pb.envoy.data.accesslog.v3 import accesslog_pb2 as al
from sidecar.pb.envoy.service.accesslog.v3 import als_pb2
from sidecar.shell import envoy_contract as ec
from sidecar.shell.access_log import AccessLogService, record_from_entry
from sidecar.shell.app import App
from sidecar.shell.bootstrap_native import render_for_mode
from sidecar.shell.outcomes import OutcomeFeed
from sidecar.shell.pb_tolerant import tolerant
from tests.test_native_log import S, Side, entry

T = calendar.timegm((2015, 10, 21, 7, 28, 0))  # Wed, 21 Oct 2015 07:28:00 GMT


def _logged(status: int = 429, details: str = "via_upstream", start: int | None = None,
            **headers: str) -> al.HTTPAccessLogEntry:
    """A native entry whose response carried ``headers`` (``_`` for ``-`` in names)."""
    e = entry(status=status, details=details)
    for k, v in headers.items():
        e.response.response_headers[k.replace("_", "-")] = v
    if start is not None:
        e.common_properties.start_time.FromSeconds(start)  # duration: 12 ms
    return e


@pytest.mark.parametrize(("e", "wait", "bad"), [
    (_logged(retry_after="3"), 3.0, False),
    (_logged(retry_after="2.5"), 2.5, False),
    (_logged(retry_after_ms="1500", retry_after="9"), 1.5, False),  # ms wins
    (_logged(retry_after_ms="-1", retry_after="9"), 9.0, False),
    # an HTTP-date against the end of the exchange on Envoy's clock (start + 12 ms)
    (_logged(retry_after="Wed, 21 Oct 2015 07:28:30 GMT", start=T), 29.988, False),
    (_logged(retry_after="Wed, 21 Oct 2015 07:27:00 GMT", start=T), 0.0, False),
    (_logged(retry_after="soon"), None, True),
    (_logged(retry_after="-3"), None, True),
    (_logged(retry_after_ms="NaN"), None, True),
    (_logged(), None, False),  # a 429 that declared nothing
    (_logged(status=200, retry_after="3"), None, False),  # read on a 429 or 503 only
    (_logged(status=503, retry_after="3"), 3.0, False),  # unavailable for a declared while
    (_logged(status=503, retry_after="later"), None, True),
    (_logged(status=500, retry_after="3"), None, False),
    # tailroute's own admission answers are a 429 or 503 with a Retry-After, and Envoy's
    # local replies are not the provider's: not the upstream's
    (_logged(details="tailroute_defer", retry_after="1"), None, False),
    (_logged(status=503, details="tailroute_shed", retry_after="1"), None, False),
    (_logged(status=503, details="no_healthy_upstream", retry_after="1"), None, False),
])
def test_an_entrys_declared_wait(e: al.HTTPAccessLogEntry, wait: float | None,
                                 bad: bool) -> None:
    rec = record_from_entry(e)
    assert rec.retry_after_s == (pytest.approx(wait) if wait is not None else None)
    assert rec.retry_after_bad is bad


def test_a_non_utf8_header_value_is_repaired_and_unreadable() -> None:
    """Envoy passes obs-text bytes on; the tolerant decoder reads them as Latin-1."""
    msg = als_pb2.StreamAccessLogsMessage()
    msg.http_logs.log_entry.append(_logged(retry_after="Q5"))
    raw = msg.SerializeToString().replace(b"Q5", b"\xff5")
    repaired: list[int] = []
    read = tolerant(als_pb2.StreamAccessLogsMessage, lambda: repaired.append(1))(raw)
    rec = record_from_entry(read.http_logs.log_entry[0])
    assert repaired == [1] and rec.retry_after_s is None and rec.retry_after_bad


@pytest.mark.parametrize("shortcut", [True, False])
def test_the_native_path_observes_the_wait_and_counts_it(shortcut: bool) -> None:
    side = Side(shortcut)
    side.feed([_logged(retry_after="4"), entry(), _logged(retry_after="x"),
               _logged(retry_after_ms="500")], 10.0)
    waits = [o.retry_after_s for o in side.seen if o.status == 429]
    assert waits == [4.0, None, 0.5]
    assert all(o.retry_after_s is None for o in side.seen if o.status != 429)
    assert side.app.retry_after.view() == {
        "a": {"count": 2, "last_s": 0.5, "max_s": 4.0, "mean_s": 2.25}}
    assert side.app.errors["retry_after_unreadable"] == 1
    assert side.app.envoy_view(10.0)["retry_after"] == side.app.retry_after.view()


@pytest.mark.parametrize("shortcut", [True, False])
def test_a_declared_wait_holds_the_route_even_when_its_outcome_is_not_sampled(
        shortcut: bool) -> None:
    """With ``stats.observe_share: 0`` the 429 below is not observed (its sub-window
    has min_samples already), but its wait still holds the cluster: outcomes are
    sampled, a provider's quota is not."""
    side = Side(shortcut, observe_share=0.0)
    woken: list[int] = []
    side.app.on_holds = lambda: woken.append(1)  # native mode wakes its publisher
    side.feed([entry() for _ in range(3)], 10.0)
    side.feed([_logged(retry_after="4")], 10.5)
    assert [o.status for o in side.seen] == [200, 200, 200]  # the 429 went unobserved
    assert side.app.router.pushback.held() == {"a": 14.5} and woken == [1]


@pytest.mark.parametrize("shortcut", [True, False])
def test_a_429_without_a_wait_on_the_native_path_backs_off_and_learns_no_limit(
        shortcut: bool) -> None:
    """Native routing counts no requests in flight, so its 429s come back holding
    nothing: a quota's (sidecar.core.pushback). One such 429 used to set the limit to 1
    for good (the route then looked full to the weights and never pressed on it)."""
    side = Side(shortcut)
    side.feed([entry() for _ in range(3)], 10.0)
    side.feed([_logged()], 10.5)
    router = side.app.router
    assert router.pushback.limit("a") == 64 and router.pushback.learned() == {}
    assert router.pushback.held() == {"a": 11.5} and router.pushback.quota("a", 10.5)
    assert router.counters[("outcome", "error")] == 1
    series = router.stats.series("a", S)
    assert series is not None and series.requests(10.5) == 4  # the 429 is evidence
    router.tick(12.0)
    assert router.inflight("a") == 0  # the hold is over: every slot back


def _config() -> Any:
    return parse_config({
        "clusters": [{"name": n, "address": f"127.0.0.1:{9000 + i}", "models": ["m"]}
                     for i, n in enumerate("ab")],
        "models": [{"name": "m", "candidates": ["a", "b"]}],
    }, "t.yaml")


def test_the_per_request_path_observes_the_wait() -> None:
    """An entry with a decision (here one this process did not make: the orphan path,
    which reads the route and slice from the entry) carries the wait to the router."""
    app = App.create(_config(), seed=1)
    seen: list[Observation] = []
    real = app.router.observe

    def observe(obs: Observation, now: float) -> Any:
        seen.append(obs)
        return real(obs, now)

    app.router.observe = observe  # type: ignore[method-assign]
    woken: list[int] = []
    app.on_holds = lambda: woken.append(1)  # native and hybrid mode wake the publisher
    e = _logged(retry_after_ms="2500")
    meta = e.common_properties.metadata.filter_metadata[ec.METADATA_NS].fields
    meta[ec.RID_KEY].string_value = "elsewhere-1"
    key = ec.route_key("a", "interactive", False)
    meta[ec.ROUTE_KEY].string_value = key
    meta[ec.SLICE_KEY].string_value = S.label()
    # Envoy logs the decided route's own name (a slice route's would be a misroute).
    e.common_properties.route_name = f"tailroute|{key}"
    AccessLogService(OutcomeFeed(app), app.envoy).consume(_batch(e), 5.0)
    assert [(o.cluster, o.outcome, o.status, o.retry_after_s) for o in seen] == [
        ("a", "error", 429, 2.5)]
    assert woken == [1] and app.router.pushback.held() == {"a": 7.5}
    counters = app.shell_counters()
    assert counters["retry_after:a"] == 1 and counters["retry_after_ms:a"] == 2500
    reg = build_registry(lambda: app.router, lambda: 5.0, app.shell_counters).registry
    text = generate_latest(reg).decode()
    assert 'tailroute_retry_after_total{cluster="a"} 1.0' in text
    assert 'tailroute_retry_after_seconds_total{cluster="a"} 2.5' in text


def _batch(e: al.HTTPAccessLogEntry) -> als_pb2.StreamAccessLogsMessage:
    msg = als_pb2.StreamAccessLogsMessage()
    msg.http_logs.log_entry.append(e)
    return msg


@pytest.mark.parametrize(("status", "wait", "want"), [
    (429, 3.0, 3.0),
    (429, None, None),
    (500, 3.0, None),  # only a 429's wait is a declared quota
])
def test_the_record_carries_it_into_the_observation_of_a_429(
        status: int, wait: float | None, want: float | None) -> None:
    """Outcomes come from the access-log entry in both modes (the per-request path's
    ResponseTimer only times sampled streams), so that is where the wait is read."""
    s = SliceKey("m", "c", "short", False)
    obs = observation_from_log(LogRecord(status, end_s=0.1, retry_after_s=wait
                                         if status == 429 else None), "a", s, False)
    assert obs is not None and obs.retry_after_s == want


@pytest.mark.parametrize("mode", ["extproc", "native", "hybrid"])
def test_both_bootstraps_log_the_retry_after_headers(mode: str) -> None:
    data = {"clusters": [{"name": "a", "address": "127.0.0.1:9000", "models": ["m"]}],
            "models": [{"name": "m", "candidates": ["a"]}], "routing": {"mode": mode}}
    cfg = parse_config(data, "t.yaml")
    boot = render_for_mode(cfg)
    hcm = (boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
           ["typed_config"])
    (log,) = hcm["access_log"]
    assert log["typed_config"]["additional_response_headers_to_log"] == [
        "retry-after", "retry-after-ms"]
