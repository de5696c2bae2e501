"""Where in the YAML file each config problem sits: ``(line N)`` after the problem.

:func:`sidecar.core.config.parse_config` works on parsed data and names the field
path (``clusters[0].max_concurrency``), which is exact but leaves the operator to
count list items in a long file. The file's node tree still knows every key's line,
so :func:`with_lines` adds it: the line of the field itself, of an unknown key
(``unknown field(s): max_concurency``), or else of the nearest enclosing entry that is
in the file (a required field that is missing: the mapping that lacks it). Problems
about the whole file, or fields the file never mentions, stay as they were.
"""

from __future__ import annotations

import re
from collections import deque

import yaml

from sidecar.core.fields import ConfigError

_UNKNOWN = "unknown field(s): "
# libyaml where PyYAML has it, as for the config itself (sidecar.ops.config_file)
_COMPOSER = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader
_LAST_STEP = re.compile(r"(\[\d+\]|\.[^.\[]+)$")  # the path's last ".key" or "[i]"


def field_lines(text: str) -> dict[str, int]:
    """Field path (as the config reader writes it) -> 1-based line of its key, or of
    the item for list entries. Empty when the text is not YAML."""
    try:
        root = yaml.compose(text, Loader=_COMPOSER)
    except (yaml.YAMLError, RecursionError):  # the pure-Python parser's stack ends at ~400
        return {}
    out: dict[str, int] = {}
    todo: deque[tuple[yaml.Node | None, str]] = deque([(root, "")])  # in file order
    seen: set[int] = set()
    while todo:
        node, path = todo.popleft()
        if node is None or id(node) in seen:  # an alias repeats a node: keep its first path
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    child = f"{path}.{key.value}" if path else str(key.value)
                    out.setdefault(child, key.start_mark.line + 1)
                    todo.append((value, child))
        elif isinstance(node, yaml.SequenceNode):
            for i, value in enumerate(node.value):
                child = f"{path}[{i}]"
                out.setdefault(child, value.start_mark.line + 1)
                todo.append((value, child))
    return out


def locate(problem: str, source: str, lines: dict[str, int]) -> str:
    """``problem`` (``<source>: <path>: <what>``) with `` (line N)`` appended when
    the file shows where it is."""
    head = f"{source}: "
    path, sep, what = problem.removeprefix(head).partition(": ")
    if not problem.startswith(head) or not sep:
        return problem
    if path == "<root>":
        path = ""
    if what.startswith(_UNKNOWN):  # point at the first unknown key itself
        name = what.removeprefix(_UNKNOWN).split(" (", 1)[0].split(", ", 1)[0]
        path = f"{path}.{name}" if path else name
    while path:
        if path in lines:
            return f"{problem} (line {lines[path]})"
        shorter = _LAST_STEP.sub("", path)
        if shorter == path:  # a first step that is not in the file
            break
        path = shorter
    return problem


def with_lines(exc: ConfigError, source: str, text: str) -> ConfigError:
    """``exc`` with each of its problems located in ``text`` (module docstring)."""
    lines = field_lines(text)
    problems = tuple(locate(p, source, lines) for p in exc.problems)
    return ConfigError("\n".join(problems), problems)
