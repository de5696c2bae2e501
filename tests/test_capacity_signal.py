"""Held requests are woken one at a time, in the admission queue's service order: after
a slot frees only the first waiter can take it (sidecar.core.admission_queue), and
waking all of them made every one re-ask -- 64 re-asks per closed stream under
overload (sidecar.shell.admission.CapacitySignal)."""

from __future__ import annotations

import asyncio

from sidecar.core.admission_queue import AdmissionQueue
from sidecar.shell.admission import CapacitySignal


def _queue() -> AdmissionQueue:
    q = AdmissionQueue(8)
    q.join("low-old", priority=1, now=0.0, until=60.0)
    q.join("high", priority=10, now=1.0, until=60.0)
    q.join("low-new", priority=1, now=2.0, until=60.0)
    return q


def _order(q: AdmissionQueue) -> CapacitySignal:
    return CapacitySignal(lambda t: (w.order() if (w := q.get(t)) is not None else None))


def test_a_wake_goes_to_the_first_waiter_in_service_order_only() -> None:
    q = _queue()
    woken: list[str] = []

    async def main() -> None:
        signal = _order(q)

        async def hold(ticket: str) -> None:
            await signal.wait(ticket, 30.0)
            woken.append(ticket)

        tasks = [asyncio.create_task(hold(t)) for t in ("low-new", "low-old", "high")]
        for _ in range(3):
            await asyncio.sleep(0)  # all three registered
        for expected in ([], ["high"], ["high", "low-old"], ["high", "low-old", "low-new"]):
            for _ in range(3):
                await asyncio.sleep(0)
            assert woken == expected
            assert signal.waiting == (len(expected) < 3)
            signal.notify()  # one freed slot: one waiter
        await asyncio.gather(*tasks)

    asyncio.run(main())


def test_a_ticket_the_queue_no_longer_holds_goes_first_and_waits_end_by_deadline() -> None:
    q = _queue()
    woken: list[str] = []

    async def main() -> None:
        signal = _order(q)

        async def hold(ticket: str, timeout: float) -> None:
            await signal.wait(ticket, timeout)
            woken.append(ticket)

        gone = asyncio.create_task(hold("gone", 30.0))  # e.g. pruned after its deadline
        high = asyncio.create_task(hold("high", 30.0))
        short = asyncio.create_task(hold("low-old", 0.01))  # its own deadline wakes it
        await short
        assert woken == ["low-old"]
        signal.notify()
        await gone
        assert woken == ["low-old", "gone"] and not high.done()
        signal.notify()
        await high
        assert not signal.waiting

    asyncio.run(main())
