"""First-body-byte to first-token offsets per (cluster, slice) (pure).

Envoy's access log knows when the first upstream *body* byte arrived, not when
the first *token* did. For most providers the two coincide; a provider that
opens its stream with a role-only event (``{"delta": {"role": "assistant"}}``)
sends its first byte about one prefill early. The shell times a small sampled
share of streamed responses at the first content token (the observing ext_proc
filter) and records ``offset = first token - first body byte`` here; every
other response's TTFT is then ``first body byte + median offset``.

Estimator: the median of the last ``window`` offsets of the (cluster, slice),
falling back to the cluster's own last ``window`` offsets while the slice has
fewer than ``min_samples`` (a provider's framing habit is a property of the
provider, the slice only refines it), and to 0 with no sample at all.

Blind routes: when the median offset is at least :data:`BLIND_OFFSET_S`, the
first body byte says nothing about when the token came (a role-only event sent
at once): adding a median to it would give every unsampled request the same
TTFT and erase the tail a tail-latency router exists to see. So too when only
*some* streams open early: a provider that sends ``: keep-alive`` comments only
while a request waits opens exactly its slow streams early, so the median offset
stays 0 while the first body byte caps every unsampled TTFT at the keep-alive
interval (an audit: true p95 3.0 s, seen 0.5 s). A route is blind when at least
:data:`BLIND_LATE_MIN` of the offsets its median reads are :data:`BLIND_OFFSET_S`
or more (3 % of a full window: its p97 and beyond are not in the first body
byte); an offset is exactly 0 where the first body chunk carries the first token.
Such a route's TTFT comes from its sampled requests only (each timed exactly),
and it is sampled at ``blind_share`` instead of ``share``.

Sampling: the first ``min_samples`` streamed responses of a (cluster, slice)
are sampled (evidence first), then a ``share`` of them. The first ones count
as tried whether or not they yield an offset (a route whose streams never carry
a token must not be sampled forever).

Invariants: at most ``window`` offsets per key; at most ``max_keys`` slice keys
per cluster (the oldest-created key is dropped first), and as many tried
counters; offsets are >= 0.
"""

from __future__ import annotations

import random
from collections import deque
from statistics import median
from typing import Final

from sidecar.core.types import SliceKey

BLIND_OFFSET_S: Final = 0.002  # a first-body-byte -> first-token gap that opened early
BLIND_LATE_MIN: Final = 2  # early openings among the offsets read that make a route blind


class OffsetBook:
    """Median first-token offsets, per (cluster, slice) with a per-cluster fallback."""

    def __init__(self, share: float, min_samples: int, window: int = 64,
                 max_keys: int = 512, blind_share: float = 0.25) -> None:
        self.share = share
        self.blind_share = blind_share
        self.min_samples = min_samples
        self.window = window
        self.max_keys = max_keys
        self._by_slice: dict[tuple[str, SliceKey], deque[float]] = {}
        self._by_cluster: dict[str, deque[float]] = {}
        # (median, early openings) of the offsets read, invalidated on add
        self._cache: dict[tuple[str, SliceKey], tuple[float, int]] = {}
        self._keys_per_cluster: dict[str, deque[SliceKey]] = {}
        self._tried: dict[tuple[str, SliceKey], int] = {}  # evidence-first samples handed out

    def reconfigure(self, share: float, min_samples: int, blind_share: float | None = None
                    ) -> None:
        self.share, self.min_samples = share, min_samples
        if blind_share is not None:
            self.blind_share = blind_share
        self._cache.clear()

    def wants_sample(self, cluster: str, slice: SliceKey, rng: random.Random) -> bool:
        """Should this streamed response also be timed at its first token?"""
        key = (cluster, slice)
        tried = self._tried.get(key, 0)
        if tried < self.min_samples:
            if len(self._tried) >= self.max_keys * 4:
                self._tried.clear()  # bounded: a key seen again starts over, harmlessly
            self._tried[key] = tried + 1
            return True
        share = self.blind_share if self.blind(cluster, slice) else self.share
        return share > 0.0 and rng.random() < share

    def add(self, cluster: str, slice: SliceKey, offset_s: float) -> None:
        """Record one measured offset (clamped at 0: a token cannot precede its bytes)."""
        value = max(offset_s, 0.0)
        key = (cluster, slice)
        ring = self._by_slice.get(key)
        if ring is None:
            ring = self._by_slice[key] = deque(maxlen=self.window)
            order = self._keys_per_cluster.setdefault(cluster, deque())
            order.append(slice)
            if len(order) > self.max_keys:
                old = order.popleft()
                self._by_slice.pop((cluster, old), None)
                self._cache.pop((cluster, old), None)
        ring.append(value)
        self._tried[key] = max(self._tried.get(key, 0), len(ring))
        self._by_cluster.setdefault(cluster, deque(maxlen=self.window)).append(value)
        # Another slice's fallback may have changed too: medians are cheap to redo.
        self._cache.clear()

    def _read(self, cluster: str, slice: SliceKey) -> tuple[float, int]:
        """(median offset, early openings) of the offsets the key reads (module docstring)."""
        key = (cluster, slice)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        ring = self._by_slice.get(key)
        if ring is None or len(ring) < self.min_samples:
            ring = self._by_cluster.get(cluster)
        value = (median(ring), _early(ring)) if ring else (0.0, 0)
        self._cache[key] = value
        return value

    def offset(self, cluster: str, slice: SliceKey) -> float:
        """The offset to add to a first-body-byte time (seconds)."""
        return self._read(cluster, slice)[0]

    def blind(self, cluster: str, slice: SliceKey) -> bool:
        """Is the first body byte of this route's responses no guide to the first token?"""
        return _blind(*self._read(cluster, slice))

    def samples(self, cluster: str, slice: SliceKey) -> int:
        ring = self._by_slice.get((cluster, slice))
        return len(ring) if ring is not None else 0

    def summary(self) -> dict[str, dict[str, float | int]]:
        """Per-cluster view for /state: samples and median offset in ms."""
        out: dict[str, dict[str, float | int]] = {}
        for c, r in self._by_cluster.items():
            if r:
                middle, early = median(r), _early(r)
                out[c] = {"samples": len(r), "median_offset_ms": round(middle * 1000.0, 3),
                          "early": early, "blind": _blind(middle, early)}
        return out


def _blind(middle: float, early: int) -> bool:
    """The blind-route rule (module docstring) on a median offset and its early openings."""
    return middle >= BLIND_OFFSET_S or early >= BLIND_LATE_MIN


def _early(ring: deque[float]) -> int:
    """How many of ``ring``'s offsets opened the stream early (``>= BLIND_OFFSET_S``)."""
    return sum(1 for v in ring if v >= BLIND_OFFSET_S)
