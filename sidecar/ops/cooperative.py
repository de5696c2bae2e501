"""Admin views built a slice at a time, so a big one never holds the event loop.

The admin server shares the event loop with the ext_proc streams, whose every
message Envoy waits for at most its ``message_timeout`` (500 ms in the rendered
bootstrap) before it fails the request open. A view over every cluster x slice
(``/metrics``, ``/state``, the status page's samples) costs about 0.1 ms per
route; with thousands of routes (100 models on 4 of 16 clusters, 12 slices each:
4,800) one scrape held the loop for 0.7-1.2 s, so every request in flight then
was served undecided, on each scrape.

So the views are written as steps (:mod:`sidecar.core.steps`: generators that
``yield`` between slices of :data:`STEP_ROUTES` routes and ``return`` the view):

* :func:`~sidecar.core.steps.run_steps` drains one at once (tests, the CLI);
* :func:`~sidecar.shell.pausing.run_steps_async` gives the loop a turn at every
  pause point.

A step reads the clock again after each pause (``clock()``), so each route is read
at the time its slice is built (a series never folds backwards: ``RouteStats._sync``
keeps its newest sub-window). The view's ``now`` is the time it started. Between
pauses the router may change (new routes, a reload replacing it): a view walks a list
of the routes taken at its start and reads the router object it started with, so it
never fails on that, and what it shows is each route as of its own step.

Encoding the finished view is done the same way. JSON (:func:`json_steps`): the
long lists a slice at a time on the loop -- ``json.dumps`` is C code that keeps
the GIL for the whole document (53 ms for the 2.9 MB ``/state`` above), so a
worker thread would stop the loop as surely. Prometheus text
(:func:`encode_off_loop`): the client's encoder is Python, so in a worker thread
the interpreter hands the loop the GIL back every few milliseconds; the loop
slows while it runs but never stops.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Collection
from typing import Any, Final, TypeVar

from sidecar.core.steps import Steps, run_steps
from sidecar.shell.pausing import run_steps_async

__all__ = ["STEP_ROUTES", "Steps", "encode_off_loop", "json_steps", "run_steps",
           "run_steps_async"]

T = TypeVar("T")
STEP_ROUTES: Final = 64  # routes per step: under 10 ms of the loop at the costliest view


async def encode_off_loop(encode: Callable[[], T]) -> T:
    """``encode()`` in a worker thread: it must read only data no one changes meanwhile."""
    return await asyncio.to_thread(encode)


def json_steps(data: dict[str, Any], lists: Collection[str]) -> Steps[bytes]:
    """``json.dumps(data).encode()``, byte for byte, pausing every
    :data:`STEP_ROUTES` items of the top-level lists named in ``lists``."""
    parts = []
    for key, value in data.items():
        if key in lists and isinstance(value, list):
            items: list[str] = []
            for start in range(0, len(value), STEP_ROUTES):
                items += map(json.dumps, value[start:start + STEP_ROUTES])
                yield
            text = "[" + ", ".join(items) + "]"
        else:
            text = json.dumps(value)
        parts.append(f"{json.dumps(key)}: {text}")
    return ("{" + ", ".join(parts) + "}").encode()
