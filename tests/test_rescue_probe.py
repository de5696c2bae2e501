"""Probe instead of refuse (sidecar.core.rescue_probe): a request admission refuses for
want of room probes a cooling route, and the answer counts as probe evidence; marked as
a rescue from the decision to the health machine, it alone ends a cooldown early."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

from sidecar.core.config import HealthConfig, StatsConfig, parse_config
from sidecar.core.envoy_log import LogRecord
from sidecar.core.health import HealthState, RouteHealth
from sidecar.core.health_board import CLUSTER_SLICE
from sidecar.core.replayed_draw import ReplayedDraw
from sidecar.core.rescue_probe import counts_as_probe
from sidecar.core.router import Router
from sidecar.core.types import Decision, Observation, RequestInfo, SliceKey
from sidecar.shell.app import App
from sidecar.shell.extproc import RouteStream
from sidecar.shell.outcomes import OutcomeFeed
from sidecar.sim.engine import Simulation
from sidecar.sim.loader import parse_scenario
from tests.conftest import base_config_dict
from tests.streamharness import body_only_msg, chat_request, routed_cluster
from tests.test_sim_fixtures import tiny

SL = SliceKey("m", "batch", "short", True)
HIT, MISS = ReplayedDraw(0.0), ReplayedDraw(0.99)  # below / above probe_share 0.05


def router(**overrides: Any) -> Router:
    data = base_config_dict(stats={"min_samples": 5})
    for c in data["clusters"]:
        c["max_concurrency"] = 1
    data.update(overrides)
    return Router(parse_config(data, "t.yaml"))


def request(klass: str = "batch", **kw: Any) -> RequestInfo:
    k = parse_config(base_config_dict(), "t.yaml").workload_class(klass)
    assert k is not None
    base = RequestInfo(api="chat", model="m", stream=True, max_tokens=None, input_tokens=10,
                       klass=klass, priority=k.priority, tenant=None,
                       slice=SliceKey("m", klass, "short", True))
    return replace(base, **kw)


def eject_c(r: Router, now: float = 1.0) -> None:
    """Hard failures on c: its circuit opens (cooldown 15 s)."""
    for _ in range(r.config.health.eject_consecutive):
        r.observe(Observation("c", SL, "error", 503, e2e_s=0.005), now)
    assert r.health("c", SL).state == "quarantined"


def cooling(r: Router) -> RouteHealth:
    """c's quarantined entry (the hard failures open the cluster-wide circuit)."""
    h = r.board.peek("c", CLUSTER_SLICE)
    assert h is not None and h.state is HealthState.QUARANTINED
    return h


def slow(r: Router, *clusters: str) -> None:
    """Batch answers far over budget on ``clusters`` (routes over budget, with room)."""
    for c in clusters:
        for _ in range(10):
            r.observe(Observation(c, SL, "ok", 200, ttft_s=20.0, e2e_s=80.0), 1.0)


# (setup, request, draw) -> (admission, cluster, probe, detail prefix)
CASES: list[tuple[str, str, dict[str, Any], random.Random, tuple[str, str | None, bool, str]]] = [
    # a and b full, c cooling: the refusal probes c instead
    ("full", "batch", {}, HIT, ("admit", "c", True, "rescue")),
    ("full", "interactive", {}, HIT, ("admit", "c", True, "rescue")),  # row 13 (full)
    # the draw above probe_share: refused as before
    ("full", "batch", {}, MISS, ("defer", None, False, "overload")),
    # a probe to c already in flight: one at a time
    ("full+c_busy", "batch", {}, HIT, ("defer", None, False, "overload")),
    # nothing cooling: refused
    ("full_no_cooling", "batch", {}, HIT, ("defer", None, False, "overload")),
    # other reasons than room: never a probe
    ("full", "batch", {"step": "optional"}, HIT, ("skip", None, False, "overload_optional")),
    ("full", "batch", {"deadline_ms": 0}, HIT, ("reject", None, False, "deadline_exhausted")),
    # routes with room but over budget: refused for the budget, not for room
    ("slow", "batch", {}, HIT, ("defer", None, False, "overload")),
]


@pytest.mark.parametrize(("setup", "klass", "kw", "draw", "want"), CASES)
def test_a_refusal_for_want_of_room_probes_a_cooling_route(
    setup: str, klass: str, kw: dict[str, Any], draw: random.Random,
    want: tuple[str, str | None, bool, str],
) -> None:
    r = router()
    if setup != "full_no_cooling":
        eject_c(r)
    if setup == "slow":
        slow(r, "a", "b")
    else:
        r.started("a")
        r.started("b")
    if setup == "full_no_cooling":
        r.started("c")
    if setup == "full+c_busy":
        r.started("c")
    d = r.decide(request(klass, **kw), 2.0, draw)
    admission, cluster, probe, detail = want
    assert d.admission == admission
    assert d.is_probe is probe
    assert d.detail.startswith(detail), d.detail
    if cluster is not None:
        assert (d.cluster, d.reason, d.status) == (cluster, "probe", None)
        assert r.counters[("admission_reason", "rescue")] == 1


