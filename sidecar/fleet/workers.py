"""`tailroute serve --workers N`: N sidecar processes on one gRPC port, one fleet.

One Python process decides on one core. The supervisor starts N ordinary
``serve`` processes that bind the same gRPC port with SO_REUSEPORT (the kernel
spreads Envoy's connections over them) and share statistics and health
through the configured ``fleet:`` store, exactly as replicas on different hosts
do. So ``--workers`` requires a ``fleet:`` section and TCP gRPC (a Unix socket
cannot be shared this way).

* **Admin**: worker ``i`` serves its admin endpoints on ``listen.admin``'s port
  ``+ i`` (each worker's ``/metrics`` counts its own requests; ``/state`` shows
  the same fleet-wide statistics and health in every worker). With port 0 each
  picks a free one; the supervisor logs them.
* **Snapshot**: every worker reads it at start (when the store does not answer),
  only worker 0 writes it (all workers hold the same fleet-merged state).
* **Signals**: SIGTERM/SIGINT/SIGHUP are forwarded to every worker (drain,
  reload). A worker that dies is restarted after a second, at most 5 times a
  minute; beyond that the supervisor stops the rest and exits 1.
* **Liveness**: a worker that is alive but whose event loop stopped (a blocking
  call, a deadlock, a CPU-bound bug) stops beating on its heartbeat pipe; after
  ``workers.probe_misses`` probes in a row without a beat the supervisor sends it
  SIGTERM, SIGKILL ``workers.kill_grace_s`` later, and restarts it like a worker
  that died (the same budget): :mod:`sidecar.fleet.liveness`, :mod:`sidecar.fleet.heartbeat`.
* ``--ready-file``: written once every worker is serving, as
  ``<grpc port> <admin port of worker 0>``; ``<ready-file>.workers`` lists every
  worker's admin port, one per line. Both are rewritten when a restarted worker
  serves on another admin port (port 0). The workers' own ready files live in a
  ``tailroute-workers-*`` directory beside it (under TMPDIR without one); the
  supervisor removes it on its way out, and a SIGKILLed supervisor leaves it in
  the directory its starter owns, not in /tmp.
* **Restarts**: the supervisor keeps ``workers.json`` in that directory (pid,
  admin port, restarts and last exit status of each worker), and every worker
  shows it on /state (``workers``) and /metrics
  (``tailroute_worker_restarts_total{worker,reason}``, ``reason`` ``exited`` or
  ``hung``): :mod:`sidecar.fleet.worker_status`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sidecar.core.config import Config, ConfigError
from sidecar.core.hostport import join_hostport, same_port, split_hostport
from sidecar.core.workers_config import MIN_PROBE_INTERVAL_S
from sidecar.devtools.harness import free_port
from sidecar.fleet import heartbeat
from sidecar.fleet.liveness import Liveness
from sidecar.fleet.worker_status import WorkerRecord, write_status
from sidecar.ops.snapshot import write_text_atomic

log = logging.getLogger("tailroute.workers")
_RESTARTS_PER_MINUTE = 5
_BEATS_PER_PROBE = 4  # a worker beats this often a probe period: one late beat is no miss


def _split(addr: str, what: str) -> tuple[str, int]:
    try:
        return split_hostport(addr, port_zero=True)
    except ValueError as exc:
        raise ConfigError(f"{what}: {exc}") from None


def check_workers(config: Config, n: int, grpc: str, unix: str | None,
                  admin: str | None = None) -> None:
    """ConfigError (naming the file) unless ``n`` workers can share state and a port, and
    (given ``admin``) each can serve its admin endpoints on ``admin``'s port + its index."""
    from sidecar.cli import MAX_WORKERS  # (late: the command line imports this module)

    if not 1 <= n <= MAX_WORKERS:  # the command line refuses these already
        raise ConfigError(f"--workers must be from 1 to {MAX_WORKERS}, got {n}")
    if admin is not None:
        host, port = _split(admin, "--admin")
        if port and port + n - 1 > 65535:
            raise ConfigError(f"--workers {n}: worker i serves admin on port {port} + i "
                              f"({admin}), the last on {port + n - 1}, above 65535: use a "
                              "lower admin port (listen.admin, --admin) or fewer workers")
        # (worker 0's port is checked with the config: sidecar.core.config_listen)
        clash = [i for i in range(1, n) if port and grpc
                 and same_port(grpc, join_hostport(host, port + i))]
        if clash:
            raise ConfigError(f"--workers {n}: worker i serves admin on port {port} + i "
                              f"({admin}), worker {clash[0]} on the gRPC port ({grpc}): "
                              "give the admin ports (listen.admin, --admin) room for the "
                              "workers")
    if config.fleet is None:
        raise ConfigError(f"{config.source}: fleet: --workers {n} needs a fleet: section "
                          "(workers share statistics and health through Redis/Valkey)")
    if unix or not grpc:
        raise ConfigError(f"{config.source}: listen: --workers needs TCP gRPC "
                          "(listen.grpc / --grpc); a Unix socket cannot be shared by processes")
    if config.routing.mode != "extproc":
        # Envoy holds one RTDS stream per sidecar address: it would land on one worker
        # (moved by the connection ageing that spreads ext_proc streams), whose
        # weights plan only the load of the access-log entries reaching it. Native
        # routing takes no decision on the request path: one process serves it.
        raise ConfigError(f"{config.source}: routing.mode: --workers {n} needs "
                          f"routing.mode extproc, not {config.routing.mode!r} (native "
                          "weights are published by one process: run serve without --workers)")


