"""The written-out ``__init__`` of the per-request value types (sidecar.core.frozen).

Interpreted, :func:`~sidecar.core.frozen.fast_init` replaces a written ``__init__``
with its own and keeps the written one as ``__wrapped__``: these tests run the
written body (the one the compiled lab runs) and check it against the fields.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from sidecar.core.admission import Verdict
from sidecar.core.frozen import fast_init
from sidecar.core.selection import LatencyValue
from sidecar.core.subwindow import Evidence
from sidecar.core.types import Decision, Observation, RequestInfo

WRITTEN = [RequestInfo, Observation, Evidence, LatencyValue, Decision, Verdict]


@pytest.mark.parametrize("cls", WRITTEN, ids=lambda c: c.__name__)
def test_a_written_init_stores_each_argument_in_its_own_field(cls: type[Any]) -> None:
    fields = dataclasses.fields(cls)
    values = [object() for _ in fields]  # distinct: a swapped pair shows
    obj = object.__new__(cls)
    cls.__init__.__wrapped__(obj, *values)
    assert [getattr(obj, f.name) for f in fields] == values
    kw = object.__new__(cls)
    cls.__init__.__wrapped__(kw, **{f.name: v for f, v in zip(fields, values, strict=True)})
    assert [getattr(kw, f.name) for f in fields] == values


@pytest.mark.parametrize("cls", WRITTEN, ids=lambda c: c.__name__)
def test_a_written_init_leaves_the_defaults_to_the_fields(cls: type[Any]) -> None:
    fields = dataclasses.fields(cls)
    required = [object() for f in fields if f.default is dataclasses.MISSING]
    obj = object.__new__(cls)
    cls.__init__.__wrapped__(obj, *required)
    for f in fields[len(required):]:
        assert getattr(obj, f.name) == f.default, f.name


def test_a_written_init_that_disagrees_with_the_fields_fails_at_import() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Missing:
        a: int
        b: int = 2

        def __init__(self, a: int) -> None:
            object.__setattr__(self, "a", a)

    with pytest.raises(TypeError, match="does not match the fields"):
        fast_init(Missing)

    @dataclasses.dataclass(frozen=True, slots=True)
    class OtherDefault:
        a: int
        b: int = 2

        def __init__(self, a: int, b: int = 3) -> None:
            object.__setattr__(self, "a", a)
            object.__setattr__(self, "b", b)

    with pytest.raises(TypeError, match="does not match the fields"):
        fast_init(OtherDefault)


def test_fast_init_keeps_a_written_class_a_frozen_dataclass() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class V:
        a: int
        b: str = "x"

        def __init__(self, a: int, b: str = "x") -> None:
            object.__setattr__(self, "a", a)
            object.__setattr__(self, "b", b)

    fast_init(V)
    v = V(1)
    assert (v.a, v.b) == (1, "x") and getattr(V.__init__, "__wrapped__", None) is not None
    assert dataclasses.replace(v, b="y") == V(1, "y") and hash(V(2)) == hash(V(2))
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.a = 3  # type: ignore[misc]


def test_a_judged_observation_is_replace_written_out() -> None:
    fields = dataclasses.fields(Observation)
    values: list[Any] = [object() for _ in fields]  # distinct: a swapped pair shows
    obs = Observation(*values)
    new: list[Any] = [object() for _ in range(4)]
    judged = obs.judged(*new)
    assert judged == dataclasses.replace(
        obs, outcome=new[0], ttft_s=new[1], e2e_s=new[2], censored=new[3])
