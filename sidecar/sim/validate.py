"""Strict reading of scenario YAML with errors naming the file and the field path.

Same contract as :mod:`sidecar.core.config` (built on its
:class:`~sidecar.core.fields.FieldReader`): every problem raises
:class:`ScenarioError` (a :class:`~sidecar.core.config.ConfigError`) whose
message reads ``<file>: <field path>: <problem>``, e.g.
``burst.yaml: workloads[0].arrival.rate_per_s: must be > 0, got 0``.
Unknown keys are errors: a typo must not silently fall back to a default.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from sidecar.core.fields import ConfigError, FieldReader


class ScenarioError(ConfigError):
    """A mistake in a scenario file; the message names the file and the field path."""


class Reader(FieldReader):
    """Walks one mapping while remembering its field path (see module docstring).

    Unlike the config file's reader, a key given as null counts as missing.
    """

    error = ScenarioError

    def missing(self, key: str) -> bool:
        return not self.has(key)

    # ------------------------------------------------------------ scalars

    def num(
        self,
        key: str,
        default: float | None = None,
        lo: float | None = None,
        hi: float | None = None,
        gt: float | None = None,
    ) -> float:
        """A number; ``default=None`` makes the field required."""
        self.used.add(key)
        if self.missing(key):
            if default is None:
                self.fail("required field is missing", key)
            return float(default)
        v = self.data[key]
        if isinstance(v, bool) or not isinstance(v, int | float):
            self.fail(f"must be a number, got {v!r}", key)
        if v != v or v in (float("inf"), float("-inf")):
            self.fail(f"must be a finite number, got {v!r}", key)
        try:
            f = float(v)
        except OverflowError:  # an integer beyond any float: a typo, not a number we use
            self.fail("must be a finite number, got an integer too large for one", key)
        if lo is not None and v < lo:
            self.fail(f"must be >= {lo:g}, got {v!r}", key)
        if gt is not None and v <= gt:
            self.fail(f"must be > {gt:g}, got {v!r}", key)
        if hi is not None and v > hi:
            self.fail(f"must be <= {hi:g}, got {v!r}", key)
        return f

    def opt_num(
        self, key: str, lo: float | None = None, hi: float | None = None, gt: float | None = None
    ) -> float | None:
        self.used.add(key)
        if self.missing(key):
            return None
        return self.num(key, 0.0, lo=lo, hi=hi, gt=gt)

    def int_(self, key: str, default: int | None = None, lo: int | None = None,
             hi: int | None = None) -> int:
        v = self.num(key, None if default is None else float(default), lo=lo, hi=hi)
        if not v.is_integer():
            self.fail(f"must be an integer, got {self.data.get(key)!r}", key)
        return int(v)

    def opt_int(self, key: str, lo: int | None = None, hi: int | None = None) -> int | None:
        self.used.add(key)
        if self.missing(key):
            return None
        return self.int_(key, 0, lo=lo, hi=hi)

    def str_(self, key: str, default: str | None = None) -> str:
        """A non-empty string; ``default=None`` makes the field required."""
        self.used.add(key)
        if self.missing(key):
            if default is None:
                self.fail("required field is missing", key)
            return default
        v = self.data[key]
        if not isinstance(v, str) or not v:
            self.fail(f"must be a non-empty string, got {v!r}", key)
        return v

    def opt_str(self, key: str) -> str | None:
        self.used.add(key)
        if self.missing(key):
            return None
        return self.str_(key)

    def choice(self, key: str, default: str | None, choices: tuple[str, ...]) -> str:
        self.used.add(key)
        v = self.data.get(key, default)
        if v is None:
            self.fail(f"required field is missing (one of {', '.join(choices)})", key)
        if v not in choices:
            self.fail(f"must be one of {', '.join(choices)}; got {v!r}", key)
        return cast(str, v)

    def str_list(self, key: str) -> tuple[str, ...]:
        out: list[str] = []
        for i, v in enumerate(self.list_(key)):
            if not isinstance(v, str) or not v:
                self.fail(f"must be a non-empty string, got {v!r}", f"{key}[{i}]")
            out.append(v)
        return tuple(out)

    def mapping(self, key: str, required: bool = False) -> Mapping[str, Any]:
        self.used.add(key)
        v = self.data.get(key)
        if v is None:
            if required:
                self.fail("required field is missing", key)
            return {}
        if not isinstance(v, Mapping):
            self.fail(f"must be a mapping, got {type(v).__name__}", key)
        return cast(Mapping[str, Any], v)
