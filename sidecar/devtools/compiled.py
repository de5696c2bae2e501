"""The compiled build of the policy lab: the same sources, compiled with mypyc.

The decision core and the simulator are plain, fully typed Python (mypy
strict). mypyc, which ships with mypy, compiles such modules to C extensions
that run the same code about twice as fast. :func:`ensure` builds a compiled
*copy* of the package -- never in the checkout, where a stale extension would
silently shadow an edited source -- under ``build/compiled/<key>/`` (or
``$TAILROUTE_COMPILED_DIR``), keyed by a hash of every source file, the
Python and the mypy version: an edit makes a new build, an unchanged tree
reuses the last one; a lock file lets one process build while another waits
for it. ``tailroute simulate --compiled`` and
``bench/bench_sim.py --compiled`` run in a child process that imports that
copy first (:func:`child_command`).

What is compiled: ``sidecar/core`` and the lab's simulation path
(``sidecar/sim`` and its policies), less :data:`INTERPRETED`. Everything else
(the shell, operations, the fleet, the protobuf code) is copied as source and
runs interpreted beside it. The compiled lab must give the same JSON document,
byte for byte, as the interpreted one (``tests/test_compiled_build.py``).

A build takes about two minutes on two cores and needs a C compiler and the
Python headers (on the machines this project targets: gcc and the python3-dev
headers that pip already needs). A failed build names its log.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.machinery
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # .../sidecar
CHECKOUT = PACKAGE.parent

#: Set in the child that runs the compiled copy (and checked there: see require()).
ENV_FLAG = "TAILROUTE_COMPILED"
ENV_DIR = "TAILROUTE_COMPILED_DIR"
_LOCK = ".lock"

#: Compiled: every module of these folders, except INTERPRETED.
COMPILED_DIRS = ("core", "sim", "sim/policies")

#: Kept interpreted, and why.
INTERPRETED = {
    # Subclasses random.Random, a type implemented in C: a compiled class cannot.
    "core/replayed_draw.py",
    # Entry points and drivers: no speed to gain; `python -m` needs a code object.
    "sim/__main__.py", "sim/cli.py", "sim/gen_run.py",
    # Real sockets and asyncio, or matplotlib: not the simulation path.
    "sim/realtime.py", "sim/realtime_compare.py", "sim/realtime_load.py",
    "sim/realtime_metrics.py", "sim/realtime_scenario.py", "sim/report.py",
}

_SETUP = """
import sys
from setuptools import setup
from mypyc.build import mypycify
paths = sys.argv[1:]
sys.argv[1:] = ["build_ext", "--inplace"]
setup(name="tailroute-compiled", ext_modules=mypycify(paths, opt_level="3", multi_file=True))
"""


class BuildError(RuntimeError):
    """The compiled build failed; the message names the log."""


def compiled_modules() -> list[str]:
    """Paths (relative to the package) of the modules the build compiles."""
    out: list[str] = []
    for d in COMPILED_DIRS:
        for p in sorted((PACKAGE / d).glob("*.py")):
            rel = p.relative_to(PACKAGE).as_posix()
            if rel not in INTERPRETED:
                out.append(rel)
    return out


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def build_key() -> str:
    """Hash of every source file, the module list, the Python and the mypy version."""
    try:
        import mypy.version  # a dev extra: imported only when a build is asked for
    except ImportError as exc:
        raise BuildError("the compiled build needs mypy (it ships mypyc) and setuptools: "
                         "pip install -e '.[dev]'") from exc
    h = hashlib.sha256()
    h.update(f"{sys.version}\n{mypy.version.__version__}\n".encode())
    h.update("\n".join(compiled_modules()).encode())
    for p in _sources():
        h.update(p.relative_to(PACKAGE).as_posix().encode() + b"\0")
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def default_root() -> Path:
    """Where builds go: ``$TAILROUTE_COMPILED_DIR``, else the checkout's ``build/compiled``."""
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env)
    if (CHECKOUT / "pyproject.toml").is_file():
        return CHECKOUT / "build" / "compiled"
    return Path.home() / ".cache" / "tailroute" / "compiled"


def ensure(root: Path | None = None, log: Path | None = None) -> Path:
    """The directory to put first on ``sys.path`` for the compiled package, built
    now unless a build of the same sources is there already. Older builds under
    ``root`` are removed once the new one is complete."""
    root = root or default_root()
    key = build_key()
    src = root / key
    if (src / "sidecar" / ".complete").is_file():
        return src
    root.mkdir(parents=True, exist_ok=True)
    with (root / _LOCK).open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time; a second waits for it
        if (src / "sidecar" / ".complete").is_file():
            return src
        _build(root, key, log or root / f"{key}.log")
    return src


def _build(root: Path, key: str, log: Path) -> None:
    """Copy the package to ``root/<key>.partial``, compile it there, and move it to
    ``root/<key>`` when complete (so a half-built copy is never used)."""
    src = root / key
    tmp = root / f"{key}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copytree(PACKAGE, tmp / "sidecar",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyc"))
    if (CHECKOUT / "pyproject.toml").is_file():  # mypy's settings for the type check
        shutil.copy2(CHECKOUT / "pyproject.toml", tmp / "pyproject.toml")
    paths = [f"sidecar/{m}" for m in compiled_modules()]
    with log.open("w") as fh:
        rc = subprocess.run([sys.executable, "-c", _SETUP, *paths], cwd=tmp, stdout=fh,
                            stderr=subprocess.STDOUT, check=False).returncode
    if rc != 0:
        raise BuildError(f"mypyc build failed (exit {rc}); see {log}")
    for scratch in ("build", ".mypy_cache"):  # the C sources and mypy's cache: not needed
        shutil.rmtree(tmp / scratch, ignore_errors=True)
    (tmp / "sidecar" / ".complete").write_text(key + "\n")
    shutil.rmtree(src, ignore_errors=True)
    tmp.rename(src)
    for old in root.iterdir():  # earlier builds and their logs
        if old.name.startswith(key) or old.name == _LOCK:
            continue
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)


def is_compiled() -> bool:
    """Whether the decision core in this process is the compiled build."""
    import sidecar.core.router as router

    return any(router.__file__.endswith(s) for s in importlib.machinery.EXTENSION_SUFFIXES)


def require() -> None:
    """In a child started by :func:`child_command`: fail loudly when the compiled
    package did not load (a silent fall-back would report interpreted speed)."""
    if os.environ.get(ENV_FLAG) == "1" and not is_compiled():
        import sidecar.core.router as router

        raise BuildError(f"the compiled build did not load: sidecar.core.router is "
                         f"{router.__file__}")


def child_command(src: Path, args: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """``(argv, env)`` running ``python -P args...`` with the compiled copy first on
    the path (``-P``: the working directory, a checkout, is not put before it)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(src), *filter(None, [env.get("PYTHONPATH", "")])])
    env[ENV_FLAG] = "1"
    return [sys.executable, "-P", *args], env


def run_compiled(args: Sequence[str], root: Path | None = None) -> int:
    """Build if need be, then run ``python -P args...`` on the compiled copy; its exit code."""
    try:
        src = ensure(root)
    except (BuildError, OSError) as exc:
        print(f"tailroute: --compiled: {exc}", file=sys.stderr)
        return 2
    argv, env = child_command(src, args)
    return subprocess.run(argv, env=env, check=False).returncode
