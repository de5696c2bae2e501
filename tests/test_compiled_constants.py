"""Module constants of the compiled packages are declared ``Final``.

mypyc compiles a read of a plain module-level name into a lookup in the
module's globals dict (and an unboxing for a number) at every use; a ``Final``
one it inlines (literals) or keeps in a C static. Declaring the lab's constants
``Final`` took the compiled simulator from about 195k to 189k instructions per
simulated request (docs/policy-lab.md, "Constants the compiled build can
inline"). This keeps a new constant from quietly going back to dict lookups.
"""

from __future__ import annotations

import ast
import re

import pytest

from sidecar.devtools.compiled import PACKAGE, compiled_modules

CONSTANT = re.compile(r"^_?[A-Z][A-Z0-9_]+$")
# Rebound by tests (a Final would say they never change).
REBOUND = {
    ("core/plan_cache.py", "LOW_VARIANTS_MAX"),  # tests/test_plan_cache.py
    ("core/input_limits.py", "_BLOCK"),  # tests/test_input_limits.py
}
# Values that are type constructs, not constants.
TYPE_CONSTRUCTS = {"TypeVar", "ParamSpec", "NewType"}


def _is_final(annotation: ast.expr | None) -> bool:
    if annotation is None:
        return False
    node = annotation.value if isinstance(annotation, ast.Subscript) else annotation
    return isinstance(node, ast.Name | ast.Attribute) and ast.unparse(node).endswith("Final")


def _constructs_a_type(value: ast.expr | None) -> bool:
    return (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
            and value.func.id in TYPE_CONSTRUCTS)


def plain_constants(source: str, rel: str) -> list[str]:
    """Module-level UPPER_CASE names of ``source`` (module ``rel``) bound once and not
    declared Final."""
    tree = ast.parse(source)
    bound: dict[str, list[bool]] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            if not _constructs_a_type(stmt.value):
                bound.setdefault(stmt.target.id, []).append(_is_final(stmt.annotation))
        elif isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name) and not _constructs_a_type(stmt.value):
                    bound.setdefault(target.id, []).append(False)
    return sorted(name for name, finals in bound.items()
                  if CONSTANT.match(name) and len(finals) == 1 and not finals[0]
                  and (rel, name) not in REBOUND)


@pytest.mark.parametrize("rel", compiled_modules())
def test_module_constants_are_final(rel: str) -> None:
    assert plain_constants((PACKAGE / rel).read_text(), rel) == [], (
        f"sidecar/{rel}: declare these module constants Final (mypyc inlines them)")


def test_the_rule_names_plain_constants_only() -> None:
    src = ("from typing import Final, TypeVar\n"
           "PLAIN = 1\nTYPED: int = 2\nDONE: Final = 3\nSHAPED: Final[tuple[int]] = (4,)\n"
           "T = TypeVar('T')\nlower = 5\nTWICE = 6\nTWICE = 7\n_BLOCK = 8\n")
    assert plain_constants(src, "core/x.py") == ["PLAIN", "TYPED", "_BLOCK"]
    assert plain_constants(src, "core/input_limits.py") == ["PLAIN", "TYPED"]
