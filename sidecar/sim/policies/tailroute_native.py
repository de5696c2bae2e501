"""tailroute's native and hybrid routing modes in the lab (docs/native-mode.md).

``tailroute_native`` models ``routing.mode: native``: the same core
:class:`~sidecar.core.router.Router` learns from every response, but the
cluster of a request is drawn the way Envoy's ``weighted_clusters`` draws it --
at random in proportion to the slice's integer weights -- and the weights are
recomputed only every ``routing.publish_interval_s`` (and at once when a health
transition happens in between: a cooldown ends, a run of hard failures ejects a
route, a failure puts a route on trial, or a push-back hold starts -- a declared
wait or a quota's backoff -- or ends; a hold that started or ended since the last
publication makes it a full one), with
:func:`sidecar.core.weights.compute_weights` planning the last interval's load,
as the sidecar's publisher does. Health and latency verdicts change once per
evaluation window (``stats.subwindow_s``) in every mode.
What that costs against per-request decisions:

* no admission control (nothing defers, sheds, queues or skips), and no
  per-request timeout from a deadline: the route's timeouts are the class's (an
  unstreamed answer's whole timeout, a stream's idle timeout);
* in-flight counts are the last interval's average (:class:`WindowLoad`, from
  finished requests, as the sidecar learns them from Envoy's access log), so
  capacity and load scoring act on a plan for the next interval, not on each
  request's live count;
* probes are a fixed share of each window's weights instead of a per-request draw.

``tailroute_hybrid`` models ``routing.mode: hybrid``: requests that carry a
deadline or a workflow step, or whose class is in
``routing.per_request_classes``, get the per-request decision
(``Router.decide``, admission included); all others take the native path. Both
feed the same router.

The slice of a request is the simulator's exact one; the real native path
approximates the input size from ``content-length`` (docs/native-mode.md).
"""

from __future__ import annotations

import random

from sidecar.core.types import Decision, SliceKey
from sidecar.core.weights import SliceWeights, cold_slices, refresh_weights
from sidecar.core.window_load import WindowLoad, WindowView
from sidecar.sim.policies import PolicyContext, live_entries
from sidecar.sim.policies.tailroute import Tailroute, _ticket
from sidecar.sim.records import Attempt


class TailrouteNative(Tailroute):
    name = "tailroute_native"
    needs_tick = True

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self.window_s = self.config.routing.publish_interval_s
        self.load = WindowLoad()
        self.load.roll(0.0)
        self.weights: dict[SliceKey, SliceWeights] = {}
        self._window = 0
        self._holds = self.router.pushback.holds_version  # as of the last publication
        self.weights = self._compute(0.0, full=True)
        self._next_window = self.window_s
        self.publications = 1
        self._per_request: set[int] = set()  # ids of attempts decided per request

    def _compute(self, now: float, full: bool) -> dict[SliceKey, SliceWeights]:
        """As the sidecar: every slice at a new evaluation window or after a health
        transition, else the slices with traffic in the last interval."""
        window = int(now / self.config.stats.subwindow_s)
        # As the sidecar's loop (sidecar.shell.native): a hold's start or end since the
        # last publication moves a route's capacity, so every slice is redone.
        holds = self.router.pushback.holds_version
        full = full or window != self._window or holds != self._holds
        self._window, self._holds = window, holds
        return refresh_weights(self.config, WindowView(self.router, {}), now, self.weights,
                               self.load.demand, full, live=self.router.live,
                               cold=cold_slices(self.config, self.load, now))

    def wants_per_request(self, att: Attempt) -> bool:
        return False

    def choose(self, att: Attempt, now: float, rng: random.Random) -> str | Decision:
        if self.wants_per_request(att):
            d = self.router.decide(att.request_info(now), now, rng, ticket=_ticket(att.call))
            if d.admission == "admit":  # others never start: their id could be reused
                self._per_request.add(id(att))
            return d
        klass = self.config.workload_class(att.call.klass)
        # A stream's slice route has no whole-answer timeout (the engine applies the
        # class timeout to its first byte, as the route's idle timeout).
        timeout = klass.slo.timeout_ms if klass and not att.call.stream else None
        sw = self.weights.get(att.call.slice)
        if sw is None:  # no slice route (unknown model): Envoy's default route
            return Decision(self.config.default_cluster, "unknown_model", timeout_ms=timeout)
        x = rng.random() * sw.total
        cluster = sw.weights[-1][0]
        for c, w in sw.weights:
            x -= w
            if x < 0:
                cluster = c
                break
        return Decision(cluster, "native", timeout_ms=timeout, is_probe=cluster in sw.probes)

    def on_start(self, att: Attempt, now: float) -> None:
        if id(att) in self._per_request:  # as the shell: only what it decided (live books too)
            att.sent_load = self.router.started(att.cluster, att.low)
            live_entries.track(self.router, att, now, self.sample_rng)

    def on_result(self, att: Attempt, now: float) -> None:
        decided = id(att) in self._per_request
        if decided:
            self._per_request.discard(id(att))
            self.router.finished(att.cluster, att.low)
        else:
            self.load.add(att.call.slice, att.cluster, now - att.sent_at)
        obs = att.observation()
        live_entries.resolve(self.router, att, obs, now)  # a decided request's entry
        if obs is not None:
            holds = self.router.pushback.holds_version
            # As the shell: a native request is learned from its log entry alone.
            events = (self.router.observe(obs, now) if decided
                      else self.router.observe_logged(obs, now))
            for e in events:
                self.transitions[e.new] += 1
            if events:  # e.g. a fast ejection: the sidecar publishes at once, not at a tick
                self.weights = self._compute(now, full=True)
                self.publications += 1
            elif self.router.pushback.holds_version != holds:
                # As the sidecar (sidecar.shell.native_log): a hold that starts -- a
                # declared wait, or push-back's backoff on a quota's 429 -- wakes the
                # publisher, so it is published at once (a full refresh: _compute).
                self.weights = self._compute(now, full=False)
                self.publications += 1
            elif obs.outcome != "ok" and self.router.board.runs and \
                    self.router.board.on_trial(obs.cluster, obs.slice):
                # As the sidecar: a failure that puts a route on trial is published at
                # once (its weight floor, sidecar.core.weights).
                self.weights = self._compute(now, full=False)
                self.publications += 1

    def tick(self, now: float) -> None:
        events = self.router.tick(now)
        for e in events:
            self.transitions[e.new] += 1
        window_over = now >= self._next_window
        if window_over:
            self.load.roll(now)
            while self._next_window <= now:
                self._next_window += self.window_s
        # The sidecar's loop wakes at the router's deadlines too: a hold that ended is
        # published then (_compute makes it a full refresh).
        if window_over or events or self.router.pushback.holds_version != self._holds:
            self.weights = self._compute(now, full=bool(events))
            self.publications += 1

    def next_deadline(self) -> float | None:
        nd = self.router.next_deadline()
        return self._next_window if nd is None else min(nd, self._next_window)

    def stats(self) -> dict[str, dict[str, int]]:
        out = super().stats()
        out["native"] = {"publications": self.publications}
        return out


class TailrouteHybrid(TailrouteNative):
    name = "tailroute_hybrid"

    def wants_per_request(self, att: Attempt) -> bool:
        call = att.call
        return (call.deadline is not None or call.step is not None
                or call.klass in self.config.routing.per_request_classes)
