"""Per-slice route weights for native mode: the policy core's selection, once per window.

In native mode Envoy picks each request's cluster itself, from the slice's
``weighted_clusters`` route, with integer weights tailroute publishes once per
evaluation window (docs/native-mode.md). They come from the same selection
pipeline the per-request path runs (:mod:`sidecar.core.pipeline`), for a
representative request of the slice:

1. **Route candidates** (:func:`route_candidates`): the model's candidates that
   pass the hard filters (model served, region policy). Those depend on config
   only, so the rendered route lists exactly these clusters.
2. **Probes**: every candidate the per-request path would probe -- probing
   (cooldown over; the cluster-wide entry or the slice's), or restricted for a
   latency-sensitive class -- that has room (in flight below
   ``max_concurrency``) gets its probe share of the slice's traffic
   (:attr:`HealthView.probe_share`: ``health.probe_share``, shrunk by the
   route's relapse memory), as :meth:`Router._maybe_probe` sends it per
   request. Its responses count as probes (:attr:`SliceWeights.probes`).
3. **Selection** shares the rest, ``1 - probes``, by the picker's probabilities
   over the pipeline's survivors::

       weighted_random   p_i = w_i / sum_j w_j    (w = health x prod s^k, exploration floor)
       lowest_score      p_chosen = 1

   Quarantined routes never survive the quarantine filter (weight 0) -- unless
   every candidate is excluded, when panic mode serves the least-bad tier.
   Nor does a route missing the slice's budget now (live misses, from the native
   requests' log entries) while the others have room (the ``live_misses``
   filter's herding guard); it is back once its misses age out.
   **Trial floor** (:func:`~sidecar.core.weight_shares.trial_floor`): a
   surviving route whose open run of hard failures is on trial
   (:attr:`HealthView.on_trial`) gets at least ``TRIAL_SHARE`` (split evenly
   when several are), the others keep their
   proportions -- the weights' form of the per-request trial pace
   (:mod:`sidecar.core.health`): a route that went down is judged within a few
   of its own requests instead of whenever its scored share brings them. It
   lasts until the run is judged; the shell publishes at once when a failure
   puts a route on trial.
4. **Integers**: largest-remainder rounding to exactly ``scale`` (ties go to
   candidate order); a candidate with a positive share keeps at least 1
   (:func:`~sidecar.core.weight_shares.integer_weights`).

Invariants (tests/test_weights.py, hypothesis properties):

* the weights of a slice sum to ``scale`` > 0 -- never all zero: Envoy 1.40
  answers 404 (no route) when every weight of a ``weighted_clusters`` is 0;
* a quarantined route (circuit open, not probed) has weight 0 unless every
  candidate's circuit is open (quarantined or probing): then panic mode
  serves them all, as it does per request;
* a pure function of the view, the config and ``now``.

What a window cannot do: in-flight counts are the window's average
(:mod:`sidecar.core.window_load`), so the capacity filter, herding guard and
load score act on the last window's load, not on each request's; the queue
score (:mod:`sidecar.core.live_latency`), whose point is to act within one
request's duration, is left out.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from sidecar.core.config import Config
from sidecar.core.filters import DEFAULT_FILTERS
from sidecar.core.live_misses import LiveMisses
from sidecar.core.native_slices import (
    cold_slices,
    model_candidates,
    native_slices,
    representative,
    route_candidates,
)
from sidecar.core.pickers import PICKERS
from sidecar.core.pipeline import panic_tier, run_pipeline
from sidecar.core.scorers import DEFAULT_SCORERS
from sidecar.core.selection import RouteView, SelectionContext
from sidecar.core.steps import Steps, run_steps
from sidecar.core.types import SliceKey
from sidecar.core.weight_shares import TRIAL_SHARE, integer_weights, trial_floor
from sidecar.core.window_load import LoadedView

__all__ = ["TRIAL_SHARE", "WEIGHT_SCALE", "SliceWeights", "cold_slices", "compute_weights",
           "integer_weights", "native_slices", "refresh_weights", "representative",
           "route_candidates", "slice_weights", "trial_floor"]

WEIGHT_SCALE: Final = 10_000  # integer weights of one slice sum to this


@dataclass(frozen=True, slots=True)
class SliceWeights:
    """What Envoy is told for one slice: integer weights in route-candidate order."""

    slice: SliceKey
    weights: tuple[tuple[str, int], ...]
    probes: tuple[str, ...] = ()  # clusters whose share is the probe share
    panic: bool = False  # every candidate was excluded: least-bad tier served
    missing: tuple[str, ...] = ()  # clusters kept out by live misses (weight 0)

    def weight(self, cluster: str) -> int:
        return dict(self.weights).get(cluster, 0)

    @property
    def total(self) -> int:
        return sum(w for _, w in self.weights)


def _probe_shares(
    config: Config, view: RouteView, slice: SliceKey, candidates: Iterable[str]
) -> dict[str, float]:
    """Routes the per-request path would send probes to, with their probe shares
    (:attr:`HealthView.probe_share`, as the router's probes use them:
    :func:`sidecar.core.plan_cache.probes`)."""
    out = {}
    for c in candidates:
        share = view.health(c, slice).probe_share
        if share > 0 and view.inflight(c) < config.cluster(c).max_concurrency:
            out[c] = share
    return out


@dataclass(frozen=True, slots=True)
class _Split:
    """A slice's traffic split as fractions (before integer rounding)."""

    shares: dict[str, float]
    probes: tuple[str, ...]
    panic: bool
    missing: tuple[str, ...] = ()

    def rounded(self, slice: SliceKey, order: tuple[str, ...], scale: int) -> SliceWeights:
        """What Envoy is told: the shares as integer weights (step 4), in ``order``."""
        return SliceWeights(slice, integer_weights(self.shares, order, scale), self.probes,
                            self.panic, self.missing)


