"""The decision core stays pure: no clock, no I/O, no gRPC, no global RNG.

This is what lets the server and the simulator drive the same objects.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[1] / "sidecar" / "core"
FORBIDDEN_MODULES = {"time", "datetime", "asyncio", "grpc", "socket", "os", "subprocess",
                     "threading", "urllib", "http", "pathlib", "logging", "sys"}
# Module-level functions of `random` draw from the hidden global generator.
GLOBAL_RANDOM = {"random", "uniform", "choice", "choices", "shuffle", "sample", "randint",
                 "gauss", "expovariate", "seed", "getrandbits", "lognormvariate"}


@pytest.mark.parametrize("path", sorted(CORE.glob("*.py")), ids=lambda p: p.name)
def test_core_module_is_pure(path: Path) -> None:
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [(node.module or "").split(".")[0]]
        else:
            names = []
        bad = FORBIDDEN_MODULES.intersection(names)
        assert not bad, f"{path.name}:{node.lineno} imports {bad}"
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "random"):
            assert node.func.attr not in GLOBAL_RANDOM, (
                f"{path.name}:{node.lineno} uses the global RNG random.{node.func.attr}()"
            )
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in {"open", "print", "input"}, (
                f"{path.name}:{node.lineno} calls {node.func.id}()"
            )
