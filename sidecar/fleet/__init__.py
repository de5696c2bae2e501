"""Fleet mode: replicas (and worker processes) share statistics and health through
Redis/Valkey. See docs/operations.md ("Fleet mode") for what is shared and sizing.

* :mod:`sidecar.fleet.codec` -- wire form of sub-windows, route states, probe results;
* :mod:`sidecar.fleet.exchange` -- what one push/pull cycle carries (one
  :class:`~sidecar.fleet.exchange.Exchange` out, one :class:`~sidecar.fleet.exchange.Reply` in);
* :mod:`sidecar.fleet.sync` -- the pure per-replica sync state machine: route leases and
  health, driving :mod:`sidecar.fleet.stats_sync` (push own statistics, merge peers');
* :mod:`sidecar.fleet.memory` -- an in-process store with the same semantics (policy lab);
* :mod:`sidecar.fleet.redis_store` -- the Redis/Valkey store (one pipelined round trip);
* :mod:`sidecar.fleet.link` -- the asyncio loop: cadence, timeouts, backoff, logging;
* :mod:`sidecar.fleet.metrics` -- its Prometheus collector.
"""