class Supervisor:
    def __init__(self, ns: argparse.Namespace, config: Config, n: int) -> None:
        grpc = ns.grpc if ns.grpc is not None else config.listen.grpc
        admin = ns.admin if ns.admin is not None else config.listen.admin
        check_workers(config, n, grpc, ns.unix if ns.unix is not None else
                      config.listen.grpc_unix, admin)
        host, port = _split(grpc, "--grpc")
        self.grpc = join_hostport(host, port or free_port())
        self.admin_host, self.admin_port = _split(admin, "--admin")
        if n > (os.cpu_count() or 1):
            log.warning("--workers %d on %d CPUs: each worker is a process deciding on one "
                        "core, so the extra ones only contend", n, os.cpu_count() or 1)
        self.ns, self.n = ns, n
        # Beside the ready file when there is one: whoever starts us owns that
        # directory and removes it, even if a SIGKILL skips our own cleanup.
        where = Path(ns.ready_file).resolve().parent if ns.ready_file else None
        self.dir = Path(tempfile.mkdtemp(prefix="tailroute-workers-", dir=where))
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.restarts: list[float] = []
        self.stopping = False
        self.records = [WorkerRecord() for _ in range(n)]
        self.status = self.dir / "workers.json"
        self.listed: list[int] | None = None  # the admin ports last written out
        self.live_cfg = config.workers
        self.liveness: dict[int, Liveness] = {}
        self.beats: dict[int, int] = {}  # the supervisor's end of each worker's heartbeat pipe

    def argv(self, i: int) -> list[str]:
        ns = self.ns
        admin = self.admin_port + i if self.admin_port else 0
        # -P: the caller's working directory is not put first on the workers' path, so
        # a ./sidecar there (an old checkout, a backup) is not what they run (_worker_env).
        out = [sys.executable, "-P", "-m", "sidecar.cli", *(["-v"] if ns.verbose else []),
               "serve",
               "--config", ns.config, "--grpc", self.grpc, "--worker-index", str(i),
               "--admin", join_hostport(self.admin_host, admin), "--ready-file", str(self.ready(i)),
               "--snapshot-every", str(ns.snapshot_every), "--workers-status", str(self.status)]
        if ns.snapshot:
            out += ["--snapshot", ns.snapshot]
        if ns.seed is not None:
            out += ["--seed", str(ns.seed + i)]
        return out

    def ready(self, i: int) -> Path:
        return self.dir / f"worker-{i}.ready"

    def spawn(self, i: int) -> None:
        self.ready(i).unlink(missing_ok=True)
        argv, keep = self.argv(i), tuple[int, ...]()
        heartbeat.close(self.beats.pop(i, None))
        if self.live_cfg.enabled:
            self.beats[i], w = heartbeat.open_pipe()
            every = self.live_cfg.probe_interval_s / _BEATS_PER_PROBE
            argv += ["--heartbeat-fd", str(w), "--heartbeat-every", f"{every:g}"]
            keep = (w,)
        try:
            self.procs[i] = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                             env=_worker_env(), pass_fds=keep)
        finally:
            for w in keep:  # the worker has its own copy; ours would only leak
                os.close(w)
        self.liveness[i] = Liveness(self.live_cfg, time.monotonic())
        self.records[i].pid = self.procs[i].pid
        self.records[i].most_missed = 0
        self.records[i].admin_port = None  # known once its ready file names it
        write_status(self.status, self.records)

    def forward(self, sig: int, _frame: object = None) -> None:
        if sig in (signal.SIGTERM, signal.SIGINT):
            self.stopping = True
        for p in self.procs.values():
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(sig)

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self.forward)
        for i in range(self.n):
            self.spawn(i)
        while True:
            self._track_ports()
            self._probe()  # also while stopping: a hung worker would never finish its drain
            for i, p in list(self.procs.items()):
                if p.poll() is None or self.stopping:
                    continue
                rec = self.records[i]
                if rec.pid == p.pid:  # its death not yet recorded
                    rec.pid, rec.admin_port, rec.last_exit = None, None, p.returncode
                    write_status(self.status, self.records)
                hung = self.liveness[i].hung
                how = f"worker {i} {'killed after it hung, ' if hung else ''}exited {p.returncode}"
                if not self._may_restart():
                    log.error("%s; too many restarts, stopping", how)
                    self.forward(signal.SIGTERM)
                    break
                log.warning("%s; restarting it", how)
                time.sleep(1.0)
                if self.stopping:  # told to stop meanwhile: a worker started now would
                    break  # never be told, and the supervisor would wait for it forever
                rec.restarts += 1
                rec.hung_restarts += int(hung)
                self.spawn(i)
            if all(p.poll() is not None for p in self.procs.values()):
                break
            time.sleep(MIN_PROBE_INTERVAL_S)
        codes = [p.returncode for p in self.procs.values()]
        for fd in self.beats.values():
            heartbeat.close(fd)
        return 0 if self.stopping and all(c == 0 for c in codes) else max(codes) or 1

    def _probe(self) -> None:
        """Read every live worker's heartbeats; SIGTERM a hung one, SIGKILL it after the grace
        (:mod:`sidecar.fleet.liveness`). Its death is then handled like any other."""
        now = time.monotonic()
        for i, p in self.procs.items():
            fd = self.beats.get(i)
            if fd is None or p.poll() is not None:
                continue
            live, rec = self.liveness[i], self.records[i]
            act = live.step(now, heartbeat.read_beats(fd))
            if live.missed > rec.most_missed:  # rare: how close a busy worker came
                rec.most_missed = live.missed
                write_status(self.status, self.records)
            if act == "term":
                log.error("worker %d (pid %d) hung: %s; SIGTERM, then SIGKILL in %g s", i,
                          p.pid, live.reason, self.live_cfg.kill_grace_s)
            elif act == "kill":
                log.error("worker %d (pid %d) still running %g s after SIGTERM; SIGKILL", i,
                          p.pid, self.live_cfg.kill_grace_s)
            if act != "wait":
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM if act == "term" else signal.SIGKILL)

    def _may_restart(self) -> bool:
        now = time.monotonic()
        self.restarts = [t for t in self.restarts if now - t < 60.0] + [now]
        return len(self.restarts) <= _RESTARTS_PER_MINUTE

    def _track_ports(self) -> None:
        """Learn the admin port of each worker that started since the last look (its ready
        file, ``<grpc port> <admin port>``); once every worker's is known, write them out
        when they differ from what was written (the first time: every worker serves)."""
        changed = False
        for i, rec in enumerate(self.records):
            if rec.admin_port is not None or rec.pid is None:
                continue
            try:
                rec.admin_port = int(self.ready(i).read_text().split()[1])
            except (OSError, IndexError, ValueError):
                continue  # not serving yet (the worker writes it whole, by rename)
            changed = True
        if changed:
            write_status(self.status, self.records)
        ports = [r.admin_port for r in self.records]
        if any(p is None for p in ports) or ports == self.listed:
            return
        known = [p for p in ports if p is not None]
        if self.listed is None:
            log.info("%d workers serving ext_proc on %s (SO_REUSEPORT); admin on %s", self.n,
                     self.grpc, ", ".join(join_hostport(self.admin_host, p) for p in known))
        else:
            log.info("workers' admin ports now %s", ", ".join(
                join_hostport(self.admin_host, p) for p in known))
        self.listed = known
        if self.ns.ready_file:
            # The listing first: whoever waits for the ready file then finds it complete.
            listing = "".join(f"{p}\n" for p in known)
            write_text_atomic(Path(self.ns.ready_file + ".workers"), listing)
            grpc_port = split_hostport(self.grpc)[1]
            write_text_atomic(Path(self.ns.ready_file), f"{grpc_port} {known[0]}\n")


def run_workers(ns: argparse.Namespace, config: Config, n: int) -> int:
    sup = Supervisor(ns, config, n)
    try:
        return sup.run()
    finally:  # it holds only the workers' ready files: nothing to keep once they are gone
        shutil.rmtree(sup.dir, ignore_errors=True)


def worker_log_format(index: int) -> None:
    """Prefix a worker's log lines with its index (they share the supervisor's stderr)."""
    fmt = f"%(asctime)s %(levelname)s [w{index} pid {os.getpid()}] %(name)s: %(message)s"
    for h in logging.getLogger().handlers:
        h.setFormatter(logging.Formatter(fmt))


def _worker_env() -> dict[str, str]:
    """The environment for a worker: this process's own ``sidecar`` package first on
    ``PYTHONPATH``, so a worker runs the very code its supervisor runs, whether that
    is installed or a checkout started with ``python -m`` from its root."""
    root = str(Path(__file__).resolve().parents[2])  # the directory holding sidecar/
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env
