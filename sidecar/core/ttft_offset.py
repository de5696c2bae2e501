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

Sampling: while a (cluster, slice) has fewer than ``min_samples`` offsets every
streamed response is sampled (evidence first), then a ``share`` of them.

Invariants: at most ``window`` offsets per key; at most ``max_keys`` slice keys
per cluster (the oldest-created key is dropped first); offsets are >= 0.
"""

from __future__ import annotations

import random
from collections import deque
from statistics import median

from sidecar.core.types import SliceKey


class OffsetBook:
    """Median first-token offsets, per (cluster, slice) with a per-cluster fallback."""

    def __init__(self, share: float, min_samples: int, window: int = 64,
                 max_keys: int = 512) -> None:
        self.share = share
        self.min_samples = min_samples
        self.window = window
        self.max_keys = max_keys
        self._by_slice: dict[tuple[str, SliceKey], deque[float]] = {}
        self._by_cluster: dict[str, deque[float]] = {}
        self._cache: dict[tuple[str, SliceKey], float] = {}  # medians, invalidated on add
        self._keys_per_cluster: dict[str, deque[SliceKey]] = {}

    def reconfigure(self, share: float, min_samples: int) -> None:
        self.share, self.min_samples = share, min_samples
        self._cache.clear()

    def wants_sample(self, cluster: str, slice: SliceKey, rng: random.Random) -> bool:
        """Should this streamed response also be timed at its first token?"""
        ring = self._by_slice.get((cluster, slice))
        if len(ring or ()) < self.min_samples:
            return True
        return self.share > 0.0 and rng.random() < self.share

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
        self._by_cluster.setdefault(cluster, deque(maxlen=self.window)).append(value)
        # Another slice's fallback may have changed too: medians are cheap to redo.
        self._cache.clear()

    def offset(self, cluster: str, slice: SliceKey) -> float:
        """The offset to add to a first-body-byte time (seconds)."""
        key = (cluster, slice)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        ring = self._by_slice.get(key)
        if ring is None or len(ring) < self.min_samples:
            ring = self._by_cluster.get(cluster)
        value = median(ring) if ring else 0.0
        self._cache[key] = value
        return value

    def samples(self, cluster: str, slice: SliceKey) -> int:
        ring = self._by_slice.get((cluster, slice))
        return len(ring) if ring is not None else 0

    def summary(self) -> dict[str, dict[str, float | int]]:
        """Per-cluster view for /state: samples and median offset in ms."""
        return {
            c: {"samples": len(r), "median_offset_ms": round(median(r) * 1000.0, 3)}
            for c, r in self._by_cluster.items() if r
        }
