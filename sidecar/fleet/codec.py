"""Wire form of what replicas share, and the arithmetic on sub-window contents.

Everything is compact JSON (bytes), versioned by the ``v`` of the replica's
meta record. Field names are tab-separated (cluster names and slice labels
contain no tabs; slice labels contain ``|``)::

    stats field   "<cluster>\\t<slice label>\\t<sub-window midpoint, wall-clock ms>"
    stats value   {"c": [ok, error, timeout, cancel], "h": {"ttft": [offset, zero, n0, n1, ...]},
                   "f": cancels whose measured first token is a TTFT sample (when any)}
    route field   "<cluster>\\t<slice label>"
    health value  {"o": owner id, "w": wall-clock ms written, "r": route state (ages) or {}}
    probe value   [route field, ok] or, for a rescue, [route field, ok, sent wall-clock ms]
    load value    {"n": {cluster: in flight}, "w": wall-clock ms}  (field "_load")
    limits value  {cluster: [learned limit, last refusal wall-clock ms]}  (field "_limits")
    meta value    {"v": 1, "subwindow_s": s, "accuracy": a}

Sub-windows are named by their midpoint on the wall clock so that replicas
whose loop clocks have different origins place the same evidence in the same
local sub-window (NTP-synced hosts: to within a clock skew).

:func:`diff` and :func:`add` work on :class:`SubWindowData` as plain counts:
``diff(a, b)`` is ``a - b`` clamped at zero bucket by bucket (contents only
grow, so a negative part can only come from a lost or reordered write and is
dropped rather than turned into negative evidence).
"""

from __future__ import annotations

import json
import math
from typing import Any

from sidecar.core.config import Metric
from sidecar.core.fleet_share import COUNTERS, SubWindowData, hist_minus
from sidecar.core.histogram import LogHistogram
from sidecar.core.histogram_snapshot import hist_from_dict, hist_to_dict
from sidecar.core.stats import METRICS
from sidecar.core.types import SliceKey

WIRE_VERSION = 1
_SEP = "\t"
# No number a replica writes (counts, weights, bucket offsets, wall-clock ms) comes
# near float64's last exact integer: anything past it is not a record of ours.
_MAX_ABS = 2.0**53
# No record a replica writes comes near this (a sub-window's histograms, a load or limits
# map over every cluster: kilobytes): a larger one is not ours, and parsing 50 MB of it
# held the event loop -- and every decision waiting on it -- for about half a second.
MAX_RECORD_BYTES = 4 * 1024 * 1024


def _number(x: float) -> float:
    if not abs(x) <= _MAX_ABS:  # NaN fails too
        raise ValueError(f"number out of range: {x!r}")
    return x


def _constant(name: str) -> float:
    raise ValueError(f"{name} is not a number a replica writes")


def loads(raw: bytes) -> Any:
    """``json.loads`` for what others wrote: ValueError, never anything else, on what
    json would take but no replica writes -- NaN, infinities (``1e999`` included),
    numbers past :data:`_MAX_ABS`, nesting deep enough to exhaust the recursion limit
    (RecursionError), bytes that are not UTF-8, records over :data:`MAX_RECORD_BYTES`
    (refused unparsed). Before, those raised OverflowError or RecursionError out of the
    decoders, and one such record failed every cycle."""
    if len(raw) > MAX_RECORD_BYTES:
        raise ValueError(f"record of {len(raw)} bytes, over {MAX_RECORD_BYTES}")
    try:
        return json.loads(raw, parse_constant=_constant,
                          parse_float=lambda t: _number(float(t)),
                          parse_int=lambda t: int(_number(int(t))))
    except RecursionError as exc:
        raise ValueError("record nested too deep") from exc


def route_field(cluster: str, slice: SliceKey) -> str:
    return f"{cluster}{_SEP}{slice.label()}"


def parse_route(field: str) -> tuple[str, SliceKey]:
    """Inverse of :func:`route_field`; ValueError if malformed."""
    cluster, sep, label = field.rpartition(_SEP)
    if not sep or not cluster:
        raise ValueError(f"malformed route field {field!r}")
    return cluster, SliceKey.parse(label)


def stats_field(cluster: str, slice: SliceKey, mid_ms: int) -> str:
    return f"{cluster}{_SEP}{slice.label()}{_SEP}{mid_ms}"


