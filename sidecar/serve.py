"""`tailroute serve`: run the ext_proc server and the admin server until signalled.

Besides serving, the loop owns the operational chores:

* hot reload on SIGHUP and on config file change (:mod:`sidecar.ops.reload`);
* warm restart: load the snapshot before serving, rewrite it every
  ``snapshot_every_s`` and once more after the final drain (:mod:`sidecar.ops.snapshot`);
* graceful shutdown on SIGTERM/SIGINT: stop accepting, let in-flight streams
  finish for up to ``drain_s``, then snapshot and exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import time
from collections import Counter
from pathlib import Path

import grpc
from prometheus_client import Histogram

from sidecar.core.config import Config
from sidecar.core.hostport import same_port
from sidecar.fleet import heartbeat as heartbeat_pipe
from sidecar.fleet.link import FleetLink
from sidecar.fleet.metrics import FleetCollector
from sidecar.fleet.worker_status import WorkerStatus, WorkerStatusCollector
from sidecar.ops import genai_metrics, snapshot
from sidecar.ops.admin import AdminServer
from sidecar.ops.metrics import build_registry
from sidecar.ops.native_metrics import NativeCollector
from sidecar.ops.reload import ConfigReloader, Fingerprint, watch_loop
from sidecar.shell.app import App
from sidecar.shell.gc_freeze import CHECK_EVERY_S, LongLivedFreezer
from sidecar.shell.health import HealthService
from sidecar.shell.native import NativeRouting
from sidecar.shell.pausing import run_steps_async
from sidecar.shell.server import ExtProcService, start_grpc, tick_loop
from sidecar.shell.startup import (
    StartupError,
    bind_error,
    check_bindable,
    check_unix_path,
    held_sighup,
)
from sidecar.shell.tls import CertificateWatcher

log = logging.getLogger("tailroute")


async def _freeze_loop(freezer: LongLivedFreezer, stop: asyncio.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=CHECK_EVERY_S)
        if not stop.is_set():
            freezer.check()


async def _sample_loop(admin: AdminServer, stop: asyncio.Event, every_s: float) -> None:
    while not stop.is_set():
        await admin.sample()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=every_s)


async def drain(server: grpc.aio.Server, service: ExtProcService, app: App,
                drain_s: float) -> None:
    """Let in-flight requests finish and their access-log entries arrive, for up to ``drain_s``.

    New routing streams are refused at once (Envoy fails open to the default
    route); access-log and observing streams are still accepted, because a
    request's outcome and its first-token time arrive after the request was
    routed, on streams Envoy may only open then. The app's sweep keeps running
    (the tick loop has stopped): an entry whose first-token time does not come
    is observed alone after its short grace, as while serving. Once no request
    has been pending for two checks in a row, or at ``drain_s``, the access-log
    streams are ended with an OK status, what is still pending is settled
    (:meth:`~sidecar.shell.app.App.settle_all`: observed from its entry, or
    counted lost) and the server stops.
    """
    loop = asyncio.get_running_loop()
    service.draining = True
    deadline, idle = loop.time() + drain_s, 0
    while loop.time() < deadline:
        app.tick(loop.time())
        idle = idle + 1 if not app.pending else 0
        if idle >= 2:
            break
        await asyncio.sleep(0.05)
    if service.access_log is not None:
        service.access_log.close()
    observed, lost = app.settle_all(loop.time())
    if observed or lost:
        log.warning("drain over after %.1fs: %d requests observed from their entry alone, "
                    "%d without an entry counted lost", drain_s, observed, lost)
    await server.stop(grace=0.05)


async def _start_admin(admin: AdminServer, addr: str, setting: str) -> int:
    check_bindable("the admin server", addr, setting)
    try:
        return await admin.start(addr)
    except OSError as exc:
        raise bind_error("the admin server", addr, setting, exc) from None


async def _start_grpc(
    app: App, tcp: str | None, unix: str | None, phase_hist: Histogram, tcp_setting: str,
    unix_setting: str, health: HealthService, tls: CertificateWatcher | None,
    reuse_port: bool = False,
    native: NativeRouting | None = None,
) -> tuple[grpc.aio.Server, ExtProcService, int | None]:
    """Start the ext_proc server; a busy or invalid address is a one-line StartupError.
    ``reuse_port`` (``--workers``): the port is shared, so it is not probed first."""
    if tcp and not reuse_port:
        check_bindable("ext_proc gRPC", tcp, tcp_setting)
    if unix:
        check_unix_path("ext_proc gRPC", unix, unix_setting)
    try:
        return await start_grpc(app, tcp, unix, phase_hist, register=health.register,
                                tcp_credentials=tls.credentials() if tls else None,
                                reuse_port=reuse_port, native=native)
    except (OSError, RuntimeError) as exc:
        addr, setting = (tcp, tcp_setting) if tcp else (f"unix:{unix}", unix_setting)
        raise bind_error("ext_proc gRPC", addr or "", setting, exc) from None


class Snapshotter:
    """Periodic and final snapshots; the path follows the live config unless overridden."""

    def __init__(self, app: App, override: str | None, errors: Counter[str]) -> None:
        self.app = app
        self.override = override
        self.errors = errors  # exported as tailroute_errors_total{kind="snapshot_*"}
        self.writes = True  # workers other than 0 only read it (the fleet state is shared)

    @property
    def path(self) -> str | None:
        return self.override or self.app.config.snapshot_path

    def load(self, now: float) -> None:
        if self.path and not snapshot.load(self.app.router, self.path, now):
            self.errors["snapshot_load"] += int(os.path.exists(self.path))

    async def save(self) -> None:
        path = self.path
        if not path or not self.writes:
            return
        loop = asyncio.get_running_loop()
        # Built and encoded on the loop thread (the router is not thread-safe) a few
        # routes at a time, serving what is ready between them; written off it.
        text = await run_steps_async(
            snapshot.encode_steps(self.app.router, loop.time(), time.time()))
        try:
            size = await asyncio.to_thread(snapshot.write_text_atomic, path, text)
        except OSError as exc:
            self.errors["snapshot_write"] += 1
            log.warning("cannot write snapshot %s: %s", path, exc.strerror or exc)
            return
        log.debug("snapshot written to %s (%d bytes)", path, size)

    async def loop(self, stop: asyncio.Event, every_s: float) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=every_s)
            if not stop.is_set():
                await self.save()


async def serve(
    config: Config,
    grpc_addr: str | None = None,
    unix: str | None = None,
    admin_addr: str | None = None,
    ready_file: str | None = None,
    seed: int | None = None,
    drain_s: float = 5.0,
    config_path: str | None = None,
    snapshot_path: str | None = None,
    snapshot_every_s: float = 30.0,
    watch_every_s: float = 1.0,
    worker: int | None = None,
    workers_status: str | None = None,
    heartbeat: tuple[int, float] | None = None,
    config_fingerprint: Fingerprint = None,
) -> int:
    """Serve until SIGTERM/SIGINT, then drain in-flight streams for up to ``drain_s``.

    ``config_path`` (default: ``config.source`` if it is a file) is watched for
    changes and re-read on SIGHUP; ``config_fingerprint``: its fingerprint from before
    ``config`` was read from it (:class:`~sidecar.ops.reload.ConfigReloader`).
    ``snapshot_path`` overrides ``config.snapshot_path``.
    ``worker``: index under ``serve --workers N`` (:mod:`sidecar.fleet.workers`): the
    gRPC port is shared (SO_REUSEPORT) and only worker 0 writes the snapshot;
    ``workers_status``: the supervisor's records of its workers, shown on /state and
    /metrics (:mod:`sidecar.fleet.worker_status`); ``heartbeat``: ``(fd, every_s)``,
    the pipe on which this worker proves to its supervisor that its loop runs
    (:mod:`sidecar.fleet.heartbeat`), from now until the process ends (drain included).
    """
    loop = asyncio.get_running_loop()
    beats = None if heartbeat is None else asyncio.create_task(
        heartbeat_pipe.beat(*heartbeat), name="heartbeat")
    app = App.create(config, seed)
    if config_path is None and os.path.isfile(config.source):
        config_path = config.source
    reloader = (ConfigReloader(app, config_path, loaded_from=config_fingerprint)
                if config_path else None)
    ops_errors: Counter[str] = Counter()
    snap = Snapshotter(app, snapshot_path, ops_errors)
    snap.writes = not worker  # None (no workers) or worker 0
    # Before serving, so the first decisions are already informed: from the fleet
    # if there is one and it answers (it holds what a snapshot would), else the snapshot.
    fleet = FleetLink.create(app)
    if fleet is None or not await fleet.warm_start():
        snap.load(loop.time())
        if fleet is not None:
            fleet.sync.mark_baseline(loop.time())  # fleet-merged already: never re-pushed

    freezer = LongLivedFreezer()

    def shell_counters() -> dict[str, int]:
        out = app.shell_counters()
        for k, v in ops_errors.items():
            out[f"error:{k}"] = out.get(f"error:{k}", 0) + v
        if reloader is not None:
            out.update(reloader.counters())
        if tls is not None:
            out.update(tls.counters())
        out.update(freezer.counters())
        return out

    registry, phase_hist, router_metrics = build_registry(lambda: app.router, loop.time,
                                                          shell_counters)
    genai = genai_metrics.attach(registry, lambda: app.router.config)
    app.on_observation, app.on_ok_samples = genai.record, genai.record_ok
    if fleet is not None:
        registry.register(FleetCollector(fleet))
    tcp = grpc_addr if grpc_addr is not None else config.listen.grpc
    unix_arg = unix
    unix = unix if unix is not None else config.listen.grpc_unix
    if unix and os.path.exists(unix):
        os.unlink(unix)  # a stale socket from a crashed run would block the bind
    serving = False
    admin = AdminServer(app, registry, ready=lambda: serving, router_metrics=router_metrics)
    if fleet is not None:
        admin.extra_state["fleet"] = fleet.state
    if reloader is not None:
        admin.extra_state["config"] = reloader.view
    if workers_status is not None and worker is not None:
        workers = WorkerStatus(Path(workers_status), worker)
        registry.register(WorkerStatusCollector(workers))
        admin.extra_state["workers"] = workers.view
    health = HealthService()  # grpc.health.v1 on the ext_proc server: NOT_SERVING until up
    # TLS files are read and checked now (ConfigError naming file and field), reloaded on change.
    tls_cfg = config.listen.tls
    tls = CertificateWatcher(tls_cfg, config.source) if tls_cfg is not None and tcp else None
    admin_at = admin_addr if admin_addr is not None else config.listen.admin
    admin_setting = "--admin" if admin_addr else "listen.admin"
    if tcp and same_port(tcp, admin_at):  # else gRPC's bind blamed "another process"
        raise StartupError(
            f"cannot listen for the admin server on {admin_at} ({admin_setting}): ext_proc "
            f"gRPC is to listen there ({'--grpc' if grpc_addr is not None else 'listen.grpc'})")
    admin_port = await _start_admin(admin, admin_at, admin_setting)
    native = None
    if config.routing.mode != "extproc":
        native = NativeRouting(lambda: app.config, lambda: app.router)
        registry.register(NativeCollector(native))
        admin.extra_state["native"] = native.state
        wake = native.wake
        app.on_transitions = lambda _events: wake()
        app.on_holds = wake  # a hold started by a response, whichever path learned it
        if fleet is not None:
            # Peers add this replica's native load to their in-flight counts (as it
            # adds theirs), so the fleet's weights plan for the provider's whole load.
            fleet.sync.extra_load = lambda: native.load.last
    server, service, port = await _start_grpc(
        app, tcp or None, unix, phase_hist,
        tcp_setting="--grpc" if grpc_addr is not None else "listen.grpc",
        unix_setting="--unix" if unix_arg is not None else "listen.grpc_unix", health=health,
        tls=tls, reuse_port=worker is not None, native=native)
    # Everything built so far (modules, config, protobuf descriptors, the restored
    # state) lives as long as the process: out of the collector's sight, so the
    # full collections that per-request garbage triggers do not walk it again.
    gc.freeze()
    health.set_serving(True)  # config loaded, listeners up
    serving = True
    stop, hup = asyncio.Event(), asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    with contextlib.suppress(NotImplementedError):
        loop.add_signal_handler(signal.SIGHUP, hup.set)
    if held_sighup():  # one came while starting (sidecar.shell.startup.hold_sighup)
        hup.set()
    if beats is not None:
        # The pipe breaks only once the supervisor is gone (its read end closes with it):
        # no one would restart this worker or forward it a SIGTERM, and a new supervisor
        # would share the gRPC port with it. So it drains and exits, as on SIGTERM.
        beats.add_done_callback(lambda t: None if t.cancelled() else stop.set())
    tasks = [asyncio.create_task(tick_loop(app, stop), name="tick"),
             asyncio.create_task(_sample_loop(admin, stop, config.stats.subwindow_s / 2),
                                 name="metrics sampling"),
             asyncio.create_task(snap.loop(stop, snapshot_every_s), name="snapshots"),
             asyncio.create_task(_freeze_loop(freezer, stop), name="gc freezer")]
    if reloader is not None:
        tasks.append(asyncio.create_task(watch_loop(reloader, stop, hup, watch_every_s),
                                         name="config watcher"))
    if fleet is not None:
        tasks.append(asyncio.create_task(fleet.run(stop), name="fleet link"))
    if native is not None:
        tasks.append(asyncio.create_task(native.loop(app.tick, stop), name="native weights"))
    died = _watch_tasks(tasks, stop)
    log.info("tailroute serving ext_proc on %s%s; admin on %s:%d",
             f"{tcp.rpartition(':')[0]}:{port}" if port and tcp else "",
             f" unix:{unix}" if unix else "", admin_at.rpartition(":")[0] or "127.0.0.1",
             admin_port)
    if ready_file:
        tmp = Path(ready_file + ".tmp")
        tmp.write_text(f"{port or 0} {admin_port}\n")
        tmp.replace(ready_file)
    await stop.wait()
    serving = False
    health.shutdown()  # NOT_SERVING while draining: health checkers stop sending
    # Snapshot before the drain too: an orchestrator whose grace period is shorter
    # than the drain may SIGKILL us mid-drain, and a slightly older snapshot beats none.
    await snap.save()
    log.info("shutting down: draining %d streams, %d requests in flight",
             service.active_streams, len(app.pending))
    await drain(server, service, app, drain_s)
    await asyncio.gather(*tasks, return_exceptions=True)  # a dead one was logged already
    await snap.save()  # again after the drain, so the last observations are in it
    if fleet is not None:
        await fleet.close()
    await admin.stop()
    if beats is not None:
        beats.cancel()
    return 1 if died else 0


def _watch_tasks(tasks: list[asyncio.Task[None]], stop: asyncio.Event) -> list[str]:
    """Stop the process, loudly, when a background loop dies of an exception.

    Each loop handles the failures it expects (a dead Redis, an unwritable snapshot);
    one that escapes is a bug, and a sidecar whose tick loop or config watcher is gone
    keeps answering while its health verdicts or reloads silently stop. Better to log
    it, drain, save the snapshot and exit 1, so a supervisor restarts a whole process.
    Returns the names of the loops that died (filled in as they do)."""
    died: list[str] = []

    def done(task: asyncio.Task[None]) -> None:
        if task.cancelled() or (exc := task.exception()) is None:
            return
        died.append(task.get_name())
        log.critical("background task %r died: %r; shutting down (exit 1) so that a "
                     "supervisor restarts tailroute", task.get_name(), exc, exc_info=exc)
        stop.set()

    for task in tasks:
        task.add_done_callback(done)
    return died
