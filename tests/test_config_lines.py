"""Config mistakes as an operator meets them: each problem names the file, the field
and the line (sidecar.ops.config_lines); a file without clusters or models still has
every problem reported; no mistake ends in a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.core.config import ConfigError
from sidecar.ops.config_file import load_config
from sidecar.ops.config_lines import field_lines, locate

GOOD = """\
default_cluster: a
clusters:
  - name: a
    address: 127.0.0.1:8001
    models: [m]
  - name: b
    address: 127.0.0.1:8002
    models: [m]
models:
  - name: m
    candidates: [a, b]
classes:
  interactive:
    slo: {metric: ttft, budget_ms: 800}
"""


def _problems(tmp_path: Path, text: str) -> tuple[str, ...]:
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    prefix = f"{path}: "
    assert all(p.startswith(prefix) for p in err.value.problems)
    return tuple(p.removeprefix(prefix) for p in err.value.problems)


@pytest.mark.parametrize(("old", "new", "problem"), [
    # a typo in a field name: the line of the unknown key itself
    ("    models: [m]\n  - name: b", "    models: [m]\n    max_concurency: 3\n  - name: b",
     "clusters[0]: unknown field(s): max_concurency (did you mean max_concurrency?) (line 6)"),
    ("default_cluster: a", "defualt_cluster: a",
     "<root>: unknown field(s): defualt_cluster (did you mean default_cluster?) (line 1)"),
    # wrong type, negative number, nested in a flow mapping
    ("address: 127.0.0.1:8002", "address: 127.0.0.1:8002\n    max_concurrency: lots",
     "clusters[1].max_concurrency: must be a number, got 'lots' (line 8)"),
    ("budget_ms: 800", "budget_ms: -800",
     "classes.interactive.slo.budget_ms: must be >= 1, got -800 (line 14)"),
    # duplicate cluster name; a candidate naming an unknown cluster
    ("  - name: b", "  - name: a",
     "clusters[1].name: duplicate cluster name 'a' (line 6)"),
    ("candidates: [a, b]", "candidates: [a, bb]",
     "models[0].candidates: unknown cluster 'bb' (did you mean b?) (known: a, b) (line 11)"),
    # a required field that is missing: the entry that lacks it
    ("    address: 127.0.0.1:8002\n", "",
     "clusters[1].address: required field is missing (line 6)"),
])
def test_each_problem_names_its_line(tmp_path: Path, old: str, new: str, problem: str) -> None:
    assert old in GOOD
    assert problem in _problems(tmp_path, GOOD.replace(old, new, 1))


@pytest.mark.parametrize(("text", "problems"), [
    ("", ("clusters: required field is missing", "models: required field is missing")),
    ("# nothing yet\n", ("clusters: required field is missing",
                         "models: required field is missing")),
    # The rest of the file is still read: the typo beside a bad clusters is reported.
    ("clusters: 5\nmodels: []\ndefualt_class: x\n", (
        "clusters: must be a list, got int (line 1)",
        "models: must define at least one model (with none, tailroute routes nothing: "
        "every request goes to default_cluster) (line 2)",
        "<root>: unknown field(s): defualt_class (did you mean default_class?) (line 3)")),
    ("clusters:\nmodels:\n", ("clusters: must be a list, got nothing (null) (line 1)",
                              "models: must be a list, got nothing (null) (line 2)")),
])
def test_a_file_without_usable_clusters_reports_every_problem(
        tmp_path: Path, text: str, problems: tuple[str, ...]) -> None:
    assert _problems(tmp_path, text) == problems


def test_check_config_on_an_empty_file_exits_2_without_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    out = subprocess.run([sys.executable, "-m", "sidecar.cli", "check-config", "--config",
                          str(path)], capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.splitlines() == [f"{path}: clusters: required field is missing",
                                       f"{path}: models: required field is missing",
                                       f"{path}: 2 problems"]


def test_lines_follow_aliases_and_sequences_and_leave_the_rest_alone() -> None:
    lines = field_lines("a: &x\n  b: 1\nc: *x\nd:\n  - e: 2\n  - 3\n")
    assert lines == {"a": 1, "a.b": 2, "c": 3, "d": 4, "d[0]": 5, "d[0].e": 5, "d[1]": 6}
    assert field_lines("a: [") == {}
    for problem in ("f.yaml: line 3, column 1: invalid YAML: x", "f.yaml: cannot read config",
                    "other.yaml: a: x", "f.yaml: <root>: expected a mapping, got list"):
        assert locate(problem, "f.yaml", lines) == problem
