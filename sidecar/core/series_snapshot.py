"""A series' evidence as JSON-safe data and back (warm restart, handover).

Times are stored as ages relative to the ``now`` of the snapshot, so a new
process (a new monotonic clock) rebuilds the same window at its own ``now``:
each live sub-window by its age, with its outcome counters and one histogram
snapshot per measured metric; the last observation's age; and the fence (the
sub-window before which nothing is evidence) as an age too. The decayed window,
the shift tests and the caches are not stored: they are rebuilt from the ring.
"""

from __future__ import annotations

import math
from typing import Any, Final

from sidecar.core.config import StatsConfig
from sidecar.core.histogram_snapshot import hist_from_dict, hist_to_dict
from sidecar.core.series import RouteStats
from sidecar.core.subwindow import COUNTERS, NEVER, as_metric

_MAX_COUNT: Final = 2**53  # counts above this are not requests anyone served


def series_to_dict(rs: RouteStats, now: float) -> dict[str, Any]:
    """JSON-safe snapshot of ``rs``; times as ages relative to ``now``."""
    subs = [
        {"age": age, **{c: getattr(s, c) for c in COUNTERS},
         **({"first": s.first} if s.first else {}),  # absent from older snapshots
         "hists": {m: hist_to_dict(h) for m, h in s.hists.items() if h.count}}
        for age, s in rs.live(now)
        if s.requests or s.cancel
    ]  # fmt: skip
    # Not below 0: a snapshot built in steps reads a route observed since its ``now``.
    age = None if rs.last_seen is None else max(0.0, now - rs.last_seen)
    out: dict[str, Any] = {"last_seen_age": age, "subwindows": subs}
    if rs.fence_index != NEVER and rs.window.current_index is not None:
        out["fence_age"] = rs.window.current_index - rs.fence_index
    return out


def series_from_dict(
    data: dict[str, Any], cfg: StatsConfig, now: float, relative_accuracy: float = 0.02
) -> RouteStats:
    """Rebuild a :func:`series_to_dict` snapshot as if taken at ``now`` (ages kept);
    ``KeyError``/``TypeError``/``ValueError`` on malformed data."""
    rs = RouteStats(cfg, relative_accuracy)
    k = rs.window.advance(now)
    age = data.get("last_seen_age")
    if age is not None and not math.isfinite(float(age)):
        raise ValueError(f"last_seen_age is not a finite number: {age!r}")
    rs.last_seen = None if age is None else now - float(age)
    for sub in data.get("subwindows", []):
        if (a := int(sub["age"])) < 0:
            raise ValueError(f"a sub-window from the future (age {a})")
        if a >= cfg.subwindows:
            continue  # aged out while the process was down
        slot = rs.window.reset_slot(k - a)
        for c in COUNTERS:
            if not 0 <= (n := int(sub[c])) < _MAX_COUNT:
                raise ValueError(f"sub-window count {c} out of range: {n}")
            setattr(slot, c, n)
        if not 0 <= (n := int(sub.get("first", 0))) <= slot.cancel:
            raise ValueError(f"sub-window count first out of range: {n}")
        slot.first = n
        for m, raw in sub.get("hists", {}).items():
            slot.hists[as_metric(m)] = h = hist_from_dict(raw)
            if h.relative_accuracy != relative_accuracy:
                raise ValueError("snapshot histogram accuracy differs from the store's")
    if data.get("fence_age") is not None:
        rs.fence_index = k - int(data["fence_age"])
        rs.span.unjudged = rs.fence_index
    return rs
