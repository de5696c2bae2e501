"""The asyncio side of fleet mode: push/pull every ``push_interval_s``, off the request path.

:class:`FleetLink` runs :class:`~sidecar.fleet.sync.FleetSync` against a store.
Every cycle is one store round trip bounded by ``fleet.timeout_ms``; the
router keeps deciding on its local state meanwhile (decisions never wait for
the store). When the store is down, slow or answers nonsense:

* one WARNING line when it goes away, one INFO line when it is back (with how
  long it was gone); a server that refuses the URL's credentials (or wants some
  and gets none), or whose ACL refuses the user a command or the keys, is one
  ERROR line saying so (:mod:`sidecar.fleet.store_errors`), with the password
  redacted; a new line only when the kind of failure changes while the store
  stays down; ``tailroute_fleet_store_up`` is 0 meanwhile and
  ``tailroute_fleet_syncs_total{result="error"}`` counts the failed cycles;
* every route is decided locally (:meth:`FleetSync.disconnected`), and the probe
  results the failed push forwarded count here; the peers' in-flight counts still
  count while as fresh as an answer's would have to be (``lease_ttl_s``);
* reconnect attempts back off exponentially (0.5 s doubling to 30 s, +-20 %
  jitter) so a fleet does not hammer a recovering server;
* on return the replica re-pushes its whole live window, re-takes or follows
  leases, and adopts the owners' states: the fleet converges within one cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import time
from collections.abc import Callable
from typing import Protocol

from redis.exceptions import RedisError

from sidecar.core.config import FleetConfig
from sidecar.core.store_url import redacted
from sidecar.core.types import TransitionEvent
from sidecar.fleet.exchange import Exchange, Reply
from sidecar.fleet.redis_store import RedisStore
from sidecar.fleet.store_errors import describe
from sidecar.fleet.sync import FleetSync
from sidecar.shell.app import App
from sidecar.shell.pausing import run_steps_async

log = logging.getLogger("tailroute.fleet")

BACKOFF_MIN_S, BACKOFF_MAX_S = 0.5, 30.0
# A host clock this far from the store's is wrong, not a round trip's uncertainty (the
# store's TIME is read somewhere within a round trip of at most fleet.timeout_ms).
SKEW_WARN_S = 1.0
# Skipped records are re-read every cycle: said at most this often, with how many.
SKIPPED_SAY_S = 60.0


class Store(Protocol):
    async def exchange(self, ex: Exchange, now_ms: float) -> Reply: ...

    async def close(self) -> None: ...


def replica_id() -> str:
    """Unique per process start (a restarted replica is a new one: no double counting)."""
    host = "".join(c if c.isalnum() or c in "-_." else "_" for c in socket.gethostname())
    return f"{host or 'host'}-{os.getpid()}-{random.getrandbits(24):06x}"


class FleetLink:
    def __init__(self, app: App, cfg: FleetConfig, store: Store | None = None,
                 rid: str | None = None, wall: Callable[[], float] = time.time) -> None:
        loop = asyncio.get_running_loop()
        self.app = app
        self.cfg = cfg
        self.rid = rid or replica_id()
        self.store: Store = store or RedisStore(cfg.url, cfg.key_prefix, cfg.timeout_ms / 1000)
        # Fixed for the process lifetime: sub-window names must not drift with NTP slew
        # (except at the first answer, for a host clock that is off: _clock).
        self._wall = wall
        offset = wall() - loop.time()
        self.sync = FleetSync(app.router, self.rid, cfg.stats_ttl_s, cfg.lease_ttl_s, offset)
        self.up: bool | None = None  # None until the first cycle
        # The inbox take (Exchange.take_gen / ack_gen): a reply lost to a timeout is
        # delivered again by the next cycle instead of lost with it.
        self._take_gen = 0
        self._acked: int | None = None
        self.syncs_ok = 0
        self.syncs_failed = 0
        self.last_cycle_s = 0.0
        self._down_since: float | None = None
        self._down_kind = ""  # the kind of failure last logged (store_errors.Problem.kind)
        self.last_problem = ""  # its log line (redacted), for /state
        self._failures = 0
        self._rng = random.Random()
        self.clock_skew_s: float | None = None  # the store's clock minus this host's
        self.on_store_clock = False  # the wall clock was taken from the store's (_clock)
        self._answered = False
        self._skew_logged = False
        self._bug_said = ""  # the unexpected error last logged with its traceback
        self._skips_said = (0, 0, 0)  # (unreadable, mismatched, foreign) when last said
        self._skips_next = 0.0  # monotonic time before which no new line is said

    @classmethod
    def create(cls, app: App) -> FleetLink | None:
        return None if app.config.fleet is None else cls(app, app.config.fleet)

    # ------------------------------------------------------------ one cycle

    async def cycle(self) -> None:
        """One push/pull; raises on any store failure (the caller counts it)."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        ex = self.sync.outgoing(t0)
        forwards = self.app.forwards.take()
        ex.entries = {p: [r.encode() for r in rids] for p, rids in forwards.items()}
        ex.entries_for = self.app.prefix
        ex.take_gen, ex.ack_gen = self._take_gen, self._acked
        w0 = self._wall()
        try:
            reply = await asyncio.wait_for(self.store.exchange(ex, w0 * 1000.0),
                                           self.cfg.timeout_ms / 1000.0)
        except BaseException:
            events = self.sync.disconnected(loop.time())
            self.app.forwards.put_back(forwards)
            self._record(events)  # probe results it forwarded, counted here instead
            raise
        # Processed below: the next cycle acknowledges this take and starts another.
        self._acked, self._take_gen = self._take_gen, self._take_gen + 1
        now = loop.time()
        self._clock(reply.server_ms, (w0 + self._wall()) / 2.0,
                    (t0 + now) / 2.0 + self.sync.wall_offset)
        # In steps: merging a whole window of every peer's (the first answer after the
        # store was away at start) must not stop the decisions meanwhile.
        self._record(await run_steps_async(self.sync.incoming_steps(reply, now)))
        self._say_skipped()
        self.app.check_holds()  # a peer's declared wait or quota backoff: native publishes now
        self.app.settled_elsewhere([r.decode(errors="replace") for r in reply.entries], now)
        self.last_cycle_s = now - t0

    def _clock(self, server_ms: float | None, wall: float, shared: float) -> None:
        """How far this host's clock (``wall``), and the clock this replica shares by
        (``shared``: fixed at start), are from the store's. Replicas place what they
        share (sub-windows, in-flight counts, limits, states) by the latter: one host off
        by minutes had its peers' evidence dropped as older than the window, and its own
        dropped by them. So at the store's first answer, before anything was placed, a
        sharing clock off by SKEW_WARN_S or more is replaced by the store's; either way
        it is said once, and the host's skew shown in /state. (A host clock stepped later
        moves ``wall`` only: what is shared stays placed right, and is not warned of.)"""
        if server_ms is None:  # a store without a clock (the policy lab's)
            return
        self.clock_skew_s = server_ms / 1000.0 - wall
        skew = server_ms / 1000.0 - shared
        first, self._answered = not self._answered, True
        if abs(skew) < SKEW_WARN_S:
            self._skew_logged = self._skew_logged and abs(skew) >= SKEW_WARN_S / 2
            return
        if first and self.sync.reanchor(self.sync.wall_offset + skew):
            self.on_store_clock = True
            log.warning("fleet: this host's clock is %.1f s %s the fleet store's; sharing "
                        "on the store's clock instead (fix the host's clock: NTP)",
                        abs(skew), "behind" if skew > 0 else "ahead of")
        elif not self._skew_logged:
            log.warning("fleet: the clock this replica shares by (this host's at its start) "
                        "is %.1f s %s the fleet store's; what it shares is misplaced by as "
                        "much (evidence older than the statistics window is dropped): fix "
                        "the host's clock (NTP) and restart",
                        abs(skew), "behind" if skew > 0 else "ahead of")
        self._skew_logged = True

    def _say_skipped(self) -> None:
        """Records the sync skipped (unreadable, peers not comparable, clusters this
        config lacks), said at most
        every SKIPPED_SAY_S with how many since the last line. Before, they were only
        counted in memory: a fleet could lose a peer's evidence with no sign."""
        c = self.sync.counters
        counts = (c.bad_peer_records, c.mismatched_peers, c.foreign_records)
        if counts == self._skips_said or time.monotonic() < self._skips_next:
            return
        bad, mismatched, foreign = (n - m for n, m in zip(counts, self._skips_said,
                                                          strict=True))
        if bad:
            log.warning("fleet: skipped %d unreadable record(s) in the store (last: %s); "
                        "the rest is shared", bad, c.last_bad)
        if mismatched:
            log.warning("fleet: not merging %d reading(s) of peers whose statistics do not "
                        "compare with this replica's (last: %s)", mismatched, c.last_mismatch)
        if foreign:
            log.warning("fleet: skipped %d record(s) of clusters this config lacks (last: "
                        "%s); replicas with another config share the fleet.key_prefix "
                        "(expected while a config change rolls out)", foreign, c.last_foreign)
        self._skips_said, self._skips_next = counts, time.monotonic() + SKIPPED_SAY_S

    def _record(self, events: list[TransitionEvent]) -> None:
        """Transitions adopted from the fleet, recorded as the router records its own
        (logged, and handed on: native mode publishes them at once, not at the next
        interval)."""
        router = self.app.router
        for e in events:
            router.transitions.append(e)
            router.counters[("transition", e.new)] += 1
        self.app.log_events(events)

    async def _attempt(self) -> bool:
        try:
            await self.cycle()
        except (RedisError, OSError, TimeoutError, ValueError) as exc:
            self._went_down(exc)
            return False
        except Exception as exc:  # a bug here must not stop the sidecar, nor the loop
            # With its traceback once per outage and kind of error: it recurs at every
            # retry (seven tracebacks in the first minute of backoff, then two a minute).
            said = f"{type(exc).__name__}: {exc}"[:200]
            if self.up is not False or said != self._bug_said:
                log.exception("fleet sync failed unexpectedly; continuing on local state")
            else:
                log.debug("fleet sync failed unexpectedly again (%s)", said)
            self._bug_said = said
            self._went_down(exc)
            return False
        self._came_up()
        return True

    def _went_down(self, exc: BaseException) -> None:
        self.syncs_failed += 1
        self._failures += 1
        problem = describe(exc, self.cfg.url, self.cfg.key_prefix)
        self.last_problem = problem.text
        if self.up is not False:
            self._down_since = time.monotonic()
        if self.up is not False or problem.kind != self._down_kind:
            # Once per outage, and again when its kind changes (back up, but now
            # refusing the credentials): the fix differs.
            log.log(problem.level, "%s; continuing on local state, retrying with backoff",
                    problem.text)
            if problem.kind != "unreachable":
                log.debug("fleet store: the server said %s", str(exc)[:200])
        self._down_kind = problem.kind
        self.up = False

    def _came_up(self) -> None:
        self.syncs_ok += 1
        if self.up is False and self._down_since is not None:
            log.info("fleet store %s back after %.1fs; state resynced", redacted(self.cfg.url),
                     time.monotonic() - self._down_since)
        elif self.up is None:
            log.info("fleet mode: replica %s sharing through %s (%d peers)", self.rid,
                     redacted(self.cfg.url), len([p for p in self.sync.peers if p != self.rid]))
        self.up, self._failures, self._down_since, self._down_kind = True, 0, None, ""

    def state(self, _now: float) -> dict[str, object]:
        """The ``fleet`` section of /state: what the metrics say, plus why it is down."""
        since = self._down_since if self.up is False else None
        return {
            "replica": self.rid,
            "store": redacted(self.cfg.url),
            "up": self.up,
            "down_for_s": None if since is None else round(time.monotonic() - since, 1),
            "problem": self.last_problem if self.up is False else None,
            "peers": [p for p in self.sync.peers if p != self.rid],
            "routes_owned": len(self.sync.owned),
            "routes_followed": self.sync.followed,
            "syncs": {"ok": self.syncs_ok, "error": self.syncs_failed},
            "clock_skew_s": None if self.clock_skew_s is None else round(self.clock_skew_s, 2),
            "on_store_clock": self.on_store_clock,
            "skipped": {"unreadable": self.sync.counters.bad_peer_records,
                        "last_unreadable": self.sync.counters.last_bad or None,
                        "mismatched": self.sync.counters.mismatched_peers,
                        "last_mismatched": self.sync.counters.last_mismatch or None,
                        "foreign": self.sync.counters.foreign_records,
                        "last_foreign": self.sync.counters.last_foreign or None},
        }

    # ------------------------------------------------------------ lifecycle

    async def warm_start(self) -> bool:
        """Before serving: two cycles (discover peers, then fetch their statistics
        and the owners' states), so the first request already routes on fleet
        evidence. False (logged once) if the store does not answer."""
        return await self._attempt() and await self._attempt()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            ok = self.up is True
            if ok:
                delay = self.cfg.push_interval_s
            else:
                delay = min(BACKOFF_MIN_S * 2 ** max(self._failures - 1, 0), BACKOFF_MAX_S)
                delay *= 1.0 + 0.2 * (2.0 * self._rng.random() - 1.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)
            if not stop.is_set():
                await self._attempt()

    async def close(self) -> None:
        """Final push (so peers have our last observations), then disconnect."""
        if self.up:
            await self._attempt()
        with contextlib.suppress(RedisError, OSError):
            await self.store.close()
