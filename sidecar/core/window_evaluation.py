"""Judging finished windows: every narrow route's summary through the health policy.

Called by the router at each sub-window boundary. Per narrow (cluster, slice)
series with a known class, the window summary of the class's SLO metric at its
percentile, as a verdict, goes to
:meth:`~sidecar.core.health_board.HealthBoard.judge`,
which may quarantine only if another route stays viable
(:func:`~sidecar.core.viability.others_viable`), or for a burst of failures
if another still serves (:func:`~sidecar.core.viability.others_serve`). A
window judged on its failures alone that escalates closes its series'
evaluation span (:mod:`sidecar.core.evaluation_span`), so those failures vote
once. A cluster whose circuit is open is judged as a whole instead: its
slices' windows hold the outage and the probes, and they start afresh on
restore. Cluster-wide entries that are not
healthy are then judged on their outcome counts in the sub-window just ended,
summed over every model the cluster serves.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from sidecar.core.config import Config, ModelConfig
from sidecar.core.health import HealthState
from sidecar.core.health_board import CLUSTER_SLICE, HealthBoard
from sidecar.core.health_signals import WindowVerdict, escalates_on_failures
from sidecar.core.stats import StatsStore
from sidecar.core.types import ANY, SliceKey, TransitionEvent
from sidecar.core.viability import others_serve, others_viable


def evaluate_windows(config: Config, stats: StatsStore, board: HealthBoard,
                     models_of: Mapping[str, tuple[ModelConfig, ...]],
                     now: float) -> list[TransitionEvent]:
    """Run every window verdict due at ``now`` (module docstring); the transitions."""
    events: list[TransitionEvent] = []
    open_clusters = {c for (c, s), h in board.items()
                     if s == CLUSTER_SLICE and h.circuit_open}  # fmt: skip
    for cluster, slice in stats.narrow_keys():
        klass = config.workload_class(slice.klass)
        if klass is None or cluster in open_clusters:
            continue
        summary = stats.window_summary(
            cluster, slice, klass.slo.metric, klass.slo.percentile / 100.0, now
        )
        v = WindowVerdict.of(summary, klass.slo, config.health)
        viable = others_viable(board, config, cluster, slice)
        events.extend(board.judge(
            cluster, slice, v, now, may_quarantine=viable,
            may_quarantine_failing=viable or others_serve(board, config, cluster, slice),
        ))
        if escalates_on_failures(v, config.health):
            stats.close_span(cluster, slice, now)
    k = math.floor(now / config.stats.subwindow_s) - 1
    for (cluster, slice), h in board.items():
        if slice == CLUSTER_SLICE and h.state is not HealthState.HEALTHY:
            req, fail = cluster_outcomes(stats, models_of, cluster, k, now)
            events.extend(board.evaluate_outcomes(cluster, slice, k, req, fail, now))
    return events


def cluster_outcomes(stats: StatsStore, models_of: Mapping[str, tuple[ModelConfig, ...]],
                     cluster: str, index: int, now: float) -> tuple[int, int]:
    """Requests and failures of every model on ``cluster`` in sub-window ``index``."""
    req = fail = 0
    for m in models_of.get(cluster, ()):
        rs = stats.series(cluster, SliceKey(m.name, ANY, ANY, None))
        if rs is not None:
            r, f = rs.outcomes_in(index, index, now)
            req, fail = req + r, fail + f
    return req, fail
