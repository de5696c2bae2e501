"""`tailroute bench publish`: how native-mode weights reach Envoy, and what stays.

A benchmark, not a test (bounded, 127.0.0.1 only): the real Envoy in native
mode, two fake providers, and the RTDS service on its own event-loop thread of
this process (so the stream can be dropped and restored at will). It prints:

* **publication latency**: after a publish that flips a slice from 100/0 to
  0/100, the time until Envoy ACKs the version and until the first request
  lands on the new cluster (one keep-alive client sending back to back);
* **dead sidecar**: requests after the RTDS stream drops (failures, share on
  the last weights); an Envoy restarted while the sidecar is down (time to
  ready, split on the rendered weights); the sidecar back (time until Envoy
  re-subscribed and ACKed, split after).

Figures are wall-clock on a shared machine: read them as orders of magnitude.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import statistics
import threading
import time
from collections import Counter
from typing import Any

import grpc

from sidecar.core.config import Config
from sidecar.core.types import SliceKey
from sidecar.core.weights import SliceWeights, native_slices
from sidecar.devtools.harness import Stack, free_port
from sidecar.shell.rtds import RtdsService, WeightLayer, add_to_server


class RtdsThread:
    """A grpc.aio server with the RTDS service, on a private event-loop thread."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.layer = WeightLayer()
        self.loop = asyncio.new_event_loop()
        self.server: grpc.aio.Server | None = None
        self.service: RtdsService | None = None
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.start()

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def start(self) -> None:
        async def go() -> None:
            self.server = grpc.aio.server()
            self.service = add_to_server(self.server, self.layer)
            self.server.add_insecure_port(f"127.0.0.1:{self.port}")
            await self.server.start()
        self._run(go())

    def stop(self) -> None:
        if self.server is not None:
            self._run(self.server.stop(0))
            self.server = None

    def publish(self, weights: dict[SliceKey, SliceWeights]) -> int:
        async def go() -> None:
            self.layer.publish(weights, self.loop.time())
        self._run(go())
        return self.layer.version

    def acked(self, version: int) -> bool:
        return self.service is not None and any(
            s["acked_version"] >= version for s in self.service.state())

    def wait_acked(self, version: int, timeout: float = 10.0) -> float:
        """Seconds until some Envoy ACKed ``version`` (TimeoutError after ``timeout``)."""
        t0 = time.monotonic()
        while not self.acked(version):
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"runtime layer version {version} not acked")
            time.sleep(0.0005)
        return time.monotonic() - t0

    def close(self) -> None:
        self.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)


def split_weights(config: Config, weights: dict[str, int]) -> dict[SliceKey, SliceWeights]:
    """The same cluster weights for every slice of ``config``."""
    return {s: SliceWeights(s, tuple(weights.items())) for s in native_slices(config)}


class Client:
    """One keep-alive HTTP client to Envoy; returns (status, serving provider)."""

    BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 1})

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

    def send(self) -> tuple[int, str]:
        try:
            self.conn.request("POST", "/v1/chat/completions", self.BODY,
                              {"content-type": "application/json"})
            r = self.conn.getresponse()
            r.read()
            return r.status, r.getheader("x-fake-provider") or ""
        except (OSError, http.client.HTTPException):
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            return 0, ""

    def split(self, n: int) -> Counter[str]:
        return Counter(f"{s}:{p}" for s, p in (self.send() for _ in range(n)))


def _ms(xs: list[float]) -> str:
    xs = sorted(xs)
    p95 = xs[min(len(xs) - 1, int(0.95 * len(xs)))]
    return f"median {statistics.median(xs) * 1000:.2f} ms, p95 {p95 * 1000:.2f}, " \
           f"max {xs[-1] * 1000:.2f} (n={len(xs)})"


def two_provider_native(st: Stack) -> Config:
    """Fast fake providers ``a`` and ``b`` serving model ``m``, a native-mode config."""
    ports = {n: st.start_provider(n, "1", "1", seed=i) for i, n in enumerate("ab")}
    st.write_config({
        "clusters": [{"name": n, "address": f"127.0.0.1:{p}", "models": ["m"]}
                     for n, p in ports.items()],
        "models": [{"name": "m", "candidates": ["a", "b"]}],
        "routing": {"mode": "native"},
    })
    assert st.config is not None
    return st.config


def run_publish_bench(flips: int = 40, requests: int = 200) -> int:
    with Stack() as st:
        two_provider_native(st)
        assert st.config is not None
        rtds = RtdsThread(free_port())
        rtds.publish(split_weights(st.config, {"a": 10_000, "b": 0}))
        try:
            t0 = time.monotonic()
            st.start_envoy(sidecar_port=rtds.port)
            print(f"Envoy ready (sidecar up): {time.monotonic() - t0:.3f} s")
            client = Client(st.ports["envoy"])
            ack, effect = [], []
            for i in range(flips):
                target = "b" if i % 2 == 0 else "a"
                weights = {"a": 0, "b": 10_000} if target == "b" else {"a": 10_000, "b": 0}
                t0 = time.monotonic()
                version = rtds.publish(split_weights(st.config, weights))
                while client.send()[1] != target:
                    if time.monotonic() - t0 > 10:
                        raise TimeoutError("weights never took effect")
                effect.append(time.monotonic() - t0)
                rtds.wait_acked(version)
                assert rtds.service is not None
                # The service's loop clock is time.monotonic(), like t0.
                acked_at = max(s["acked_at"] or 0.0 for s in rtds.service.state())
                ack.append(acked_at - t0)
            print(f"publish -> Envoy ACK: {_ms(ack)}")
            print(f"publish -> first request on the new cluster: {_ms(effect)}")
            rtds.stop()
            time.sleep(0.5)
            last = "a" if flips % 2 == 0 else "b"
            print(f"RTDS stream dropped: {dict(client.split(requests))} "
                  f"(last weights: all to {last})")
            st.stop_envoy()
            t0 = time.monotonic()
            st.start_envoy(sidecar_port=rtds.port)
            ready_s = time.monotonic() - t0
            print(f"Envoy restarted with the sidecar down: ready after {ready_s:.3f} s; "
                  f"{dict(Client(st.ports['envoy']).split(requests))} (rendered equal weights)")
            version = rtds.publish(split_weights(st.config, {"a": 0, "b": 10_000}))
            t0 = time.monotonic()
            rtds.start()
            print(f"sidecar back: Envoy re-subscribed and acked after "
                  f"{rtds.wait_acked(version, 30):.3f} s; "
                  f"{dict(Client(st.ports['envoy']).split(requests))} (published: all to b)")
        finally:
            rtds.close()
    return 0
