"""`tailroute serve`: run the ext_proc server and the admin server until signalled."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from pathlib import Path

from sidecar.admin import AdminServer
from sidecar.app import App
from sidecar.core.config import Config
from sidecar.metrics import build_registry
from sidecar.server import start_grpc, tick_loop

log = logging.getLogger("tailroute")


async def _sample_loop(admin: AdminServer, stop: asyncio.Event, every_s: float) -> None:
    while not stop.is_set():
        admin.sample()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=every_s)


async def serve(
    config: Config,
    grpc_addr: str | None = None,
    unix: str | None = None,
    admin_addr: str | None = None,
    ready_file: str | None = None,
    seed: int | None = None,
    drain_s: float = 5.0,
) -> int:
    """Serve until SIGTERM/SIGINT, then drain in-flight streams for up to ``drain_s``."""
    loop = asyncio.get_running_loop()
    app = App.create(config, seed)
    registry, phase_hist = build_registry(
        lambda: app.router, loop.time, lambda: app.shell_counters()
    )
    tcp = grpc_addr if grpc_addr is not None else config.listen.grpc
    unix = unix if unix is not None else config.listen.grpc_unix
    if unix and os.path.exists(unix):
        os.unlink(unix)  # a stale socket from a crashed run would block the bind
    serving = False
    admin = AdminServer(app, registry, ready=lambda: serving)
    admin_port = await admin.start(admin_addr if admin_addr is not None else config.listen.admin)
    server, service, port = await start_grpc(app, tcp or None, unix, phase_hist)
    serving = True
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.create_task(tick_loop(app, stop)),
             asyncio.create_task(_sample_loop(admin, stop, config.stats.subwindow_s / 2))]
    log.info("tailroute serving ext_proc on %s%s; admin on 127.0.0.1:%d",
             f"127.0.0.1:{port}" if port else "", f" unix:{unix}" if unix else "", admin_port)
    if ready_file:
        tmp = Path(ready_file + ".tmp")
        tmp.write_text(f"{port or 0} {admin_port}\n")
        tmp.replace(ready_file)
    await stop.wait()
    serving = False
    log.info("shutting down: draining %d streams", service.active_streams)
    await server.stop(grace=drain_s)
    await asyncio.gather(*tasks)
    await admin.stop()
    return 0
