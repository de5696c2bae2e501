"""The command line's conventions: one `--config` spelling, help on every option, and
`check-config` reporting every problem at once with "did you mean" suggestions."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.cli import build_parser
from sidecar.core.config import ConfigError, parse_config
from sidecar.fake_provider.cli import build_arg_parser as fake_provider_parser
from sidecar.sim.cli import build_parser as sim_parser
from tests.conftest import base_config_dict


def _parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    out = []
    for name, top in (("tailroute", build_parser()), ("simulate/report", sim_parser()),
                      ("fake-provider", fake_provider_parser())):
        out.append((name, top))
        for action in top._actions:
            if isinstance(action, argparse._SubParsersAction):
                out += [(f"{name} {cmd}", p) for cmd, p in action.choices.items()]
    return out


@pytest.mark.parametrize(("name", "parser"), _parsers(), ids=[n for n, _ in _parsers()])
def test_every_option_has_help(name: str, parser: argparse.ArgumentParser) -> None:
    missing = [a.dest for a in parser._actions
               if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
               and not a.help]
    assert not missing, f"{name}: options without help text: {missing}"


def test_config_file_is_spelled_the_same_everywhere() -> None:
    p = build_parser()
    for argv in (["serve", "--config", "x.yaml"], ["envoy-config", "-c", "x.yaml"],
                 ["check-config", "--config", "x.yaml"], ["status", "-c", "x.yaml"]):
        assert p.parse_args(argv).config == "x.yaml", argv


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sidecar.cli", *args], capture_output=True,
                          text=True, timeout=30, check=False)


def _write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def _many_mistakes() -> dict[str, Any]:
    data = base_config_dict()
    data["clusters"][0]["max_concurency"] = 3  # typo
    data["clusters"][1]["max_concurrency"] = 0  # out of range
    data["picker"] = "lowest"  # not a choice
    data["stats"] = {"subwindows": 0, "min_sample": 3}
    data["helth"] = {}
    data["models"][0]["candidates"] = ["a", "bb"]
    return data


EXPECTED = [
    "clusters[0]: unknown field(s): max_concurency (did you mean max_concurrency?)",
    "clusters[1].max_concurrency: must be >= 1, got 0",
    "models[0].candidates: unknown cluster 'bb' (did you mean b?)",
    "picker: must be one of weighted_random, lowest_score; got 'lowest' (did you mean "
    "lowest_score?)",
    "stats.subwindows: must be >= 1, got 0",
    "stats: unknown field(s): min_sample (did you mean min_samples?)",
    "<root>: unknown field(s): helth (did you mean health?)",
]


def test_parse_reports_every_problem_in_file_order() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(_many_mistakes(), "bad.yaml")
    problems = err.value.problems
    assert len(problems) == len(EXPECTED)
    for got, want in zip(problems, EXPECTED, strict=True):
        assert got.startswith("bad.yaml: ") and want in got, (got, want)
    assert str(err.value).splitlines() == list(problems)


def test_a_default_standing_in_for_a_mistake_raises_no_second_false_alarm() -> None:
    data = base_config_dict(classes={"x": {"slo": {"budget_ms": -1, "timeout_ms": 500}}})
    with pytest.raises(ConfigError) as err:  # default budget 1000 > timeout 500: not reported
        parse_config(data, "bad.yaml")
    assert err.value.problems == ("bad.yaml: classes.x.slo.budget_ms: must be >= 1, got -1",)


def test_a_broken_cluster_is_reported_once_not_by_every_model() -> None:
    data = base_config_dict()
    data["clusters"][2]["address"] = "nowhere"
    with pytest.raises(ConfigError) as err:
        parse_config(data, "bad.yaml")
    assert err.value.problems == ("bad.yaml: clusters[2].address: must be host:port, got "
                                  "'nowhere'",)


@pytest.mark.parametrize(("interactive", "problem"), [
    ({"slo": {"budget_ms": 800, "timeout_ms": 10}},
     "classes.interactive.slo.timeout_ms: must be >= budget_ms (800), got 10"),
    (5, "classes.interactive: expected a mapping, got int"),
    ({"slo": 5}, "classes.interactive.slo: expected a mapping, got int"),
    ({"priority": 5, "colour": "red"}, "classes.interactive: unknown field(s): colour"),
])
def test_a_broken_class_is_reported_once_not_by_what_names_it(interactive: Any,
                                                              problem: str) -> None:
    data = base_config_dict(classes={"interactive": interactive, "batch": {}},
                            default_class="interactive",
                            routing={"mode": "hybrid", "per_request_classes": ["interactive"]})
    data["clusters"][2]["models"] = ["m"]  # hybrid routing cannot rename the model
    with pytest.raises(ConfigError) as err:
        parse_config(data, "bad.yaml")
    assert err.value.problems == (f"bad.yaml: {problem}",)


def test_check_config_prints_every_problem(tmp_path: Path) -> None:
    path = _write(tmp_path / "bad.yaml", _many_mistakes())
    out = _cli("check-config", "--config", str(path))
    assert out.returncode == 2
    lines = out.stderr.splitlines()
    for want in EXPECTED:
        assert any(ln.startswith(f"{path}: ") and want in ln for ln in lines), want
    assert lines[-1] == f"{path}: {len(EXPECTED)} problems"


def test_check_config_positional_file_still_works_with_a_note(tmp_path: Path) -> None:
    path = _write(tmp_path / "ok.yaml", base_config_dict())
    out = _cli("check-config", str(path))
    assert out.returncode == 0 and f"{path}: OK" in out.stdout
    assert "deprecated" in out.stderr and "--config" in out.stderr
    assert _cli("check-config").returncode == 2


@pytest.mark.parametrize(("listen", "args", "problem"), [
    ({}, ["--grpc", "garbage"], "--grpc: must be host:port, got 'garbage'"),
    ({}, ["--grpc", "127.0.0.1:99999"],
     "--grpc: must be host:port with a port of 1..65535, got '127.0.0.1:99999'"),
    ({"grpc": "127.0.0.1:0"}, [],
     "listen.grpc: must be host:port with a port of 1..65535, got '127.0.0.1:0' (give --grpc"),
    ({"grpc": ""}, [], "listen.grpc: TCP is off ('') and listen.grpc_unix is not set"),
    ({}, ["--grpc", "[::1]:50051"], None),
    ({"grpc": ""}, ["--unix", "/tmp/t.sock"], None),
])
def test_envoy_config_needs_an_address_envoy_can_reach_the_sidecar_at(
    tmp_path: Path, listen: dict[str, str], args: list[str], problem: str | None
) -> None:
    path = _write(tmp_path / "t.yaml", base_config_dict(listen=listen))
    out = _cli("envoy-config", "--config", str(path), *args)
    if problem is None:
        assert out.returncode == 0, out.stderr
        if "--grpc" in args:  # an IPv6 address without its brackets, as Envoy takes it
            assert "address: ::1\n" in out.stdout
        return
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith("config error: "), out.stderr
    assert problem in out.stderr.splitlines()[0], out.stderr


def test_status_finds_the_admin_address_in_the_config(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.yaml", base_config_dict(listen={"admin": "127.0.0.1:1"}))
    out = _cli("status", "--config", str(path))
    assert out.returncode == 1 and "127.0.0.1:1" in out.stderr


@pytest.mark.parametrize(("mode", "fleet", "problem"), [
    ("extproc", True, None),
    ("native", True, "routing.mode: --workers 2 needs routing.mode extproc, not 'native'"),
    ("hybrid", True, "routing.mode: --workers 2 needs routing.mode extproc, not 'hybrid'"),
    ("extproc", False, "fleet: --workers 2 needs a fleet: section"),
])
def test_check_config_checks_what_serve_workers_needs(
    tmp_path: Path, mode: str, fleet: bool, problem: str | None
) -> None:
    data = base_config_dict(routing={"mode": mode}, listen={"grpc": "127.0.0.1:50051"})
    data["clusters"][2]["models"] = ["m"]  # native routing cannot rename the model
    if fleet:
        data["fleet"] = {"url": "redis://127.0.0.1:6379/0"}
    path = _write(tmp_path / "t.yaml", data)
    assert _cli("check-config", "--config", str(path)).returncode == 0  # alone: fine
    out = _cli("check-config", "--config", str(path), "--workers", "2")
    if problem is None:
        assert out.returncode == 0 and f"{path}: OK" in out.stdout
    else:
        assert out.returncode == 2
        assert out.stderr.splitlines()[0] == f"{path}: {problem}" + (
            " (native weights are published by one process: run serve without --workers)"
            if "routing" in problem else
            " (workers share statistics and health through Redis/Valkey)")


def _cli(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sidecar.cli", *args], capture_output=True,
                          text=True, timeout=60, check=False, **kw)


@pytest.mark.parametrize(
    ("args", "says"),
    [(["status", "--watch", "--interval", "-1"], "must be a number of seconds above 0"),
     (["status", "--interval", "0"], "must be a number of seconds above 0"),
     (["status", "--interval", "soon"], "not a number of seconds"),
     (["envoy-config", "-c", "deploy/local/tailroute.yaml", "-o", "/nonexistent/dir/x.yaml"],
      "cannot write /nonexistent/dir/x.yaml"),
     (["serve", "-c", "deploy/local/tailroute.yaml", "--snapshot-every", "0"],
      "argument --snapshot-every: must be a number of seconds >= 0.1 and at most 86400"),
     (["bench", "load", "--levels", "abc"], "argument --levels: not an integer: 'abc'"),
     (["bench", "soak", "--minutes", "0"], "argument --minutes: must be a number of minutes"),
     (["demo", "--duration", "nan"], "argument --duration: must be a number of seconds >= 1"),
     (["simulate", "--generate", "1", "--duration", "1e12"],
      "argument --duration: must be a number of seconds above 0 and at most 259200"),
     (["simulate", "--scenario", "/dev/zero"],
      "/dev/zero: scenario file is larger than 16 MiB: refused")],
)
def test_cli_mistakes_are_one_line_and_exit_2(args: list[str], says: str) -> None:
    out = _cli(*args, cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 2 and says in out.stderr
    assert "Traceback" not in out.stderr


def test_a_reader_that_leaves_early_is_not_a_traceback() -> None:
    """`tailroute envoy-config | head`: the pipe closes before the output is written."""
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sidecar.cli", "envoy-config", "-c", "deploy/local/tailroute.yaml"],
        cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the process has even imported its modules
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 1
    assert "Traceback" not in err and "BrokenPipe" not in err


def _parse(args: list[str]) -> argparse.Namespace:
    """What `tailroute ARGS` parses to (the policy lab has its own parser)."""
    parser = sim_parser() if args[0] in ("simulate", "report") else build_parser()
    return parser.parse_args(args)


_SCENARIO = "sidecar/sim/scenarios/isolated_spike.yaml"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["serve", "-c", "x.yaml", "--snapshot-every", "-1"], "--snapshot-every: must be a "
         "number of seconds >= 0.1 and at most 86400, got -1"),
        (["serve", "-c", "x.yaml", "--snapshot-every", "nan"], "--snapshot-every: must be"),
        (["serve", "-c", "x.yaml", "--snapshot-every", "0.01"], "--snapshot-every: must be"),
        (["demo", "--duration", "0"], "--duration: must be a number of seconds >= 1"),
        (["demo", "--duration", "-5"], "--duration: must be a number of seconds >= 1"),
        (["demo", "--seed", "-1"], "--seed: must be an integer >= 0, got -1"),
        (["bench", "overhead", "--concurrency", "0"],
         "--concurrency: must be an integer from 1 to 1024, got 0"),
        (["bench", "overhead", "--concurrency", "5000"], "--concurrency: must be an integer"),
        (["bench", "overhead", "--requests", "0"],
         "--requests: must be an integer from 1 to 1000000, got 0"),
        (["bench", "overhead", "--requests", "-5"], "--requests: must be an integer"),
        (["bench", "overhead", "--requests", "1e3"], "--requests: not an integer: '1e3'"),
        (["bench", "load", "--levels", "0"], "--levels: must be an integer from 1 to 1024, "
         "got 0 (a comma-separated list of concurrency levels, e.g. 1,16,64)"),
        (["bench", "load", "--levels", "1,,16"], "--levels: not an integer: ''"),
        (["bench", "load", "--tokens", "-3"], "--tokens: must be an integer from 1 to 4096"),
        (["bench", "load", "--duration", "nan"],
         "--duration: must be a number of seconds above 0 and at most 86400, got nan"),
        (["bench", "load", "--rounds", "0"], "--rounds: must be an integer from 1 to 100"),
        (["bench", "load", "--workers", "0"], "--workers: must be an integer from 1 to 64"),
        (["serve", "-c", "x.yaml", "--workers", "0"],
         "--workers: must be an integer from 1 to 64, got 0"),
        (["serve", "-c", "x.yaml", "--workers", "65"],
         "--workers: must be an integer from 1 to 64, got 65"),
        (["serve", "-c", "x.yaml", "--workers", "100000"], "--workers: must be an integer"),
        (["serve", "-c", "x.yaml", "--workers", "two"], "--workers: not an integer: 'two'"),
        (["check-config", "-c", "x.yaml", "--workers", "65"],
         "--workers: must be an integer from 1 to 64, got 65"),
        (["bench", "soak", "--minutes", "-1"],
         "--minutes: must be a number of minutes above 0 and at most 1440, got -1"),
        (["bench", "soak", "--minutes", "nan"], "--minutes: must be a number of minutes"),
        (["bench", "soak", "--rate", "0"],
         "--rate: must be a number of requests per second above 0 and at most 10000, got 0"),
        (["bench", "soak", "--warmup-min", "-1"], "--warmup-min: must be a number of minutes "
         ">= 0"),
        (["simulate", "--scenario", _SCENARIO, "--duration", "nan"],
         "--duration: must be a number of seconds above 0 and at most 259200, got nan"),
        (["simulate", "--scenario", _SCENARIO, "--duration", "inf"], "--duration: must be"),
        (["simulate", "--scenario", _SCENARIO, "--seed", "-1"],
         "--seed: must be an integer >= 0, got -1"),
        (["simulate", "--generate", "1", "--noise-seeds", "100000000"],
         "--noise-seeds: must be an integer from 1 to 100, got 100000000"),
        (["simulate", "--generate", "100000000", "--write-only"],
         "--generate: must be an integer from 1 to 10000, got 100000000"),
        (["simulate", "--generate", "2", "--jobs", "500"],
         "--jobs: must be an integer from 1 to 64, got 500"),
        (["report", "--out", "r", "--duration", "0"], "--duration: must be a number"),
    ],
)
def test_out_of_range_options_are_refused_naming_the_option(
        args: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _parse(args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"error: argument {says}" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "field", "value"),
    [
        (["serve", "-c", "x.yaml", "--snapshot-every", "0.1"], "snapshot_every", 0.1),
        (["serve", "-c", "x.yaml", "--workers", "64"], "workers", 64),
        (["serve", "-c", "x.yaml"], "workers", 1),
        (["check-config", "-c", "x.yaml", "--workers", "64"], "workers", 64),
        (["demo", "--duration", "1"], "duration", 1.0),
        (["bench", "load", "--levels", "1, 16,1024"], "levels", (1, 16, 1024)),
        (["bench", "load"], "levels", None),
        (["bench", "soak", "--warmup-min", "0"], "warmup_min", 0.0),
        (["simulate", "--generate", "10000", "--jobs", "64", "--noise-seeds", "100",
          "--seed", "0", "--duration", "259200"], "jobs", 64),
    ],
)
def test_options_at_their_bounds_are_accepted(args: list[str], field: str, value: Any) -> None:
    assert getattr(_parse(args), field) == value


def test_check_config_refuses_a_config_without_models(tmp_path: Path) -> None:
    path = _write(tmp_path / "empty.yaml", base_config_dict(models=[]))
    out = _cli("check-config", "--config", str(path))
    assert out.returncode == 2, out.stdout
    assert out.stderr.splitlines() == [
        f"{path}: models: must define at least one model (with none, tailroute routes "
        "nothing: every request goes to default_cluster) (line 15)",
        f"{path}: 1 problem"]


@pytest.mark.parametrize(("admin", "workers", "problem"), [
    ("127.0.0.1:65530", "6", None),  # the last worker on 65535
    ("127.0.0.1:65530", "7", "--workers 7: worker i serves admin on port 65530 + i "
     "(127.0.0.1:65530), the last on 65536, above 65535: use a lower admin port "
     "(listen.admin, --admin) or fewer workers"),
    ("127.0.0.1:0", "64", None),  # port 0: each worker picks a free one
    ("127.0.0.1:50049", "2", None),
    ("127.0.0.1:50049", "3", "--workers 3: worker i serves admin on port 50049 + i "
     "(127.0.0.1:50049), worker 2 on the gRPC port (127.0.0.1:50051): give the admin "
     "ports (listen.admin, --admin) room for the workers"),
    ("0.0.0.0:50050", "2", "--workers 2: worker i serves admin on port 50050 + i "
     "(0.0.0.0:50050), worker 1 on the gRPC port (127.0.0.1:50051): give the admin "
     "ports (listen.admin, --admin) room for the workers"),
])
def test_check_config_checks_every_worker_has_an_admin_port(
    tmp_path: Path, admin: str, workers: str, problem: str | None
) -> None:
    data = base_config_dict(listen={"grpc": "127.0.0.1:50051", "admin": admin},
                            fleet={"url": "redis://127.0.0.1:6379/0"})
    path = _write(tmp_path / "t.yaml", data)
    out = _cli("check-config", "--config", str(path), "--workers", workers)
    if problem is None:
        assert out.returncode == 0, out.stderr
    else:
        assert out.returncode == 2 and out.stderr.splitlines()[0] == problem, out.stderr


@pytest.mark.parametrize(("name", "parser"), _parsers(), ids=[n for n, _ in _parsers()])
def test_help_is_written_for_the_operator(name: str, parser: argparse.ArgumentParser) -> None:
    """`tailroute --help` printed the module docstring: "This module parses the command
    line and dispatches; what each command does is :mod:`sidecar.cli_commands`"."""
    text = parser.format_help()
    leaks = [m.group(0) for m in re.finditer(r":[a-z]+:`[^`]*`|``[^`]*``|This module", text)]
    assert not leaks, f"{name} --help shows the code's docstring markup: {leaks}"


