"""Native and hybrid routing in the sidecar: learn from Envoy's log, publish weights.

In ``routing.mode: native`` (and for the native share of ``hybrid``) Envoy
picks each request's cluster from its slice route's ``weighted_clusters``
(:mod:`sidecar.shell.bootstrap_native`); the sidecar never sees the request
until Envoy logs it. :class:`NativeRouting` is the shell side of that loop,
off the request path:

* **learn** (:meth:`NativeRouting.on_logged`): each access-log entry of a slice
  route gives the slice (the route's name) and the cluster (the entry's
  upstream cluster); its observation goes to the same router the per-request
  path uses, marked as a probe when the cluster held only the probe share of
  that slice's published weights, and its duration feeds the interval's load
  (:class:`~sidecar.core.window_load.WindowLoad`); the access-log sink that reads
  the entries is :class:`sidecar.shell.native_log.NativeFeed`;
* **publish** (:meth:`NativeRouting.publish`, every
  ``routing.publish_interval_s`` and at once when a health transition happens
  in between, or a push-back hold starts or ends -- a declared wait or a quota's
  backoff): the core's weights for every slice
  (:func:`~sidecar.core.weights.compute_weights`, planning the load) go to the
  RTDS layer (:class:`~sidecar.shell.rtds.WeightLayer`) when they changed
  materially: a weight moved by at least :data:`MIN_CHANGE` of the scale, or a
  route's probe / panic status changed. Envoy has them for its next request.

``/state`` shows the weights in force, when each version was published and
what changed, and every Envoy's RTDS stream (acked version, NACKs).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from sidecar.core.config import Config
from sidecar.core.router import Router
from sidecar.core.steps import Steps, run_steps
from sidecar.core.types import SliceKey
from sidecar.core.weights import (
    WEIGHT_SCALE,
    SliceWeights,
    cold_slices,
    refresh_weights_steps,
    route_candidates,
)
from sidecar.core.window_load import WindowLoad, WindowView
from sidecar.shell.bootstrap_native import route_slices
from sidecar.shell.pausing import run_steps_async
from sidecar.shell.rtds import RtdsService, WeightLayer

log = logging.getLogger("tailroute.native")
MIN_CHANGE = 0.005  # of WEIGHT_SCALE: smaller moves are not worth a push to every Envoy


def material_change(old: dict[SliceKey, SliceWeights],
                    new: dict[SliceKey, SliceWeights], scale: int = WEIGHT_SCALE) -> bool:
    """Would publishing ``new`` over ``old`` change routing noticeably?"""
    if old.keys() != new.keys():
        return True
    if any(dict(old[s].weights).keys() != dict(sw.weights).keys() for s, sw in new.items()):
        return True  # a key added or dropped: a stale cluster's 0 (NativeRouting.note_served)
    step = max(1, round(MIN_CHANGE * scale))
    for s, sw in new.items():
        before = old[s]
        if before.probes != sw.probes or before.panic != sw.panic:
            return True
        was = dict(before.weights)
        for c, w in sw.weights:
            moved = abs(w - was.get(c, 0))
            if moved >= step or (moved and (w == 0 or was.get(c, 0) == 0)):
                return True
    return False


class NativeRouting:
    """Learning from logged native requests and publishing weights (module docstring)."""

    def __init__(self, config: Config | Callable[[], Config],
                 router: Callable[[], Router]) -> None:
        """``config`` may be a callable (the live config: a reload takes effect at the
        next publication) and ``router`` is one (a reload may replace the router)."""
        self._config = config if callable(config) else (lambda: config)
        self._router = router
        self.layer = WeightLayer()
        self.rtds: RtdsService | None = None
        self.load = WindowLoad()
        self.computed_at: float | None = None
        self._window: int | None = None  # evaluation window of the last full refresh
        self.counters: dict[str, int] = {"logged": 0, "probes": 0}
        self._routes: dict[str, SliceKey] = {}
        self._routable: dict[str, frozenset[str]] = {}  # model -> its routes' clusters
        # Clusters Envoy's slice routes serve per model, as its log entries show: the
        # ones the config routes (served) and the ones it does not (stale).
        self.served: dict[str, set[str]] = {}
        self.stale: dict[str, set[str]] = {}
        self._routes_of: Config | None = None
        self._wake: asyncio.Event | None = None  # set by wake(): a transition to publish

    @property
    def config(self) -> Config:
        """The live config. After a reload, new slices and routes take effect at the
        next publication; Envoy's routes come from its bootstrap, so re-render it
        (``tailroute envoy-config``) when models, classes or candidates change."""
        cfg = self._config()
        if cfg is not self._routes_of:
            self._routes, self._routes_of = route_slices(cfg), cfg
            routable = {m.name: frozenset(route_candidates(cfg, m)) for m in cfg.models}
            if routable != self._routable:  # what Envoy's entries showed is about other routes
                self._routable, self.served, self.stale = routable, {}, {}
            self._window = None  # the next publication recomputes every slice
        return cfg

    @property
    def weights(self) -> dict[SliceKey, SliceWeights]:
        return self.layer.weights

    # ------------------------------------------------------------ learning

    def routes(self) -> dict[str, SliceKey]:
        """Rendered slice route name -> slice, for the live config."""
        if self._routes_of is not self._config():
            _ = self.config
        return self._routes

    def slice_of_route(self, route_name: str) -> SliceKey | None:
        """The slice of a rendered slice route (None for any other route)."""
        return self.routes().get(route_name)

    def routable(self, slice: SliceKey, cluster: str) -> bool:
        """Does the live config render ``slice``'s route with ``cluster`` in it? An entry
        of a slice route served elsewhere comes from an Envoy whose bootstrap was
        rendered from another config (sidecar.shell.native_log)."""
        if self._routes_of is not self._config():
            _ = self.config
        return cluster in self._routable.get(slice.model, ())

    def note_served(self, model: str, cluster: str, routable: bool) -> None:
        """Envoy's route of a slice of ``model`` sent a request to ``cluster``. A cluster
        the config does not route the model to is new here: publish now (:meth:`wake`)
        its weight 0, which that route then reads instead of its bootstrap weight."""
        if not routable and cluster not in self.stale.get(model, ()):
            self.stale.setdefault(model, set()).add(cluster)
            self.wake()
        elif routable:
            self.served.setdefault(model, set()).add(cluster)

    def _zero_stale(self, weights: dict[SliceKey, SliceWeights]) -> dict[SliceKey, SliceWeights]:
        """``weights`` with weight 0 for every stale cluster of the slice's model -- only
        where a cluster Envoy is known to route (it served one) keeps a positive weight:
        Envoy answers 404 to a route whose clusters it knows all weigh 0, and one it
        does not know (a new candidate) takes nothing from its route."""
        for s, sw in weights.items():
            stale, served = self.stale.get(s.model), self.served.get(s.model, ())
            if not stale or not any(w > 0 and c in served for c, w in sw.weights):
                continue
            extra = tuple((c, 0) for c in sorted(stale) if c not in dict(sw.weights))
            if extra:
                weights[s] = replace(sw, weights=sw.weights + extra)
        return weights

    def probes_of(self, slice: SliceKey) -> tuple[str, ...]:
        """The clusters that hold only the probe share of ``slice``'s published weights."""
        sw = self.layer.weights.get(slice)
        return sw.probes if sw is not None else ()

    def on_logged(self, slice: SliceKey, cluster: str, duration_s: float | None) -> bool:
        """A logged request of ``slice`` served by ``cluster``: count its load.

        Returns whether its observation is a probe (the cluster held only the
        probe share of the slice's weights when it was published).
        """
        self.counters["logged"] += 1
        if duration_s is not None:
            self.load.add(slice, cluster, duration_s)
        probe = cluster in self.probes_of(slice)
        if probe:
            self.counters["probes"] += 1
        return probe

    # ------------------------------------------------------------ publishing

    def publish(self, now: float, force: bool = False) -> bool:
        """Recompute the weights (every slice at a new evaluation window or when
        ``force``d, else the slices with traffic); push them if they changed materially."""
        return run_steps(self.publish_steps(now, force))

    async def publish_async(self, now: float, force: bool = False) -> bool:
        """:meth:`publish`, giving the event loop a turn every few slices: with a thousand
        slices one computation takes seconds (sidecar.core.steps). The weights are all
        computed at ``now`` and published at once at the end."""
        return await run_steps_async(self.publish_steps(now, force))

    def publish_steps(self, now: float, force: bool = False) -> Steps[bool]:
        """:meth:`publish` as steps."""
        self.load.roll(now)
        config = self.config
        window = int(now / config.stats.subwindow_s)
        full = force or window != self._window
        self._window = window
        router = self._router()
        old = self.layer.weights
        new = yield from refresh_weights_steps(config, WindowView(router, {}), now, old,
                                               self.load.demand, full, live=router.live,
                                               cold=cold_slices(config, self.load, now))
        if self.layer.weights is not old:  # published meanwhile: do not undo a newer one
            return False
        new = self._zero_stale(new)
        self.computed_at = now
        for s, sw in new.items():  # routes live misses kept out, per slice computed
            if sw.missing and sw is not old.get(s):
                for c in sw.missing:
                    router.counters[("live_missing", c)] += 1
        if not force and self.layer.version and not material_change(self.layer.weights, new):
            return False
        changed = self.layer.publish(new, now)
        if changed:
            log.debug("published runtime layer version %d", self.layer.version)
        return changed

    def wake(self) -> None:
        """A health transition happened outside a tick (e.g. a fast ejection while an
        access-log batch was read), or a failure put a route on trial (its weight
        floor, sidecar.core.weights): publish now instead of at the next interval."""
        if self._wake is not None:
            self._wake.set()

    async def loop(self, tick: Callable[[float], None], stop: asyncio.Event) -> None:
        """Publish at once, then every interval, and at once after a health
        transition (:meth:`wake`; transitions from ticks are seen after the tick).

        ``tick`` is the app's periodic work (health evaluation), run first so a
        publication always reflects the windows that just closed.
        """
        loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        await self.publish_async(loop.time(), force=True)
        transitions = self._transition_count()
        holds = self._router().pushback.holds_version
        while not stop.is_set():
            now = loop.time()
            step = self.config.routing.publish_interval_s
            wake = (int(now / step) + 1) * step
            nd = self._router().next_deadline()
            if nd is not None and now < nd < wake:
                wake = nd
            await _first_of(stop, self._wake, max(wake - now, 0.005))
            if stop.is_set():
                return
            now = loop.time()
            tick(now)
            count = self._transition_count()
            # A hold's start or end (a declared wait or a quota's backoff,
            # sidecar.core.pushback) moves a route's capacity as a transition moves its
            # health: every slice is redone.
            held = self._router().pushback.holds_version
            await self.publish_async(now, force=count != transitions or held != holds)
            transitions, holds = count, held
            self._wake.clear()  # this publication covers every transition so far

    def _transition_count(self) -> int:
        return sum(n for (k, _), n in self._router().counters.items() if k == "transition")

    # ------------------------------------------------------------ views

    def state(self, now: float) -> dict[str, Any]:
        """The ``native`` section of /state."""
        layer = self.layer
        return {
            "mode": self.config.routing.mode,
            "publish_interval_s": self.config.routing.publish_interval_s,
            "version": layer.version,
            "computed_at": self.computed_at,
            "published_at": layer.history[-1].at if layer.history else None,
            "weights": {s.label(): {"weights": dict(sw.weights), "probes": list(sw.probes),
                                    "panic": sw.panic, "missing": list(sw.missing)}
                        for s, sw in layer.weights.items()},
            "publications": [
                {"at": p.at, "version": p.version, "keys": p.keys,
                 "changed": {label: dict(w) for label, w in p.changed}}
                for p in list(layer.history)[-10:]
            ],
            "load": {c: round(n, 3) for c, n in self.load.last.items()},
            "envoys": self.rtds.state() if self.rtds is not None else [],
            "counters": dict(self.counters),
        }


async def _first_of(a: asyncio.Event, b: asyncio.Event, timeout: float) -> None:
    """Wait until ``a`` or ``b`` is set, at most ``timeout`` seconds."""
    waiters = [asyncio.ensure_future(a.wait()), asyncio.ensure_future(b.wait())]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()