def parse_stats_field(field: str) -> tuple[str, SliceKey, int]:
    route, sep, mid = field.rpartition(_SEP)
    if not sep:
        raise ValueError(f"malformed stats field {field!r}")
    cluster, slice = parse_route(route)
    return cluster, slice, int(mid)


def _num(x: float) -> float | int:
    return int(x) if x.is_integer() else x


def encode_hist(h: LogHistogram) -> list[float | int]:
    d = hist_to_dict(h)
    counts = (_num(float(c)) for c in d.get("counts", []))
    return [int(d.get("offset", 0)), _num(float(d["zero"])), *counts]


def decode_hist(raw: Any, accuracy: float) -> LogHistogram:
    if not isinstance(raw, list) or len(raw) < 2:
        raise ValueError("malformed histogram")
    return hist_from_dict({"relative_accuracy": accuracy, "offset": raw[0],
                                   "zero": raw[1], "counts": raw[2:]})


def encode_sub(sub: SubWindowData) -> bytes:
    body: dict[str, Any] = {"c": [getattr(sub, c) for c in COUNTERS],
                            "h": {m: encode_hist(h) for m, h in sub.hists.items() if h.count}}
    if sub.first:  # a key of its own: a replica from before it reads "c" as four counts
        body["f"] = sub.first
    return json.dumps(body, separators=(",", ":")).encode()


def decode_sub(raw: bytes, index: int, accuracy: float) -> SubWindowData:
    """ValueError on anything malformed (a peer's bug must not break this replica)."""
    try:
        d = loads(raw)
        counts = [int(x) for x in d["c"]]
        first = int(d.get("f", 0))
        if len(counts) != len(COUNTERS) or min(counts) < 0 or not 0 <= first <= counts[3]:
            raise ValueError("bad counters")
        hists: dict[Metric, LogHistogram] = {}
        for m, h in d.get("h", {}).items():
            if m not in METRICS:
                raise ValueError(f"unknown metric {m!r}")
            hists[m] = decode_hist(h, accuracy)
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
        raise ValueError(f"malformed sub-window: {exc!r}") from exc
    ok, error, timeout, cancel = counts
    return SubWindowData(index, ok, error, timeout, cancel, hists, first)


def _hist_diff(a: LogHistogram, b: LogHistogram | None) -> LogHistogram:
    return a.copy() if b is None or not b.count else hist_minus(a, b)


def diff(a: SubWindowData, b: SubWindowData | None) -> SubWindowData:
    """``a - b`` clamped at zero (counters and every histogram bucket)."""
    if b is None:
        return SubWindowData(a.index, a.ok, a.error, a.timeout, a.cancel,
                             {m: h.copy() for m, h in a.hists.items()}, a.first)  # fmt: skip
    ok, error, timeout, cancel = (max(getattr(a, c) - getattr(b, c), 0) for c in COUNTERS)
    hists: dict[Metric, LogHistogram] = {}
    for m, h in a.hists.items():
        d = _hist_diff(h, b.hists.get(m))
        if d.count:
            hists[m] = d
    return SubWindowData(a.index, ok, error, timeout, cancel, hists,
                         min(max(a.first - b.first, 0), cancel))


def add(acc: SubWindowData | None, d: SubWindowData) -> SubWindowData:
    """``acc + d`` (a new object when ``acc`` is None; else ``acc`` updated in place)."""
    if acc is None:
        return diff(d, None)
    for c in COUNTERS:
        setattr(acc, c, getattr(acc, c) + getattr(d, c))
    acc.first += d.first
    for m, h in d.hists.items():
        cur = acc.hists.get(m)
        if cur is None:
            acc.hists[m] = h.copy()
        else:
            cur.merge(h)
    return acc


def encode_meta(subwindow_s: float, accuracy: float) -> bytes:
    return json.dumps({"v": WIRE_VERSION, "subwindow_s": subwindow_s,
                       "accuracy": accuracy}).encode()


