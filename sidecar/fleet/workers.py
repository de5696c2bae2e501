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
  reload); a worker still starting gets its SIGHUP once it serves (before, the
  signal's default action ended it: Python had not yet installed a handler).
* **Restarts**: a worker that dies is restarted a second later. One that keeps
  dying (more than 5 times in a row, each within a minute of its start: a port it
  cannot bind, a config file a restart can no longer read) is restarted after 2,
  4, 8 ... up to 60 s while the others keep serving; only when no other worker
  serves either does the supervisor stop them all and exit 1 (before, 6 deaths
  of one worker in a minute took the whole fleet down).
* **Liveness**: a worker that is alive but whose event loop stopped (a blocking
  call, a deadlock, a CPU-bound bug) stops beating on its heartbeat pipe; after
  ``workers.probe_misses`` probes in a row without a beat the supervisor sends it
  SIGTERM, SIGKILL ``workers.kill_grace_s`` later, and restarts it like a worker
  that died (the same back-off): :mod:`sidecar.fleet.liveness`, :mod:`sidecar.fleet.heartbeat`.
* ``--ready-file``: written once every worker is serving, as
  ``<grpc port> <admin port of worker 0>``; ``<ready-file>.workers`` lists every
  worker's admin port, one per line. Both are rewritten when a restarted worker
  serves on another admin port (port 0). The workers' own ready files live in a
  ``tailroute-workers-*`` directory beside it (under TMPDIR without one); the
  supervisor removes it on its way out, and a SIGKILLed supervisor leaves it in
  the directory its starter owns, not in /tmp.
* **Status**: the supervisor keeps ``workers.json`` in that directory (pid,
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
from sidecar.shell.startup import check_bindable

log = logging.getLogger("tailroute.workers")
_QUICK_DEATHS = 5  # deaths in a row restarted after a second; then the back-off
_RESTART_AFTER_S = 1.0
_BACKOFF_MAX_S = 60.0
_STABLE_S = 60.0  # a worker that lived this long was no quick death: its streak ends
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
        if self.admin_port:  # busy: one line now, not a worker failing again and again
            setting = "--admin" if ns.admin is not None else "listen.admin"
            for i in range(n):
                check_bindable(f"worker {i}'s admin server",
                               join_hostport(self.admin_host, self.admin_port + i),
                               f"{setting} + {i}" if i else setting)
        if n > (os.cpu_count() or 1):
            log.warning("--workers %d on %d CPUs: each worker is a process deciding on one "
                        "core, so the extra ones only contend", n, os.cpu_count() or 1)
        self.ns, self.n = ns, n
        # Beside the ready file when there is one: whoever starts us owns that
        # directory and removes it, even if a SIGKILL skips our own cleanup.
        where = Path(ns.ready_file).resolve().parent if ns.ready_file else None
        self.dir = Path(tempfile.mkdtemp(prefix="tailroute-workers-", dir=where))
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.stopping = False
        self.started = [0.0] * n  # when each worker's process was spawned (monotonic)
        self.due: dict[int, float] = {}  # dead workers -> when to start them again
        self.hup_owed: set[int] = set()  # starting workers owed a SIGHUP once they serve
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
        self.hup_owed.discard(i)  # it reads the config as it is now (one after this: owed)
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
        self.started[i] = time.monotonic()
        self.liveness[i] = Liveness(self.live_cfg, self.started[i])
        self.records[i].pid = self.procs[i].pid
        self.records[i].most_missed = 0
        self.records[i].admin_port = None  # known once its ready file names it
        write_status(self.status, self.records)

    def forward(self, sig: int, _frame: object = None) -> None:
        if sig in (signal.SIGTERM, signal.SIGINT):
            self.stopping = True
        for i, p in self.procs.items():
            if sig == signal.SIGHUP and self.records[i].admin_port is None:
                # Still starting: until serve installs its handler, SIGHUP's default
                # action would end it. It gets the signal once its ready file is seen.
                self.hup_owed.add(i)
            elif p.poll() is None:
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
            now = time.monotonic()
            for i, p in list(self.procs.items()):
                if p.poll() is None or self.stopping or i in self.due:
                    continue
                if not self._schedule(i, p, now):
                    self.forward(signal.SIGTERM)
                    break
            for i, at in sorted(self.due.items()):
                if self.stopping:  # a worker started now would never be told to stop,
                    break  # and the supervisor would wait for it forever
                if at <= now:
                    del self.due[i]
                    rec = self.records[i]
                    rec.restarts += 1
                    rec.hung_restarts += int(self.liveness[i].hung)
                    self.spawn(i)
            self._settle(now)
            if (self.stopping or not self.due) and all(
                    p.poll() is not None for p in self.procs.values()):
                break
            time.sleep(MIN_PROBE_INTERVAL_S)
        codes = [p.returncode for p in self.procs.values()]
        for fd in self.beats.values():
            heartbeat.close(fd)
        if self.stopping and all(c == 0 for c in codes):
            return 0
        # A worker's status, or 1 when they all died of signals (negative: sys.exit(-9)
        # was exit status 247).
        return max(max(codes), 0) or 1

    def _schedule(self, i: int, p: subprocess.Popen[bytes], now: float) -> bool:
        """Worker ``i`` died: note it and set when to start it again. False when it keeps
        dying and no other worker serves: the supervisor then stops (exit 1)."""
        rec = self.records[i]
        rec.pid, rec.admin_port, rec.last_exit = None, None, p.returncode
        rec.failed_starts = rec.failed_starts + 1 if now - self.started[i] < _STABLE_S else 0
        delay = restart_delay(rec.failed_starts)
        how = (f"worker {i} {'killed after it hung, ' if self.liveness[i].hung else ''}"
               f"exited {p.returncode}")
        serving = [j for j, q in self.procs.items()
                   if j != i and q.poll() is None and self.records[j].admin_port is not None]
        if delay > _RESTART_AFTER_S and not serving:
            log.error("%s, %d times in a row, and no other worker serves; stopping", how,
                      rec.failed_starts)
            write_status(self.status, self.records)
            return False
        rec.backoff_s = delay if delay > _RESTART_AFTER_S else 0.0
        if rec.failed_starts == _QUICK_DEATHS + 1:  # said once, as the back-off begins
            log.error("%s, %d times in a row within a minute of its start; restarting it "
                      "in %g s, then waiting twice as long after each quick death (up to "
                      "%g s) while the other %d serve", how, rec.failed_starts, delay,
                      _BACKOFF_MAX_S, len(serving))
        else:
            log.warning("%s; restarting it in %g s", how, delay)
        self.due[i] = now + delay
        write_status(self.status, self.records)
        return True

    def _settle(self, now: float) -> None:
        """A worker that has run :data:`_STABLE_S` since its start ends its streak of quick
        deaths: /state stops showing it as failing, and its next death is restarted in
        a second again."""
        changed = False
        for i, rec in enumerate(self.records):
            if rec.failed_starts and rec.pid is not None and now - self.started[i] >= _STABLE_S:
                rec.failed_starts, rec.backoff_s, changed = 0, 0.0, True
        if changed:
            write_status(self.status, self.records)

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
            if i in self.hup_owed:  # serving now: its loop handles the SIGHUP as a reload
                self.hup_owed.discard(i)
                with contextlib.suppress(ProcessLookupError):
                    self.procs[i].send_signal(signal.SIGHUP)
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


def restart_delay(failed_starts: int) -> float:
    """Seconds before starting again a worker that died ``failed_starts`` times in a row,
    each within :data:`_STABLE_S` of its start: a second for the first few, then doubling."""
    over = failed_starts - _QUICK_DEATHS
    return _RESTART_AFTER_S if over <= 0 else min(_BACKOFF_MAX_S, 2.0 ** min(over, 16))


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
