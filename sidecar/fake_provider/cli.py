"""Command line of the fake provider: ``tailroute fake-provider``.

Runs one :class:`~sidecar.fake_provider.server.FakeProvider` until SIGTERM/SIGINT and
can announce the bound port through a ready file.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .framing import SSE_EOLS, SSE_SPLITS
from .latency import ConfigError, Profile, parse_schedule

if TYPE_CHECKING:
    from .server import FakeProvider


def build_arg_parser() -> argparse.ArgumentParser:
    """Argument parser for ``tailroute fake-provider``."""
    p = argparse.ArgumentParser(prog="tailroute fake-provider",
                                description="Simulated OpenAI-compatible LLM upstream.")
    p.add_argument("--name", default="fake", help="reported in the x-fake-provider header")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port (see --ready-file)")
    p.add_argument("--ttft-ms", metavar="MEDIAN[:P99]", help="time to first token (fixed w/o P99)")
    p.add_argument("--tpot-ms", metavar="MEDIAN[:P99]", help="time per output token")
    p.add_argument("--error-rate", type=float,
                   help="fraction of requests answered with --error-status (default 500)")
    p.add_argument("--error-status", type=int, help="status of those answers (400-599)")
    p.add_argument("--retry-after", metavar="VALUE",
                   help="send this retry-after header with every --error-rate answer "
                        "(seconds, an HTTP-date, or any text)")
    p.add_argument("--retry-after-ms", metavar="VALUE",
                   help="send this retry-after-ms header with every --error-rate answer")
    p.add_argument("--stall-ms", type=float, help="pause after the first token")
    p.add_argument("--role-first", action="store_true", default=None,
                   help="streamed chat opens with a role-only event at once (first body "
                        "byte one prefill before the first token)")
    p.add_argument("--seed", type=int, help="RNG seed (default: derived from --name)")
    p.add_argument("--max-tokens", type=int, default=64, help="cap on output tokens")
    p.add_argument("--default-tokens", type=int, default=16, help="tokens if request sets none")
    p.add_argument("--schedule", metavar="JSON|@FILE", help='[{"at_s": 5, "set": {...}}, ...]')
    p.add_argument("--ready-file", type=Path, help="write the bound port here once listening")
    p.add_argument("--sse-eol", choices=sorted(SSE_EOLS), default="lf",
                   help="SSE line endings (all legal per the SSE standard)")
    p.add_argument("--sse-split", choices=SSE_SPLITS, default="none",
                   help="where chunk boundaries fall: after events, mid-line, or between CR and LF")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run a fake provider until SIGTERM/SIGINT; return the exit status."""
    parser = build_arg_parser()
    args = parser.parse_args(argv)
    settings = {"ttft_ms": args.ttft_ms, "tpot_ms": args.tpot_ms, "error_rate": args.error_rate,
                "error_status": args.error_status, "stall_ms": args.stall_ms,
                "role_first": args.role_first, "retry_after": args.retry_after,
                "retry_after_ms": args.retry_after_ms}
    from .server import FakeProvider  # late: that module re-exports this one's main

    try:
        profile = Profile().updated({k: v for k, v in settings.items() if v is not None})
        schedule = parse_schedule(args.schedule) if args.schedule else []
        provider = FakeProvider(args.name, profile, seed=args.seed, max_tokens=args.max_tokens,
                                default_tokens=args.default_tokens, schedule=schedule,
                                sse_eol=args.sse_eol, sse_split=args.sse_split)
    except ConfigError as exc:
        parser.error(str(exc))
    return asyncio.run(_serve(provider, args.host, args.port, args.ready_file))


async def _serve(provider: FakeProvider, host: str, port: int, ready_file: Path | None) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        bound = await provider.start(host, port)
        if ready_file is not None:
            # Write-then-rename so a polling parent never reads a half-written port.
            tmp = ready_file.with_name(ready_file.name + ".tmp")
            tmp.write_text(f"{bound}\n")
            os.replace(tmp, ready_file)
        print(f"fake-provider {provider.name} on {host}:{bound}", file=sys.stderr, flush=True)
        await stop.wait()
    finally:
        await provider.stop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    return 0
