"""The scenario's ``replicas:`` field: run tailroute as k replicas splitting the traffic.

::

    replicas: 4                                  # shared state, 1 s push interval
    replicas: {count: 4, state: isolated}        # every replica learns alone
    replicas: {count: 4, state: shared, push_interval_s: 2.0}

Only the tailroute policies are replicated (the baselines stand for one
router with all the traffic). The model is in :mod:`sidecar.sim.replicas`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from sidecar.core.fields import FieldReader

ReplicaState = Literal["shared", "isolated"]


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    count: int
    state: ReplicaState = "shared"
    push_interval_s: float = 1.0


def parse_replicas(root: FieldReader, key: str = "replicas") -> ReplicaSpec | None:
    """None when absent; errors name the file and field."""
    raw: Any = root.raw(key)
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | dict):
        root.fail(f"must be a replica count or a mapping {{count, state, push_interval_s}}, "
                  f"got {raw!r}", key)
    if isinstance(raw, int):
        raw = {"count": raw}
    r = root.sub(key) if isinstance(root.raw(key), dict) else type(root)(raw, root.source,
                                                                         root.where(key))
    count = r.data.get("count")
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 64:
        r.fail(f"must be an integer in 1..64, got {count!r}", "count")
    r.used.add("count")
    state = r.data.get("state", "shared")
    if state not in ("shared", "isolated"):
        r.fail(f"must be shared or isolated, got {state!r}", "state")
    r.used.add("state")
    push = r.data.get("push_interval_s", 1.0)
    if isinstance(push, bool) or not isinstance(push, int | float) or not 0.05 <= push <= 60:
        r.fail(f"must be a number in 0.05..60, got {push!r}", "push_interval_s")
    r.used.add("push_interval_s")
    r.done()
    return ReplicaSpec(count, state, float(push))
