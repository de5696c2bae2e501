"""The mypyc-compiled lab gives exactly the interpreted lab's results.

``tailroute simulate --compiled`` (:mod:`sidecar.devtools.compiled`) runs the
same sources compiled to C extensions. Compiled code can differ where Python
is dynamic (an ``int`` stored in a ``float`` attribute becomes a float, a
narrowed attribute is trusted), so the test is the whole JSON document, byte
for byte, on shipped scenarios that exercise admission, workflows and
outages, and on generated ones run in parallel processes. The first build takes
about two minutes; later runs of an unchanged tree reuse it.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sidecar.devtools import compiled

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "sidecar" / "sim" / "scenarios"
TIMEOUT_S = 900


def test_the_module_lists_name_real_files() -> None:
    modules = compiled.compiled_modules()
    assert "core/router.py" in modules and "sim/engine.py" in modules
    for rel in [*modules, *compiled.INTERPRETED]:
        assert (compiled.PACKAGE / rel).is_file(), rel
    assert not set(modules) & compiled.INTERPRETED


def test_the_build_key_is_a_function_of_the_sources() -> None:
    assert compiled.build_key() == compiled.build_key()


def test_without_mypy_the_build_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mypy.version", None)  # import now fails
    with pytest.raises(compiled.BuildError, match="needs mypy"):
        compiled.build_key()
    assert compiled.run_compiled(["-c", "pass"]) == 2  # a clear error, nothing run


def test_outside_a_compiled_child_nothing_is_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(compiled.ENV_FLAG, raising=False)
    compiled.require()  # interpreted here, and not asked to be compiled: no error
    monkeypatch.setenv(compiled.ENV_FLAG, "1")
    with pytest.raises(compiled.BuildError, match="did not load"):
        compiled.require()


def test_two_processes_asking_at_once_build_once(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []
    started = threading.Event()

    def fake_build(root: Path, key: str, log: Path) -> None:
        built.append(key)
        started.set()
        time.sleep(0.2)  # hold the lock while the other asker arrives
        (root / key / "sidecar").mkdir(parents=True)
        (root / key / "sidecar" / ".complete").write_text(key)

    monkeypatch.setattr(compiled, "build_key", lambda: "k1")
    monkeypatch.setattr(compiled, "_build", fake_build)
    results: list[Path] = []
    first = threading.Thread(target=lambda: results.append(compiled.ensure(tmp_path)))
    first.start()
    started.wait(10)
    results.append(compiled.ensure(tmp_path))  # waits on the lock, then finds it built
    first.join(10)
    assert built == ["k1"] and results == [tmp_path / "k1", tmp_path / "k1"]


@pytest.fixture(scope="module")
def build() -> Path:
    return compiled.ensure()


def _simulate(args: list[str], *, on_compiled: bool) -> str:
    argv = [sys.executable, "-m", "sidecar.cli", "simulate", *args, "--json", "-q"]
    if on_compiled:
        argv.append("--compiled")
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_the_child_really_runs_compiled_code(build: Path) -> None:
    argv, env = compiled.child_command(build, [
        "-c", "from sidecar.devtools import compiled; compiled.require(); "
              "print(compiled.is_compiled())"])
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"


@pytest.mark.parametrize("args", [
    pytest.param(["--scenario", str(SCENARIOS / "overload.yaml"),
                  "--scenario", str(SCENARIOS / "agentic_fanout.yaml"),
                  "--scenario", str(SCENARIOS / "outage_recovery.yaml")], id="shipped"),
    pytest.param(["--scenario", str(SCENARIOS / "burst_queueing.yaml"),
                  "--policy", "tailroute", "tailroute_native", "tailroute_hybrid",
                  "--noise-seeds", "2"], id="native-and-noise"),
    pytest.param(["--generate", "12", "--family-seed", "29", "--jobs", "2",
                  "--policy", "tailroute", "round_robin", "envoy_outlier", "oracle"],
                 id="generated"),
])
def test_compiled_and_interpreted_give_the_same_document(build: Path, args: list[str]) -> None:
    assert _simulate(args, on_compiled=True) == _simulate(args, on_compiled=False)
