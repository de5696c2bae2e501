"""The standard gRPC health service (``grpc.health.v1.Health``) beside ext_proc.

Envoy's ``grpc_health_check`` on the sidecar cluster (rendered by
``tailroute envoy-config``), Kubernetes ``grpc`` probes and ``grpc_health_probe``
all speak it. States, one for the whole server::

    NOT_SERVING --config loaded, listeners up (set_serving(True))--> SERVING
    SERVING     --SIGTERM: draining (shutdown())------------------> NOT_SERVING (final)

An invalid hot reload keeps the last good config serving, so it does not
change the status. Known service names: ``""`` (the server),
``envoy.service.ext_proc.v3.ExternalProcessor`` and ``grpc.health.v1.Health``;
``Check`` of another name is the ``NOT_FOUND`` status code, ``Watch`` of one
sends ``SERVICE_UNKNOWN`` and stays open, as the protocol says. ``Watch``
sends the current status at once and then every change; at shutdown watchers
get ``NOT_SERVING`` and their streams end, so they never hold up the drain.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc

from sidecar.pb.grpc.health.v1 import health_pb2 as hpb
from sidecar.pb.grpc.health.v1 import health_pb2_grpc as hpb_grpc

log = logging.getLogger("tailroute.health")

SERVICES = frozenset({"", "envoy.service.ext_proc.v3.ExternalProcessor", "grpc.health.v1.Health"})
Status = hpb.HealthCheckResponse.ServingStatus
SERVING: Status = hpb.HealthCheckResponse.SERVING
NOT_SERVING: Status = hpb.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN: Status = hpb.HealthCheckResponse.SERVICE_UNKNOWN


class HealthService(hpb_grpc.HealthServicer):  # type: ignore[misc]
    """grpc.health.v1.Health for one serving process; starts NOT_SERVING."""

    def __init__(self) -> None:
        self.status: Status = NOT_SERVING
        self.final = False
        self._changed = asyncio.Event()

    def register(self, server: grpc.aio.Server) -> None:
        hpb_grpc.add_HealthServicer_to_server(self, server)

    def set_serving(self, serving: bool) -> None:
        if self.final:
            return  # draining is for good
        self._set(SERVING if serving else NOT_SERVING)

    def shutdown(self) -> None:
        """Draining: NOT_SERVING for good, and every Watch stream ends after saying so."""
        self.final = True
        self._set(NOT_SERVING, force=True)

    def _set(self, status: Status, force: bool = False) -> None:
        if status == self.status and not force:
            return
        log.info("health: %s", hpb.HealthCheckResponse.ServingStatus.Name(status))
        self.status = status
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def Check(self, request: hpb.HealthCheckRequest, context: Any
                    ) -> hpb.HealthCheckResponse:
        if request.service not in SERVICES:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return hpb.HealthCheckResponse(status=self.status)

    async def Watch(self, request: hpb.HealthCheckRequest, context: Any
                    ) -> AsyncIterator[hpb.HealthCheckResponse]:
        if request.service not in SERVICES:
            yield hpb.HealthCheckResponse(status=SERVICE_UNKNOWN)
            while not self.final:  # stays unknown: hold the stream until shutdown
                await self._changed.wait()
            return
        sent = None
        while True:
            changed = self._changed
            if self.status != sent:
                sent = self.status
                yield hpb.HealthCheckResponse(status=sent)
                continue  # the status may have moved on while this waited at the yield
            if self.final:
                return
            await changed.wait()
