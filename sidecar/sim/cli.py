"""Command line of the policy lab: ``simulate`` and ``report``.

``main(argv)`` takes the subcommand first, so ``tailroute simulate ...`` maps
to ``main(["simulate", ...])``::

    simulate --scenario FILE [--scenario FILE ...] [--policy NAME ...] [--seed N]
             [--json] [--trace PATH] [--duration S] [--out FILE]
    simulate --suite [DIR]          (default: the shipped scenarios)
    report   [--suite DIR] --out DIR [--policy NAME ...] [--seed N] [--trace PATH]
             [--duration S] [--from-json FILE]

Exit codes: 0 ok, 2 usage or scenario error (the message names the file and
field). In suite mode a failing scenario (e.g. a missing trace) is reported on
stderr and under ``errors`` in the JSON, the others still run, and the exit
code is 2. Progress goes to stderr; results to stdout (table, or JSON with
``--json``) or to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sidecar.core.config import ConfigError
from sidecar.sim.policies import POLICY_NAMES
from sidecar.sim.runner import StderrProgress, run_suite, scenario_files
from sidecar.sim.tables import LEGEND, suite_lines, text_table


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tailroute", description="tailroute policy lab")
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("simulate", help="run scenarios against routing policies")
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--scenario", action="append", metavar="FILE", help="a scenario file")
    src.add_argument("--suite", nargs="?", const="", metavar="DIR",
                     help="every *.yaml in DIR (default: the shipped scenarios)")
    _common(s)
    s.add_argument("--json", action="store_true", help="print the JSON document (schema 1)")
    s.add_argument("--out", metavar="FILE", help="also write the JSON document here")
    s.set_defaults(func=_cmd_simulate)

    r = sub.add_parser("report", help="write a markdown report with plots")
    r.add_argument("--suite", default="", metavar="DIR",
                   help="scenario directory (default: the shipped scenarios)")
    r.add_argument("--out", required=True, metavar="DIR", help="output directory")
    r.add_argument("--from-json", metavar="FILE",
                   help="render an existing results document instead of running")
    _common(r)
    r.set_defaults(func=_cmd_report)
    return p


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", action="extend", nargs="+", metavar="NAME", choices=POLICY_NAMES,
                   help=f"policies to run (default: the scenario's list or all but "
                        f"tailroute_no_admission); known: {', '.join(POLICY_NAMES)}")
    p.add_argument("--seed", type=int, help="override every scenario's seed")
    p.add_argument("--trace", metavar="PATH",
                   help="trace CSV for trace-replay workloads (overrides their path)")
    p.add_argument("--duration", type=float, metavar="S",
                   help="override every scenario's duration_s (quick runs)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")


def _run(ns: argparse.Namespace, files: list[Path], keep_going: bool) -> dict[str, Any]:
    progress = None if ns.quiet else StderrProgress()
    doc = run_suite(files, ns.policy, seed=ns.seed, trace=ns.trace, duration=ns.duration,
                    progress=progress, keep_going=keep_going)
    if progress is not None:
        progress.done()
    for err in doc.get("errors", []):
        sys.stderr.write(f"error: {err['error']} (scenario skipped)\n")
    return doc


def _cmd_simulate(ns: argparse.Namespace) -> int:
    files = ([Path(f) for f in ns.scenario] if ns.scenario
             else scenario_files(ns.suite or None))
    doc = _run(ns, files, keep_going=not ns.scenario)
    text = json.dumps(doc, indent=1)  # insertion order is deterministic (and meaningful)
    if ns.out:
        Path(ns.out).write_text(text + "\n", encoding="utf-8")
    if ns.json:
        sys.stdout.write(text + "\n")
    else:
        for sc in doc["scenarios"]:
            sys.stdout.write(text_table(sc) + "\n\n")
        sys.stdout.write(LEGEND + "\n\n")
        sys.stdout.write("\n".join(suite_lines(doc["summary"])) + "\n")
    return 2 if doc.get("errors") else 0


def _cmd_report(ns: argparse.Namespace) -> int:
    from sidecar.sim.report import write_report

    if ns.from_json:
        doc = json.loads(Path(ns.from_json).read_text(encoding="utf-8"))
        if doc.get("schema_version") != 1:
            raise ConfigError(f"{ns.from_json}: unsupported schema_version "
                              f"{doc.get('schema_version')!r} (expected 1)")
    else:
        doc = _run(ns, scenario_files(ns.suite or None), keep_going=True)
    md = write_report(doc, Path(ns.out))
    sys.stderr.write(f"report written to {md}\n")
    return 2 if doc.get("errors") else 0


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``main(["simulate", "--scenario", "x.yaml"])``; returns the exit code."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        return int(ns.func(ns))
    except ConfigError as exc:  # scenario and config errors: file + field path
        sys.stderr.write(f"error: {exc}\n")
        return 2
    except FileNotFoundError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
