"""A faster ``__init__`` for the frozen slotted dataclasses made once per request.

``@dataclass(frozen=True, slots=True)`` generates an ``__init__`` that stores
every field through ``object.__setattr__`` looked up anew per field; for the
value types the decision path creates per request (requests, observations,
decisions, pipeline results) that alone cost several microseconds.
:func:`fast_init` replaces it with one that stores through the slots' own
member descriptors, bound once. Everything else -- immutability
(``__setattr__`` still raises), ``dataclasses.replace``, ``fields``, ``asdict``,
equality, hashing, defaults and default factories -- is the dataclass's own.

The compiled lab (:mod:`sidecar.devtools.compiled`) needs one more thing. mypyc
compiles a class with any decorator besides ``@dataclass`` as a plain Python
class, whose ``__init__`` stays interpreted: 1.6 us per ``RequestInfo`` even with
the descriptor stores. So the types made per simulated request
(``RequestInfo``, ``Observation``, the window ``Evidence``, ``LatencyValue``) write their
``__init__`` out -- ``object.__setattr__`` per field, in field order, which
mypyc turns into native stores -- and call ``fast_init(cls)`` after the class
instead of decorating it. Compiled, that call finds a native ``__init__`` and
leaves it (the class is a native class: 0.32 us per ``RequestInfo``, timed
from the interpreter with the call included);
interpreted, it checks the written ``__init__`` against the fields (names,
order, defaults: an edit that adds a field to one and not the other fails at
import) and replaces it like any other, keeping it as ``__init__.__wrapped__``
for the tests that run its body.
"""

from __future__ import annotations

import dataclasses
import inspect
from types import FunctionType
from typing import Any, Final, TypeVar

T = TypeVar("T")
_MISSING: Final = dataclasses.MISSING


def fast_init(cls: type[T]) -> type[T]:
    """Give a frozen ``slots=True`` dataclass a faster, equivalent ``__init__``."""
    written = cls.__dict__.get("__init__")
    if written is not None and not isinstance(written, FunctionType) \
            and dataclasses.is_dataclass(cls):
        return cls  # compiled by mypyc: the class's own __init__ is native code
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    if not (dataclasses.is_dataclass(cls) and params.frozen and "__slots__" in cls.__dict__):
        raise TypeError(f"{cls.__name__}: fast_init needs a frozen dataclass with slots")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: __post_init__ is not supported")
    fields = dataclasses.fields(cls)
    if isinstance(written, FunctionType):  # written out, or the dataclass's own
        _check_signature(cls, written, fields)
    env: dict[str, Any] = {"_NOTHING": object()}
    args: list[str] = []
    body: list[str] = []
    for i, f in enumerate(fields):
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
    init.__wrapped__ = written
    setattr(cls, "__init__", init)  # noqa: B010 -- replacing the generated method
    return cls


def _check_signature(cls: type, init: FunctionType,
                     fields: tuple[dataclasses.Field[Any], ...]) -> None:
    """``init`` takes exactly the fields, in order, each with its default (a field
    with a default factory: some default)."""
    params = list(inspect.signature(init).parameters.values())[1:]
    names = [p.name for p in params] == [f.name for f in fields]
    if not names or not all(_same_default(p, f) for p, f in zip(params, fields, strict=True)):
        raise TypeError(f"{cls.__name__}.__init__ does not match the fields: it takes "
                        f"{[(p.name, p.default) for p in params]}, the fields are "
                        f"{[(f.name, f.default) for f in fields]}")


def _same_default(p: inspect.Parameter, f: dataclasses.Field[Any]) -> bool:
    if f.default is not _MISSING:
        return bool(p.default == f.default)
    return (p.default is inspect.Parameter.empty) == (f.default_factory is _MISSING)
