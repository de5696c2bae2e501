"""The access-log sink of native and hybrid mode: learning from requests Envoy routed.

Entries of a slice route without a tailroute decision are the native path's:
the cluster comes from the entry (``upstream_cluster``), the slice from the
route's name, the probe flag from the published weights; they count as
``envoy: native``, never as fail-open. An LLM request that no slice route
matched (a model no route serves, a body ``json_to_metadata`` could not read)
and that Envoy served on the default route is the native path's default route,
the counterpart of ``unknown_model`` on the per-request path: ``envoy:
native_default`` and ``tailroute_fail_open_total{reason="native_default"}``,
not ``fail_open`` (the sidecar did not fail: native requests never ask it; a
per-request request that fails open lands on a slice route). Every other entry
goes on to the inner sink (:class:`~sidecar.shell.outcomes.OutcomeFeed`).

Every native request is learned from its entry, so this is the sidecar's whole
per-request cost in native mode. Two ways in, one result:

==========================================  ===========================================
entry                                       path
==========================================  ===========================================
slice route, no tailroute decision (rid),   :meth:`NativeFeed.batch`: read straight from
2xx, no response flag, no error field in    the wire entry -- the route name, the cluster
the stream, not answered by tailroute,      and the one tag the native bootstrap logs
a cluster the route lists in the live       (``envoy_contract.TAG_ENTRY``: status, flags,
config, end time logged, one upstream       durations, tokens, rid, stream error) --
attempt (Envoy did not retry)               with what cannot change within a batch
                                            (route -> slice, known
                                            clusters, first-token offsets, probe
                                            routes) looked up once per batch and route
                                            (:class:`NativeBatch`); the successes are
                                            learned a route at a time
                                            (``Router.observe_ok``)
anything else (errors, an error field in a  :meth:`NativeFeed.__call__`: the entry's
200 stream, timeouts, cancels, flags,       :class:`~sidecar.core.envoy_log.LogRecord`,
retried, decided requests, other routes)    :func:`~sidecar.core.envoy_log.observation_from_log`
==========================================  ===========================================

Both teach the router the same for the same entries (the ``ok`` timing is
:func:`~sidecar.core.envoy_log.ok_timing` on both; ``tests/test_native_log.py``
compares the router's statistics, health, live-miss books, counters and the load after
any batches, against the record path fed every entry as one observation).
"""

from __future__ import annotations

import logging

from sidecar.core.classify import API_PATHS, api_for_path
from sidecar.core.envoy_log import (
    TAILROUTE_DETAILS_PREFIX,
    LogRecord,
    observation_from_log,
    ok_timing,
    waited_s,
)
from sidecar.core.subwindow import OkSample
from sidecar.core.types import Api, Observation, SliceKey
from sidecar.pb.envoy.data.accesslog.v3 import accesslog_pb2 as al
from sidecar.shell.access_log import Sink, entry_tag, us_seconds
from sidecar.shell.app import App
from sidecar.shell.native import NativeRouting
from sidecar.shell.outcomes import is_llm_request

