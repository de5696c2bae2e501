"""A timeout at the caller's own deadline is the caller's, not the route's
(sidecar.core.envoy_log.at_callers_deadline): driven through the stream handler and the
access-log feed in memory, with the entries Envoy logs when the per-request upstream
timeout (x-envoy-upstream-rq-timeout-ms, from x-tailroute-deadline-ms) passes."""

from __future__ import annotations

from dataclasses import replace

from sidecar.core.config import parse_config
from sidecar.core.envoy_log import LogRecord, at_callers_deadline
from sidecar.core.types import Observation, SliceKey
from sidecar.shell.app import App
from sidecar.shell.extproc import RouteStream
from sidecar.shell.outcomes import OutcomeFeed
from tests.conftest import base_config_dict
from tests.streamharness import POST_CHAT, body_msg, chat_request, headers_msg, metadata

UT = frozenset({"upstream_request_timeout"})


def _app() -> App:
    return App.create(parse_config(base_config_dict(stats={"observe_share": 1.0}), "t.yaml"),
                      seed=1)


def _timed_out(app: App, headers: dict[str, str], waited_s: float, n: int,
               flags: frozenset[str] = UT) -> None:
    """``n`` unary chat requests (no first-token sampling to wait for) with ``headers``,
    each answered by Envoy's 504 after ``waited_s`` (the entry Envoy logs for an upstream
    request timeout)."""
    feed = OutcomeFeed(app)
    now = 10.0
    for _ in range(n):
        s = RouteStream(app)
        s.on_message(headers_msg({**POST_CHAT, **headers}), now)
        answer = s.on_message(body_msg(chat_request(stream=False)), now)
        meta = metadata(answer)  # type: ignore[arg-type]
        feed(LogRecord(status=504, flags=flags, details="upstream_response_timeout",
                       method="POST", path="/v1/chat/completions", duration_s=waited_s,
                       upstream_tx_s=0.001, rid=s.rid, route_key=meta["route"],
                       slice_label=meta["slice"], upstream_cluster=meta["route"].split("|")[0]),
             now + waited_s)
        s.close(now + waited_s, cancelled=False)
        now += waited_s + 0.01


def test_timeouts_at_a_short_caller_deadline_eject_nothing() -> None:
    """Nine such requests quarantined two routes and restricted the third (three timeouts
    in a row each); a sidecar without latency data refuses no deadline as unreachable."""
    app = _app()
    _timed_out(app, {"x-tailroute-deadline-ms": "50"}, 0.05, 40)
    assert list(app.router.transitions) == []
    assert app.router.counters[("outcome", "timeout")] == 0
    assert app.router.counters[("outcome", "cancel")] == 40


def test_a_route_timeout_is_still_a_hard_failure() -> None:
    """Without a deadline the timeout is the class's route timeout: the fast path ejects."""
    app = _app()
    _timed_out(app, {}, 30.0, 9)
    assert app.router.counters[("outcome", "timeout")] == 9
    assert {e.new for e in app.router.transitions} & {"quarantined", "restricted"}


def test_a_caller_deadline_past_the_class_budget_is_a_timeout() -> None:
    """Waited past the class budget (agentic: 8 s end to end) before the deadline ended
    it: evidence of a slow route, as a client giving up after the budget is."""
    app = _app()
    _timed_out(app, {"x-tailroute-class": "agentic", "x-tailroute-deadline-ms": "20000"},
               20.0, 3)
    assert app.router.counters[("outcome", "timeout")] == 3


def test_only_envoys_own_timeout_at_a_shortened_budget_is_the_callers() -> None:
    obs = Observation("a", SliceKey("m", "interactive", "short", True), "timeout", 504,
                      0.05, None, 0.05, None, censored=True)
    rec = LogRecord(status=504, flags=UT)
    assert at_callers_deadline(rec, obs, 50.0, 30000.0).outcome == "cancel"
    assert at_callers_deadline(rec, obs, None, 30000.0) is obs
    upstream_504 = LogRecord(status=504)  # the provider's gateway timed out, not Envoy
    assert at_callers_deadline(upstream_504, obs, 50.0, 30000.0) is obs
    # A stream's route has no whole-answer timeout: a per-request one is the caller's
    # deadline even when longer than the class timeout; an idle timeout is the route's.
    assert at_callers_deadline(rec, obs, 90000.0, 30000.0).outcome == "cancel"
    idle = LogRecord(status=504, flags=frozenset({"stream_idle_timeout"}))
    assert at_callers_deadline(idle, obs, 50.0, 30000.0) is obs
    # An unstreamed answer's per-request timeout at the class timeout is the class's own.
    unary = replace(obs, slice=SliceKey("m", "interactive", "short", False))
    assert at_callers_deadline(rec, unary, 30000.0, 30000.0) is unary
    assert at_callers_deadline(rec, unary, 50.0, 30000.0).outcome == "cancel"
