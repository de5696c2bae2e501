"""Start-up failures as one line naming the address and the setting, never a traceback.

``tailroute serve`` prints :class:`StartupError` as ``tailroute serve: <message>``
and exits 1. The gRPC core reports a failed bind only as ``RuntimeError`` plus
a line of its own on stderr, so TCP addresses are tried with a plain socket
first (:func:`check_bindable`), which gives the real reason (``EADDRINUSE``,
``EADDRNOTAVAIL``, ``EACCES``) before gRPC is asked.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket

from sidecar.core import hostport

_REASONS = {
    errno.EADDRINUSE: "address already in use (another process listens there)",
    errno.EADDRNOTAVAIL: "address not available on this host",
    errno.EACCES: "permission denied (ports below 1024 need privileges)",
}


class StartupError(Exception):
    """The serving process cannot start; the message is the whole story (one line)."""


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno in _REASONS:
        return _REASONS[exc.errno]
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc).split(";", 1)[0]  # gRPC appends advice about GRPC_VERBOSITY


def bind_error(what: str, addr: str, setting: str, exc: BaseException) -> StartupError:
    """``cannot listen for <what> on <addr> (<setting>): <reason>``."""
    return StartupError(f"cannot listen for {what} on {addr} ({setting}): {_reason(exc)}")


def check_bindable(what: str, addr: str, setting: str) -> None:
    """Raise :class:`StartupError` if ``host:port`` cannot be bound right now (port 0 is fine).

    gRPC binds with SO_REUSEADDR too, so a socket in TIME_WAIT does not count as busy.
    """
    try:
        # The config checks its own addresses at parse time; flags are checked here.
        host, port = hostport.split_hostport(addr, port_zero=True)  # port 0: any free one
    except ValueError as exc:
        raise StartupError(f"cannot listen for {what} on {addr!r} ({setting}): {exc}") from None
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as exc:
        raise bind_error(what, addr, setting, exc) from None


def check_unix_path(what: str, path: str, setting: str) -> None:
    """Raise :class:`StartupError` if the socket's directory is missing or not writable."""
    _check_directory(path, f"cannot listen for {what} on unix:{path} ({setting})")


def check_ready_file(path: str) -> None:
    """Raise :class:`StartupError` if ``--ready-file`` cannot be written: its directory is
    missing or not writable (it is written once serving, as ``<path>.tmp`` renamed, and
    a failure then was a traceback with the listeners up)."""
    _check_directory(path, f"cannot write the ready file {path} (--ready-file)")


def _check_directory(path: str, doing: str) -> None:
    """Raise :class:`StartupError` (``doing``: what failed) if the directory ``path`` is
    created in is missing or not writable."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise StartupError(f"{doing}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise StartupError(f"{doing}: directory {parent} is not writable")


_held_hups: list[int] = []  # SIGHUPs that came while the process was starting


def hold_sighup() -> None:
    """Note a SIGHUP that comes before the serve loop handles it, rather than die of it.

    SIGHUP's default action ends the process, and the loop takes it over (as a reload)
    only once the snapshot is loaded, the fleet asked and the listeners up: seconds,
    when the fleet store is slow. A config-reload hook or ``kill -HUP`` of every worker
    in that span killed a starting sidecar without a log line. The loop reloads once
    for what was held (:func:`held_sighup`)."""
    with contextlib.suppress(ValueError, AttributeError):  # not the main thread; no SIGHUP
        signal.signal(signal.SIGHUP, lambda signum, _frame: _held_hups.append(signum))


def held_sighup() -> bool:
    """Whether a SIGHUP came since :func:`hold_sighup` (and forget it)."""
    came = bool(_held_hups)
    _held_hups.clear()
    return came
