"""The `tailroute` command line: run the sidecar, validate and render its config, watch it,
and run the demo, the benchmarks and the policy lab. This module parses the command
line and dispatches; what each command does is :mod:`sidecar.cli_commands` (the lab's
commands: :mod:`sidecar.sim.cli`)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable

from sidecar import cli_commands as commands
from sidecar.cli_commands import DEFAULT_ADMIN
from sidecar.cli_types import MAX_CLIENTS, integer, levels_type, number, positive_seconds
from sidecar.core.config import ConfigError

# Bounds of the demo's and the benchmarks' options: far above any useful run, low enough
# that a typo is refused instead of starting hours of load or a thousand threads.
MAX_REQUESTS = 1_000_000  # bench overhead --requests
MAX_TOKENS = 4096  # bench load --tokens (output tokens per request)
MAX_RUN_S = 86400.0  # one day: demo --duration, bench load --duration
MAX_SOAK_MIN = 1440.0  # one day: bench soak --minutes, --warmup-min
MAX_RATE = 10_000.0  # bench soak --rate (requests per second)
MAX_ROUNDS = 100  # bench load --rounds
# serve/check-config/bench load --workers: a worker is a whole process deciding on one core
# (own memory, store connection, admin port + i): more than the cores only contend.
MAX_WORKERS = 64
MIN_SNAPSHOT_S = 0.1  # serve --snapshot-every: each write serialises the whole state
MAX_SNAPSHOT_S = 86400.0
MIN_DEMO_S = 1.0  # demo --duration: it sends at most 40 requests a second
CONFIG_HELP = "the sidecar's config file (YAML; `tailroute check-config` validates it)"
# What `tailroute --help` says; the module docstring is for readers of the code (it names
# modules in Sphinx roles an operator's terminal would show as they are).
DESCRIPTION = ("The tailroute command line: run the ext_proc sidecar, validate its config "
               "and render the Envoy bootstrap from it, watch a running sidecar, and run "
               "the demo, the benchmarks and the policy lab.")


def _config_option(p: argparse.ArgumentParser, required: bool) -> None:
    """The one spelling of the config file every subcommand uses."""
    p.add_argument("-c", "--config", required=required, metavar="FILE", help=CONFIG_HELP)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tailroute", description=DESCRIPTION,
        epilog="`tailroute <command> --help` describes each command's options.")
    p.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="command")

    s = sub.add_parser("serve", help="run the ext_proc sidecar",
                       description="Serve Envoy's ext_proc streams and the admin endpoints "
                       "until SIGTERM/SIGINT; SIGHUP or a changed file reloads the config.")
    _config_option(s, required=True)
    s.add_argument("--grpc", default=None, metavar="HOST:PORT",
                   help="ext_proc gRPC address (default: listen.grpc; '' = off)")
    s.add_argument("--unix", default=None, metavar="PATH",
                   help="also serve gRPC on this Unix socket (default: listen.grpc_unix)")
    s.add_argument("--admin", default=None, metavar="HOST:PORT",
                   help="admin HTTP address (default: listen.admin)")
    s.add_argument("--ready-file", default=None, metavar="PATH",
                   help="write '<grpc port> <admin port>' here once serving")
    s.add_argument("--seed", type=int, default=None, help="seed the picker's RNG")
    s.add_argument("--snapshot", default=None, metavar="PATH",
                   help="warm-restart snapshot file (default: snapshot_path from the config)")
    s.add_argument("--snapshot-every", default=30.0, metavar="SECONDS",
                   type=number("seconds", MAX_SNAPSHOT_S, lo=MIN_SNAPSHOT_S, lo_ok=True),
                   help=f"how often to rewrite the snapshot (also written on shutdown; "
                        f"{MIN_SNAPSHOT_S:g} to {MAX_SNAPSHOT_S:g})")
    s.add_argument("--loop", choices=["auto", "uvloop", "asyncio"], default="auto",
                   help="event loop: uvloop when installed (auto, the default) or asyncio")
    s.add_argument("--workers", type=integer(1, MAX_WORKERS), default=1, metavar="N",
                   help="N processes on one gRPC port (SO_REUSEPORT) sharing statistics and "
                        "health through the fleet: store; worker i's admin port is +i; 1 to "
                        f"{MAX_WORKERS} (one core each: more than the host's cores only contend)")
    s.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    # The supervisor's records of its workers (sidecar.fleet.worker_status).
    s.add_argument("--workers-status", default=None, help=argparse.SUPPRESS)
    # The write end of the worker's heartbeat pipe, and how often to beat
    # (sidecar.fleet.heartbeat): the supervisor's proof that the worker's loop runs.
    s.add_argument("--heartbeat-fd", type=int, default=None, help=argparse.SUPPRESS)
    s.add_argument("--heartbeat-every", type=positive_seconds, default=0.25,
                   help=argparse.SUPPRESS)
    s.set_defaults(func=commands.serve)

    st = sub.add_parser("status", help="terminal view of a running sidecar's /state")
    st.add_argument("--admin", default=None, metavar="HOST:PORT",
                    help=f"the sidecar's admin address (default: listen.admin of --config, "
                    f"else {DEFAULT_ADMIN})")
    _config_option(st, required=False)
    st.add_argument("--watch", action="store_true", help="refresh until interrupted")
    st.add_argument("--interval", type=positive_seconds, default=2.0, metavar="SECONDS",
                    help="seconds between refreshes with --watch (default: 2)")
    st.add_argument("--all", action="store_true",
                    help="also show aggregate (broader) slices, not only the routed ones")
    st.set_defaults(func=commands.status)

    c = sub.add_parser("check-config", help="validate a config file (every problem at once)")
    _config_option(c, required=False)
    c.add_argument("file", nargs="?", metavar="FILE",
                   help="deprecated spelling of --config FILE")
    c.add_argument("--workers", type=integer(1, MAX_WORKERS), default=1, metavar="N",
                   help=f"also check what `serve --workers N` needs (1 to {MAX_WORKERS})")
    c.set_defaults(func=commands.check_config)

    e = sub.add_parser("envoy-config", help="render the Envoy bootstrap from a sidecar config")
    _config_option(e, required=True)
    e.add_argument("--grpc", default=None, metavar="HOST:PORT",
                   help="where Envoy reaches the sidecar (default: listen.grpc)")
    e.add_argument("--unix", default=None, metavar="PATH",
                   help="reach the sidecar over this Unix socket instead")
    e.add_argument("-o", "--output", default=None, metavar="FILE",
                   help="write the bootstrap here (default, or -: stdout)")
    e.set_defaults(func=commands.envoy_config)

    sub.add_parser("fake-provider", help="simulated OpenAI-compatible provider", add_help=False)
    sub.add_parser("simulate", help="policy lab: replay scenarios against policies",
                   add_help=False)
    sub.add_parser("report", help="policy lab: markdown + PNG report for a suite",
                   add_help=False)

    d = sub.add_parser("demo", help="Envoy + sidecar + 3 simulated providers, one degrades")
    d.add_argument("--duration", type=number("seconds", MAX_RUN_S, MIN_DEMO_S, lo_ok=True),
                   default=60.0, metavar="SECONDS",
                   help=f"how long to drive traffic (default: 60; {MIN_DEMO_S:g} to "
                        f"{MAX_RUN_S:g})")
    d.add_argument("--seed", type=integer(0), default=7,
                   help="seed of the traffic and the providers (>= 0)")
    d.set_defaults(func=commands.demo)

    b = sub.add_parser("bench", help="benchmarks (print figures; not tests)")
    b.add_argument("what", choices=["overhead", "load", "soak", "publish"],
                   help="overhead: added latency and CPU per request, per setup; "
                        "load: Envoy alone vs Envoy + tailroute at rising concurrency; "
                        "soak: memory under steady load (RSS slope); "
                        "publish: how fast native-mode weights reach Envoy, what a dead "
                        "sidecar leaves")
    b.add_argument("--requests", type=integer(1, MAX_REQUESTS), default=400,
                   help=f"overhead: requests per setup (1 to {MAX_REQUESTS})")
    b.add_argument("--concurrency", type=integer(1, MAX_CLIENTS), default=8,
                   help=f"overhead, soak: concurrent clients (1 to {MAX_CLIENTS})")
    b.add_argument("--levels", type=levels_type, default=None, metavar="C1,C2,...",
                   help=f"load: concurrency levels (default 1,16,64,256; each 1 to "
                        f"{MAX_CLIENTS})")
    b.add_argument("--duration", type=number("seconds", MAX_RUN_S), default=30.0,
                   metavar="SECONDS",
                   help=f"load: seconds per setup and level (default 30; at most "
                        f"{MAX_RUN_S:g})")
    b.add_argument("--tokens", type=integer(1, MAX_TOKENS), default=4,
                   help=f"load: output tokens per request (1 to {MAX_TOKENS})")
    b.add_argument("--no-stream", action="store_true", help="load: non-streaming requests")
    b.add_argument("--workers", type=integer(1, MAX_WORKERS), default=1, metavar="N",
                   help="load: the sidecar as `serve --workers N` sharing state through a "
                        f"redis-server started for the run (needs redis-server; 1 to "
                        f"{MAX_WORKERS})")
    b.add_argument("--loop", choices=["auto", "uvloop", "asyncio"], default="auto",
                   help="load: the sidecar's event loop")
    b.add_argument("--rounds", type=integer(1, MAX_ROUNDS), default=3,
                   help="load: alternate the setups this many times per level (drift on a "
                        f"shared machine then hits all alike; 1 to {MAX_ROUNDS})")
    b.add_argument("--modes", default="extproc", metavar="M1,M2,...",
                   help="load: routing modes to run beside Envoy alone: extproc, native, "
                        "hybrid (10 %% per-request traffic); default extproc")
    soak = b.add_argument_group("soak (memory under steady load)")
    soak.add_argument("--minutes", type=number("minutes", MAX_SOAK_MIN), default=30.0,
                      help=f"soak length (above 0, at most {MAX_SOAK_MIN:g})")
    soak.add_argument("--rate", type=number("requests per second", MAX_RATE), default=70.0,
                      help=f"requests per second (above 0, at most {MAX_RATE:g})")
    soak.add_argument("--warmup-min", type=number("minutes", MAX_SOAK_MIN, lo_ok=True),
                      default=None,
                      help="minutes before the RSS slope is fitted (default: min(5, M/5))")
    soak.add_argument("--distinct", action="store_true",
                      help="a distinct tenant and request id per request")
    soak.add_argument("--tracemalloc", action="store_true",
                      help="run the sidecar under tracemalloc and print what grew")
    b.set_defaults(func=commands.bench)
    return p


def interrupt_on_sigterm(signum: int, _frame: object) -> None:
    """SIGTERM (``timeout``, ``kill``, a CI cancel) stops a command -- or the test run
    (tests/conftest.py) -- as Ctrl-C does: the exception unwinds its ``with Stack()``
    blocks, which stop every process it started (own sessions: they never see the
    signal). A second SIGTERM ends the process without that cleanup."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "fake-provider":
        return commands.fake_provider(argv[1:])
    if next((a for a in argv if not a.startswith("-")), None) == "serve":  # -v serve too
        from sidecar.shell.startup import hold_sighup

        hold_sighup()  # a SIGHUP before the serve loop handles it is a reload, not death
    if not argv or argv[0] != "serve":
        # serve handles SIGTERM in its event loop (drain, snapshot); everything else
        # (demo, bench, simulate) cleans up through KeyboardInterrupt.
        with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
            signal.signal(signal.SIGTERM, interrupt_on_sigterm)
    if argv and argv[0] in ("simulate", "report"):
        from sidecar.sim.cli import main as sim_main

        try:
            return sim_main(argv)
        except KeyboardInterrupt:
            print("tailroute: interrupted", file=sys.stderr)
            return 130
    ns = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if ns.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    func: Callable[[argparse.Namespace], int] = ns.func
    try:
        return func(ns)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"config error: {problem}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `tailroute status | head`: the reader left. Point stdout at /dev/null so the
        # interpreter's final flush does not raise again, and exit quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
