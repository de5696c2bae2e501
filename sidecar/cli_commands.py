"""What each `tailroute` command does (:mod:`sidecar.cli` parses the command line and
dispatches here): serve, check-config, envoy-config, status, demo, the benchmarks and
the fake provider. Heavy imports stay inside each command, so ``tailroute status``
does not load the server."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Coroutine
from typing import Any

from sidecar.core.config import Config, ConfigError

DEFAULT_ADMIN = "127.0.0.1:9911"


def serve(ns: argparse.Namespace) -> int:
    from pathlib import Path

    from sidecar.ops import log_throttle
    from sidecar.ops.config_file import load_config
    from sidecar.ops.reload import fingerprint
    from sidecar.serve import serve
    from sidecar.shell.startup import StartupError, check_ready_file

    loaded_from = fingerprint(Path(ns.config))  # before the read: an edit during it is seen
    config = load_config(ns.config)
    try:
        if ns.ready_file:  # written once serving; the supervisor's work files go beside it
            check_ready_file(ns.ready_file)
        if ns.workers != 1:  # N processes on one port sharing state through the fleet store
            from sidecar.fleet.workers import run_workers

            return run_workers(ns, config, ns.workers)
    except StartupError as exc:
        print(f"tailroute serve: {exc}", file=sys.stderr)
        return 1
    if ns.worker_index is not None:
        from sidecar.fleet.workers import worker_log_format

        worker_log_format(ns.worker_index)
    throttle = log_throttle.install()  # warnings rate-limited, suppressed lines counted
    try:
        return run_on_loop(
            serve(config, grpc_addr=ns.grpc, unix=ns.unix, admin_addr=ns.admin,
                  ready_file=ns.ready_file, seed=ns.seed, config_path=ns.config,
                  config_fingerprint=loaded_from,
                  snapshot_path=ns.snapshot, snapshot_every_s=ns.snapshot_every,
                  worker=ns.worker_index, workers_status=ns.workers_status,
                  heartbeat=None if ns.heartbeat_fd is None else (
                      ns.heartbeat_fd, ns.heartbeat_every)),
            ns.loop,
        )
    except StartupError as exc:
        print(f"tailroute serve: {exc}", file=sys.stderr)
        return 1
    finally:
        throttle.flush()


def run_on_loop(main: Coroutine[Any, Any, int], kind: str) -> int:
    """Run ``main`` on uvloop (``auto``: when installed) or the standard asyncio loop.

    uvloop measured cheaper per request (docs/response-timing.md); it is an optional
    dependency (``pip install 'tailroute[uvloop]'``), so ``auto`` falls back quietly.
    """
    if kind in ("auto", "uvloop"):
        try:
            import uvloop
        except ImportError:
            if kind == "uvloop":
                raise ConfigError("--loop uvloop: uvloop is not installed "
                                  "(pip install 'tailroute[uvloop]')") from None
        else:
            return uvloop.run(main)
    return asyncio.run(main)


def check_config(ns: argparse.Namespace) -> int:
    from sidecar.ops.config_file import load_config

    path = ns.config or ns.file
    if ns.file and not ns.config:
        print("note: `check-config FILE` is deprecated; use `check-config --config FILE`",
              file=sys.stderr)
    if ns.file and ns.config:
        print("error: give the file once, as --config FILE", file=sys.stderr)
        return 2
    if not path:
        print("error: check-config needs --config FILE", file=sys.stderr)
        return 2
    try:
        cfg = load_config(path)
        if ns.workers != 1:  # what `serve --workers N` would refuse
            from sidecar.fleet.workers import check_workers

            check_workers(cfg, ns.workers, cfg.listen.grpc, cfg.listen.grpc_unix,
                          cfg.listen.admin)
    except ConfigError as exc:
        for problem in exc.problems:  # every mistake, not only the first
            print(problem, file=sys.stderr)
        n = len(exc.problems)
        print(f"{path}: {n} problem{'s' if n != 1 else ''}", file=sys.stderr)
        return 2
    from sidecar.shell.bootstrap import unverified_providers
    from sidecar.shell.hint_rules import trusted_header_notes

    for warning in unverified_providers(cfg):
        print(f"warning: {warning}", file=sys.stderr)
    for note in trusted_header_notes(cfg):
        print(f"note: {note}", file=sys.stderr)
    print(f"{path}: OK ({_count(len(cfg.clusters), 'cluster')}, "
          f"{_count(len(cfg.models), 'model')}, {_count(len(cfg.classes), 'class', 'es')})")
    return 0


def _count(n: int, noun: str, plural: str = "s") -> str:
    return f"{n} {noun}{'' if n == 1 else plural}"


def envoy_config(ns: argparse.Namespace) -> int:
    from sidecar.ops.config_file import load_config
    from sidecar.shell.bootstrap import to_yaml, unverified_providers
    from sidecar.shell.bootstrap_native import render_for_mode
    from sidecar.shell.hint_rules import trusted_header_notes

    cfg = load_config(ns.config)
    check_sidecar_target(cfg, ns.grpc, ns.unix)
    for warning in unverified_providers(cfg):
        print(f"warning: {warning}", file=sys.stderr)
    for note in trusted_header_notes(cfg):
        print(f"note: {note}", file=sys.stderr)
    text = to_yaml(render_for_mode(cfg, grpc_target=ns.grpc, unix_socket=ns.unix))
    # `-o -` is standard output, as for most Unix tools: not a file named "-".
    if ns.output and ns.output != "-":
        try:
            with open(ns.output, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            print(f"tailroute envoy-config: cannot write {ns.output}: {exc.strerror or exc}",
                  file=sys.stderr)
            return 2
    else:
        sys.stdout.write(text)
    return 0


def check_sidecar_target(cfg: Config, grpc: str | None, unix: str | None) -> None:
    """ConfigError unless Envoy gets an address it can connect to: a listen address the
    config may give (port 0, ``""`` = TCP off) is no target for Envoy's sidecar cluster."""
    from sidecar.core.hostport import split_hostport

    if unix or (grpc is None and cfg.listen.grpc_unix):
        return
    if grpc is not None:
        setting, addr, hint = "--grpc", grpc, ""
    else:
        setting, addr = f"{cfg.source}: listen.grpc", cfg.listen.grpc
        hint = " (give --grpc HOST:PORT or --unix PATH for Envoy)"
        if not addr:
            raise ConfigError(f"{setting}: TCP is off ('') and listen.grpc_unix is not set: "
                              f"Envoy has no address to reach the sidecar at{hint}")
    try:
        split_hostport(addr)
    except ValueError as exc:
        raise ConfigError(f"{setting}: {exc}{hint}") from None


