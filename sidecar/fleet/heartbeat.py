"""The heartbeat pipe from a worker of ``serve --workers N`` to its supervisor.

The supervisor opens one pipe per worker process and hands the worker its write
end (``serve --heartbeat-fd FD --heartbeat-every S``, hidden options); a task
on the worker's event loop writes one byte every ``S`` seconds, and the
supervisor counts the bytes (:class:`~sidecar.fleet.liveness.Liveness` judges them).

Why a pipe rather than polling ``/healthz`` or a file: a byte written by a task
on the loop proves the loop runs, at the cost of one ``write`` a beat; nothing
waits on a slow answer (the supervisor's read never blocks); there is no clock
to compare (bytes, not timestamps) and no filesystem (a full disk cannot look
like a hang); and a supervisor that was itself delayed finds the beats waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

log = logging.getLogger("tailroute.workers")
BEAT = b"."
_READ = 4096  # a probe's read: ~1000 beats at 4 a period, and a read drains any backlog


def open_pipe() -> tuple[int, int]:
    """``(read end, write end)``: the read end never blocks; the write end is for the
    worker (``pass_fds``), to be closed in the supervisor once the worker has it."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    return r, w


def read_beats(fd: int) -> int:
    """The beats waiting on the supervisor's end; 0 when none (or the worker is gone:
    its death is seen by the process, not here)."""
    n = 0
    while True:
        try:
            got = os.read(fd, _READ)
        except BlockingIOError:
            return n
        if not got:
            return n
        n += len(got)


def close(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


async def beat(fd: int, every_s: float) -> None:
    """Write a beat every ``every_s`` from this event loop, for the life of the process;
    return once the pipe breaks (the supervisor is gone: ``serve`` then stops)."""
    os.set_blocking(fd, False)  # a supervisor not reading must never block the loop
    try:
        while True:
            try:
                os.write(fd, BEAT)
            except BlockingIOError:
                pass  # the pipe is full: the supervisor has beats enough to read
            except OSError as exc:  # EPIPE: the supervisor is gone; nobody is listening
                log.error("heartbeat to the supervisor stopped: %s (the supervisor is gone); "
                          "shutting down", exc.strerror or exc)
                return
            await asyncio.sleep(every_s)
    finally:
        close(fd)
