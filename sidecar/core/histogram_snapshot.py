"""A :class:`~sidecar.core.histogram.LogHistogram` as JSON-safe data and back.

The form the warm-restart snapshot (:mod:`sidecar.core.series_snapshot`) and the
fleet's wire records (:mod:`sidecar.fleet.codec`) carry::

    {"relative_accuracy": a, "zero": w0, "offset": i, "counts": [w_i, w_i+1, ...]}

only the non-empty span of buckets is written (``offset`` and ``counts`` are left
out when there is none). Reading checks what another process or an older file
could get wrong -- missing keys, weights that are negative, NaN or infinite,
buckets outside the covered range -- and says so with ``ValueError``, never
anything else. Built on the histogram's public span (:meth:`LogHistogram.span`,
:meth:`LogHistogram.from_span`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from sidecar.core.buckets import buckets
from sidecar.core.histogram import LogHistogram


def hist_to_dict(h: LogHistogram) -> dict[str, Any]:
    """JSON-safe form: only the non-empty span of buckets is written."""
    span = h.span()
    out: dict[str, Any] = {"relative_accuracy": h.relative_accuracy, "zero": h.zero}
    if span is not None:
        lo, counts = span
        nz = np.flatnonzero(counts)
        if len(nz):
            first, last = int(nz[0]), int(nz[-1])
            out["offset"] = lo + first
            out["counts"] = [float(v) for v in counts[first : last + 1]]
    return out


def hist_from_dict(data: dict[str, Any]) -> LogHistogram:
    """Inverse of :func:`hist_to_dict`; raises ``ValueError`` on malformed input."""
    try:
        accuracy = float(data["relative_accuracy"])
        geometry = buckets(accuracy)  # the accuracy is checked first, as LogHistogram does
        zero = float(data.get("zero", 0.0))
        raw = data.get("counts", [])
        offset = int(data.get("offset", 0))
        values = [float(v) for v in raw]
    except (KeyError, TypeError, OverflowError) as exc:  # Overflow: an infinite offset
        raise ValueError(f"malformed histogram snapshot: {exc}") from exc
    if any(not v >= 0 or math.isinf(v) for v in (zero, *values)):  # NaN fails v >= 0
        raise ValueError("histogram snapshot has negative or non-finite weights")
    if values and not geometry.lo_idx <= offset <= offset + len(values) - 1 <= geometry.hi_idx:
        raise ValueError("histogram snapshot buckets outside the covered range")
    counts = np.asarray(values, dtype=np.float64) if values else None
    return LogHistogram.from_span(accuracy, zero, offset, counts)
