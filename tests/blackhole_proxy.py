"""A TCP forwarder on 127.0.0.1 whose connections can be made to go silent.

:meth:`BlackholeProxy.blackhole` makes every connection open at that moment stop
forwarding in both directions and stop reading, without closing anything: to its
peers it looks like a host that vanished (crash, partition) — no FIN, no RST,
their writes just stop being acknowledged once the socket buffers are full. New
connections are forwarded normally. Runs its own event loop in a thread; every
socket is closed by :meth:`close` (also on ``with`` exit).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading


class BlackholeProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._silenced: set[int] = set()  # ids of connections that went silent
        self._next = 0

    def __enter__(self) -> BlackholeProxy:
        self._thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def _start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = self._next
        self._next += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers += [writer, up_writer]
        with contextlib.suppress(asyncio.CancelledError):  # close() cancels it
            await asyncio.gather(self._pipe(conn, reader, up_writer),
                                 self._pipe(conn, up_reader, writer), return_exceptions=True)

    async def _pipe(self, conn: int, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> None:
        never = asyncio.Event()
        while True:
            if conn in self._silenced:
                await never.wait()  # stop reading: the peer's writes back up
            data = await reader.read(65536)
            if not data:
                break
            if conn in self._silenced:
                await never.wait()
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(OSError):
            writer.write_eof()

    def blackhole(self) -> None:
        """Silence every connection open now (new ones are forwarded)."""
        self._loop.call_soon_threadsafe(lambda: self._silenced.update(range(self._next)))

    def close(self) -> None:
        if not self._thread.is_alive():
            return

        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for w in self._writers:
                w.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
