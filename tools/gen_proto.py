"""Compile proto/ into sidecar/pb/ with grpcio-tools.

protoc names generated imports after the .proto paths (``from envoy.config...``,
``from grpc.health.v1...``); we rewrite them to ``sidecar.pb.envoy...`` and
``sidecar.pb.grpc.health...`` so the modules live inside our package without a
top-level ``envoy`` package on sys.path (or one shadowing the ``grpc`` library).
Run with ``--check`` to verify that the committed modules are up to date (used by
the test suite).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
OUT_DIR = ROOT / "sidecar" / "pb"
# Our packages: envoy.* and grpc.health.* (not grpc itself, the runtime library).
_IMPORT = re.compile(r"^from (envoy\.[\w.]+|grpc\.health\.[\w.]+) import", re.MULTILINE)


def generate(out: Path) -> None:
    """Generate all modules into ``out`` (which must exist and be empty)."""
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).parent / "_proto"
    protos = sorted(str(p.relative_to(PROTO_DIR)) for p in PROTO_DIR.rglob("*.proto"))
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    for path in out.rglob("*.py*"):
        text = _IMPORT.sub(r"from sidecar.pb.\1 import", path.read_text())
        path.write_text(text)
    for d in [out, *[p for p in out.rglob("*") if p.is_dir()]]:
        (d / "__init__.py").write_text("")


def _snapshot(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): p.read_text() for p in sorted(d.rglob("*")) if p.is_file()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if sidecar/pb is stale")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "pb"
        fresh.mkdir()
        generate(fresh)
        if ns.check:
            current = _snapshot(OUT_DIR) if OUT_DIR.exists() else {}
            current = {k: v for k, v in current.items() if "__pycache__" not in k}
            if current != _snapshot(fresh):
                print("sidecar/pb is stale: run `make proto`", file=sys.stderr)
                return 1
            return 0
        if OUT_DIR.exists():
            shutil.rmtree(OUT_DIR)
        shutil.copytree(fresh, OUT_DIR)
    print(f"generated {OUT_DIR.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
