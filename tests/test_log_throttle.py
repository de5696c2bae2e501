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
        "handler error; answering CONTINUE [47 similar lines suppressed in 2.5 s; "
        "the last of them shown]")
    assert throttle.flush() == 0


def test_flush_shows_the_last_suppressed_line_formatted(
    setup: tuple[logging.Logger, LogThrottle, Clock], caplog: pytest.LogCaptureFixture
) -> None:
    """Not the bare template: the same call site may say other things (ENOSPC, then
    EROFS), and "cannot write snapshot %s: %s" says neither."""
    log, throttle, _ = setup
    for _ in range(5):
        log.warning("cannot write snapshot %s: %s", "/var/s.json", "No space left on device")
    log.warning("cannot write snapshot %s: %s", "/var/s.json", "Read-only file system")
    assert throttle.flush() == 3
    assert caplog.records[-1].getMessage() == (
        "cannot write snapshot /var/s.json: Read-only file system [3 similar lines "
        "suppressed in 0.0 s; the last of them shown]")


def test_keys_are_bounded() -> None:
    throttle = LogThrottle(max_keys=8)
    for i in range(100):
        rec = logging.LogRecord("x", logging.WARNING, "f", 1, f"msg {i}", None, None)
        throttle.filter(rec)
    assert len(throttle._buckets) == 8


def test_a_serving_sidecar_logs_a_flood_of_bad_messages_a_few_times() -> None:
    """Through a real sidecar process: 300 out-of-order ext_proc messages."""
    import asyncio

    import grpc

    from sidecar.devtools.harness import Stack
    from sidecar.pb.envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
    from tests.conftest import base_config_dict
    from tests.streamharness import body_msg

    async def flood(port: int) -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            call = pb_grpc.ExternalProcessorStub(ch).Process()
            for _ in range(300):
                await call.write(body_msg(b"x", response=True))  # a response before any request
                await call.read()
            await call.done_writing()

    with Stack() as stack:
        stack.start_sidecar(stack.write_config(base_config_dict()))
        asyncio.run(flood(stack.ports["sidecar"]))
        stack.stop_sidecar()  # SIGTERM: the throttle reports what it still holds
        lines = [ln for ln in stack.log("sidecar").splitlines() if "unexpected" in ln]
    assert 1 <= len(lines) <= 6, lines
    assert "similar lines suppressed" in lines[-1]
