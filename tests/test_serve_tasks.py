"""A background loop that dies of an exception stops the process loudly (exit 1),
instead of leaving a sidecar that answers while its ticks or reloads have stopped."""

from __future__ import annotations

import asyncio
import logging

import pytest

from sidecar.serve import _watch_tasks


async def _bug() -> None:
    await asyncio.sleep(0)
    raise RuntimeError("a bug in a loop")


async def _until(stop: asyncio.Event) -> None:
    await stop.wait()


def test_a_dead_loop_is_logged_and_stops_everything(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> list[str]:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(_bug(), name="tick"),
                 asyncio.create_task(_until(stop), name="config watcher")]
        died = _watch_tasks(tasks, stop)
        await asyncio.wait_for(stop.wait(), timeout=10)  # bounds a broken run only
        await asyncio.gather(*tasks, return_exceptions=True)
        return died

    with caplog.at_level(logging.CRITICAL, logger="tailroute"):
        died = asyncio.run(main())
    assert died == ["tick"]
    (record,) = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert "'tick' died" in record.getMessage() and "a bug in a loop" in record.getMessage()


def test_loops_that_end_on_stop_are_not_deaths() -> None:
    async def main() -> list[str]:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(_until(stop), name="tick")]
        died = _watch_tasks(tasks, stop)
        stop.set()
        await asyncio.gather(*tasks)
        return died

    assert asyncio.run(main()) == []
