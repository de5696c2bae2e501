"""Runs of hard failures: the fast path of a route's health.

:class:`FailureRun` is a mixin of :class:`~sidecar.core.health.RouteHealth`: it
counts, and the state machine applies what it finds (FAST_FAIL or PARTIAL_FAIL,
:meth:`~sidecar.core.health.RouteHealth.eject`).

**Hard failures** (:meth:`FailureRun.note_outcome`): every
non-probe outcome updates a run of consecutive hard failures (5xx, connect
failures, resets, timeouts; 429 and successes end the run) and a slow EWMA of
the failure rate ``f`` (over ~100 requests). A run of::

    K = max(eject_consecutive, ceil(ln(1e-4) / ln f))

ejects the route at once (FAST_FAIL): a route whose normal failure rate makes
such runs likely needs a longer one (the chance of a false ejection per request
stays below 1e-4). The router keeps one such run per cluster and one per slice.
A run that is likely by chance on a *partly* failing route is PARTIAL_FAIL
instead: the route is restricted, not ejected, so the herding guard keeps it in
service while the other routes lack headroom. The route's failure *episode*
begins when its first hard failure is *seen* and counts the hard failures since
then and the successes of requests *sent* since then (a request already in
flight when the route went down says nothing about it now -- on a real proxy its
answer may well be logged after the first failure). It ends once ``f`` has
decayed below ``EPISODE_END_RATE``. With ``e`` the episode's failure
share, ``n`` its outcomes and ``K`` the run::

    PARTIAL_FAIL  iff  the episode holds a success and n (1 - e) e**K >= 1 - confidence

(the expected number of such runs among ``n`` outcomes at failure share ``e``):
a route failing every request since its first failure (a hard outage) has no
success and is ejected within ``K`` requests as before; one failing 30 % of
them trips on runs that are expected in its ~50 requests.

**Trial limit.** While a run of ``s`` hard failures is open, the requests
sent to the route since the run began are its *trials*: ``K - s`` of them
failing ejects it. The route takes no new work (the router's per-request
``failure_run`` filter) while ``K - s`` trials are pending::

    held  iff  s > 0  and  #{trials unanswered, sent < H ago} >= K - s
    H = 2 x (fastest failure of the run, send to outcome) + RUN_TRIAL_GRACE_S

so a provider that went down receives exactly the ``K`` requests that eject it
(plus those already in flight when it failed), not ``K`` plus whatever the
traffic sends while they fail, and an ejection is never slowed by holding the
route back: each trial that fails frees a slot for the next. A trial that stays
unanswered beyond ``H`` (longer than the run's failures took) is not failing
like them, so a healthy route's lone failure costs it at most ``K - 1``
requests' worth of slots for ``H``. The *fastest* failure sets ``H``: a killed
provider's streams that were cut mid-answer fail late, its new requests at
once, and an answer lost or timed differently on a loaded proxy must not hold
the route back for long. A slice-confined cluster-wide run (another
slice answers) holds nothing.

**Trial failures are judged by the run, not the score.** On a route that has
failed every request sent since its first hard failure (its episode holds no
success), the open run's ``s`` failures are its :attr:`FailureRun.trial_failures`:
the router holds its errors (not its timeouts) out of the statistics until the run ends
(:mod:`sidecar.core.trial_hold`). Otherwise each failure of a dying route cut
its share (attainment is steep), the trials that complete the run came ever
slower, and the ejection took seconds instead of the ``K`` requests it needs;
the trial limit, not the score, bounds the failures a run costs.

**Trial pace.** Nor may chance starve such a run: while a route is on trial,
its run holds no timeout, and none of its trials is pending
(:meth:`FailureRun.trial_due`), the router sends it the next first-attempt
request it may serve (reason ``trial``; never a retry or an explained one), and
native weights give it at least :data:`~sidecar.core.weight_shares.TRIAL_SHARE` of
its slices. A dead route is then judged within ``K`` requests of its own, one
after another, instead of after ``K`` requests at whatever share the scores
left it -- at a 17 % share and 20 req/s that took over a second in 8 of 60
replayed runs. A route failing only some requests leaves trial at its first success,
so the pace costs it at most ``K - 1`` extra requests per failure episode. A
run with a timeout is not paced: each timeout already waited out the class
timeout, and on a loaded route it is the overload signal (paced, timeouts sent
the shipped ``overload`` and ``capacity_fallback`` scenarios' traffic back to
the saturated provider: 11.9 -> 13.9 % and 10.8 -> 11.9 % violations).
"""

