"""Publish native-mode weights to Envoy over RTDS (the Runtime Discovery Service).

Every Envoy opens one long-lived ``StreamRuntime`` stream to the sidecar's gRPC
port (its bootstrap's RTDS layer ``tailroute_weights``) and subscribes to that
layer. The sidecar answers with the whole layer -- one runtime key per slice and
cluster, ``tailroute.w.<slice>.<cluster> = <weight>`` -- and again whenever
:meth:`WeightLayer.publish` changes it (state of the world: each response
carries every key). Envoy ACKs a version by repeating it with the response's
nonce, or NACKs by repeating the previous one; both are recorded per stream.

Why RTDS (measured on Envoy 1.40, docs/native-mode.md): a change is in force
for the next request within milliseconds; a dropped stream (dead sidecar)
leaves the last layer in force; a restarted Envoy gets the current layer as
soon as it reconnects, and uses the rendered equal weights until then.

Stream state machine (per Envoy)::

    SUBSCRIBING --first request--> SERVING: send the current layer (if any)
    SERVING --publish (new version)--> SERVING: send it
    SERVING --request, nonce = last sent, version = sent--> ACK recorded
    SERVING --request, nonce = last sent, other version--> NACK recorded (logged once)
    any --stream closed--> gone (Envoy keeps the layer it has)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import any_pb2, struct_pb2

from sidecar.core.types import SliceKey
from sidecar.core.weights import SliceWeights
from sidecar.pb.envoy.service.discovery.v3 import discovery_pb2 as d_pb
from sidecar.pb.envoy.service.runtime.v3 import rtds_pb2 as r_pb
from sidecar.pb.envoy.service.runtime.v3 import rtds_pb2_grpc as r_grpc
from sidecar.shell.native_keys import RUNTIME_LAYER, runtime_key

log = logging.getLogger("tailroute.rtds")
RUNTIME_TYPE = "type.googleapis.com/envoy.service.runtime.v3.Runtime"


@dataclass(frozen=True, slots=True)
class Publication:
    """One published version: when, and which slices changed to what."""

    at: float
    version: int
    changed: tuple[tuple[str, tuple[tuple[str, int], ...]], ...]  # (slice label, weights)
    keys: int


class WeightLayer:
    """The current runtime layer and its version; streams wait on :meth:`changed`."""

    def __init__(self, history: int = 32) -> None:
        self.version = 0
        self.values: dict[str, int] = {}
        self.weights: dict[SliceKey, SliceWeights] = {}
        self.history: deque[Publication] = deque(maxlen=history)
        self.publications = 0
        self._cond: asyncio.Condition | None = None
        self._wakeups: set[asyncio.Task[None]] = set()  # referenced until done

    def _condition(self) -> asyncio.Condition:
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    def publish(self, weights: Mapping[SliceKey, SliceWeights], now: float) -> bool:
        """Make ``weights`` the layer; a new version only if any value changed."""
        values = {runtime_key(s, c): w for s, sw in weights.items() for c, w in sw.weights}
        changed = tuple(
            (s.label(), sw.weights) for s, sw in weights.items()
            if s not in self.weights or self.weights[s].weights != sw.weights
        )
        self.weights = dict(weights)
        if values == self.values:
            return False
        self.values = values
        self.version += 1
        self.publications += 1
        self.history.append(Publication(now, self.version, changed, len(values)))
        with contextlib.suppress(RuntimeError):  # no running loop: nobody is waiting
            task = asyncio.get_running_loop().create_task(self._notify())
            self._wakeups.add(task)
            task.add_done_callback(self._wakeups.discard)
        return True

    async def _notify(self) -> None:
        cond = self._condition()
        async with cond:
            cond.notify_all()

    async def changed(self, seen: int, timeout: float) -> None:
        """Return once the version differs from ``seen`` (or after ``timeout``)."""
        cond = self._condition()
        async with cond:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(cond.wait_for(lambda: self.version != seen), timeout)

    def response(self, nonce: str) -> d_pb.DiscoveryResponse:
        layer = struct_pb2.Struct()
        layer.update({k: float(v) for k, v in self.values.items()})
        res = any_pb2.Any()
        res.Pack(r_pb.Runtime(name=RUNTIME_LAYER, layer=layer))
        return d_pb.DiscoveryResponse(version_info=str(self.version), resources=[res],
                                      type_url=RUNTIME_TYPE, nonce=nonce)


@dataclass(slots=True)
class StreamInfo:
    """One Envoy's RTDS stream, as shown on /state."""

    peer: str
    opened_at: float
    node: str = ""
    sent_version: int = 0
    acked_version: int = 0
    acked_at: float | None = None
    nacks: int = 0
    last_nack: str = ""
    _nonce: str = field(default="", repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "peer": self.peer, "opened_at": self.opened_at,
                "sent_version": self.sent_version, "acked_version": self.acked_version,
                "acked_at": self.acked_at, "nacks": self.nacks}