def _split(config: Config, view: RouteView, slice: SliceKey, now: float,
           order: tuple[str, ...], rng: random.Random | None = None,
           missing: frozenset[str] = frozenset(),
           recurrence: Mapping[str, float] | None = None) -> _Split:
    model = config.model(slice.model)
    klass = config.workload_class(slice.klass)
    if model is None or klass is None:
        raise KeyError(f"slice {slice.label()} names no configured model/class")
    probing = _probe_shares(config, view, slice, order)
    probes = tuple(probing)
    shares: dict[str, float] = dict.fromkeys(order, 0.0)
    for name, share in probing.items():
        shares[name] += share
    rest = max(1.0 - sum(probing.values()), 0.0)
    # The counts are a window's average and the weights hold for an interval: no queue
    # score (with it the suite's native total rose 135.6 -> 145.4 %, docs/native-mode.md).
    ctx = SelectionContext(config, model, klass, representative(config, slice), view, now,
                           live_counts=False, missing=missing, recurrence=recurrence)
    picker = PICKERS[config.picker]
    # The picker's draw is not used (only its probabilities): any RNG state gives the
    # same weights, so one generator serves a whole computation.
    result = run_pipeline(ctx, DEFAULT_FILTERS, DEFAULT_SCORERS, picker,
                          rng or random.Random(0))
    panic = False
    kept: tuple[str, ...] = ()
    if result is not None and rest > 0:
        panic = result.panic
        # In panic the served tier keeps its soft-filter verdicts (run_request).
        served = panic_tier(result.candidates) if panic else [
            cand for cand in result.candidates if cand.dropped is None]
        survivors = [cand for cand in served if cand.name in shares]
        if config.picker == "weighted_random":
            total = sum(cand.weight for cand in survivors)
            for cand in survivors:
                shares[cand.name] += rest * cand.weight / total
        elif result.chosen.name in shares:
            shares[result.chosen.name] += rest
        trial = [c for c in order if shares[c] > 0 and view.health(c, slice).on_trial]
        if trial:
            shares = trial_floor(shares, trial)
        if missing:
            kept = tuple(c.name for c in result.candidates
                         if c.dropped == "live_misses" and not shares.get(c.name))
    return _Split(shares, probes, panic, kept)


