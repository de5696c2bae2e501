"""A faster ``__init__`` for the frozen slotted dataclasses made once per request.

``@dataclass(frozen=True, slots=True)`` generates an ``__init__`` that stores
every field through ``object.__setattr__`` looked up anew per field; for the
value types the decision path creates per request (requests, observations,
decisions, pipeline results) that alone cost several microseconds.
:func:`fast_init` replaces it with one that stores through the slots' own
member descriptors, bound once. Everything else -- immutability
(``__setattr__`` still raises), ``dataclasses.replace``, ``fields``, ``asdict``,
equality, hashing, defaults and default factories -- is the dataclass's own.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")
_MISSING = dataclasses.MISSING


def fast_init(cls: type[T]) -> type[T]:
    """Give a frozen ``slots=True`` dataclass a faster, equivalent ``__init__``."""
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    if not (dataclasses.is_dataclass(cls) and params.frozen and "__slots__" in cls.__dict__):
        raise TypeError(f"{cls.__name__}: fast_init needs a frozen dataclass with slots")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: __post_init__ is not supported")
    env: dict[str, Any] = {"_NOTHING": object()}
    args: list[str] = []
    body: list[str] = []
    for i, f in enumerate(dataclasses.fields(cls)):
        if not f.init:
            raise TypeError(f"{cls.__name__}.{f.name}: init=False fields are not supported")
        env[f"_set{i}"] = getattr(cls, f.name).__set__
        if f.default is not _MISSING:
            env[f"_def{i}"] = f.default
            args.append(f"{f.name}=_def{i}")
            body.append(f"    _set{i}(self, {f.name})")
        elif f.default_factory is not _MISSING:
            env[f"_fac{i}"] = f.default_factory
            args.append(f"{f.name}=_NOTHING")
            body.append(f"    _set{i}(self, _fac{i}() if {f.name} is _NOTHING else {f.name})")
        else:
            args.append(f.name)
            body.append(f"    _set{i}(self, {f.name})")
    src = f"def __init__(self, {', '.join(args)}):\n" + ("\n".join(body) or "    pass") + "\n"
    exec(src, env)
    init = env["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    setattr(cls, "__init__", init)  # noqa: B010 -- replacing the generated method
    return cls
