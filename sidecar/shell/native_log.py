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
from sidecar.core.series import OkSample
from sidecar.core.types import Observation, SliceKey
from sidecar.pb.envoy.data.accesslog.v3 import accesslog_pb2 as al
from sidecar.shell.access_log import Sink, entry_tag, us_seconds
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

    def batch(self, now: float) -> NativeBatch:
        """The handler for one batch received at ``now`` (:class:`NativeBatch`)."""
        return NativeBatch(self, now)


class NativeBatch:
    """One batch's reader of the common native entry (a complete 2xx): it takes that
    entry straight from the wire and leaves every other entry to
    :meth:`NativeFeed.__call__` (module docstring).

    The common entries that are not probes are learned a route at a time: their
    samples are gathered per (cluster, slice) and handed to the router in one
    :meth:`~sidecar.core.router.Router.observe_ok` call each, together with their
    load and counts, when the batch ends (:meth:`finish`) -- and before any entry
    that takes another path (left to the record path, or a probe), so the router
    still sees every failure, probe and success in the order Envoy logged them
    (successes of different routes touch separate state: their relative order
    changes nothing). With ``stats.observe_share`` below 1 each entry is learned
    at once, as whether to keep the next one depends on what is already counted.
    """

    def __init__(self, feed: NativeFeed, now: float) -> None:
        app, native = feed.app, feed.native
        self.now = now
        self.app, self.native = app, native
        self.routes = native.routes()
        self.config, self.router, self.offsets = app.config, app.router, app.offsets
        self.sampled = self.config.stats.observe_share < 1.0
        self.known: dict[str, bool] = {}
        self.timing: dict[tuple[str, SliceKey], tuple[float, bool]] = {}
        self.probes: dict[SliceKey, tuple[str, ...]] = {}
        self.pending: dict[tuple[str, SliceKey], list[OkSample]] = {}

    def __call__(self, e: al.HTTPAccessLogEntry) -> bool:
        c = e.common_properties
        s = self.routes.get(c.route_name)
        if s is None:
            return self._leave()
        parts = entry_tag(c.custom_tags)
        if parts is None:
            return self._leave()  # a bootstrap without the tag
        status_s, flags, first_s, end_s, tokens_s, rid = parts
        if flags != "-" or rid or not status_s.isdigit():
            return self._leave()  # a response flag, a tailroute decision
        status = int(status_s)
        end = us_seconds(end_s)
        if not 200 <= status < 300 or end is None:
            return self._leave()
        tokens = None
        if tokens_s:
            try:
                n = float(tokens_s)
            except ValueError:
                return self._leave()  # not a number: as the record path reads it
            tokens = int(n) if 0 <= n < 1e9 else None
        cluster = c.upstream_cluster
        known = self.known.get(cluster)
        if known is None:
            known = self.known[cluster] = self.config.has_cluster(cluster)
        if not known or e.response.response_code_details.startswith(TAILROUTE_DETAILS_PREFIX):
            return self._leave()
        probe_set = self.probes.get(s)
        if probe_set is None:
            probe_set = self.probes[s] = self.native.probes_of(s)
        probe = cluster in probe_set
        ttft = tpot = None
        if s.streaming:
            key = (cluster, s)
            route_timing = self.timing.get(key)
            if route_timing is None:
                offsets = self.offsets
                route_timing = self.timing[key] = (offsets.offset(cluster, s),
                                                   not offsets.blind(cluster, s))
            first = us_seconds(first_s)
            ttft, tpot = ok_timing(None if first is None else first + route_timing[0],
                                   end, tokens, route_timing[1])
        if not (probe or self.sampled):
            group = self.pending.get((cluster, s))
            if group is None:
                group = self.pending[(cluster, s)] = []
            group.append((ttft, tpot, end, tokens or None))
            return True
        if self.pending:
            self.finish()
        self._count(s, cluster, [end])
        if probe:
            self.native.counters["probes"] += 1
        elif not self.router.wants_observation(cluster, s, self.now, self.app.rng):
            return True
        obs = Observation(cluster, s, "ok", status, ttft, tpot, end, tokens or None,
                          False, probe, False)
        events = self.router.observe(obs, self.now)
        if events:
            self.app.log_events(events)
        return True

    def _leave(self) -> bool:
        """An entry for the record path: what came before it is learned first."""
        if self.pending:
            self.finish()
        return False

    def _count(self, s: SliceKey, cluster: str, busy: list[float | None]) -> None:
        envoy, n = self.app.envoy, len(busy)
        envoy["entries"] += n
        envoy["native"] += n
        self.native.counters["logged"] += n
        self.native.load.add_all(s, cluster, busy)

    def finish(self) -> None:
        """Learn the gathered successes, a route at a time (class docstring)."""
        pending, self.pending = self.pending, {}
        observe_ok, now = self.router.observe_ok, self.now
        for (cluster, s), samples in pending.items():
            self._count(s, cluster, [e2e for _, _, e2e, _ in samples])
            observe_ok(cluster, s, samples, now)
