"""The real-time load generator: the scenario's planned requests sent through Envoy
with the ``openai`` client (``AsyncOpenAI``), the fake providers' ``/control``
steps applied on the same clock.

Part of :mod:`sidecar.sim.realtime` (split for size).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from sidecar.sim.realtime_scenario import ControlStep, Planned
from sidecar.sim.scenario import Scenario

#: Wait this long past a call's class timeout before the client gives up itself
#: (Envoy's route timeout should answer 504 first).
_CLIENT_MARGIN_S: Final = 5.0
ControlFn = Callable[[str, dict[str, Any]], Any]


# ---------------------------------------------------------------- load generator


@dataclass(slots=True)
class RealCall:
    """What the client saw of one request; times in seconds since the traffic started."""

    planned: Planned
    sent: float = math.nan
    first: float | None = None
    end: float | None = None
    kind: str = "unfinished"  # ok / timeout / error / unfinished
    status: int | None = None
    cluster: str | None = None


def _prompt(n_tokens: int) -> str:
    # The sidecar counts ceil(chars / 4) input tokens: send exactly 4 per token.
    words = "lorem ipsum dolor sit amet consectetur adipiscing elit "
    reps = 4 * n_tokens // len(words) + 1
    return (words * reps)[: 4 * n_tokens]


async def _one(client: Any, rc: RealCall, t0: float, sc: Scenario) -> None:
    import openai

    p, loop = rc.planned, asyncio.get_running_loop()
    wl = p.wl
    cls = sc.config.workload_class(wl.klass)
    assert cls is not None
    timeout = wl.client.timeout or cls.slo.timeout_ms / 1000.0 + _CLIENT_MARGIN_S
    rc.sent = loop.time() - t0
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model=wl.model, messages=[{"role": "user", "content": _prompt(p.input_tokens)}],
            max_tokens=p.output_tokens, stream=wl.stream, timeout=timeout,
            extra_headers={"x-tailroute-class": wl.klass},
        )
        rc.cluster = raw.headers.get("x-fake-provider")
        rc.status = raw.status_code
        body = raw.parse()
        if wl.stream:
            async for _ in body:
                if rc.first is None:
                    rc.first = loop.time() - t0
        rc.end = loop.time() - t0
        if rc.first is None:
            rc.first = rc.end
        rc.kind = "ok"
    except openai.APIStatusError as exc:
        rc.end = loop.time() - t0
        rc.status = exc.status_code
        rc.cluster = exc.response.headers.get("x-fake-provider")
        rc.kind = "timeout" if exc.status_code == 504 else "error"
    except openai.APITimeoutError:
        rc.end, rc.kind = loop.time() - t0, "timeout"
    except openai.APIConnectionError:
        rc.end, rc.kind = loop.time() - t0, "error"


async def drive(
    base_url: str,
    sc: Scenario,
    plan: Sequence[Planned],
    controls: Sequence[ControlStep],
    control: ControlFn,
) -> tuple[list[RealCall], dict[str, float]]:
    """Send ``plan`` in real time (and apply ``controls``); wait at most ``drain_s`` after.

    Returns the calls and timing diagnostics (``max_send_lag_s``: how late the
    generator sent a request; ``wall_s``). Bounded: one request per planned
    arrival, and whatever is still open ``drain_s`` after the last arrival is
    cancelled and counted as unfinished.
    """
    import openai

    loop = asyncio.get_running_loop()
    client = openai.AsyncOpenAI(base_url=base_url, api_key="validation", max_retries=0)
    calls = [RealCall(p) for p in plan]
    tasks: list[asyncio.Task[None]] = []
    lag = 0.0

    async def controller(t0: float, steps: Sequence[ControlStep]) -> None:
        for step in steps:
            await asyncio.sleep(max(0.0, t0 + step.at_s - loop.time()))
            for payload in step.payloads:
                await asyncio.to_thread(control, step.provider, payload)

    # initial profiles before the clock starts
    for step in controls:
        if step.at_s == 0.0:
            for payload in step.payloads:
                await asyncio.to_thread(control, step.provider, payload)
    later = [s for s in controls if s.at_s > 0.0]
    t0 = loop.time()
    ctl = asyncio.create_task(controller(t0, later))
    try:
        for rc in calls:
            due = t0 + rc.planned.t
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            lag = max(lag, loop.time() - due)
            tasks.append(asyncio.create_task(_one(client, rc, t0, sc)))
        if tasks:
            await asyncio.wait(tasks, timeout=max(0.0, t0 + sc.duration + sc.drain - loop.time()))
    finally:
        for t in tasks:
            t.cancel()
        ctl.cancel()
        await asyncio.gather(*tasks, ctl, return_exceptions=True)
        await client.close()
    return calls, {"max_send_lag_s": round(lag, 4), "wall_s": round(loop.time() - t0, 3)}