def status(ns: argparse.Namespace) -> int:
    from sidecar.ops.status_cli import run_status

    admin = ns.admin
    if admin is None and ns.config:
        from sidecar.ops.config_file import load_config

        admin = load_config(ns.config).listen.admin
    return run_status(admin or DEFAULT_ADMIN, watch=ns.watch, interval_s=ns.interval,
                      show_all=ns.all)


def fake_provider(argv: list[str]) -> int:
    from sidecar.fake_provider.cli import main

    return main(argv)


def demo(ns: argparse.Namespace) -> int:
    from sidecar.devtools.demo import run_demo

    return run_demo(duration_s=ns.duration, seed=ns.seed)


def bench(ns: argparse.Namespace) -> int:
    if ns.what == "soak":
        return bench_soak(ns)
    if ns.what == "load":
        from sidecar.devtools.bench_load import run_load_bench

        levels: tuple[int, ...] = ns.levels or (1, 16, 64, 256)
        modes = tuple(m.strip() for m in ns.modes.split(","))
        bad = [m for m in modes if m not in ("extproc", "native", "hybrid")]
        if bad:
            raise ConfigError(f"--modes: unknown routing mode(s) {', '.join(bad)} "
                              "(known: extproc, native, hybrid)")
        return run_load_bench(levels, duration_s=ns.duration, stream=not ns.no_stream,
                              tokens=ns.tokens, loop=ns.loop, modes=modes, rounds=ns.rounds,
                              workers=ns.workers)
    if ns.what == "publish":
        from sidecar.devtools.bench_native import run_publish_bench

        return run_publish_bench()
    from sidecar.devtools.bench import run_bench

    return run_bench(ns.what, requests=ns.requests, concurrency=ns.concurrency)


def bench_soak(ns: argparse.Namespace) -> int:
    from sidecar.devtools.bench_soak import run_soak

    return run_soak(minutes=ns.minutes, rate=ns.rate, concurrency=ns.concurrency,
                    warmup_min=ns.warmup_min, distinct=ns.distinct, traced=ns.tracemalloc)
