"""The access-log sink of native and hybrid mode: learning from requests Envoy routed.

Entries of a slice route without a tailroute decision are the native path's:
the cluster comes from the entry (``upstream_cluster``), the slice from the
route's name, the probe flag from the published weights; they count as
``envoy: native``, never as fail-open. Every other entry goes on to the inner
sink (:class:`~sidecar.shell.outcomes.OutcomeFeed`): decided requests, and LLM
requests Envoy served on the default route without a decision.

Every native request is learned from its entry, so this is the sidecar's whole
per-request cost in native mode. Two ways in, one result:

==========================================  ===========================================
entry                                       path
==========================================  ===========================================
slice route, no tailroute decision (rid),   :meth:`NativeFeed.batch`: read straight from
2xx, no response flag, not answered by      the wire entry -- the route name, the cluster
tailroute, known cluster, end time logged   and the one tag the native bootstrap logs
                                            (``envoy_contract.TAG_ENTRY``: status, flags,
                                            durations, tokens, rid) -- with what cannot
                                            change within a batch (route -> slice, known
                                            clusters, first-token offsets, probe
                                            routes) looked up once per batch
anything else (errors, timeouts, cancels,   :meth:`NativeFeed.__call__`: the entry's
flags, decided requests, other routes)      :class:`~sidecar.core.envoy_log.LogRecord`,
                                            :func:`~sidecar.core.envoy_log.observation_from_log`
==========================================  ===========================================

Both give the same observation for the same entry (the ``ok`` timing is
:func:`~sidecar.core.envoy_log.ok_timing` on both; ``tests/test_native_log.py``
compares them entry by entry).
"""

from __future__ import annotations

from sidecar.core.envoy_log import (
    TAILROUTE_DETAILS_PREFIX,
    LogRecord,
    observation_from_log,
    ok_timing,
    waited_s,
)
from sidecar.core.types import Observation, SliceKey
from sidecar.pb.envoy.data.accesslog.v3 import accesslog_pb2 as al
from sidecar.shell.access_log import EntryHandler, Sink, entry_tag, us_seconds
from sidecar.shell.app import App
from sidecar.shell.native import NativeRouting


class NativeFeed:
    """The access-log sink in native and hybrid mode (module docstring)."""

    def __init__(self, app: App, native: NativeRouting, inner: Sink) -> None:
        self.app = app
        self.native = native
        self.inner = inner

    def __call__(self, rec: LogRecord, now: float) -> None:
        if rec.rid is None:
            s = self.native.slice_of_route(rec.route_name)
            if s is not None:
                self.observe(rec, s, now)
                return
        self.inner(rec, now)

    def observe(self, rec: LogRecord, s: SliceKey, now: float) -> None:
        app = self.app
        app.envoy["entries"] += 1
        app.envoy["native"] += 1
        cluster = rec.upstream_cluster
        if not app.config.has_cluster(cluster):
            app.envoy["native_no_upstream"] += 1  # e.g. reset before a cluster was picked
            return
        busy = rec.end_s if rec.end_s is not None else waited_s(rec)
        probe = self.native.on_logged(s, cluster, busy if busy is not None else rec.duration_s)
        # stats.observe_share as on the per-request path: every response until the
        # route's current sub-window has min_samples, then that share (uniform, so
        # error rates stay unbiased); probes always count.
        if not probe and not app.router.wants_observation(cluster, s, now, app.rng):
            return
        obs = observation_from_log(
            rec, cluster, s, bool(s.streaming),
            ttft_offset_s=app.offsets.offset(cluster, s),
            ttft_from_log=not app.offsets.blind(cluster, s),
            is_probe=probe,
        )
        if obs is not None:
            app.log_events(app.router.observe(obs, now))

    def batch(self, now: float) -> EntryHandler:
        """The handler for one batch received at ``now``: it takes the common native
        entry (a complete 2xx) straight from the wire and leaves every other entry to
        :meth:`__call__` (module docstring)."""
        app, native = self.app, self.native
        routes = native.routes()
        config, router, offsets, envoy = app.config, app.router, app.offsets, app.envoy
        sampled = config.stats.observe_share < 1.0
        known: dict[str, bool] = {}
        timing: dict[tuple[str, SliceKey], tuple[float, bool]] = {}
        probes: dict[SliceKey, tuple[str, ...]] = {}
        observe, log_events, add_load = router.observe, app.log_events, native.load.add
        counters = native.counters

        def take(e: al.HTTPAccessLogEntry) -> bool:
            c = e.common_properties
            s = routes.get(c.route_name)
            if s is None:
                return False
            parts = entry_tag(c.custom_tags)
            if parts is None:
                return False  # a bootstrap without the tag
            status_s, flags, first_s, end_s, tokens_s, rid = parts
            if flags != "-" or rid or not status_s.isdigit():
                return False  # a response flag, a tailroute decision
            status = int(status_s)
            end = us_seconds(end_s)
            if not 200 <= status < 300 or end is None:
                return False
            tokens = None
            if tokens_s:
                try:
                    n = float(tokens_s)
                except ValueError:
                    return False  # not a number: as the record path reads it
                tokens = int(n) if 0 <= n < 1e9 else None
            cluster = c.upstream_cluster
            ok = known.get(cluster)
            if ok is None:
                ok = known[cluster] = config.has_cluster(cluster)
            if not ok or e.response.response_code_details.startswith(TAILROUTE_DETAILS_PREFIX):
                return False
            envoy["entries"] += 1
            envoy["native"] += 1
            counters["logged"] += 1
            add_load(s, cluster, end)
            probe_set = probes.get(s)
            if probe_set is None:
                probe_set = probes[s] = native.probes_of(s)
            probe = cluster in probe_set
            if probe:
                counters["probes"] += 1
            elif sampled and not router.wants_observation(cluster, s, now, app.rng):
                return True
            ttft = tpot = None
            if s.streaming:
                key = (cluster, s)
                route_timing = timing.get(key)
                if route_timing is None:
                    offset = offsets.offset(cluster, s)
                    route_timing = timing[key] = (offset, not offsets.blind(cluster, s))
                first = us_seconds(first_s)
                ttft, tpot = ok_timing(None if first is None else first + route_timing[0],
                                       end, tokens, route_timing[1])
            obs = Observation(cluster, s, "ok", status, ttft, tpot, end, tokens or None,
                              False, probe, False)
            events = observe(obs, now)
            if events:
                log_events(events)
            return True

        return take

