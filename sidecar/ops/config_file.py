"""Read a config file from disk (the only I/O around config parsing)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Final

import yaml

from sidecar.core.config import Config, ConfigError, parse_config
from sidecar.ops.config_lines import with_lines

# A config of 100 clusters x 100 models is 161 KiB: a larger file is a mistake (a log
# file, /dev/zero), read until memory ran out.
MAX_CONFIG_BYTES: Final = 16 << 20


def load_config(path: str | Path) -> Config:
    """Load and validate ``path``; raises :class:`ConfigError` naming the file, the
    field and, where the file shows it, the line (:mod:`sidecar.ops.config_lines`)."""
    p = Path(path)
    text = read_text(p, max_bytes=MAX_CONFIG_BYTES)
    try:
        cfg = parse_config(parse_yaml(text, p), str(p))
        if cfg.fleet is not None:
            # What the Redis client itself refuses, checked by it (the core does string
            # work only): said here, not at the first connection.
            from sidecar.fleet.store_errors import client_problem

            if (problem := client_problem(cfg.fleet.url)) is not None:
                raise ConfigError(f"{p}: fleet.url: the Redis client refuses it: {problem}")
        return cfg
    except ConfigError as exc:
        raise with_lines(exc, str(p), text) from None


def read_yaml(
    path: Path, what: str = "config", error: type[ConfigError] = ConfigError,
    max_bytes: int | None = None,
) -> Any:
    """Parse the YAML file ``path``; unreadable files, bytes that are not UTF-8 and bad
    YAML raise ``error`` naming the file (``cannot read <what>``) or the line and column
    of the mistake. With ``max_bytes`` a larger file is refused before it is read (see
    :func:`read_capped`)."""
    return parse_yaml(read_text(path, what, error, max_bytes), path, error)


def read_text(
    path: Path, what: str = "config", error: type[ConfigError] = ConfigError,
    max_bytes: int | None = None,
) -> str:
    """The UTF-8 text of ``path``; what cannot be read raises ``error`` (:func:`read_yaml`)."""
    try:
        raw = path.read_bytes() if max_bytes is None else read_capped(path, max_bytes)
        return raw.decode("utf-8")
    except TooLarge as exc:
        raise error(f"{path}: {what} file is larger than {exc}: refused") from None
    except OSError as exc:
        raise error(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{path}: {_not_utf8(exc)}") from None


def parse_yaml(text: str, path: Path, error: type[ConfigError] = ConfigError) -> Any:
    """``text`` (the file ``path``) as YAML; a mistake raises ``error`` with its line.

    Parsed by libyaml where PyYAML has it: with the pure-Python parser, loading a
    161 KiB config (100 clusters x 100 models) took 0.57 s, against 0.09 s. A file
    libyaml refuses is parsed again by the pure-Python parser, which words its
    problems better ("expected the node content", not "did not find expected node
    content"), unless it is nested deeper than Python's stack allows: then libyaml's
    words stand (it stops at 1,000 levels itself)."""
    try:
        return yaml.load(text, Loader=_FastStrictLoader)  # safe loaders: no arbitrary objects
    except (yaml.YAMLError, RecursionError) as exc:
        found: BaseException = exc
    if _FastStrictLoader is not _StrictLoader:
        try:
            yaml.load(text, Loader=_StrictLoader)
        except yaml.YAMLError as exc:
            found = exc
        except RecursionError:
            pass
    raise error(f"{path}: {_yaml_problem(found, text)}") from None


def _yaml_problem(exc: BaseException, text: str) -> str:
    """Where and what: ``line L, column C: invalid YAML: <problem>``."""
    if isinstance(exc, RecursionError):
        return f"invalid YAML: nested more than {_MAX_DEPTH_SAID} levels deep"
    if isinstance(exc, yaml.reader.ReaderError):  # a character YAML does not allow
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        code = exc.character if isinstance(exc.character, int) else ord(exc.character)
        return (f"line {line}, column {column}: invalid YAML: character U+{code:04X} is "
                f"not allowed ({exc.reason})")
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    problem = getattr(exc, "problem", None) or str(exc)
    return f"{where}invalid YAML: {problem}"


class TooLarge(Exception):
    """A file beyond the size its reader accepts; ``str()`` is the limit (``16 MiB``)."""


def read_capped(path: Path, max_bytes: int) -> bytes:
    """The bytes of ``path``, or :class:`TooLarge` when there are more than ``max_bytes``.

    A regular file's size is checked before reading; a device or a pipe that gives
    no size (``/dev/zero``) is read only up to the limit, so neither can exhaust memory.
    """
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        data = b"" if size > max_bytes else f.read(max_bytes + 1)
    if size > max_bytes or len(data) > max_bytes:
        raise TooLarge(f"{max_bytes / (1 << 20):g} MiB")
    return data


class _Strict:
    """What both loaders add to ``yaml.safe_load``: a key given twice in one mapping is
    rejected, and so is an integer Python will not read.

    Plain YAML keeps the last value, so a second ``default_cluster:`` further down a
    long file silently overrides the first. Checked on the node graph before anything
    is constructed: merge keys (``<<: *base``) are flattened during construction, and
    an explicit key overriding a merged one is what a merge is for.
    """

    def construct_document(self, node: yaml.Node) -> Any:
        self._check_unique_keys(node)
        return super().construct_document(node)  # type: ignore[misc]

    def _check_unique_keys(self, root: yaml.Node) -> None:
        todo, done = [root], set()
        while todo:
            node = todo.pop()
            if id(node) in done:  # aliases share nodes
                continue
            done.add(id(node))
            if isinstance(node, yaml.MappingNode):
                seen: dict[Any, yaml.Mark] = {}
                for key_node, value_node in node.value:
                    todo += (key_node, value_node)
                    if key_node.tag == _MERGE or not isinstance(key_node, yaml.ScalarNode):
                        continue
                    key = self.construct_object(key_node)  # type: ignore[attr-defined]
                    _check_plain_key(key, key_node)
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"duplicate key {key!r} (first given on line "
                            f"{seen[key].line + 1}; YAML would keep only the last)",
                            key_node.start_mark)
                    seen[key] = key_node.start_mark
            elif isinstance(node, yaml.SequenceNode):
                todo += node.value


def _check_plain_key(key: Any, node: yaml.ScalarNode) -> None:
    """A key YAML reads as something other than what it shows is refused: unquoted,
    ``on``, ``no`` and ``true`` are booleans, ``~`` is null, ``010`` is 8 and ``0.10``
    is 0.1, so ``classes: {on: ...}`` defined a class named ``True``. A number that
    reads as written (``7``) stays a key. (A plain scalar's style is None in the
    pure-Python parser and '' in libyaml's.)"""
    if not node.style and (key is None or isinstance(key, bool) or (
            isinstance(key, int | float) and str(key) != node.value)):
        raise yaml.constructor.ConstructorError(
            None, None, f"key {node.value} reads as {key!r} in YAML, not as written: "
            f"quote it ('{node.value}')", node.start_mark)


def _construct_int(loader: yaml.SafeLoader | yaml.CSafeLoader, node: yaml.ScalarNode) -> int:
    try:
        if len(node.value) > _MAX_INT_CHARS:  # base 60 (1:30) is read in quadratic time
            raise ValueError(node.value)
        value = int(yaml.constructor.SafeConstructor.construct_yaml_int(loader, node))
        # ... nor write them: 0x, 0b, octal and base 60 integers were read, then the
        # error message quoting one raised ValueError (a traceback)
        str(value)
        return value
    except ValueError:  # Python refuses to read integers of more than 4300 digits
        raise yaml.constructor.ConstructorError(
            None, None, f"integer of {len(node.value)} digits is too long",
            node.start_mark) from None


class _StrictLoader(_Strict, yaml.SafeLoader):
    """The pure-Python parser (:func:`parse_yaml`)."""


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_FastStrictLoader: type[yaml.SafeLoader] | type[yaml.CSafeLoader] = _StrictLoader
if yaml.__with_libyaml__:
    class _CStrictLoader(_Strict, yaml.CSafeLoader):
        """libyaml's parser, the same constructors (:func:`parse_yaml`)."""

    _CStrictLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
    _FastStrictLoader = _CStrictLoader
_MERGE = "tag:yaml.org,2002:merge"
_MAX_INT_CHARS = 4300  # Python's default limit of int <-> str conversions, in digits
_MAX_DEPTH_SAID = 400  # what the pure-Python parser reads before Python's stack runs out


def _not_utf8(exc: UnicodeDecodeError) -> str:
    """Where the first byte that is not UTF-8 sits: a Latin-1 editor's 'é' in a comment
    otherwise reads as a traceback (and used to stop the reload watcher)."""
    data = bytes(exc.object)
    line = data.count(b"\n", 0, exc.start) + 1
    return (f"line {line}: byte 0x{data[exc.start]:02x} at offset {exc.start} is not "
            "UTF-8 (save the file as UTF-8)")
