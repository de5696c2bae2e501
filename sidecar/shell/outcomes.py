"""What tailroute does with each access-log entry: outcomes and fail-open accounting.

Every entry Envoy logs lands here (:class:`OutcomeFeed` is the access-log sink):

==============================================  =========================================
entry                                           action
==============================================  =========================================
carries ``tailroute.rid`` of a pending request  the request's observation (App.on_record)
carries ``tailroute.rid``, answered by          nothing (admission answer or 400: not
tailroute itself (details ``tailroute_*``)      evidence about a route)
carries ``tailroute.rid`` of a request this     nothing: it was counted ``lost`` already
process gave up on (App.give_up)                (once); counted ``late``
carries ``tailroute.rid``, request not pending  observation from the entry's own metadata
(sidecar restarted, another worker decided it)  (route -> cluster, slice label), counted
                                                ``orphan``; in fleet mode its id is
                                                forwarded to the decider (entry_forward)
carries ``tailroute.rid``, logged upstream      counted ``misrouted`` (:func:`misrouted`),
cluster not the decided one, or logged on a     not evidence, pending or ``orphan`` alike
route for undecided requests
no tailroute metadata, POST to an LLM API       Envoy served it without a decision: counted
path, an upstream cluster logged                ``fail_open`` (metric, /state, alert), and
                                                handed to ``resolve`` if one is set
no tailroute metadata, POST to an LLM API       Envoy answered it itself before routing (body
path, no upstream cluster                       over its buffer limit: 413; client gone
                                                mid-upload): counted ``unrouted``, not a
                                                fail-open (nothing was served undecided)
no tailroute metadata, anything else            counted ``not_routed`` (GET, health checks,
                                                a POST without a body)
==============================================  =========================================

``resolve`` is the hook for a reader that learns from requests nobody decided
(native mode, where Envoy routes by weights alone): it maps an entry to
``(cluster, slice)`` or None, and the entry is then observed like any other.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from sidecar.core.classify import api_for_path
from sidecar.core.envoy_log import TAILROUTE_DETAILS_PREFIX, LogRecord, observation_from_log
from sidecar.core.types import SliceKey
from sidecar.shell import envoy_contract as ec
from sidecar.shell.native_keys import ROUTE_PREFIX as SLICE_ROUTE_PREFIX

if TYPE_CHECKING:
    from sidecar.shell.app import App

log = logging.getLogger("tailroute")
Resolver = Callable[[LogRecord], tuple[str, SliceKey] | None]


def routed_otherwise(rec: LogRecord, decided: str) -> bool:
    """Did Envoy route a request decided for cluster ``decided`` otherwise: to another
    cluster, or down a route for undecided requests, which may well lead to ``decided``
    too (:data:`ec.DEFAULT_ROUTE` to the default cluster; in hybrid mode a slice route,
    by its weights)? Its bootstrap then has no route for the decision's key (not
    re-rendered for a new class or cluster, a hand-written one), and its timing is not
    evidence about the decided route (its class timeout and sampling did not apply),
    nor about the other."""
    if rec.upstream_cluster and rec.upstream_cluster != decided:
        return True
    name = rec.route_name
    return rec.route_key is not None and (name == ec.DEFAULT_ROUTE
                                          or name.startswith(SLICE_ROUTE_PREFIX))


def misrouted(envoy: Counter[str], rec: LogRecord, decided: str) -> bool:
    """:func:`routed_otherwise`, then counted ``misrouted`` and warned. Checked for every
    decided entry, whichever process decided it (App._observation, and the orphans
    here)."""
    if not routed_otherwise(rec, decided):
        return False
    envoy["misrouted"] += 1
    log.warning("Envoy routed a request decided for %s (%s) to %s on route %s: its "
                "bootstrap has no route for that decision; re-render it with `tailroute "
                "envoy-config`", decided, rec.route_key, rec.upstream_cluster or "?",
                rec.route_name or "?")
    return True


def is_llm_request(rec: LogRecord) -> bool:
    """A request tailroute would have decided (POST with a body to an OpenAI-style API
    path). Without a body Envoy never asks on the one-message path, and the rich path
    answers ``not_llm``: an empty POST is no fail-open, whoever sends it."""
    return rec.method == "POST" and rec.body_bytes != 0 and api_for_path(rec.path) != "other"


def _cluster_of(rec: LogRecord) -> str | None:
    if rec.route_key:
        return rec.route_key.rsplit("|", 2)[0]
    return rec.upstream_cluster or None


def _slice_of(label: str | None) -> SliceKey | None:
    if not label:
        return None
    try:
        return SliceKey.parse(label)
    except ValueError:
        return None


class OutcomeFeed:
    """The access-log sink: matches entries to decisions and counts Envoy's own."""

    def __init__(self, app: App, resolve: Resolver | None = None) -> None:
        self.app = app
        self.resolve = resolve

    def __call__(self, rec: LogRecord, now: float) -> None:
        self.on_record(rec, now)

    def on_record(self, rec: LogRecord, now: float) -> None:
        app = self.app
        env = app.envoy
        app.note_entry(rec)
        app.last_entry = now
        if rec.rid is None:
            if not is_llm_request(rec):
                env["not_routed"] += 1
            elif rec.upstream_cluster:
                env["fail_open"] += 1
            else:
                # Envoy answered it before any route was taken (a body over its buffer
                # limit: 413; a client gone mid-upload): nobody served it undecided.
                env["unrouted"] += 1
            if self.resolve is not None:
                where = self.resolve(rec)
                if where is not None:
                    self._observe(rec, where[0], where[1], now)
            return
        env["decided"] += 1
        p = app.pending.get(rec.rid)
        if p is not None:
            app.on_record(p, rec, now)
            return
        if rec.details.startswith(TAILROUTE_DETAILS_PREFIX):
            return
        if app.waiting.take_lost(rec.rid):
            env["late"] += 1
            return
        env["orphan"] += 1
        app.entry_elsewhere(rec.rid)
        cluster, slice = _cluster_of(rec), _slice_of(rec.slice_label)
        # Decided elsewhere, but routed as Envoy's own entry says: a request Envoy sent
        # to another cluster was observed as the decided cluster's, uncounted.
        if cluster is not None and not misrouted(env, rec, cluster) and slice is not None:
            self._observe(rec, cluster, slice, now)

    def _observe(self, rec: LogRecord, cluster: str, slice: SliceKey, now: float) -> None:
        app = self.app
        if not app.config.has_cluster(cluster):
            return
        obs = observation_from_log(rec, cluster, slice, bool(slice.streaming),
                                   ttft_offset_s=app.offsets.offset(cluster, slice),
                                   ttft_from_log=not app.offsets.blind(cluster, slice))
        if obs is not None:
            app.observe_attempts(rec, obs, now)
            app.observe(obs, now, api_for_path(rec.path))