class RtdsService(r_grpc.RuntimeDiscoveryServiceServicer):  # type: ignore[misc]
    """envoy.service.runtime.v3.RuntimeDiscoveryService/StreamRuntime."""

    def __init__(self, layer: WeightLayer) -> None:
        self.layer = layer
        self.streams: dict[int, StreamInfo] = {}
        self.streams_total = 0
        self._ids = 0

    def _on_request(self, info: StreamInfo, req: d_pb.DiscoveryRequest, now: float) -> None:
        if not req.response_nonce or req.response_nonce != info._nonce:
            return  # the subscription itself, or about an older response
        if req.version_info == str(info.sent_version):
            info.acked_version, info.acked_at = info.sent_version, now
            return
        info.nacks += 1
        if info.last_nack != info._nonce:
            info.last_nack = info._nonce
            log.warning("Envoy %s rejected runtime layer version %d (kept %r)",
                        info.peer, info.sent_version, req.version_info)

    async def StreamRuntime(
        self, request_iterator: AsyncIterator[d_pb.DiscoveryRequest], context: Any
    ) -> AsyncIterator[d_pb.DiscoveryResponse]:
        loop = asyncio.get_running_loop()
        self._ids += 1
        sid = self._ids
        info = StreamInfo(str(context.peer()), loop.time())
        requests: asyncio.Queue[d_pb.DiscoveryRequest | None] = asyncio.Queue()

        async def read() -> None:
            try:
                async for req in request_iterator:
                    await requests.put(req)
            finally:
                await requests.put(None)

        reader = asyncio.create_task(read())
        getter: asyncio.Future[d_pb.DiscoveryRequest | None] | None = None
        waiter: asyncio.Future[None] | None = None
        try:
            first = await requests.get()
            if first is None:
                return
            info.node = first.node.id if first.HasField("node") else ""
            names = set(first.resource_names)
            if names and RUNTIME_LAYER not in names:
                log.warning("Envoy %s asked for runtime layers %s; tailroute serves only %s",
                            info.peer, sorted(names), RUNTIME_LAYER)
                return
            self.streams[sid] = info
            self.streams_total += 1
            while True:
                if self.layer.version and info.sent_version != self.layer.version:
                    info.sent_version = self.layer.version
                    info._nonce = f"{sid}-{info.sent_version}"
                    yield self.layer.response(info._nonce)
                if getter is None:
                    getter = asyncio.ensure_future(requests.get())
                waiter = asyncio.ensure_future(self.layer.changed(info.sent_version, 30.0))
                pending: set[asyncio.Future[Any]] = {waiter, getter}
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                if getter.done():
                    req, getter = getter.result(), None
                    if req is None:
                        return
                    self._on_request(info, req, loop.time())
        finally:
            self.streams.pop(sid, None)
            reader.cancel()
            # A stream cancelled mid-wait leaves both futures pending: cancel them so
            # neither is garbage-collected suspended inside the layer's condition.
            for fut in (getter, waiter):
                if fut is not None:
                    fut.cancel()

    def state(self) -> list[dict[str, Any]]:
        return [s.as_dict() for s in self.streams.values()]


def add_to_server(server: Any, layer: WeightLayer) -> RtdsService:
    """Register the RTDS service on a ``grpc.aio`` server (before it starts)."""
    service = RtdsService(layer)
    r_grpc.add_RuntimeDiscoveryServiceServicer_to_server(service, server)
    return service