def test_an_ok_rescue_ends_the_cooldown_and_starts_the_restore_ladder() -> None:
    """The lab case in small: c is back during its cooldown; the refused requests'
    probes find it, and five ok probes restore it long before the cooldown's end."""
    r = router()
    eject_c(r)
    h = cooling(r)
    cooldown_until = h.cooldown_until
    assert cooldown_until is not None and cooldown_until > 5.0
    r.started("a")
    r.started("b")
    for i in range(r.config.health.probe_successes):
        now = 2.0 + i
        d = r.decide(request(), now, HIT)
        assert (d.cluster, d.is_probe) == ("c", True), d.detail
        assert d.is_rescue is (i == 0)  # then c is probing: its own probe share
        r.started("c")
        r.finished("c")
        r.observe(Observation("c", SL, "ok", 200, ttft_s=0.1, e2e_s=0.2, is_probe=True,
                              is_rescue=d.is_rescue), now)
        if i == 0:
            assert r.health("c", SL).state == "probing"
    assert r.health("c", SL).state == "restoring"
    assert 2.0 + r.config.health.probe_successes < cooldown_until


def test_a_failed_rescue_leaves_the_cooldown_alone() -> None:
    r = router()
    eject_c(r)
    h = cooling(r)
    before = (h.state, h.cooldown_until, h.offences)
    r.started("a")
    r.started("b")
    d = r.decide(request(), 2.0, HIT)
    assert (d.cluster, d.is_probe, d.is_rescue) == ("c", True, True)
    r.observe(Observation("c", SL, "error", 503, e2e_s=0.005, is_probe=True, is_rescue=True),
              2.0)
    assert (h.state, h.cooldown_until, h.offences) == before


@pytest.mark.parametrize(("ok", "rescue", "state", "successes", "cooldown_kept"), [
    (True, True, HealthState.PROBING, 1, False),  # cooldown over, first of probe_successes
    (False, True, HealthState.QUARANTINED, 0, True),  # nothing: not a longer cooldown
    # Not a rescue: no answer of such a probe ends the cooldown (before, an ok one did).
    (True, False, HealthState.QUARANTINED, 0, True),
    (False, False, HealthState.QUARANTINED, 0, True),
])
def test_a_probe_answer_while_quarantined(
    ok: bool, rescue: bool, state: HealthState, successes: int, cooldown_kept: bool,
) -> None:
    h = RouteHealth("c", SL, HealthConfig(), StatsConfig(), 0.0)
    h.eject(0.0)
    assert h.state is HealthState.QUARANTINED and h.offences == 1
    until = h.cooldown_until
    h.record_probe(ok, 1.0, rescue)
    assert h.state is state and h.offences == 1
    assert h.votes.get(HealthState.RESTORING, 0) == successes
    assert (h.cooldown_until == until) is cooldown_kept


@pytest.mark.parametrize(("state", "rescue_sent", "counts"), [
    (HealthState.PROBING, 0.0, True),
    (HealthState.PROBING, None, True),  # any probe
    (HealthState.RESTRICTED, 0.0, True),
    (HealthState.RESTRICTED, None, True),
    (HealthState.QUARANTINED, 10.0, True),  # a rescue sent since the circuit opened at 10
    (HealthState.QUARANTINED, 9.9, False),  # a straggler from before
    (HealthState.QUARANTINED, None, False),  # not a rescue
    (HealthState.HEALTHY, 20.0, False),
    (HealthState.RESTORING, 20.0, False),
])
def test_which_probe_answers_count(
    state: HealthState, rescue_sent: float | None, counts: bool,
) -> None:
    h = RouteHealth("c", SL, HealthConfig(), StatsConfig(), 0.0)
    h.state, h.since = state, 10.0
    assert counts_as_probe(h, rescue_sent) is counts


def slice_quarantined_under_a_probing_cluster(r: Router) -> RouteHealth:
    """c's cluster-wide entry probing (its cooldown over), c's entry for SL quarantined
    since 16 s: the cluster entry's probes reach SL while SL's circuit is open."""
    r.board.eject("c", CLUSTER_SLICE, 0.0)
    r.board.tick(15.5)
    r.board.eject("c", SL, 16.0)
    hc, h = r.board.peek("c", CLUSTER_SLICE), r.board.peek("c", SL)
    assert hc is not None and hc.state is HealthState.PROBING
    assert h is not None and h.state is HealthState.QUARANTINED and h.since == 16.0
    return h


