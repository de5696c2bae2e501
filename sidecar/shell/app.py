"""Shell-side state shared by all streams: the router, the RNG, the first-token
offsets and the requests between their decision and their access-log entry.

Lives on the asyncio loop thread; nothing here blocks.

A routed request's life, by event (each arrives on its own gRPC stream, in
any order between the last two)::

    decision (routing stream)  -> Pending registered, in-flight slot taken
    routing stream closed      -> slot released (Envoy closes it when the HTTP
                                  request is over); the entry has LOG_GRACE_S to come
    [sampled] first token      -> first-token time recorded (observing stream)
    access-log entry           -> Observation from the entry (+ first-token time),
                                  Pending removed

Invariants: a Pending releases its slot exactly once (``released``); it is
removed exactly once (:meth:`App.finalize` pops it); a Pending without its
entry after its deadline, or pushed out of the bounded book of finished requests
(:mod:`sidecar.shell.log_wait`), is counted ``lost`` exactly once — no outcome,
not evidence — and an entry that still comes for it is counted ``late``, not
observed. So every decided request ends as exactly one outcome or one ``lost``.
In fleet mode an entry may reach another process instead: that one observes it
(``orphan``) and forwards the id (:mod:`sidecar.shell.entry_forward`); here the
request then ends as ``elsewhere`` (:meth:`App.settled_elsewhere`), not ``lost``.
"""

from __future__ import annotations

import itertools
import logging
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from sidecar.core.classify import api_for_path
from sidecar.core.config import Config
from sidecar.core.envoy_log import (
    LogRecord,
    at_callers_deadline,
    observation_from_log,
    retried_attempts,
)
from sidecar.core.live_book import LiveEntry
from sidecar.core.live_misses import LiveMisses
from sidecar.core.router import Router
from sidecar.core.subwindow import OkSample
from sidecar.core.ttft_offset import OffsetBook
from sidecar.core.types import Api, Decision, Observation, SliceKey, TransitionEvent
from sidecar.shell import app_view
from sidecar.shell.declared_waits import DeclaredWaits
from sidecar.shell.entry_forward import EntryForwards
from sidecar.shell.explain_limit import ExplainBudget
from sidecar.shell.log_wait import LogWait
from sidecar.shell.outcomes import misrouted, routed_otherwise

log = logging.getLogger("tailroute")

# A request whose routing stream never closed (Envoy crashed mid-request) is swept after
# its timeout plus this.
_PENDING_GRACE_S = 60.0
# A stream without a caller's deadline has no whole-answer timeout (the class timeout
# bounds its silences only), so its routing stream may stay open as long as the answer
# streams: swept only after this (a longer stream is then counted lost).
UNCAPPED_STREAM_S = 3600.0
# After the request is over, how long its access-log entry may take to arrive.
LOG_GRACE_S = 30.0
# After the entry arrived, how long a sampled request's first-token timing may still come.
OBSERVER_GRACE_S = 1.0
# The access log is "silent" when a finished request has waited this long for its entry
# (at least three flush intervals: entries are sent once per envoy.access_log_flush_ms).
SILENT_AFTER_S = 5.0


@dataclass(slots=True)
class Pending:
    """One routed request between its decision and its access-log entry."""

    rid: str
    decision: Decision
    slice: SliceKey
    streaming: bool
    deadline: float
    is_retry: bool = False
    observed: bool = True  # recorded as an observation (stats.observe_share)
    sampled: bool = False  # also timed at the first content token (observing stream)
    released: bool = False  # in-flight slot given back
    token_offset: float | None = None  # sampled: first token - first body byte (s)
    tokenless: bool = False  # sampled: its event stream was read and carried no token
    observer_done: bool = False
    record: LogRecord | None = None  # entry held while the observer may still report
    api: Api = "chat"  # which API the request called (gen_ai.operation.name)
    sent_load: float | None = None  # the route's load when released (Router.started)
    live: LiveEntry | None = None  # its entry in the router's live books (observed only)