log = logging.getLogger("tailroute")  # a serving logger: throttled per call site


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
            if rec.upstream_cluster and is_llm_request(rec):
                # No slice route matched (module docstring): counted as fail_open, one
                # client's typo paged TailrouteEnvoyFailOpen ("Envoy serves 100 % of
                # LLM requests without asking tailroute", as native ones never do).
                self.app.note_entry(rec)
                self.app.last_entry = now
                self.app.envoy["native_default"] += 1
                return
        self.inner(rec, now)

    def observe(self, rec: LogRecord, s: SliceKey, now: float) -> None:
        self._observe(rec, s, now)
        # A hold that started here -- a declared wait, or push-back's own backoff on a
        # quota's 429 (sidecar.core.pushback) -- takes the route's weight to 0: the app's
        # on_holds wakes the publisher, not the next interval. It wakes again when the
        # hold ends (the router's next deadline).
        self.app.check_holds()

    def _observe(self, rec: LogRecord, s: SliceKey, now: float) -> None:
        app = self.app
        app.note_entry(rec)
        app.envoy["native"] += 1
        cluster = rec.upstream_cluster
        if not cluster:
            app.envoy["native_no_upstream"] += 1  # e.g. reset before a cluster was picked
            return
        routable = self.native.routable(s, cluster)
        self.native.note_served(s.model, cluster, routable)
        if not routable:
            self._misrouted(rec, s, cluster)
            return
        busy = rec.end_s if rec.end_s is not None else waited_s(rec)
        probe = self.native.on_logged(s, cluster, busy if busy is not None else rec.duration_s)
        wait = rec.retry_after_s  # an upstream 429's or 503's declared wait
        # stats.observe_share as on the per-request path: every response until the
        # route's current sub-window has min_samples, then that share (uniform, so
        # error rates stay unbiased); probes always count.
        if not probe and not app.router.wants_observation(cluster, s, now, app.rng):
            if wait is not None:  # observed, router.observe holds it; unobserved, this does
                app.router.note_declared_wait(cluster, wait, now)
            return
        obs = observation_from_log(
            rec, cluster, s, bool(s.streaming),
            ttft_offset_s=app.offsets.offset(cluster, s),
            ttft_from_log=not app.offsets.blind(cluster, s),
            is_probe=probe,
        )
        if obs is not None:
            app.observe_attempts(rec, obs, now)
            app.log_events(app.router.observe_logged(obs, now))
            if app.on_observation is not None:  # the GenAI histograms, as App.observe
                app.on_observation(obs, api_for_path(rec.path))
            board = app.router.board
            if obs.outcome != "ok" and board.runs and board.on_trial(cluster, s):
                # The weights give a route on trial its floor now, not at the next
                # interval (sidecar.core.weights, step 3).
                self.native.wake()

    def _misrouted(self, rec: LogRecord, s: SliceKey, cluster: str) -> None:
        """Envoy's slice route sent a request to a cluster the live config does not
        route that slice to (not a candidate, or no cluster at all): Envoy runs a
        bootstrap rendered from another config, e.g. the sidecar restarted with a
        model's candidates changed and Envoy not. Its route still lists the cluster
        and the layer no longer has its key, so Envoy gives it the bootstrap's equal
        weight. Not evidence about any route the config knows; counted and warned,
        and published at weight 0 where that is safe (NativeRouting.note_served)."""
        self.app.envoy["misrouted"] += 1
        config = self.app.config
        index = next((i for i, m in enumerate(config.models) if m.name == s.model), None)
        field = "models" if index is None else f"models[{index}].candidates"
        log.warning("%s: %s does not route model %s to cluster %s, but Envoy's route %s sent "
                    "a request there: Envoy's bootstrap was rendered from another config; "
                    "re-render it (tailroute envoy-config) and restart Envoy", config.source,
                    field, s.model, cluster, rec.route_name)

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
        self.config, self.router = app.config, app.router
        self.sampled = self.config.stats.observe_share < 1.0
        # What cannot change within the batch, per (route name, cluster): None for an
        # entry of another path, else the route's _Route.
        self.plans: dict[tuple[str, str], _Route | None] = {}
        self.pending: list[_Route] = []  # routes with gathered successes, in first-seen order

    def _plan(self, key: tuple[str, str]) -> _Route | None:
        route_name, cluster = key
        s = self.routes.get(route_name)
        plan = None
        if s is not None and self.native.routable(s, cluster):
            self.native.note_served(s.model, cluster, True)
            offsets = self.app.offsets
            plan = _Route(s, cluster, cluster in self.native.probes_of(s),
                          offsets.offset(cluster, s), not offsets.blind(cluster, s))
        self.plans[key] = plan
        return plan

    def __call__(self, e: al.HTTPAccessLogEntry) -> bool:
        c = e.common_properties
        key = (c.route_name, c.upstream_cluster)
        plan = self.plans.get(key)
        if plan is None and (key in self.plans or (plan := self._plan(key)) is None):
            return self._leave()  # not a slice route, or no known cluster
        parts = entry_tag(c.custom_tags)
        if parts is None or c.upstream_request_attempt_count > 1:
            return self._leave()  # a bootstrap without the tag; Envoy retried (counted there)
        status_s, flags, first_s, end_s, tokens_s, rid, failed = parts
        if flags != "-" or rid or failed or not status_s.isdigit() or not end_s.isdigit():
            # a response flag, a tailroute decision, an error event in the stream, no end
            return self._leave()
        status = int(status_s)
        if not 200 <= status < 300:
            return self._leave()
        end = int(end_s) * 1e-6  # us_seconds
        tokens = None
        if tokens_s:
            n: float
            if tokens_s.isdigit():
                n = int(tokens_s)
            else:
                try:
                    n = float(tokens_s)
                except ValueError:
                    return self._leave()  # not a number: as the record path reads it
            tokens = int(n) if 0 <= n < 1e9 else None
        if e.response.response_code_details.startswith(TAILROUTE_DETAILS_PREFIX):
            return self._leave()
        s = plan.slice
        ttft = tpot = None
        if s.streaming:
            first = us_seconds(first_s)
            ttft, tpot = ok_timing(None if first is None else first + plan.offset,
                                   end, tokens, plan.trust_first)
        path = e.request.path
        api = API_PATHS.get(path) or api_for_path(path)
        if not (plan.probe or self.sampled):
            group = plan.samples
            if not group:
                self.pending.append(plan)
            group.append((ttft, tpot, end, tokens or None))
            plan.apis.append(api)
            return True
        if self.pending:
            self.finish()
        cluster = plan.cluster
        self._count(s, cluster, [end])
        if plan.probe:
            self.native.counters["probes"] += 1
        elif not self.router.wants_observation(cluster, s, self.now, self.app.rng):
            return True
        obs = Observation(cluster, s, "ok", status, ttft, tpot, end, tokens or None,
                          False, plan.probe, False)
        events = self.router.observe_logged(obs, self.now)
        if events:
            self.app.log_events(events)
        if self.app.on_observation is not None:
            self.app.on_observation(obs, api)
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
        pending, self.pending = self.pending, []
        observe_ok, now, hook = self.router.observe_ok, self.now, self.app.on_ok_samples
        for plan in pending:
            samples, plan.samples = plan.samples, []
            apis, plan.apis = plan.apis, []
            self._count(plan.slice, plan.cluster, [e2e for _, _, e2e, _ in samples])
            observe_ok(plan.cluster, plan.slice, samples, now)
            if hook is not None:  # the GenAI histograms, as for one observation each
                hook(plan.cluster, plan.slice, samples, apis)


class _Route:
    """A native slice route and cluster as one batch reads them (:class:`NativeBatch`)."""

    __slots__ = ("apis", "cluster", "offset", "probe", "samples", "slice", "trust_first")

    def __init__(self, s: SliceKey, cluster: str, probe: bool, offset: float,
                 trust_first: bool) -> None:
        self.slice, self.cluster, self.probe = s, cluster, probe
        self.offset, self.trust_first = offset, trust_first  # first-token offset, not blind
        self.samples: list[OkSample] = []  # successes gathered and not yet learned
        self.apis: list[Api] = []  # the API each of them called (gen_ai.operation.name)
