"""Read a config file from disk (the only I/O around config parsing)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from sidecar.core.config import Config, ConfigError, parse_config
from sidecar.ops.config_lines import with_lines


def load_config(path: str | Path) -> Config:
    """Load and validate ``path``; raises :class:`ConfigError` naming the file, the
    field and, where the file shows it, the line (:mod:`sidecar.ops.config_lines`)."""
    p = Path(path)
    text = read_text(p)
    try:
        return parse_config(parse_yaml(text, p), str(p))
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
    """``text`` (the file ``path``) as YAML; a mistake raises ``error`` with its line."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader: no arbitrary objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise error(f"{path}: {where}invalid YAML: {problem}") from None


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


class _StrictLoader(yaml.SafeLoader):
    """``yaml.safe_load`` that rejects a key given twice in one mapping.

    Plain YAML keeps the last value, so a second ``default_cluster:`` further down a
    long file silently overrides the first. Checked on the node graph before anything
    is constructed: merge keys (``<<: *base``) are flattened during construction, and
    an explicit key overriding a merged one is what a merge is for.
    """

    def construct_document(self, node: yaml.Node) -> Any:
        self._check_unique_keys(node)
        return super().construct_document(node)

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
                    key = self.construct_object(key_node)
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"duplicate key {key!r} (first given on line "
                            f"{seen[key].line + 1}; YAML would keep only the last)",
                            key_node.start_mark)
                    seen[key] = key_node.start_mark
            elif isinstance(node, yaml.SequenceNode):
                todo += node.value

    def _construct_int(self, node: yaml.ScalarNode) -> int:
        try:
            return int(super().construct_yaml_int(node))
        except ValueError:  # Python refuses to read integers of more than 4300 digits
            raise yaml.constructor.ConstructorError(
                None, None, f"integer of {len(node.value)} digits is too long",
                node.start_mark) from None


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader._construct_int)
_MERGE = "tag:yaml.org,2002:merge"


def _not_utf8(exc: UnicodeDecodeError) -> str:
    """Where the first byte that is not UTF-8 sits: a Latin-1 editor's 'é' in a comment
    otherwise reads as a traceback (and used to stop the reload watcher)."""
    data = bytes(exc.object)
    line = data.count(b"\n", 0, exc.start) + 1
    return (f"line {line}: byte 0x{data[exc.start]:02x} at offset {exc.start} is not "
            "UTF-8 (save the file as UTF-8)")