def decode_meta(raw: bytes | None) -> tuple[float, float] | None:
    """``(subwindow_s, accuracy)`` of a peer, or None if absent or another wire version."""
    if raw is None:
        return None
    try:
        d = loads(raw)
        if d.get("v") != WIRE_VERSION:
            return None
        s, a = float(d["subwindow_s"]), float(d["accuracy"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return (s, a) if s > 0 and 0 < a < 1 and math.isfinite(s) else None


def encode_health(owner: str, wall_ms: int, state: dict[str, Any]) -> bytes:
    return json.dumps({"o": owner, "w": wall_ms, "r": state}, separators=(",", ":")).encode()


def decode_health(raw: bytes) -> tuple[str, int, dict[str, Any]]:
    try:
        d = loads(raw)
        owner, wall, state = str(d["o"]), int(d["w"]), d["r"]
        if not isinstance(state, dict):
            raise ValueError("state is not a mapping")
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
        raise ValueError(f"malformed health entry: {exc!r}") from exc
    return owner, wall, state


LOAD_FIELD = "_load"  # a replica's in-flight requests per cluster, in its stats hash


def encode_load(wall_ms: int, counts: dict[str, int], low: dict[str, int] | None = None
                ) -> bytes:
    """``{"n": {cluster: in flight}, "l": {cluster: of those, less important than
    shed_below_priority}, "w": wall-clock ms}``, rewritten every push (``w`` tells
    peers how fresh it is). ``l`` only when some are: older replicas read ``n`` and
    ``w`` alone, and a record without ``l`` reads as none low."""
    d: dict[str, object] = {"n": counts, "w": wall_ms}
    if low:
        d["l"] = low
    return json.dumps(d, separators=(",", ":"), sort_keys=True).encode()


def decode_load(raw: bytes) -> tuple[int, dict[str, int], dict[str, int]]:
    """``(wall ms, in flight, of those low)``; ValueError on anything malformed."""
    try:
        d = loads(raw)
        counts = {str(c): int(n) for c, n in d["n"].items() if int(n) > 0}
        low = {str(c): int(n) for c, n in d.get("l", {}).items() if int(n) > 0}
        return int(d["w"]), counts, low
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"malformed load record: {exc!r}") from exc


LIMITS_FIELD = "_limits"  # a replica's learned concurrency limits (fleet.limits_sync)


def encode_limits(limits: dict[str, tuple[float, int]]) -> bytes:
    """``{cluster: [limit, last refusal wall-clock ms]}``."""
    return json.dumps({c: [_num(float(lim)), at] for c, (lim, at) in limits.items()},
                      separators=(",", ":"), sort_keys=True).encode()


def decode_limits(raw: bytes) -> dict[str, tuple[float, int]]:
    """ValueError on anything malformed, a limit below 1 or not finite included."""
    try:
        d = loads(raw)
        out = {str(c): (float(v[0]), int(v[1])) for c, v in d.items()}
    except (TypeError, ValueError, AttributeError, IndexError, KeyError) as exc:
        raise ValueError(f"malformed limits record: {exc!r}") from exc
    if any(not (math.isfinite(lim) and lim >= 1) for lim, _ in out.values()):
        raise ValueError("a limit below 1 or not finite")
    return out


HOLDS_FIELD = "_holds"  # a replica's holds by declared waits (fleet.limits_sync)


QUOTAS_FIELD = "_quotas"  # clusters whose 429s a replica reads as a quota's (same module)


def encode_times(times: dict[str, int]) -> bytes:
    """``{cluster: wall-clock ms}``: a hold's end (``HOLDS_FIELD``) or a quota's last
    429 (``QUOTAS_FIELD``)."""
    return json.dumps(times, separators=(",", ":"), sort_keys=True).encode()


def decode_times(raw: bytes, what: str) -> dict[str, int]:
    """ValueError, naming ``what`` record, on anything malformed."""
    try:
        d = loads(raw)
        return {str(c): int(v) for c, v in d.items()}
    except (TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise ValueError(f"malformed {what} record: {exc!r}") from exc


def encode_holds(holds: dict[str, int]) -> bytes:
    """``{cluster: end of the hold, wall-clock ms}``."""
    return encode_times(holds)


def decode_holds(raw: bytes) -> dict[str, int]:
    """ValueError on anything malformed."""
    return decode_times(raw, "holds")


def encode_probe(route: str, ok: bool, sent_ms: int | None = None) -> bytes:
    """A probe result for the route's owner; ``sent_ms`` (wall clock) only for a rescue,
    so that a replica of an older version still reads every other result."""
    return json.dumps([route, ok] if sent_ms is None else [route, ok, sent_ms]).encode()


def decode_probe(raw: bytes) -> tuple[str, bool, int | None]:
    try:
        route, ok, *rest = loads(raw)
        sent = rest[0] if len(rest) == 1 else None
        if (not isinstance(route, str) or not isinstance(ok, bool) or len(rest) > 1
                or (rest and (type(sent) is not int))):
            raise ValueError("bad probe types")
    except (TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"malformed probe result: {exc!r}") from exc
    return route, ok, sent