@dataclass(slots=True)
class App:
    """The sidecar's live state."""

    config: Config
    router: Router
    rng: random.Random = field(default_factory=random.Random)
    offsets: OffsetBook = field(default_factory=lambda: OffsetBook(0.05, 8))
    pending: dict[str, Pending] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)
    envoy: Counter[str] = field(default_factory=Counter)  # access-log view of Envoy
    # Sampled first-token timings by result: timed, no_token, encoded, not_sse.
    first_token_samples: Counter[str] = field(default_factory=Counter)
    # Entries of 2xx responses whose stream carried an error event (a provider that
    # failed mid-stream; their outcome is error), per upstream cluster, observed or not.
    stream_errors: Counter[str] = field(default_factory=Counter)
    # Upstream attempts Envoy retried (a route retry_policy), per cluster: attempts - 1
    # of each entry. The sidecar decided and observes the request once, by its last
    # attempt; these are the failed attempts before it.
    upstream_retries: Counter[str] = field(default_factory=Counter)
    # Waits providers declared with their 429s and 503s (Retry-After), per upstream cluster.
    retry_after: DeclaredWaits = field(default_factory=DeclaredWaits)
    explain_budget: ExplainBudget = field(default_factory=ExplainBudget)  # explain_limit
    waiting: LogWait = field(default_factory=LogWait)  # finished, entry not yet in
    # Every observation the router receives, and the successes of one route it learns at
    # once (Router.observe_ok: native mode), go to these hooks (sidecar.ops.genai_metrics).
    on_observation: Callable[[Observation, Api], None] | None = None
    on_ok_samples: Callable[[str, SliceKey, list[OkSample], list[Api]], None] | None = None
    # Called with every non-empty batch of health transitions, whichever path caused
    # them (native mode republishes its weights at once: an ejection is weight 0 now).
    on_transitions: Callable[[list[TransitionEvent]], None] | None = None
    # Called when a push-back hold started or ended (sidecar.core.pushback: a declared
    # wait, a quota's backoff) while a response was learned, whichever path learned it
    # (native mode republishes at once: a held route's weight is 0 now).
    on_holds: Callable[[], None] | None = None
    _holds_seen: int = 0  # the router's pushback.holds_version when last checked
    last_tick: float = 0.0  # the loop time of the last tick (for scrape-time gauges)
    last_entry: float | None = None  # when the last access-log entry arrived
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    _prefix: str = field(default_factory=lambda: f"{random.getrandbits(32):08x}")
    forwards: EntryForwards = field(init=False)

    def __post_init__(self) -> None:
        self.forwards = EntryForwards(self._prefix)

    @property
    def prefix(self) -> str:
        """This process's request-id prefix (ids are ``<prefix>-<n>``)."""
        return self._prefix

    @classmethod
    def create(cls, config: Config, seed: int | None = None) -> App:
        t = config.timing
        return cls(config, Router(config), random.Random(seed),
                   OffsetBook(t.token_sample_share, t.token_sample_min,
                              max_keys=config.stats.max_slices,
                              blind_share=t.role_first_share))

    def reload(self, config: Config) -> None:
        self.config = config
        self.router.reload(config)
        t = config.timing
        self.offsets.reconfigure(t.token_sample_share, t.token_sample_min, t.role_first_share)

    def shell_counters(self) -> dict[str, int]:
        """Shell-side counters for metrics (:func:`~sidecar.shell.app_view.shell_counters`)."""
        return app_view.shell_counters(self)

    def silent_after_s(self) -> float:
        return max(SILENT_AFTER_S, 3 * self.config.envoy.access_log_flush_ms / 1000.0)

    def access_log_status(self, now: float) -> str:
        """:func:`~sidecar.shell.app_view.access_log_status`."""
        return app_view.access_log_status(self, now)

    def envoy_view(self, now: float) -> dict[str, object]:
        """The access-log view of Envoy for /state (:func:`~sidecar.shell.app_view.envoy_view`)."""
        return app_view.envoy_view(self, now)

    def note_entry(self, rec: LogRecord) -> None:
        """Count one access-log entry every sink receives (before it is matched). A
        stream-error mark counts on the three LLM APIs only: another API's events may
        match the selectors (Anthropic's Messages API opens with a top-level
        ``message`` object) and are no evidence anyway (``not_llm``)."""
        self.envoy["entries"] += 1
        if rec.attempts > 1:
            self.upstream_retries[rec.upstream_cluster or "?"] += rec.attempts - 1
        if rec.stream_error and 200 <= rec.status < 300 and api_for_path(rec.path) != "other":
            self.stream_errors[rec.upstream_cluster or "?"] += 1
        if rec.retry_after_s is not None:
            self.retry_after.note(rec.upstream_cluster or "?", rec.retry_after_s)
        elif rec.retry_after_bad:
            self.errors["retry_after_unreadable"] += 1  # a 429 or 503 still, with no wait declared

    def new_rid(self) -> str:
        return f"{self._prefix}-{next(self._ids)}"

    def register(self, pending: Pending, now: float) -> None:
        self.pending[pending.rid] = pending
        cluster = pending.decision.cluster
        pending.sent_load = self.router.started(cluster, pending.decision.low)
        if pending.observed:  # only what resolves both ways (sidecar.core.live_misses)
            pending.live = self.router.live.sent(cluster, pending.slice, now, pending.sampled)

    def route_closed(self, rid: str, now: float) -> None:
        """The routing stream ended, which Envoy does when the HTTP request is over:
        the request no longer counts as in flight; its entry has LOG_GRACE_S to come."""
        p = self.pending.get(rid)
        if p is None:
            return
        self.release_pending(p)
        if p.live is not None:
            LiveMisses.closed(p.live, now)
        p.deadline = min(p.deadline, now + LOG_GRACE_S)
        for pushed_out in self.waiting.closed(rid, now):
            self.give_up(pushed_out, now)

    def on_record(self, p: Pending, rec: LogRecord, now: float) -> None:
        """The request's access-log entry arrived."""
        self.release_pending(p)  # normally done already at stream close
        self.waiting.done(p.rid)
        if p.sampled and not p.observer_done:
            p.record = rec  # the first-token timing may still be on its way
            p.deadline = min(p.deadline, now + OBSERVER_GRACE_S)
            return
        self.finalize(p, rec, now)

    def first_token_timed(self, rid: str, cluster: str, slice: SliceKey, offset: float | None,
                          now: float, tokenless: bool = False) -> None:
        """An observing stream is done: ``offset`` = first token - first body byte
        (None: no token seen; ``tokenless``: its events were read, none a token). The
        offset counts even when another process decided the request; the request
        itself, if pending here, gets its exact TTFT (or, tokenless, none)."""
        if offset is not None and self.config.has_cluster(cluster):
            self.offsets.add(cluster, slice, offset)
        p = self.pending.get(rid)
        if p is None or p.observer_done:
            return
        p.observer_done = True
        p.token_offset, p.tokenless = offset, tokenless
        if p.live is not None:
            if offset is None:
                LiveMisses.unwatch(p.live)  # no token read: its outcome will say
            else:
                LiveMisses.first_token(p.live, now)
        if p.record is not None:
            self.finalize(p, p.record, now)

    def finalize(self, p: Pending, rec: LogRecord, now: float) -> None:
        """Turn the entry (and a sampled first-token time) into an observation; once."""
        if self._close(p.rid) is None:
            return
        live, p.live = p.live, None
        obs = self._observation(p, rec, now)
        if live is not None:
            if obs is not None:
                self.router.live.observed(live, obs, now)
            elif routed_otherwise(rec, p.decision.cluster):
                LiveMisses.dropped(live)  # misrouted: about neither route
            else:
                self.router.live.unobserved(live, now)
        if obs is not None:
            self.observe_attempts(rec, obs, now)
            self.observe(obs, now, p.api)

    def _observation(self, p: Pending, rec: LogRecord, now: float) -> Observation | None:
        """The observation of ``p``'s entry; None when it is not evidence (misrouted,
        not observed, no outcome to read)."""
        cluster = p.decision.cluster
        if misrouted(self.envoy, rec, cluster):
            return None
        if not p.observed:
            if rec.retry_after_s is not None:  # a declared wait holds unobserved or not
                self.router.note_declared_wait(cluster, rec.retry_after_s, now)
                self.check_holds()
            return None
        first_token_s = None
        if p.token_offset is not None and rec.first_body_s is not None:
            first_token_s = rec.first_body_s + p.token_offset
        obs = observation_from_log(
            rec, cluster, p.slice, p.streaming,
            ttft_offset_s=self.offsets.offset(cluster, p.slice),
            first_token_s=first_token_s, tokenless=p.tokenless,
            ttft_from_log=not self.offsets.blind(cluster, p.slice),
            is_retry=p.is_retry or p.decision.is_retry, is_probe=p.decision.is_probe,
            sent_load=p.sent_load,
        )
        if obs is not None and p.decision.is_rescue:  # the decision's mark, not the entry's
            obs = replace(obs, is_rescue=True)
        klass = self.config.workload_class(p.slice.klass)
        if obs is None or klass is None:
            return obs
        return at_callers_deadline(rec, obs, p.decision.timeout_ms, klass.slo.timeout_ms)

    def observe(self, obs: Observation, now: float, api: Api) -> None:
        """Hand one finished measurement to the router and the observation hook."""
        self.log_events(self.router.observe(obs, now))
        self.check_holds()
        if self.on_observation is not None:
            self.on_observation(obs, api)

    def observe_attempts(self, rec: LogRecord, obs: Observation, now: float) -> None:
        """The attempts Envoy retried before the one ``obs`` measures, as the route's
        errors (``envoy_log.retried_attempts``); not client operations, so not
        handed to the observation hook."""
        for failed in retried_attempts(rec, obs):
            self.log_events(self.router.observe(failed, now))
        # (No check_holds here: every caller hands ``obs`` itself on next, and checks.)

    def check_holds(self) -> None:
        """Call ``on_holds`` if a push-back hold started or ended since the last check
        (call after anything that may start one)."""
        version = self.router.pushback.holds_version
        if version != self._holds_seen:
            self._holds_seen = version
            if self.on_holds is not None:
                self.on_holds()

    def release_pending(self, p: Pending) -> None:
        """Give the request's in-flight slot back once."""
        if not p.released:
            p.released = True
            self.router.finished(p.decision.cluster, p.decision.low)

    def _close(self, rid: str) -> Pending | None:
        """Stop holding ``rid`` as finished: removed, off the waiting book, its slot given
        back (once). None if it was not pending."""
        p = self.pending.pop(rid, None)
        if p is not None:
            self.waiting.done(rid)
            self.release_pending(p)
        return p

    def give_up(self, rid: str, now: float) -> None:
        """The request's entry is not coming (grace over, or pushed out of the bounded
        book): counted ``lost`` once, no observation; a late entry is not observed."""
        p = self.pending.pop(rid, None)
        if p is None:
            return
        self.release_pending(p)
        if p.live is not None:
            self.router.live.unobserved(p.live, now)
        self.waiting.lost(rid)
        self.envoy["lost"] += 1

    def entry_elsewhere(self, rid: str) -> None:
        """The entry of a request another process decided came here (``orphan``): in
        fleet mode, note its id for the decider (the fleet link forwards it)."""
        if self.config.fleet is not None:
            self.forwards.note(rid)

    def settled_elsewhere(self, rids: list[str], now: float) -> None:
        """Requests decided here whose entries another process received: stop waiting
        (``elsewhere``, not ``lost``; that process observed them). One given up on
        already was counted ``lost``; its forward then counts ``late``, as its entry would."""
        for rid in rids:
            p = self._close(rid)
            if p is not None:
                self.envoy["elsewhere"] += 1
                if p.live is not None:
                    self.router.live.unobserved(p.live, now)
            elif self.waiting.take_lost(rid):
                self.envoy["late"] += 1

    def tick(self, now: float) -> None:
        """Periodic work: health evaluation and sweeping requests whose entry never came."""
        self.last_tick = now
        self.log_events(self.router.tick(now))
        for p in [p for p in self.pending.values() if now > p.deadline]:
            self._settle(p, now)

    def settle_all(self, now: float) -> tuple[int, int]:
        """At shutdown, when nothing more can arrive: every pending request is settled
        as the sweep settles one past its deadline. Returns ``(observed, lost)``, so
        nothing leaves silently."""
        settled = [self._settle(p, now) for p in list(self.pending.values())]
        return settled.count(True), settled.count(False)

    def _settle(self, p: Pending, now: float) -> bool:
        """Stop waiting for ``p``: observed from its entry alone when the entry came (its
        first-token time never did; True), else counted lost (False)."""
        if p.record is not None:
            p.observer_done = True
            self.finalize(p, p.record, now)
            return True
        self.give_up(p.rid, now)
        return False

    def deadline_for(self, decision: Decision, stream: bool, now: float) -> float:
        if decision.timeout_ms is None and stream:
            return now + UNCAPPED_STREAM_S + _PENDING_GRACE_S
        timeout_s = (decision.timeout_ms or 300_000) / 1000.0
        return now + timeout_s + _PENDING_GRACE_S

    def log_events(self, events: list[TransitionEvent]) -> None:
        for e in events:
            log.info("health %s %s: %s -> %s (%s)", e.cluster, e.slice, e.old, e.new, e.reason)
        if events and self.on_transitions is not None:
            self.on_transitions(events)
