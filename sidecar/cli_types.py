"""argparse types: a command-line number is checked where it is read.

Each type refuses text, NaN, infinities and values outside its range with a message
naming the problem, so `tailroute ... --option value` fails at once with exit 2 and
the option's name (argparse adds it), never with a traceback or a run that divides
by zero, spins or fills memory.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

MAX_CLIENTS = 1024  # concurrent clients of the benchmarks (--concurrency, --levels)


def positive_seconds(raw: str) -> float:
    """An argparse type: a finite number of seconds above 0."""
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {raw!r}") from None
    if not 0.0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, got {raw}")
    return value


def number(what: str, hi: float, lo: float = 0.0, lo_ok: bool = False
            ) -> Callable[[str], float]:
    """An argparse type: a number of ``what`` above ``lo`` (or equal to it with ``lo_ok``)
    and at most ``hi`` (finite); NaN fails."""
    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of {what}: {raw!r}") from None
        if not ((value >= lo if lo_ok else value > lo) and value <= hi):
            floor = f">= {lo:g}" if lo_ok else f"above {lo:g}"
            raise argparse.ArgumentTypeError(
                f"must be a number of {what} {floor} and at most {hi:g}, got {raw}")
        return value

    return parse


def integer(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer from ``lo`` to ``hi`` (no upper bound if None)."""
    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {raw!r}") from None
        if value < lo or (hi is not None and value > hi):
            span = f">= {lo}" if hi is None else f"from {lo} to {hi}"
            raise argparse.ArgumentTypeError(f"must be an integer {span}, got {raw}")
        return value

    return parse


def levels_type(raw: str) -> tuple[int, ...]:
    """An argparse type: ``C1,C2,...``, concurrency levels of `bench load`."""
    level = integer(1, MAX_CLIENTS)
    try:
        return tuple(level(part.strip()) for part in raw.split(","))
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(
            f"{exc} (a comma-separated list of concurrency levels, e.g. 1,16,64)") from None