def slice_weights(
    config: Config, view: RouteView, slice: SliceKey, now: float,
    scale: int = WEIGHT_SCALE, candidates: tuple[str, ...] | None = None,
) -> SliceWeights:
    """One slice's published weights (module docstring, steps 2-4), load as the view says."""
    model = config.model(slice.model)
    if model is None:
        raise KeyError(f"slice {slice.label()} names no configured model")
    order = route_candidates(config, model) if candidates is None else candidates
    return _split(config, view, slice, now, order).rounded(slice, order, scale)


PLAN_ROUNDS: Final = 4
STEP_SLICES: Final = 8  # slices split between pause points (steps; a few ms of the loop)


def compute_weights(
    config: Config, view: RouteView, now: float,
    slices: Iterable[SliceKey] | None = None, scale: int = WEIGHT_SCALE,
    demand: Mapping[SliceKey, Mapping[str, float]] | None = None,
    live: LiveMisses | None = None,
) -> dict[SliceKey, SliceWeights]:
    """:func:`compute_weights_steps`, at once."""
    return run_steps(compute_weights_steps(config, view, now, slices, scale, demand, live))


def compute_weights_steps(
    config: Config, view: RouteView, now: float,
    slices: Iterable[SliceKey] | None = None, scale: int = WEIGHT_SCALE,
    demand: Mapping[SliceKey, Mapping[str, float]] | None = None,
    live: LiveMisses | None = None, cold: Collection[SliceKey] = frozenset(),
) -> Steps[dict[SliceKey, SliceWeights]]:
    """Weights of every slice (default: :func:`native_slices`) as of ``now``, as steps
    (:mod:`sidecar.core.steps`): a pause every :data:`STEP_SLICES` slices, since a
    slice's split costs up to a millisecond and a config may have a thousand slices.

    Without ``demand``, each slice is split with the view's in-flight counts.
    With ``demand`` -- each slice's average requests in flight per cluster over
    the last window (:attr:`~sidecar.core.window_load.WindowLoad.demand`) -- the
    weights also plan where that load lands, since one window's weights hold for
    the whole next window (a per-request router sees every request move the
    load; a window does not)::

        L0_c      = sum_s demand[s][c]                    what the last window saw
        split_r   = pipeline(in-flight_c = view_c + L_{r-1,c})   for every slice
        P_r,c     = sum_s D_s * split_r[s][c],  D_s = sum_c demand[s][c]
        L_r,c     = (L_{r-1,c} + P_r,c) / 2               damped, r = 1..PLAN_ROUNDS
        published = mean_r split_r      (a slice in ``cold`` without demand: its last)

    so the capacity filter, the herding guard and the load score see the load
    the new weights would bring, not the load the old weights brought. The view's
    own in-flight counts (per-request traffic in hybrid mode) are added as given.
    ``cold``: slices idle for a while (:func:`cold_slices`) add nothing to ``P``: split
    once, in the last round (a config of many unused slices cost PLAN_ROUNDS of each).

    ``live``: the router's live misses (:mod:`sidecar.core.live_misses`); a route
    missing a slice's budget now takes no share of it (the ``live_misses`` filter,
    herding guard included), listed in :attr:`SliceWeights.missing`; a route that
    keeps relapsing has its weight scaled by its repeat-offender factor (the
    ``recurrence`` score).
    """
    cands = model_candidates(config)
    todo = native_slices(config) if slices is None else tuple(slices)
    rng = random.Random(0)
    none: frozenset[str] = frozenset()
    missing = {s: live.missing_among(cands.get(s.model, ()), s, now) if live else none
               for s in todo}
    recur = {s: live.recurrence(cands.get(s.model, ()), s, now) if live else None
             for s in todo}
    if not demand:
        out = {}
        for i, s in enumerate(todo):
            if i and not i % STEP_SLICES:
                yield
            order = cands.get(s.model, ())
            out[s] = _split(config, view, s, now, order, rng, missing[s],
                            recur[s]).rounded(s, order, scale)
        return out
    load: dict[str, float] = defaultdict(float)
    for per_cluster in demand.values():
        for c, n in per_cluster.items():
            load[c] += n
    total = {s: sum(demand.get(s, {}).values()) for s in todo}
    acc: dict[SliceKey, dict[str, float]] = {s: defaultdict(float) for s in todo}
    kept: dict[SliceKey, set[str]] = {s: set() for s in todo}  # by live misses, any round
    last: dict[SliceKey, _Split] = {}
    rounds = {s: 1 if total[s] <= 0 and s in cold else PLAN_ROUNDS for s in todo}
    every_round = tuple(s for s in todo if rounds[s] > 1)
    for r in range(PLAN_ROUNDS):
        planned = LoadedView(view, dict(load))
        last = {}
        for i, s in enumerate(todo if r == PLAN_ROUNDS - 1 else every_round):
            if i and not i % STEP_SLICES:
                yield
            last[s] = _split(config, planned, s, now, cands.get(s.model, ()), rng, missing[s],
                             recur[s])
        predicted: dict[str, float] = defaultdict(float)
        for s, sp in last.items():
            kept[s].update(sp.missing)
            for c, share in sp.shares.items():
                acc[s][c] += share / rounds[s]
                predicted[c] += total[s] * share
        for c in set(load) | set(predicted):
            load[c] = (load[c] + predicted[c]) / 2.0
    # Published: the mean of the rounds. A route live misses kept out of some round
    # and that no round gave a share is listed as kept out.
    return {
        s: _Split(acc[s], last[s].probes, last[s].panic,
                  tuple(c for c in cands.get(s.model, ()) if c in kept[s] and not acc[s].get(c))
                  ).rounded(s, cands.get(s.model, ()), scale)
        for s in todo
    }


