"""`tailroute report --from-json FILE` reads its document within the lab's input bounds
(sidecar.sim.bounds.MAX_FILE_BYTES) and turns every unusable file into one line naming
the option and the file, exit 2, never a traceback or an unbounded read."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from sidecar.sim.bounds import MAX_FILE_BYTES
from sidecar.sim.cli import main
from tests.test_sim_fixtures import tiny


def _sparse(size: int) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        p = tmp / "huge.json"
        with p.open("wb") as f:
            f.truncate(size)  # a sparse file: its size is known without writing it
        return p

    return make


def _file(content: bytes) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        p = tmp / "doc.json"
        p.write_bytes(content)
        return p

    return make


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda _t: Path("/dev/zero"), "results document is larger than 16 MiB: refused"),
        (_sparse(MAX_FILE_BYTES + 1), "results document is larger than 16 MiB: refused"),
        (lambda t: t / "missing.json", "cannot read results document: No such file or directory"),
        (lambda t: t, "cannot read results document: Is a directory"),
        (
            _file(b'{"schema_version": 2, "x": "caf\xe9"}'),
            "not a results document (the byte at offset 31 is not UTF-8)",
        ),
        (
            _file(b'{"schema_version": 2,'),
            "not a results document (invalid JSON at line 1, "
            "column 22: Expecting property name enclosed in double quotes)",
        ),
        (_file(b"[" * 200_000), "not a results document (JSON nested too deeply to read)"),
        (_file(b"[1, 2]"), "not a results document (a JSON list, not an object)"),
        (_file(b'{"schema_version": 99}'), "unsupported schema_version 99 (expected 1 or 2)"),
        (_file(b'{"schema_version": 2}'), "not a results document (KeyError: 'scenarios')"),
        (_file(b'{"schema_version": 2, "scenarios": 5}'), "not a results document (TypeError"),
    ],
)
def test_unusable_results_documents_exit_2_naming_the_option(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    make: Callable[[Path], Path],
    says: str,
) -> None:
    path = make(tmp_path)
    rc = main(["report", "--from-json", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith(f"error: --from-json {path}: {says}"), err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_a_document_at_the_bound_is_rendered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(yaml.safe_dump(tiny()), encoding="utf-8")
    doc = tmp_path / "results.json"
    assert (
        main(
            [
                "simulate",
                "--scenario",
                str(scenario),
                "--policy",
                "round_robin",
                "-q",
                "--out",
                str(doc),
            ]
        )
        == 0
    )
    text = doc.read_bytes().rstrip()
    assert len(text) < MAX_FILE_BYTES
    doc.write_bytes(text + b" " * (MAX_FILE_BYTES - len(text)))  # exactly at the bound
    rc = main(["report", "--from-json", str(doc), "--out", str(tmp_path / "r")])
    assert rc == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "r" / "results.json").read_text())["schema_version"] == 2
