"""Strict reading of nested YAML mappings with errors naming the file and the field path.

:class:`FieldReader` walks one mapping while remembering where it is, so every
problem raises an error reading ``<source>: <field path>: <problem>``, e.g.
``tailroute.yaml: clusters[1].max_concurrency: must be >= 1, got 0``. Keys it
was not asked for are reported by :meth:`FieldReader.done`: a typo must not
silently fall back to a default; the message suggests the known key a typo
is closest to.

Reporting every mistake at once: a reader whose ``errors`` is a list records
field-level problems there (the typed readers then carry on with the field's
default) instead of raising, and :meth:`FieldReader.attempt` recovers at a
section boundary from a problem that makes the rest of the section
meaningless. The children of a reader share its list.

:class:`ConfigReader` adds the typed readers of the tailroute config file; the
policy-lab scenario reader (:mod:`sidecar.sim.validate`) adds its own.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, Final, NoReturn, Self, TypeVar

from sidecar.core.hostport import split_hostport

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration mistake; the message names the file and the field path.

    With several mistakes, ``problems`` lists them (one ``file: field: problem``
    each) and the message is those lines.
    """

    def __init__(self, message: str, problems: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.problems = problems or (message,)


def did_you_mean(key: str, known: set[str]) -> str:
    """`` (did you mean x?)`` for the closest known key, or ''."""
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


SHOWN_MAX: Final = 80  # characters of a value an error quotes
SHOWN_COUNTED: Final = 1 << 16  # characters of a long value's repr counted, at most


def shown(v: object) -> str:
    """``repr(v)`` for an error message, cut to ``SHOWN_MAX`` characters: a value may
    be a whole nested document (a list 500 levels deep quoted in full was 1,000
    characters of brackets on one line of the operator's terminal). Only the first
    :data:`SHOWN_COUNTED` characters are ever written (:func:`repr_upto`)."""
    text, whole = repr_upto(v, SHOWN_COUNTED)
    if whole and len(text) <= SHOWN_MAX:
        return text
    count = f"{len(text)}" if whole else f"more than {SHOWN_COUNTED}"
    return f"{text[:SHOWN_MAX - 20]}... ({count} characters)"


class _Piece:
    """Literal text of a container's repr (not a value to write); ``closes``: the id of
    the container whose last piece it is."""

    __slots__ = ("closes", "text")

    def __init__(self, text: str, closes: int | None = None) -> None:
        self.text, self.closes = text, closes


_SEP, _COLON, _TUPLE_OF_ONE = _Piece(", "), _Piece(": "), _Piece(",")
_END: Final = object()  # an iterator's end
# type -> (opening, closing, empty, cycle): how repr writes it
_CONTAINERS: Final[dict[type, tuple[str, str, str, str]]] = {
    list: ("[", "]", "[]", "[...]"), tuple: ("(", ")", "()", "(...)"),
    dict: ("{", "}", "{}", "{...}"), set: ("{", "}", "set()", "{...}"),
    frozenset: ("frozenset({", "})", "frozenset()", "frozenset(...)"),
}


def _parts(x: Any, closing: str) -> Iterator[object]:
    """The values and separators of the container ``x``'s repr, then its closing piece."""
    if isinstance(x, dict):
        for i, (k, v) in enumerate(x.items()):
            yield from (_SEP, k, _COLON, v) if i else (k, _COLON, v)
    else:
        for i, v in enumerate(x):
            yield from (_SEP, v) if i else (v,)
        if isinstance(x, tuple) and len(x) == 1:
            yield _TUPLE_OF_ONE
    yield _Piece(closing, id(x))


def _leaf(x: object, room: int) -> str:
    if isinstance(x, str | bytes) and len(x) > room:  # longer than room: cut by the caller
        return _cut_repr(x, room + 1)
    try:
        return repr(x)
    except ValueError:  # an int of more digits than Python writes
        return f"<an integer of {x.bit_length()} bits>" if isinstance(x, int) else "<?>"


def _cut_repr(whole: str | bytes, n: int) -> str:
    """``repr`` of the first ``n`` characters (bytes) of ``whole``, quoted as ``repr``
    quotes ``whole``: double quotes when it holds a single quote and no double one, else
    single quotes. Without the quote added past the cut, ``"it's"`` cut before its
    apostrophe began ``'it`` where ``repr`` writes ``"it``. Bytes go through latin-1
    (one character per byte, both ways), as their repr picks quotes by the same rule."""
    text = whole.decode("latin-1") if isinstance(whole, bytes) else whole
    cut = text[:n]
    if "'" in text and '"' not in text:
        cut += "'"  # no double quote in cut either
    elif "'" in cut and '"' not in cut:
        cut += '"'
    return repr(cut.encode("latin-1")) if isinstance(whole, bytes) else repr(cut)


def repr_upto(v: object, limit: int) -> tuple[str, bool]:
    """``(repr(v), True)``, or its first ``limit`` characters and False when it is longer.

    Written piece by piece, lists, tuples, dicts and sets without recursion: YAML
    aliases share one object, so nine lists of nine aliases of ... nine levels deep
    (a few hundred bytes of file) are 9 ** 9 items to ``repr``, which took gigabytes
    and never ended; here they cost what ``limit`` characters cost."""
    out: list[str] = []
    size = 0
    writing: set[int] = set()  # containers being written: meeting one again is a cycle
    todo: list[Iterator[object]] = [iter((v,))]
    while todo:
        x = next(todo[-1], _END)
        if x is _END:
            todo.pop()
            continue
        if isinstance(x, _Piece):
            piece = x.text
            if x.closes is not None:
                writing.discard(x.closes)
        elif (how := _CONTAINERS.get(type(x))) is not None:
            opening, closing, empty, cycle = how
            if id(x) in writing:
                piece = cycle
            elif not x:
                piece = empty
            else:
                piece = opening
                writing.add(id(x))
                todo.append(_parts(x, closing))
        else:
            piece = _leaf(x, limit - size)
        out.append(piece)
        size += len(piece)
        if size > limit:
            return "".join(out)[:limit], False
    return "".join(out), True


def not_finite(v: float) -> str | None:
    """Why the number ``v`` cannot be a setting, or None.

    NaN compares false with everything, so it slipped past every ``lo``/``hi`` bound
    (``.nan``, ``.inf`` and ``-.inf`` are valid YAML floats); an integer beyond a
    float's range would raise OverflowError wherever it is used as one.
    """
    try:
        finite = math.isfinite(v)
    except OverflowError:  # an int beyond a float's range
        return f"must be a finite number, got an integer of {len(str(abs(v)))} digits"
    return None if finite else f"must be a finite number, got {shown(v)}"


class FieldReader:
    """Walks one mapping while remembering its field path, for precise errors."""

    error: ClassVar[type[ConfigError]] = ConfigError  # what :meth:`fail` raises
    errors: list[str] | None = None  # set: collect problems instead of raising (see module)

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

    def bad(self, problem: str, key: str, default: T) -> T:
        """A field-level problem: recorded (the field keeps ``default``) or raised."""
        if self.errors is None:
            self.fail(problem, key)
        self.errors.append(f"{self.source}: {self.where(key)}: {problem}")
        return default

    def mark(self) -> int:
        """How many problems are recorded so far (for :meth:`clean_since`)."""
        return len(self.errors) if self.errors is not None else 0

    def clean_since(self, mark: int) -> bool:
        """No problem recorded since ``mark``: cross-field checks are meaningful (a
        field that fell back to its default must not trigger a second, false one)."""
        return self.mark() == mark

    def attempt(self, read: Callable[[], T], fallback: T) -> T:
        """Run ``read``; while collecting, a problem it raises is recorded and
        ``fallback`` stands in for the section (the rest of the file is still read)."""
        if self.errors is None:
            return read()
        try:
            return read()
        except ConfigError as exc:
            self.errors.extend(exc.problems)
            return fallback

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def missing(self, key: str) -> bool:
        """Whether ``key`` counts as not given: absent (a reader may count null too)."""
        return key not in self.data

    def raw(self, key: str, default: Any = None) -> Any:
        self.used.add(key)
        return self.data.get(key, default)

    def _child(self, data: Any, path: str) -> Self:
        child = type(self)(data, self.source, path)  # a non-mapping raises: structural
        child.errors = self.errors
        return child

    def sub(self, key: str) -> Self:
        self.used.add(key)
        return self._child(self.data.get(key), self.where(key))

    def item(self, key: str, index: int, value: Any) -> Self:
        return self._child(value, f"{self.where(key)}[{index}]")

    def done(self) -> None:
        extra = sorted(str(k) for k in set(self.data) - self.used)
        if extra:
            named = ", ".join(k + did_you_mean(k, self.used) for k in extra)
            problem = f"unknown field(s): {named}"
            if self.errors is None:
                self.fail(problem)
            self.errors.append(f"{self.source}: {self.where()}: {problem}")

    def bool_(self, key: str, default: bool) -> bool:
        self.used.add(key)
        v = self.data.get(key, default)
        if not isinstance(v, bool):
            return self.bad(f"must be true or false, got {shown(v)}", key, default)
        return v

    def list_(self, key: str, required: bool = False) -> list[Any]:
        self.used.add(key)
        if self.missing(key):
            if required:
                self.fail("required field is missing", key)
            return []
        v = self.data[key]
        if not isinstance(v, list):
            problem = ("must be a list, got nothing (null)" if v is None
                       else f"must be a list, got {type(v).__name__}")
            if required:
                self.fail(problem, key)
            return self.bad(problem, key, [])
        return v

    def strings(self, key: str, required: bool = False, strict: bool = False) -> list[str]:
        """A list of strings. An item of another type (a nested list, a mapping, a
        number) is a problem naming its index (``key[i]``): recorded and left out, or,
        with ``strict`` (the list is meaningless without it), raised."""
        out: list[str] = []
        for i, v in enumerate(self.list_(key, required)):
            if isinstance(v, str):
                out.append(v)
                continue
            problem = f"must be a string, got {type(v).__name__} {shown(v)}"
            if strict:
                self.fail(problem, f"{key}[{i}]")
            self.bad(problem, f"{key}[{i}]", None)
        return out


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
            if required or default is None:
                self.fail(f"must be a non-empty string, got {shown(v)}", key)
            return self.bad(f"must be a string, got {shown(v)}", key, default)
        return v

    def address(self, key: str, default: str, off: bool = False) -> str:
        """A ``host:port`` something binds (port 0: any free port); ``off``: ``""`` is
        allowed and turns the listener off."""
        v = self.str_(key, default)
        if off and v == "":
            return v
        try:
            split_hostport(v, port_zero=True)
        except ValueError as exc:
            return self.bad(str(exc), key, default)
        return v

    def opt_str(self, key: str) -> str | None:
        self.used.add(key)
        v = self.data.get(key)
        if v is not None and not isinstance(v, str):
            return self.bad(f"must be a string, got {shown(v)}", key, None)
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
        fallback = int(default) if integer else float(default)
        if isinstance(v, bool) or not isinstance(v, int | float):
            return self.bad(f"must be a number, got {shown(v)}", key, fallback)
        problem = not_finite(v)
        if problem:
            return self.bad(problem, key, fallback)
        if integer and isinstance(v, float) and not v.is_integer():
            return self.bad(f"must be an integer, got {shown(v)}", key, fallback)
        if lo is not None and v < lo:
            return self.bad(f"must be >= {lo}, got {shown(v)}", key, fallback)
        if hi is not None and v > hi:
            return self.bad(f"must be <= {hi}, got {shown(v)}", key, fallback)
        return int(v) if integer else float(v)

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> Any:
        self.used.add(key)
        v = self.data.get(key, default)
        if v not in choices:
            hint = did_you_mean(v, set(choices)) if isinstance(v, str) else ""
            return self.bad(f"must be one of {', '.join(choices)}; got {shown(v)}{hint}", key,
                            default)
        return v