@pytest.mark.parametrize(("rescue", "state"), [
    (False, "quarantined"),  # before: probing (any probe sent since ended the cooldown)
    (True, "probing"),
])
def test_only_a_rescues_ok_answer_ends_a_quarantine_early(rescue: bool, state: str) -> None:
    """An ok answer within the slice's budget, sent at 16.5 s, after SL's circuit opened:
    a plain probe (the probing cluster entry's) counts for that entry alone; a rescue
    also ends SL's cooldown."""
    r = router()
    h = slice_quarantined_under_a_probing_cluster(r)
    until = h.cooldown_until
    r.observe(Observation("c", SL, "ok", 200, ttft_s=0.1, e2e_s=0.5, is_probe=True,
                          is_rescue=rescue), 17.0)
    assert h.state.value == state
    assert (h.cooldown_until == until) is not rescue
    hc = r.board.peek("c", CLUSTER_SLICE)
    assert hc is not None and hc.votes == {HealthState.RESTORING: 1}  # counted there either way


def test_the_probing_cluster_entrys_probe_leaves_the_slices_cooldown() -> None:
    """The documented gap, end to end: the cluster entry's probe share sends SL's request
    to c (a and b have room: no refusal, so no rescue); its ok answer is that entry's
    probe and leaves SL's cooldown running."""
    r = router()
    h = slice_quarantined_under_a_probing_cluster(r)
    until = h.cooldown_until
    d = r.decide(request(), 17.0, HIT)
    assert (d.admission, d.cluster, d.is_probe, d.is_rescue) == ("admit", "c", True, False)
    r.observe(Observation("c", SL, "ok", 200, ttft_s=0.1, e2e_s=0.5, is_probe=d.is_probe,
                          is_rescue=d.is_rescue), 17.5)
    assert h.state is HealthState.QUARANTINED and h.cooldown_until == until


def test_the_shell_carries_the_rescue_mark_to_the_observation() -> None:
    """Decision -> the pending request -> its access-log entry's Observation -> health."""
    data = base_config_dict(stats={"min_samples": 5}, timing={"token_sample_share": 0.0,
                                                             "token_sample_min": 0})
    for c in data["clusters"]:
        c["max_concurrency"] = 1
    app = App.create(parse_config(data, "t.yaml"), seed=1)
    app.rng = HIT
    eject_c(app.router)
    app.router.started("a")
    app.router.started("b")
    seen: list[Observation] = []
    app.on_observation = lambda obs, api: seen.append(obs)
    s = RouteStream(app)
    resp = s.on_message(body_only_msg(chat_request(), {"x-tailroute-class": "batch"}), 2.0)
    assert routed_cluster(resp) == "c"  # type: ignore[arg-type]
    assert app.pending[s.rid].decision.is_rescue
    s.close(2.3, cancelled=False)
    OutcomeFeed(app)(LogRecord(status=200, flags=frozenset(), details="via_upstream",
                               method="POST", path="/v1/chat/completions", duration_s=0.3,
                               upstream_tx_s=0.01, first_body_s=0.1, end_s=0.3, tokens=5,
                               rid=s.rid), 2.4)
    assert [(o.cluster, o.is_probe, o.is_rescue) for o in seen] == [("c", True, True)]
    assert app.router.health("c", SL).state == "probing"  # the cooldown is over


class _Marks:
    """A lab policy sending every call to c as a probe, every other one a rescue; it
    keeps the Observation each attempt's answer gives."""

    name = "marks"
    needs_tick = False

    def __init__(self) -> None:
        self.seen: list[tuple[bool, bool]] = []
        self.sent: dict[int, bool] = {}

    def choose(self, att: Any, now: float, rng: Any) -> Decision:
        self.sent[id(att)] = rescue = len(self.sent) % 2 == 1
        return Decision("c", "probe", is_probe=True, is_rescue=rescue)

    def on_start(self, att: Any, now: float) -> None: ...

    def on_result(self, att: Any, now: float) -> None:
        obs = att.observation()
        if obs is not None:
            assert obs.is_rescue is self.sent[id(att)]
            self.seen.append((obs.is_probe, obs.is_rescue))

    def tick(self, now: float) -> None: ...
    def next_deadline(self) -> float | None:
        return None


def test_the_lab_carries_the_rescue_mark_to_the_observation() -> None:
    sim = Simulation(parse_scenario(tiny(), "t.yaml"), "round_robin")
    pol = _Marks()
    sim.policy = pol  # type: ignore[assignment]
    sim._on_start, sim._on_result = pol.on_start, pol.on_result
    sim.run()
    assert {(True, False), (True, True)} == set(pol.seen)


def test_a_rescue_never_crosses_a_hard_filter() -> None:
    """Hard filters (model served, region policy) are never relaxed (sidecar.core.filters).
    Model m may run only in region eu; c, its candidate in us, is cooling. Before, a
    refusal for want of room on a and b sent m's request to c as a rescue."""
    data = base_config_dict(stats={"min_samples": 5})
    for c, region in zip(data["clusters"], ("eu", "eu", "us"), strict=True):
        c["max_concurrency"], c["region"] = 1, region
    data["models"][0]["regions"] = ["eu"]
    r = Router(parse_config(data, "t.yaml"))
    eject_c(r)
    r.started("a")
    r.started("b")
    d = r.decide(request(), 2.0, HIT)
    assert (d.admission, d.is_probe) == ("defer", False), d.detail
    assert r.counters[("admission_reason", "rescue")] == 0
