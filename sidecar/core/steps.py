"""Work in steps: a generator that ``yield``s at pause points and ``return``s its result.

A computation over every slice or every route (native weights, the admin views)
can take longer than the event loop may stop: Envoy fails a request open when the
sidecar leaves one of its messages unanswered for 500 ms. Written as steps, the
same code runs at once where nothing waits (:func:`run_steps`: tests, the
simulator) and a step at a time on the event loop, which serves what is ready
between steps (:func:`sidecar.ops.cooperative.run_steps_async`). A pause point
carries no value and changes nothing, so both give the same result; the core
stays pure (no clock, no I/O): pausing is the caller's business.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TypeVar

T = TypeVar("T")
Steps = Generator[None, None, T]  # yields at pause points, returns the result


def run_steps(steps: Steps[T]) -> T:
    """Drain ``steps`` without pausing; its result."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
