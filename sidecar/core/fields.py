"""Strict reading of nested YAML mappings with errors naming the file and the field path.

:class:`FieldReader` walks one mapping while remembering where it is, so every
problem raises an error reading ``<source>: <field path>: <problem>``, e.g.
``tailroute.yaml: clusters[1].max_concurrency: must be >= 1, got 0``. Keys it
was not asked for are reported by :meth:`FieldReader.done`: a typo must not
silently fall back to a default.

:class:`ConfigReader` adds the typed readers of the tailroute config file; the
policy-lab scenario reader (:mod:`sidecar.sim.validate`) adds its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, NoReturn, Self


class ConfigError(ValueError):
    """A configuration mistake; the message names the file and the field path."""


class FieldReader:
    """Walks one mapping while remembering its field path, for precise errors."""

    error: ClassVar[type[ConfigError]] = ConfigError  # what :meth:`fail` raises

    def __init__(self, data: Any, source: str, path: str) -> None:
        self.source = source
        self.path = path
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            self.fail(f"expected a mapping, got {type(data).__name__}")
        self.data: Mapping[str, Any] = data
        self.used: set[str] = set()

    def where(self, key: str | None = None) -> str:
        """The field path of ``key`` under this mapping (of the mapping itself if None)."""
        if key is None:
            return self.path or "<root>"
        return f"{self.path}.{key}" if self.path else key

    def fail(self, problem: str, key: str | None = None) -> NoReturn:
        raise self.error(f"{self.source}: {self.where(key)}: {problem}")

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def missing(self, key: str) -> bool:
        """Whether ``key`` counts as not given: absent (a reader may count null too)."""
        return key not in self.data

    def raw(self, key: str, default: Any = None) -> Any:
        self.used.add(key)
        return self.data.get(key, default)

    def sub(self, key: str) -> Self:
        self.used.add(key)
        return type(self)(self.data.get(key), self.source, self.where(key))

    def item(self, key: str, index: int, value: Any) -> Self:
        return type(self)(value, self.source, f"{self.where(key)}[{index}]")

    def done(self) -> None:
        extra = sorted(str(k) for k in set(self.data) - self.used)
        if extra:
            self.fail(f"unknown field(s): {', '.join(extra)}")

    def bool_(self, key: str, default: bool) -> bool:
        self.used.add(key)
        v = self.data.get(key, default)
        if not isinstance(v, bool):
            self.fail(f"must be true or false, got {v!r}", key)
        return v

    def list_(self, key: str, required: bool = False) -> list[Any]:
        self.used.add(key)
        if self.missing(key):
            if required:
                self.fail("required field is missing", key)
            return []
        v = self.data[key]
        if not isinstance(v, list):
            self.fail(f"must be a list, got {type(v).__name__}", key)
        return v


class ConfigReader(FieldReader):
    """The typed readers of the tailroute config file (:mod:`sidecar.core.config_parse`).

    A key given as null is not missing: it must then have the right type (only
    :meth:`opt_str` accepts null).
    """

    def str_(self, key: str, default: str | None = None, required: bool = False) -> str:
        self.used.add(key)
        if self.missing(key):
            if required or default is None:
                self.fail("required field is missing", key)
            return default
        v = self.data[key]
        if not isinstance(v, str) or (required and not v):
            self.fail(f"must be a non-empty string, got {v!r}", key)
        return v

    def opt_str(self, key: str) -> str | None:
        self.used.add(key)
        v = self.data.get(key)
        if v is not None and not isinstance(v, str):
            self.fail(f"must be a string, got {v!r}", key)
        return v

    def num(
        self,
        key: str,
        default: float,
        lo: float | None = None,
        hi: float | None = None,
        integer: bool = False,
    ) -> Any:
        self.used.add(key)
        v = self.data.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int | float):
            self.fail(f"must be a number, got {v!r}", key)
        if integer and not float(v).is_integer():
            self.fail(f"must be an integer, got {v!r}", key)
        if lo is not None and v < lo:
            self.fail(f"must be >= {lo}, got {v!r}", key)
        if hi is not None and v > hi:
            self.fail(f"must be <= {hi}, got {v!r}", key)
        return int(v) if integer else float(v)

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> Any:
        self.used.add(key)
        v = self.data.get(key, default)
        if v not in choices:
            self.fail(f"must be one of {', '.join(choices)}; got {v!r}", key)
        return v
