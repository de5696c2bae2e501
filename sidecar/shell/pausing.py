"""Steps (:mod:`sidecar.core.steps`) run on the event loop, a step at a time.

Whatever is ready runs between two steps: the ext_proc streams, whose every
message Envoy waits for at most 500 ms, the access-log streams, the admin server.
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

from sidecar.core.steps import Steps

T = TypeVar("T")


async def run_steps_async(steps: Steps[T]) -> T:
    """Drain ``steps``, letting the event loop run whatever is ready at each pause."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        await asyncio.sleep(0)
