"""Command line of the policy lab: ``simulate`` and ``report``.

``main(argv)`` takes the subcommand first, so ``tailroute simulate ...`` maps
to ``main(["simulate", ...])``::

    simulate --scenario FILE [--scenario FILE ...] [--policy NAME ...] [--seed N]
             [--json] [--trace PATH] [--duration S] [--out FILE] [--noise-seeds K]
    simulate --suite [DIR]          (default: the shipped scenarios)
    simulate --generate N [--family-seed S] [--family NAME ...] [--jobs J]
             [--write-scenarios DIR [--write-only]] [--full]
    simulate ... --compiled         (the same run on the mypyc-compiled build)
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
import os
import sys
from pathlib import Path
from typing import Any

from sidecar.cli_types import integer, number
from sidecar.core.config import ConfigError
from sidecar.sim.bounds import MAX_DURATION_S, MAX_GENERATE, MAX_JOBS, MAX_NOISE_SEEDS
from sidecar.sim.gen_families import FAMILIES
from sidecar.sim.gen_run import family_lines, generate, run_generated, write_yaml
from sidecar.sim.policies import DEFAULT_POLICIES, POLICY_NAMES
from sidecar.sim.runner import (
    SCHEMA_VERSION,
    SHIPPED,
    StderrProgress,
    run_suite,
    scenario_files,
)
from sidecar.sim.tables import LEGEND, suite_lines, text_table


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tailroute", description="tailroute policy lab")
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("simulate", help="run scenarios against routing policies")
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--scenario", action="append", metavar="FILE", help="a scenario file")
    src.add_argument("--suite", nargs="?", const="", metavar="DIR",
                     help="every *.yaml in DIR (default: the shipped scenarios)")
    src.add_argument("--generate", type=integer(1, MAX_GENERATE), metavar="N",
                     help=f"N randomized scenarios drawn from the families (docs/scenarios.md; "
                          f"1 to {MAX_GENERATE})")
    _common(s)
    s.add_argument("--json", action="store_true",
                   help=f"print the JSON document (schema {SCHEMA_VERSION})")
    s.add_argument("--out", metavar="FILE", help="also write the JSON document here")
    g = s.add_argument_group("generated scenarios (with --generate)")
    g.add_argument("--family-seed", type=int, default=1, metavar="S",
                   help="seed of the draw: scenario k of a family is the same for the same S "
                        "(default 1)")
    g.add_argument("--family", action="extend", nargs="+", metavar="NAME",
                   help=f"families to draw from (default: all): {', '.join(FAMILIES)}")
    g.add_argument("--jobs", type=integer(1, MAX_JOBS), default=1, metavar="J",
                   help=f"run J scenarios in parallel processes (default 1; at most {MAX_JOBS})")
    g.add_argument("--write-scenarios", metavar="DIR",
                   help="also write each generated scenario to DIR/<name>.yaml")
    g.add_argument("--write-only", action="store_true",
                   help="write the scenarios (needs --write-scenarios) without running them")
    g.add_argument("--full", action="store_true",
                   help="keep every run's time series in the JSON (large)")
    s.add_argument("--compiled", action="store_true",
                   help="run on the mypyc-compiled build of the core and the lab (about "
                        "twice as fast, the same results; built on first use, about two "
                        "minutes; sidecar.devtools.compiled)")
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
    p.add_argument("--seed", type=integer(0), help="override every scenario's seed (>= 0)")
    p.add_argument("--trace", metavar="PATH",
                   help="trace CSV for trace-replay workloads (overrides their path)")
    p.add_argument("--duration", type=number("seconds", MAX_DURATION_S), metavar="S",
                   help=f"override every scenario's duration_s (quick runs; at most "
                        f"{MAX_DURATION_S:g})")
    p.add_argument("--noise-seeds", type=integer(1, MAX_NOISE_SEEDS), default=1, metavar="K",
                   help="run each policy K times per scenario on independent service noise "
                        f"and pool the counts (default 1: one run; at most {MAX_NOISE_SEEDS})")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")


def _run(ns: argparse.Namespace, files: list[Path], keep_going: bool) -> dict[str, Any]:
    progress = None if ns.quiet else StderrProgress()
    doc = run_suite(files, ns.policy, seed=ns.seed, trace=ns.trace, duration=ns.duration,
                    progress=progress, keep_going=keep_going, noise_seeds=ns.noise_seeds)
    if progress is not None:
        progress.done()
    for err in doc.get("errors", []):
        sys.stderr.write(f"error: {err['error']} (scenario skipped)\n")
    return doc


def _cmd_generate(ns: argparse.Namespace) -> int:
    items = generate(ns.generate, ns.family_seed, ns.family)
    if ns.write_scenarios:
        for g in items:
            write_yaml(g, Path(ns.write_scenarios))
        if not ns.quiet:
            sys.stderr.write(f"{len(items)} scenario(s) written to {ns.write_scenarios}\n")
    elif ns.write_only:
        raise ConfigError("--write-only needs --write-scenarios DIR")
    if ns.write_only:
        return 0
    policies = list(dict.fromkeys(ns.policy)) if ns.policy else list(DEFAULT_POLICIES)
    progress = None if ns.quiet else StderrProgress()
    doc = run_generated(items, policies, duration=ns.duration, jobs=ns.jobs, full=ns.full,
                        progress=None if progress is None else progress.step,
                        noise_seeds=ns.noise_seeds)
    if progress is not None:
        progress.done()
    text = json.dumps(doc, indent=1)
    if ns.out:
        Path(ns.out).write_text(text + "\n", encoding="utf-8")
    if ns.json:
        sys.stdout.write(text + "\n")
    else:
        sys.stdout.write("\n".join(family_lines(doc)) + "\n")
    return 0


def _cmd_simulate(ns: argparse.Namespace) -> int:
    if ns.generate is not None:
        return _cmd_generate(ns)
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
    from sidecar.sim.report import load_results, write_report

    if ns.from_json:
        doc = load_results(Path(ns.from_json), (1, SCHEMA_VERSION))
        try:
            md = write_report(doc, Path(ns.out))
        except (KeyError, TypeError, AttributeError, IndexError) as exc:
            # Valid JSON of the wrong shape: say so instead of a traceback.
            raise ConfigError(f"--from-json {ns.from_json}: not a results document "
                              f"({type(exc).__name__}: {exc})") from None
    else:
        doc = _run(ns, scenario_files(ns.suite or None), keep_going=True)
        md = write_report(doc, Path(ns.out))
    sys.stderr.write(f"report written to {md}\n")
    return 2 if doc.get("errors") else 0


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``main(["simulate", "--scenario", "x.yaml"])``; returns the exit code."""
    parser = build_parser()
    args = sys.argv[1:] if argv is None else list(argv)
    ns = parser.parse_args(args)
    if getattr(ns, "compiled", False):
        from sidecar.devtools import compiled

        if os.environ.get(compiled.ENV_FLAG) != "1":  # this process: start the child
            if ns.suite == "":  # the shipped suite as files of this tree, not of the copy
                args += ["--suite", str(SHIPPED)]
            return compiled.run_compiled(["-m", "sidecar.cli", *args])
        try:
            compiled.require()  # the child: it must really be the compiled build
        except compiled.BuildError as exc:
            sys.stderr.write(f"error: --compiled: {exc}\n")
            return 2
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
