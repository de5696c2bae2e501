"""docs/architecture.md matches the tree: every folder and module of the package is
named in it, and it names no module that does not exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "architecture.md").read_text()
PACKAGE = ROOT / "sidecar"
# Generated code and package markers are described by their folder, not one by one.
_SKIP_DIRS = {"pb", "__pycache__"}


def _modules() -> list[Path]:
    out = []
    for p in sorted(PACKAGE.rglob("*.py")):
        rel = p.relative_to(PACKAGE)
        if rel.parts[0] in _SKIP_DIRS or p.name in {"__init__.py", "__main__.py"}:
            continue
        out.append(rel)
    return out


def _folders() -> list[str]:
    return sorted(p.name for p in PACKAGE.iterdir()
                  if p.is_dir() and p.name not in {"__pycache__"})


def test_every_folder_of_the_package_is_described() -> None:
    missing = [f for f in _folders() if f"sidecar/{f}/" not in DOC]
    assert not missing, f"docs/architecture.md does not describe sidecar/{missing}"


def test_every_module_is_named() -> None:
    missing = [str(m) for m in _modules() if m.name not in DOC]
    assert not missing, f"docs/architecture.md does not name {missing}"


def test_every_named_module_exists() -> None:
    names = {p.name for p in PACKAGE.rglob("*.py")}
    named = {n for n in re.findall(r"\b([a-z_][a-z0-9_]*\.py)\b", DOC)
             if not n.startswith("test_")}  # tests/ are not part of the package
    unknown = sorted(named - names)
    assert not unknown, f"docs/architecture.md names modules that do not exist: {unknown}"