@pytest.mark.parametrize("output", [[], ["-o", "-"], ["--output", "-"]])
def test_envoy_config_writes_to_stdout_by_default_and_for_dash(
        tmp_path: Path, output: list[str]) -> None:
    """`-o -` is standard output, as for other tools; it wrote a file named "-" in the
    working directory and printed nothing."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(  # this tree's code, from tmp_path
        p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}
    out = _cli("envoy-config", "-c", str(root / "deploy/local/tailroute.yaml"), *output,
               cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout == (root / "envoy" / "envoy.yaml").read_text()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("classes", "says"), [
    (None, "OK (3 clusters, 1 model, 3 classes)"),
    ({"only": {}}, "OK (3 clusters, 1 model, 1 class)"),
])
def test_check_config_counts_in_words(tmp_path: Path, classes: Any, says: str) -> None:
    """It printed "1 models" for the shipped example's one model."""
    data = base_config_dict() if classes is None else base_config_dict(classes=classes)
    path = _write(tmp_path / "ok.yaml", data)
    out = _cli("check-config", "--config", str(path), cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0 and out.stdout == f"{path}: {says}\n"


@pytest.mark.parametrize("command", ["check-config", "envoy-config"])
def test_a_header_envoy_must_set_is_named(tmp_path: Path, command: str) -> None:
    """hints.class read from a header the rendered Envoy removes from callers: the
    operator is told to add the filter that sets it (nothing in the bootstrap does)."""
    path = _write(tmp_path / "t.yaml", base_config_dict(hints={
        "class": {"header": "x-auth-class"}, "tenant": {"header": "x-t", "set_by": "front"}}))
    out = _cli(command, "--config", str(path))
    assert out.returncode == 0, out.stderr
    notes = [ln for ln in out.stderr.splitlines() if ln.startswith("note: ")]
    assert notes == [f"note: {path}: hints.class: read from x-auth-class, which the rendered "
                     "Envoy removes from callers' requests; add the filter that sets it "
                     "(jwt_authn claim_to_headers, ext_authz, lua) before tailroute.route, "
                     "or no request has a class"]