from __future__ import annotations

import math
from typing import Final

from sidecar.core.config import HealthConfig

FALSE_EJECT_ODDS: Final = 1e-4  # accepted chance per request that a healthy route's run ejects it
FAIL_RATE_HORIZON: Final = 100  # requests the fast path's failure-rate EWMA averages over
# A failure episode ends once the failure-rate EWMA is back below this.
EPISODE_END_RATE: Final = 1e-3
# A trial unanswered this much longer than twice the run's fastest failure stops
# counting as pending (the trial limit above): it is not failing like the run.
RUN_TRIAL_GRACE_S: Final = 0.25
RUN_TRIALS_MAX: Final = 64  # send times kept per open run (K is small; bounded memory)
# A failure's send time (its outcome time minus its measured duration) matches a
# trial's recorded send time within this (the two clocks are the router's and the
# proxy's timing of the same request).
TRIAL_MATCH_S: Final = 0.02
# What :meth:`FailureRun._init_run` sets: one process's own count of its outcomes.
_RUN_FIELDS: Final = ("streak", "streak_since", "run_parts", "run_confined", "run_trials",
                      "run_fail_s", "run_timeouts", "fail_rate", "episode_since", "episode_ok",
                      "episode_fail")


class FailureRun:
    """The open run of hard failures, its trials and the failure episode of one route
    (module docstring); a mixin of :class:`~sidecar.core.health.RouteHealth`."""

    cfg: HealthConfig

    def _init_run(self, now: float) -> None:
        self.streak = 0  # consecutive hard failures (fast path)
        self.streak_since = now  # when the current run's first failed request was sent
        self.run_parts: set[str] = set()  # slices that failed in the run (cluster-wide entry)
        self.run_confined = False  # another slice answered during the run
        self.run_trials: list[float] = []  # send times of unanswered trials (trial limit)
        self.run_fail_s = 0.0  # fastest failure of the run, send to outcome
        self.run_timeouts = 0  # timeouts in the run: it is not paced (trial pace)
        self.fail_rate = 0.0  # EWMA of hard failures per request (fast path)
        self.episode_since: float | None = None  # when the episode's first failure was seen
        self.episode_ok = 0  # successes of requests sent since then
        self.episode_fail = 0  # hard failures since then

    def keep_run_of(self, other: FailureRun | None, now: float) -> None:
        """Continue ``other``'s run, trials, failure rate and episode here (or start
        afresh), not those loaded with this state: the fast path counts this process's
        own outcomes, and a state adopted from another replica carries that replica's
        (:func:`sidecar.core.fleet_share.adopt_route`). An open circuit ends the run,
        as :meth:`~sidecar.core.health.RouteHealth.eject` does."""
        self._init_run(now)
        if other is not None:
            for name in _RUN_FIELDS:
                setattr(self, name, getattr(other, name))
        if self.circuit_open:
            self.end_run()

    @property
    def circuit_open(self) -> bool:
        """Is the route's circuit open (the state machine says)? An open circuit's
        probes judge it: no run counts then."""
        raise NotImplementedError

    @property
    def trial_failures(self) -> int:
        """The open run's failures while every request sent since the episode began
        failed (module docstring, "Trial failures"); 0 otherwise."""
        return self.streak if self.streak and not self.episode_ok else 0

    def note_outcome(
        self, hard_failure: bool, now: float, sent_at: float | None = None,
        part: str | None = None, timeout: bool = False,
    ) -> bool:
        """Fast path: count one non-probe outcome; True when the run of hard failures
        reaches :meth:`eject_threshold` (the caller then decides on :meth:`eject`).

        A success ends a run only if its request was sent after the run began
        (``sent_at``, when known): a slow answer to a request sent before a
        provider went down says nothing about it now. A run begins when its first
        failed request was sent (a timeout's waited time tells), so successes of
        requests sent after a hung one do end it. For a cluster-wide entry
        ``part`` names the slice of each outcome: while all failures of the run
        come from one slice and another slice keeps answering (even with such
        older requests), the run may be slice-confined and does not trip here
        (the slice's own run does)."""
        if self.circuit_open:
            return False
        self.fail_rate += ((1.0 if hard_failure else 0.0) - self.fail_rate) / FAIL_RATE_HORIZON
        sent = now if sent_at is None else sent_at
        self._note_episode(hard_failure, now, sent)
        if not hard_failure:
            if self.streak and sent_at is not None and sent_at < self.streak_since:
                if part is not None and part not in self.run_parts:
                    self.run_confined = True
                return False
            self.end_run()
            return False
        if not self.streak:
            self.streak_since = sent
            self.run_trials.clear()
            self.run_fail_s = now - sent
            self.run_timeouts = 0
        else:
            self._answer_trial(sent)
            self.run_fail_s = min(self.run_fail_s, now - sent)
        self.streak += 1
        self.run_timeouts += timeout
        if part is not None:
            self.run_parts.add(part)
        return self.streak >= self.eject_threshold() and (
            not self.run_confined or len(self.run_parts) >= 2)

    def end_run(self) -> None:
        """Forget the open run of hard failures (a success ended it, or an ejection)."""
        if not (self.streak or self.run_trials or self.run_parts or self.run_confined):
            return  # nothing open: the common case, once per successful request
        self.streak = 0
        self.run_parts.clear()
        self.run_confined = False
        self.run_trials.clear()

    def note_sent(self, now: float) -> None:
        """A request was sent to the route; during an open run it is a trial."""
        if not self.streak:
            return
        trials = self.run_trials
        horizon = self._trial_horizon(now)
        if trials and (trials[0] <= horizon or len(trials) >= RUN_TRIALS_MAX):
            trials[:] = [t for t in trials if t > horizon][-(RUN_TRIALS_MAX - 1):]
        trials.append(now)

    def _trial_horizon(self, now: float) -> float:
        """Trials sent before this are no longer pending: ``now - H`` (module docstring)."""
        return now - (2.0 * self.run_fail_s + RUN_TRIAL_GRACE_S)

    def _answer_trial(self, sent: float) -> None:
        """A failure of a request sent at ``sent``: the trial nearest it (within the
        caller's clock skew) is answered; a failure sent since the run began that
        matches none (the proxy's timing of it drifted further, as on a loaded
        machine) answers the oldest, so an unmatched trial never holds the route
        back while its failure already counts in the run."""
        trials = self.run_trials
        if not trials:
            return
        i = min(range(len(trials)), key=lambda j: abs(trials[j] - sent))
        if abs(trials[i] - sent) <= TRIAL_MATCH_S:
            trials.pop(i)
        elif sent >= self.streak_since:
            trials.pop(0)

    def run_held(self, now: float) -> bool:
        """The trial limit (module docstring): no new work while ``K - s`` trials
        of the open run are pending."""
        if not self.streak or self.run_confined or self.circuit_open:
            return False
        need = self.eject_threshold() - self.streak
        if need <= 0:
            return False
        horizon = self._trial_horizon(now)
        pending = 0
        for t in self.run_trials:
            if t > horizon:
                pending += 1
        return pending >= need

    @property
    def paced(self) -> bool:
        """Trial pace (module docstring): the open run is on trial, holds no
        timeout, is not slice-confined, and the circuit is closed."""
        return bool(self.trial_failures) and not (
            self.run_timeouts or self.run_confined or self.circuit_open)

    def trial_due(self, now: float) -> bool:
        """The run is :attr:`paced` and none of its trials is pending: the next
        request should be one."""
        if not self.paced:
            return False
        horizon = self._trial_horizon(now)
        return not any(t > horizon for t in self.run_trials)

    def _note_episode(self, hard_failure: bool, now: float, sent: float) -> None:
        if hard_failure:
            if self.episode_since is None:
                self.episode_since = now
            self.episode_fail += 1
        elif self.episode_since is not None:
            if self.fail_rate < EPISODE_END_RATE:
                self._end_episode()
            elif sent >= self.episode_since:
                self.episode_ok += 1

    def _end_episode(self) -> None:
        self.episode_since, self.episode_ok, self.episode_fail = None, 0, 0

    def run_by_chance(self, run: int) -> bool:
        """Is a run of ``run`` hard failures expected on this route (module docstring)?"""
        ok, fail = self.episode_ok, self.episode_fail
        if ok <= 0 or fail <= 0:
            return False
        e = fail / (ok + fail)
        return (ok + fail) * (1.0 - e) * e ** run >= 1.0 - self.cfg.confidence

    def eject_threshold(self) -> int:
        """``K = max(eject_consecutive, ceil(ln(1e-4) / ln f))`` (module docstring)."""
        f = min(self.fail_rate, 0.99)
        floor = self.cfg.eject_consecutive
        if f <= 0.0:
            return floor
        return max(floor, math.ceil(math.log(FALSE_EJECT_ODDS) / math.log(f) - 1e-9))
