"""A simulated LLM provider: concurrency slots, a FIFO queue and lognormal service.

Model (per provider, all times in seconds):

* ``capacity`` slots serve requests; more requests wait in a FIFO queue of at
  most ``queue_limit`` (beyond that the provider answers 429 at once).
* Service starts when a slot frees. With ``busy`` requests already in service,
  contention slows the new one by ``slow = 1 + contention * busy / capacity``
  (batching shares the accelerator), fixed for the request's lifetime.
* ``TTFT = (ttft_median + prefill_per_1k * input/1000) * noise1 * slow * f_ttft``
  and ``TPOT = tpot_median * noise2 * slow * f_tpot``, with noise lognormal of
  median 1 and the spec's p99/median spread; ``e2e = TTFT + TPOT * (out - 1)``.
  TTFT as a client sees it also includes the time queued.
* With probability ``error_rate`` the answer is ``error_status`` after
  ``error_after``; with ``stall_rate`` no answer comes at all (the slot is held
  until the client gives up).
* Degradation events (``f_*``, error/stall rates, a slow-path share
  ``tail_rate`` with its own factors, outage, capacity) apply to
  requests *starting service* while the event is active and matching their
  slice; requests already in service keep what they started with. An outage
  answers ``error_status`` after ``error_after`` without taking a slot.
* A client may give up waiting for the first byte (``first_token_timeout_ms``:
  the first token of a stream, the whole body otherwise) or for the whole
  response (its own ``timeout_ms``, the route timeout, a workflow deadline).
* A request abandoned by its client frees its slot at once, unless
  ``keeps_working_on_cancel``: then the slot stays busy until the generation
  would have ended (wasted work, what makes retry storms self-sustaining).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from sidecar.sim.dists import TAIL_CAP, KeyedRows, Lognormal, Stream, Variates
from sidecar.sim.heavy import HeavyTailed, latency_value
from sidecar.sim.records import QUEUED, SERVING, Attempt
from sidecar.sim.scenario import ErrorSpec, EventSpec, ProviderSpec, merged_windows

Push = Callable[[float, Callable[[Any], None], Any], None]
#: One request's service variates (see :meth:`Provider.draw`).
Draws = list[float]
#: Active parts of a status mix: (rate now, spec).
Mix = tuple[tuple[float, ErrorSpec], ...]


#: What the active degradation events do to one request now: ``(ttft factor, tpot factor,
#: error rate (the provider's own share: the highest active one), stall rate, outage,
#: degraded (some event matched: the degraded-share metric), status mix parts after the
#: error rate, in order)``. A plain tuple: it is built per request.
Effects = tuple[float, float, float, float, bool, bool, Mix]


class Provider:
    """State of one provider during one run. ``push`` schedules engine events."""

    def __init__(
        self,
        spec: ProviderSpec,
        events: list[EventSpec],
        rng: Variates,
        push: Push,
        on_end: Callable[[Attempt], None],
        keyed: str | None = None,
        horizon: float = math.inf,
    ) -> None:
        """``keyed``: name prefix of the keyed service draws (:class:`KeyedRows`); without
        it (or for calls without a ``draw_key``) draws come from ``rng`` in sequence."""
        self.spec = spec
        self.name = spec.name
        self.events = events
        self.rng = rng
        self._push = push
        self._on_end = on_end
        self.busy = 0
        self.queued = 0
        self.queue: deque[Attempt] = deque()
        self.in_service: set[Attempt] = set()
        self.peak_inflight = 0
        self.cap_events = [e for e in events if e.capacity is not None]
        # Events that change how a request is served (a pure capacity change does not).
        self._deg_events = [e for e in events if e.degrades]
        # Their windows merged, to tell "no event active now" cheaply (most requests).
        self._quiet_lo, self._quiet_hi = merged_windows(self._deg_events, horizon)
        ttft, tpot = spec.ttft, spec.tpot
        self._ttft_med = ttft.median
        self._tpot_med = tpot.median
        # Plain lognormals are inlined on the hot path; heavy-tailed ones draw noise(z, u).
        self._ttft_heavy = ttft if isinstance(ttft, HeavyTailed) else None
        self._tpot_heavy = tpot if isinstance(tpot, HeavyTailed) else None
        self._ttft_sigma = ttft.sigma if isinstance(ttft, Lognormal) else 0.0
        self._tpot_sigma = tpot.sigma if isinstance(tpot, Lognormal) else 0.0
        self._ttft_cap = TAIL_CAP * ttft.p99 / ttft.median if ttft.median > 0 else 1.0
        self._tpot_cap = TAIL_CAP * tpot.p99 / tpot.median if tpot.median > 0 else 1.0
        self._alpha = spec.contention
        self._per_token_prefill = spec.prefill_per_1k / 1000.0
        self._base_mix: tuple[tuple[float, ErrorSpec], ...] = tuple(
            (e.rate, e) for e in spec.errors)
        afters = [e.after for e in spec.errors] + [x.after for e in events for x in e.errors]
        # Rows of 7 variates when a distribution needs a uniform to pick its part.
        self.wide = (self._ttft_heavy is not None or self._tpot_heavy is not None
                     or any(isinstance(a, HeavyTailed) for a in afters))
        self._row: Callable[[], list[float]] | None = None
        if isinstance(rng, Stream):
            self._row = rng.wide_row if self.wide else rng.row
        self._keyed = keyed
        # keyed draws per workload, one table per attempt number (retries have their own luck)
        self._tables: dict[str, list[KeyedRows]] = {}

    # ------------------------------------------------------------ state

    def capacity(self, now: float) -> int:
        cap = self.spec.capacity
        for e in self.cap_events:
            if e.active(now) and e.capacity is not None:
                cap = min(cap, e.capacity)
        return cap

    @property
    def inflight(self) -> int:
        return self.busy + self.queued

    def effects(self, att: Attempt, now: float, u_tail: float = 1.0) -> Effects:
        """What the active events do to ``att`` now (see :class:`Effects`).

        ``u_tail`` is the attempt's uniform draw for tail events (slow path when
        below an event's ``tail_rate``). An event at ramp level ``x`` applies a
        factor ``F`` as ``1 + x (F - 1)`` and a rate ``r`` as ``x r``.
        """
        s = self.spec
        lo = self._quiet_lo
        if lo is not None:
            i = bisect_right(lo, now) - 1
            if i < 0 or now >= self._quiet_hi[i]:  # between windows: nothing active
                return 1.0, 1.0, s.error_rate, s.stall_rate, False, False, self._base_mix
        f1 = f2 = 1.0
        err, stall, outage, degraded = s.error_rate, s.stall_rate, False, False
        mix = self._base_mix
        c = att.call
        for e in self._deg_events:
            lvl = e.level(now)
            if lvl <= 0.0:
                continue
            if e.match is not None and not e.match.matches(
                c.klass, c.model, c.stream, c.slice.profile, c.input_tokens, c.output_tokens
            ):
                continue
            degraded = True
            if lvl == 1.0:  # full strength (exactly the factors: no rounding)
                f1 *= e.ttft_factor
                f2 *= e.tpot_factor
                if u_tail < e.tail_rate:
                    f1 *= e.tail_ttft_factor
                    f2 *= e.tail_tpot_factor
            else:
                f1 *= 1.0 + lvl * (e.ttft_factor - 1.0)
                f2 *= 1.0 + lvl * (e.tpot_factor - 1.0)
                if u_tail < e.tail_rate * lvl:
                    f1 *= 1.0 + lvl * (e.tail_ttft_factor - 1.0)
                    f2 *= 1.0 + lvl * (e.tail_tpot_factor - 1.0)
            if e.error_rate is not None:
                err = max(err, e.error_rate * lvl)
            if e.stall_rate is not None:
                stall = max(stall, e.stall_rate * lvl)
            outage = outage or e.outage
            if e.errors:
                mix = mix + tuple((x.rate * lvl, x) for x in e.errors)
        return f1, f2, err, stall, outage, degraded, mix

    def error_for(self, u_err: float, err: float, mix: Mix, z: float, u: float
                  ) -> tuple[int, float, float | None] | None:
        """``(status, seconds until the answer, its declared Retry-After)`` if the draw
        ``u_err`` is an error: the provider's own share ``[0, err)`` first, then each
        part of the status mix in turn (its delay from the request's TTFT deviates
        ``z, u``, unused when it errors)."""
        if u_err < err:
            return self.spec.error_status, self.spec.error_after, None
        acc = err
        for rate, e in mix:
            acc += rate
            if u_err < acc:
                return e.status, latency_value(e.after, z, u), e.retry_after
        return None

    def service_times(self, att: Attempt, draws: Sequence[float], k1: float,
                      k2: float) -> tuple[float, float]:
        """``(TTFT, TPOT)`` of service for the attempt's draws and multipliers ``k``."""
        z1, z2 = draws[2], draws[3]
        h1, h2 = self._ttft_heavy, self._tpot_heavy
        n1 = min(math.exp(self._ttft_sigma * z1), self._ttft_cap) if h1 is None \
            else h1.noise(z1, draws[5])
        n2 = min(math.exp(self._tpot_sigma * z2), self._tpot_cap) if h2 is None \
            else h2.noise(z2, draws[6])
        ttft = (self._ttft_med + self._per_token_prefill * att.call.input_tokens) * n1 * k1
        return ttft, self._tpot_med * n2 * k2

    def draw_for(self, att: Attempt) -> list[float]:
        """The service variates of ``att`` on this provider: the keyed row of (its workload,
        its call's ``draw_key``, its attempt number) -- the same under every policy --
        or the next sequential row for calls without a key."""
        c = att.call
        if self._keyed is None or c.draw_key < 0:
            return self._row() if self._row is not None else self.draw()
        tabs = self._tables.get(c.wl.name)
        if tabs is None:
            tabs = self._tables[c.wl.name] = []
        n = att.n
        while len(tabs) <= n:
            tabs.append(KeyedRows(f"{self._keyed}:{c.wl.name}:{len(tabs)}",
                                  7 if self.wide else 5))
        return tabs[n].row(c.draw_key)

    def draw(self) -> list[float]:
        """One request's service variates in sequence: ``[u_error, u_stall, z_ttft, z_tpot,
        u_tail]`` plus ``[u_ttft_part, u_tpot_part]`` when :attr:`wide`."""
        if self._row is not None:
            return self._row()
        r = self.rng
        out = [r.random(), r.random(), r.gauss(0.0, 1.0), r.gauss(0.0, 1.0), r.random()]
        if self.wide:
            out += [r.random(), r.random()]
        return out

    # ------------------------------------------------------------ requests

    def submit(self, att: Attempt, now: float) -> None:
        """An attempt arrives: serve, queue, or refuse it."""
        if self._deg_events:
            outage = self.effects(att, now)[4]
            if outage:
                self._refuse(att, now, self.spec.error_status, degraded=True)
                return
        if self.busy < (self.capacity(now) if self.cap_events else self.spec.capacity):
            self._start(att, now)
        elif self.queued >= self.spec.queue_limit:
            self._refuse(att, now, 429, degraded=False)
        else:
            att.state = QUEUED
            self.queue.append(att)
            self.queued += 1
            if self.busy + self.queued > self.peak_inflight:
                self.peak_inflight = self.busy + self.queued
            self._push(min(att.deadline, att.ttft_deadline), self._queue_timeout, att)

    def _refuse(self, att: Attempt, now: float, status: int, degraded: bool) -> None:
        att.state = SERVING  # answered without a slot; the end event finishes it
        att.degraded = degraded
        end = now + self.spec.error_after
        if end >= att.deadline or end > att.ttft_deadline:
            _cut_at_first_token_deadline(att, None)
            att.end_at = att.deadline
            self._push(att.deadline, self._on_end, att)
            return
        att.outcome, att.status, att.end_at = "error", status, end
        self._push(end, self._on_end, att)

    def _start(self, att: Attempt, now: float) -> None:
        cap = self.spec.capacity
        slow = 1.0 + self._alpha * self.busy / cap
        self.busy += 1
        if self.busy + self.queued > self.peak_inflight:
            self.peak_inflight = self.busy + self.queued
        self.in_service.add(att)
        att.state = SERVING
        d = att.draws
        if d is None:
            d = self.draw_for(att)
        u_err, z1 = d[0], d[2]
        mix: Mix = self._base_mix
        if self._deg_events:
            f1, f2, err, stall, outage, att.degraded, mix = self.effects(att, now, d[4])
        else:
            f1 = f2 = 1.0
            err, stall, outage = self.spec.error_rate, self.spec.stall_rate, False
        deadline, fdl = att.deadline, att.ttft_deadline
        first_byte: float | None = None
        failed = (self.spec.error_status, self.spec.error_after, None) if outage else (
            self.error_for(u_err, err, mix, z1, d[5] if self.wide else 0.5)
            if u_err < err or mix else None)
        if failed is not None:
            end = now + failed[1] * slow
            if end < deadline and end <= fdl:
                att.outcome, att.status, att.retry_after = "error", failed[0], failed[2]
                att.end_at = end
                self._push(end, self._on_end, att)
                return
            natural = end
        elif d[1] < stall:
            natural = math.inf
        else:
            # inlined service_times() (hot path)
            c = att.call
            h = self._ttft_heavy
            if h is None:
                n1 = math.exp(self._ttft_sigma * z1)
                if n1 > self._ttft_cap:
                    n1 = self._ttft_cap
            else:
                n1 = h.noise(z1, d[5])
            h = self._tpot_heavy
            if h is None:
                n2 = math.exp(self._tpot_sigma * d[3])
                if n2 > self._tpot_cap:
                    n2 = self._tpot_cap
            else:
                n2 = h.noise(d[3], d[6])
            first = now + (self._ttft_med + self._per_token_prefill * c.input_tokens) \
                * n1 * slow * f1
            tpot = self._tpot_med * n2 * slow * f2
            out = c.output_tokens
            end = first + tpot * (out - 1)
            att.tpot_s = tpot if out > 1 else None
            first_byte = first if c.stream else end
            if end <= deadline and first_byte <= fdl:
                att.outcome, att.status = "ok", 200
                att.first_token_at, att.end_at, att.tokens_done = first, end, out
                self._push(end, self._on_end, att)
                return
            natural = end
            _cut_at_first_token_deadline(att, first_byte)
            deadline = att.deadline
            if first < deadline:
                att.first_token_at = first
                att.tokens_done = min(out, 1 + int((deadline - first) / tpot)) if tpot > 0 else 1
        if first_byte is None:
            _cut_at_first_token_deadline(att, None)
            deadline = att.deadline
        # The attempt does not finish before its deadline: it ends there.
        att.end_at = deadline
        if self.spec.keeps_working_on_cancel and math.isfinite(natural):
            att.slot_until = natural
        self._push(deadline, self._on_end, att)

    def _queue_timeout(self, att: Attempt) -> None:
        if att.state != QUEUED:
            return
        att.state = SERVING  # left the queue; _on_end marks it done
        self.queued -= 1
        _cut_at_first_token_deadline(att, None)
        att.end_at = att.deadline
        self._on_end(att)

    # ------------------------------------------------------------ slots

    def finish(self, att: Attempt, now: float) -> None:
        """Called by the engine when ``att`` ends; frees (or keeps) its slot."""
        if att in self.in_service:
            if att.slot_until is not None and att.slot_until > now:
                self._push(att.slot_until, self._release_later, att)
                return
            self.in_service.discard(att)
            self.busy -= 1
            if self.queued or self.cap_events:
                self.pump(now)

    def _release_later(self, att: Attempt) -> None:
        self.in_service.discard(att)
        self.busy -= 1
        self.pump(att.slot_until or 0.0)

    def pump(self, now: float) -> None:
        """Start queued requests while slots are free (also on capacity increases)."""
        q = self.queue
        cap = self.capacity(now) if self.cap_events else self.spec.capacity
        while q and self.busy < cap:
            att = q.popleft()
            if att.state != QUEUED:
                continue  # timed out while queued (lazy removal)
            self.queued -= 1
            self._start(att, now)

    def release_times(self, now: float) -> list[float]:
        """When each busy slot frees, ascending (the oracle's queue-wait estimate)."""
        out = []
        for a in self.in_service:
            t = a.slot_until if a.slot_until is not None else (a.end_at or now)
            out.append(max(t, now))
        out.sort()
        return out


def _cut_at_first_token_deadline(att: Attempt, first_byte: float | None) -> None:
    """The first-byte deadline passes before the first byte: the attempt ends then, the
    client's giving up or the route's idle timeout (``ttft_kind``)."""
    fdl = att.ttft_deadline
    if fdl < att.deadline and (first_byte is None or first_byte > fdl):
        att.deadline, att.deadline_kind = fdl, att.ttft_kind
