"""Warnings are rate-limited per call site, and the suppressed count is reported."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from sidecar.ops.log_throttle import LogThrottle, install, uninstall


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def setup(caplog: pytest.LogCaptureFixture) -> Iterator[tuple[logging.Logger, LogThrottle, Clock]]:
    clock = Clock()
    throttle = install(["tailroute.test"], LogThrottle(burst=3, every_s=10.0, clock=clock))
    caplog.set_level(logging.INFO, logger="tailroute.test")
    yield logging.getLogger("tailroute.test"), throttle, clock
    uninstall(throttle, ["tailroute.test"])


def test_burst_then_suppressed_then_reported(
    setup: tuple[logging.Logger, LogThrottle, Clock], caplog: pytest.LogCaptureFixture
) -> None:
    log, throttle, clock = setup
    for i in range(1000):
        log.warning("unexpected %s in phase %s", f"kind{i}", "routed")
    assert len(caplog.records) == 3 and throttle.suppressed_total == 997
    clock.t = 10.0  # one token back
    log.warning("unexpected %s in phase %s", "x", "y")
    assert len(caplog.records) == 4
    assert caplog.records[-1].getMessage() == (
        "unexpected x in phase y [997 similar lines suppressed in 10.0 s]")


def test_keys_are_call_sites_and_info_is_never_throttled(
    setup: tuple[logging.Logger, LogThrottle, Clock], caplog: pytest.LogCaptureFixture
) -> None:
    log, _, _ = setup
    for _ in range(10):
        log.warning("a %s", 1)
        log.warning("b %s", 1)
        log.info("fine %s", 1)
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs.count("a 1") == 3 and msgs.count("b 1") == 3 and msgs.count("fine 1") == 10


def test_flush_reports_pending_counts_once(
    setup: tuple[logging.Logger, LogThrottle, Clock], caplog: pytest.LogCaptureFixture
) -> None:
    log, throttle, clock = setup
    for _ in range(50):
        log.error("handler error; answering CONTINUE")
    clock.t = 2.5
    assert throttle.flush() == 47
    assert caplog.records[-1].getMessage() == (
        "handler error; answering CONTINUE [47 similar lines suppressed in 2.5 s]")
    assert throttle.flush() == 0


def test_keys_are_bounded() -> None:
    throttle = LogThrottle(max_keys=8)
    for i in range(100):
        rec = logging.LogRecord("x", logging.WARNING, "f", 1, f"msg {i}", None, None)
        throttle.filter(rec)
    assert len(throttle._buckets) == 8
