"""Distributions used by scenarios: lognormal latencies and token counts.

A lognormal is specified the way operators talk about latency, by its median
and its p99::

    mu    = ln(median)
    sigma = ln(p99 / median) / z99          (z99 = 2.3263, the normal 0.99 quantile)

Samples are capped at ``TAIL_CAP x p99`` (the same cap as the fake provider):
the cap only bites beyond ~p99.99 and keeps one freak sample from dominating a
short run. A plain number means a fixed value (sigma = 0).

Samples are drawn as ``median * exp(sigma * z)`` with ``z`` a standard normal,
so a caller can pre-draw ``z`` (the oracle does) and apply it later.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Final, Protocol

import numpy as np
import numpy.typing as npt

Z99: Final = 2.3263478740408408
TAIL_CAP: Final = 10.0
_BLOCK: Final = 4096


class Variates(Protocol):
    """What the simulator draws from (``random.Random`` and :class:`Stream` both fit)."""

    def random(self) -> float: ...

    def gauss(self, mu: float = 0.0, sigma: float = 1.0) -> float: ...

    def expovariate(self, lambd: float = 1.0) -> float: ...


class Stream:
    """A named, reproducible stream of variates, generated in numpy blocks.

    ``Stream("7:provider:a")`` always yields the same sequence (PCG64 seeded
    from a SHA-256 of the name), independent of every other stream. Drawing
    from pre-generated blocks costs a fraction of ``random.gauss``, which
    matters on the per-request path.
    """

    __slots__ = ("_gen", "_n", "_ni", "_r", "_ri", "_u", "_ui", "_w", "_wi")

    def __init__(self, name: str) -> None:
        seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
        self._gen = np.random.Generator(np.random.PCG64(seed))
        self._u: list[float] = []
        self._ui = 0
        self._n: list[float] = []
        self._ni = 0
        self._r: list[list[float]] = []
        self._ri = 0
        self._w: list[list[float]] = []
        self._wi = 0

    def random(self) -> float:
        """Uniform in [0, 1)."""
        i = self._ui
        if i >= len(self._u):
            self._u = self._gen.random(_BLOCK).tolist()
            i = 0
        self._ui = i + 1
        return self._u[i]

    def gauss(self, mu: float = 0.0, sigma: float = 1.0) -> float:
        i = self._ni
        if i >= len(self._n):
            self._n = self._gen.standard_normal(_BLOCK).tolist()
            i = 0
        self._ni = i + 1
        return mu + sigma * self._n[i]

    def row(self) -> list[float]:
        """Five variates at once: ``[u, u, z, z, u]`` (u uniform [0, 1), z standard normal).

        One call per request instead of five: the provider's service draws.
        """
        i = self._ri
        if i >= len(self._r):
            self._r = service_block(self._gen, 5)
            i = 0
        self._ri = i + 1
        row: list[float] = self._r[i]
        return row

    def wide_row(self) -> list[float]:
        """Seven variates: ``[u, u, z, z, u, u, u]`` -- :meth:`row` plus two uniforms that
        pick the part of a heavy-tailed TTFT and TPOT distribution
        (:mod:`sidecar.sim.heavy`). Only providers that need them draw wide rows, so
        the streams of scenarios without heavy tails are unchanged."""
        i = self._wi
        if i >= len(self._w):
            self._w = service_block(self._gen, 7)
            i = 0
        self._wi = i + 1
        row: list[float] = self._w[i]
        return row

    def normals(self, n: int) -> npt.NDArray[np.float64]:
        """``n`` standard normals as an array (vectorised sampling)."""
        return self._gen.standard_normal(n)

    def expovariate(self, lambd: float = 1.0) -> float:
        return -math.log(1.0 - self.random()) / lambd

    def randrange(self, n: int) -> int:
        return min(int(self.random() * n), n - 1)


def service_array(g: np.random.Generator, width: int) -> npt.NDArray[np.float64]:
    """``_BLOCK`` rows of service variates ``[u, u, z, z, u, ...]`` (``width`` >= 5)."""
    arr = np.empty((_BLOCK, width))
    arr[:, 0:2] = g.random((_BLOCK, 2))
    arr[:, 2:4] = g.standard_normal((_BLOCK, 2))
    arr[:, 4:width] = g.random((_BLOCK, width - 4))
    return arr


def service_block(g: np.random.Generator, width: int) -> list[list[float]]:
    """:func:`service_array` as Python rows, for a stream that uses every row in turn."""
    rows: list[list[float]] = service_array(g, width).tolist()
    return rows


class KeyedRows:
    """Service variates addressed by a request's key instead of drawn in sequence.

    Row ``k`` of ``KeyedRows("7:service:a:chat")`` is always the same, whatever
    was drawn before: rows come in blocks of 4096, and block ``b`` is generated
    from its own PCG64 seeded with a SHA-256 of ``f"{name}:{b}"``. A provider
    keys each attempt by (its workload, the call's policy-independent key, the
    attempt number), so the same request meets the same luck on a provider
    under every policy (common random numbers for service, not only for
    arrivals) and the oracle sees exactly the draws any policy would get.
    Rows are :meth:`Stream.row` (5 variates) or :meth:`Stream.wide_row` (7).

    A block stays a numpy array and a row becomes Python floats when asked for.
    Its keys are every call's, so a table (one provider, workload and attempt
    number) uses only the rows of its own calls: converting whole blocks made
    about 3 rows per simulated request, and the ~60k lists the kept blocks held
    were most of what the cyclic garbage collector traversed in a run
    (docs/policy-lab.md, "Service draws kept as arrays").
    """

    __slots__ = ("_blocks", "name", "width")
    _KEEP = 3  # blocks kept (keys arrive in order); an older one is regenerated if asked for

    def __init__(self, name: str, width: int = 5) -> None:
        self.name = name
        self.width = width
        self._blocks: dict[int, npt.NDArray[np.float64]] = {}

    def row(self, key: int) -> list[float]:
        b = key >> 12
        blk = self._blocks.get(b)
        if blk is None:
            blk = self._block(b)
        row: list[float] = blk[key & 4095].tolist()
        return row

    def _block(self, b: int) -> npt.NDArray[np.float64]:
        blocks = self._blocks
        if len(blocks) >= self._KEEP:
            del blocks[min(blocks)]
        seed = int.from_bytes(hashlib.sha256(f"{self.name}:{b}".encode()).digest()[:8],
                              "little")
        blk = blocks[b] = service_array(np.random.Generator(np.random.PCG64(seed)), self.width)
        return blk


@dataclass(frozen=True, slots=True)
class Lognormal:
    """A lognormal from median and p99 (same unit); ``sigma == 0`` is a fixed value."""

    median: float
    p99: float
    sigma: float = field(init=False, compare=False)
    cap: float = field(init=False, compare=False)

    def __post_init__(self) -> None:
        sigma = 0.0
        if self.p99 > self.median > 0:
            sigma = math.log(self.p99 / self.median) / Z99
        object.__setattr__(self, "sigma", sigma)
        object.__setattr__(self, "cap", TAIL_CAP * max(self.p99, self.median))

    def at(self, z: float) -> float:
        """The value at standard-normal deviate ``z`` (capped)."""
        s = self.sigma
        if s == 0.0:
            return self.median
        v = self.median * math.exp(s * z)
        return v if v < self.cap else self.cap

    def sample(self, rng: Variates) -> float:
        return self.at(rng.gauss(0.0, 1.0))

    def scaled(self, factor: float) -> Lognormal:
        return Lognormal(self.median * factor, self.p99 * factor)

    def to_json(self) -> dict[str, float]:
        return {"median": self.median, "p99": self.p99}


@dataclass(frozen=True, slots=True)
class TokenDist:
    """Token counts: a lognormal rounded to an integer in ``[lo, hi]``."""

    dist: Lognormal
    lo: int = 1
    hi: int = 1_000_000

    def sample(self, rng: Variates) -> int:
        v = round(self.dist.sample(rng))
        return self.hi if v > self.hi else (self.lo if v < self.lo else v)

    def block(self, rng: Stream, n: int) -> list[int]:
        """``n`` samples at once, distributed exactly like :meth:`sample`."""
        d = self.dist
        if d.sigma == 0.0:
            v = np.full(n, d.median)
        else:
            v = np.minimum(d.median * np.exp(d.sigma * rng.normals(n)), d.cap)
        out: list[int] = np.clip(np.rint(v), self.lo, self.hi).astype(np.int64).tolist()
        return out

    @property
    def median(self) -> int:
        return max(self.lo, min(self.hi, round(self.dist.median)))
