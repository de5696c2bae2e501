"""A busy or unusable listen address is one line naming it and the setting, no traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import base_config_dict


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def _serve(tmp_path: Path, listen: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "tailroute.yaml"
    path.write_text(yaml.safe_dump(base_config_dict(listen=listen)))
    return subprocess.run([sys.executable, "-m", "sidecar.cli", "serve", "--config", str(path),
                           *args], capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(("which", "setting", "what"), [
    ("admin", "listen.admin", "the admin server"),
    ("grpc", "listen.grpc", "ext_proc gRPC"),
])
def test_busy_port_in_config(tmp_path: Path, busy_port: int, which: str, setting: str,
                             what: str) -> None:
    listen = {"grpc": "127.0.0.1:0", "admin": "127.0.0.1:0", which: f"127.0.0.1:{busy_port}"}
    out = _serve(tmp_path, listen)
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert lines == [f"tailroute serve: cannot listen for {what} on 127.0.0.1:{busy_port} "
                     f"({setting}): address already in use (another process listens there)"]


@pytest.mark.parametrize(("flag", "addr", "problem"), [
    ("--grpc", "127.0.0.1:99999", "must be host:port with a port of 0..65535"),
    ("--admin", "nowhere", "must be host:port, got 'nowhere'"),
])
def test_a_malformed_address_on_the_command_line_names_the_flag(
    tmp_path: Path, flag: str, addr: str, problem: str
) -> None:
    out = _serve(tmp_path, {"grpc": "127.0.0.1:0", "admin": "127.0.0.1:0"}, flag, addr)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"({flag}): {problem}" in out.stderr, out.stderr


def test_busy_port_given_on_the_command_line_names_the_flag(tmp_path: Path,
                                                            busy_port: int) -> None:
    out = _serve(tmp_path, {"grpc": "127.0.0.1:0", "admin": "127.0.0.1:0"},
                 "--grpc", f"127.0.0.1:{busy_port}")
    assert out.returncode == 1 and "(--grpc)" in out.stderr and "Traceback" not in out.stderr


def test_unix_socket_in_a_missing_directory(tmp_path: Path) -> None:
    out = _serve(tmp_path, {"grpc": "", "admin": "127.0.0.1:0",
                            "grpc_unix": str(tmp_path / "nope" / "x.sock")})
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "(listen.grpc_unix): directory" in out.stderr and "does not exist" in out.stderr


@pytest.mark.parametrize(("listen", "args", "said"), [
    ({"grpc": "127.0.0.1:{p}", "admin": "127.0.0.1:0"}, ("--admin", "127.0.0.1:{p}"),
     "cannot listen for the admin server on 127.0.0.1:{p} (--admin): ext_proc gRPC is to "
     "listen there (listen.grpc)"),
    ({"grpc": "127.0.0.1:0", "admin": "127.0.0.1:0"},
     ("--grpc", "0.0.0.0:{p}", "--admin", "127.0.0.1:{p}"),
     "cannot listen for the admin server on 127.0.0.1:{p} (--admin): ext_proc gRPC is to "
     "listen there (--grpc)"),
])
def test_one_port_for_grpc_and_admin_is_not_blamed_on_another_process(
    tmp_path: Path, listen: dict[str, str], args: tuple[str, ...], said: str
) -> None:
    """The admin server bound first, then gRPC's bind failed as "address already in use
    (another process listens there)": the other process was the sidecar itself."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])  # free again once closed
    out = _serve(tmp_path, {k: v.format(p=port) for k, v in listen.items()},
                 *(a.format(p=port) for a in args))
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert lines == [f"tailroute serve: {said.format(p=port)}"], out.stderr


@pytest.mark.parametrize("workers", [(), ("--workers", "2")])
def test_a_ready_file_in_a_missing_directory(tmp_path: Path, workers: tuple[str, ...]) -> None:
    """It was written once serving: a FileNotFoundError traceback, listeners up (with
    --workers, the supervisor's work directory beside it failed the same way)."""
    ready = tmp_path / "nope" / "ready"
    path = tmp_path / "tailroute.yaml"
    path.write_text(yaml.safe_dump(base_config_dict(
        listen={"grpc": "127.0.0.1:0", "admin": "127.0.0.1:0"},
        fleet={"url": "redis://127.0.0.1:1/0"})))
    out = subprocess.run([sys.executable, "-m", "sidecar.cli", "serve", "--config", str(path),
                          "--ready-file", str(ready), *workers],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert lines == [f"tailroute serve: cannot write the ready file {ready} (--ready-file): "
                     f"directory {ready.parent} does not exist"], out.stderr
    assert not ready.parent.exists()
