"""A real ``redis-server`` (or ``valkey-server``) on 127.0.0.1 for tests and benchmarks.

No persistence, no config file; started in its own process group and stopped
by PID. ``kill()`` is a SIGKILL (what a crashed store looks like); ``start()``
again brings up an empty server on the same port (what a restarted store
without persistence looks like). ``password``: started with ``--requirepass``
(:attr:`RedisServer.url` stays without it: tests choose the credentials they send).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from sidecar.devtools.harness import discard_workdir, free_port, open_workdir


def redis_binary() -> str | None:
    """``redis-server`` or ``valkey-server`` from PATH (Debian: apt-get install redis-server)."""
    return shutil.which("redis-server") or shutil.which("valkey-server")


class RedisServer:
    def __init__(self, port: int | None = None, workdir: Path | None = None,
                 password: str | None = None) -> None:
        binary = redis_binary()
        if binary is None:
            raise RuntimeError("redis-server not found (Debian: apt-get install redis-server)")
        self.binary = binary
        self.port = port or free_port()
        self._own_dir = workdir is None  # a directory it made is its to remove
        self.workdir = workdir or open_workdir("tailroute-redis-")
        self.proc: subprocess.Popen[bytes] | None = None
        self.password = password

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.stop()
        if self._own_dir:  # the same rule as a Stack's (sidecar.devtools.harness)
            discard_workdir(self.workdir, failed=exc_type is not None)

    def start(self, timeout_s: float = 10.0) -> None:
        argv = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--daemonize", "no",
                "--dir", str(self.workdir), "--protected-mode", "yes"]
        if self.password is not None:
            argv += ["--requirepass", self.password]
        log = open(self.workdir / "redis.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout_s
        while not self.ping():
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited {self.proc.returncode}: "
                                   f"{(self.workdir / 'redis.log').read_text()[-1000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError("redis-server not ready")
            time.sleep(0.02)

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                # With --requirepass an unauthenticated PING is refused: it is up.
                return s.recv(16).startswith((b"+PONG", b"-NOAUTH"))
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: the store vanishes mid-conversation."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        self._signal(signal.SIGTERM)

    def _signal(self, sig: int) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
