"""Hostile or foreign data in the keys a replica reads: a record another replica (a
bug, another version) or another program wrote. It must never stop a replica from
sharing the rest, never reach a decision, and always be counted."""

from __future__ import annotations

import random
from typing import Any

from sidecar.core.types import Observation, RequestInfo
from tests.test_fleet_sync import SL, Fleet

FIELD = "a\tm|interactive|short|stream\t1005000"  # route a's sub-window [1000, 1010)


def _request() -> RequestInfo:
    return RequestInfo(api="chat", model="m", stream=True, max_tokens=16, input_tokens=10,
                       klass="interactive", priority=10, tenant=None, slice=SL)


def _shared(f: Fleet, t: float = 1000.0) -> None:
    """Both replicas know each other and route a."""
    for i, r in enumerate(f.routers):
        r.observe(Observation("a", SL, "ok", ttft_s=0.1), t + i * 0.1)
    for k in range(3):
        f.cycle(t + 0.5 + 0.1 * k)


def _decides(f: Fleet, i: int, now: float) -> Any:
    return f.routers[i].decide(_request(), now, random.Random(0))


def test_a_peers_nan_weight_is_refused_and_decisions_go_on() -> None:
    """A peer's sub-window whose zero bucket weighs NaN was merged, and every later
    decision on the route raised (``cannot convert float NaN to integer``)."""
    f = Fleet(2)
    _shared(f)
    f.store.stats["r1"].fields[FIELD] = b'{"c":[1,0,0,0],"h":{"ttft":[0,NaN,1]}}'
    f.cycle(1001.0, only=[0])
    assert f.syncs[0].counters.bad_peer_records == 1
    assert _decides(f, 0, 1001.1).cluster in ("a", "b", "c")