def refresh_weights(
    config: Config, view: RouteView, now: float, previous: Mapping[SliceKey, SliceWeights],
    demand: Mapping[SliceKey, Mapping[str, float]], full: bool, scale: int = WEIGHT_SCALE,
    live: LiveMisses | None = None, cold: Collection[SliceKey] = frozenset(),
) -> dict[SliceKey, SliceWeights]:
    """:func:`refresh_weights_steps`, at once."""
    return run_steps(refresh_weights_steps(config, view, now, previous, demand, full, scale,
                                           live, cold))


def refresh_weights_steps(
    config: Config, view: RouteView, now: float, previous: Mapping[SliceKey, SliceWeights],
    demand: Mapping[SliceKey, Mapping[str, float]], full: bool, scale: int = WEIGHT_SCALE,
    live: LiveMisses | None = None, cold: Collection[SliceKey] = frozenset(),
) -> Steps[dict[SliceKey, SliceWeights]]:
    """Recompute the slices that carried load in the last interval; all of them if ``full``.

    Between evaluation windows only load changes, and only slices with traffic
    are affected by where their own load lands; an idle slice keeps its weights
    until the next full refresh (at every window boundary and on any health
    transition). That bounds the work per interval by the active slices, not by
    models x classes x profiles x streams.
    """
    every = native_slices(config)
    if full or not previous:
        return (yield from compute_weights_steps(config, view, now, every, scale, demand, live,
                                                 cold))
    active = [s for s in every if s in demand or s not in previous]
    out = {s: previous[s] for s in every if s in previous}
    if active:
        out.update((yield from compute_weights_steps(config, view, now, active, scale, demand,
                                                     live, cold)))
    return out
