"""The Envoy-facing shell: ext_proc streams, the gRPC server, bootstrap rendering.

Thin asyncio adapters around the pure decision core (:mod:`sidecar.core`): they
read the loop's clock, do the I/O and hand events to the core with ``now``.
"""
