"""Counting the event loop's turns around a coroutine: did it let other tasks run?"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def while_ticking(trace: list[str], work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` beside a task noting "tick" in ``trace`` at each turn it gets (the
    work notes its own steps in the same list, so the ticks between them count turns)."""
    async def main() -> T:
        done = False

        async def ticker() -> None:
            while not done:
                trace.append("tick")
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        try:
            return await work
        finally:
            done = True
            await task

    return asyncio.run(main())
