"""The policy lab's providers can fail mid-stream behind a 200, as live ones do.

A status mix part with ``status: 200`` is a stream that fails mid-way (an error event,
then the end). The live sidecar reads such a stream as an ``error`` that its duration
does not date (sidecar.core.timing, the access log's ``stream_error``); the lab's
attempt gives the router the same observation, and its client counts an error. Before,
the lab refused ``status: 200`` (400..599 only), so no scenario could hold the failure
mode that looks like a fast success on a status-only view.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_sim_engine import Driver
from test_sim_fixtures import tiny
from test_sim_scenarios import _error

from sidecar.sim.dists import Stream
from sidecar.sim.engine import run_once
from sidecar.sim.loader import parse_scenario
from sidecar.sim.provider import Provider


def _failing(rate: float, **more: Any) -> dict[str, Any]:
    data = tiny(**more)
    data["providers"]["a"]["errors"] = [{"rate": rate, "status": 200, "after_ms": 300}]
    return data


def test_a_stream_failing_behind_its_200_is_an_error_the_router_sees_undated() -> None:
    sc = parse_scenario(_failing(0.3), "t.yaml")
    d = Driver()
    prov = Provider(sc.providers["a"], [], Stream("e"), d.push, d.end)
    d.prov = prov
    atts = [d.send(at=i * 1.0, deadline=i * 1.0 + 30.0) for i in range(400)]
    d.run()
    failed = [a for a in atts if a.outcome == "error"]
    assert failed and all(a.status == 200 for a in failed)
    for att in failed:
        obs = att.observation()
        assert obs is not None and obs.outcome == "error" and obs.status == 200
        # As the sidecar reads a stream cut by an error event: no latency, not dated.
        assert obs.ttft_s is None and obs.tpot_s is None and obs.e2e_s is None


@pytest.mark.parametrize("status", [201, 302, 399])
def test_other_statuses_below_400_are_refused(status: int) -> None:
    data = tiny()
    data["providers"]["a"]["errors"] = [{"rate": 0.1, "status": status}]
    assert ("providers.a.errors[0].status: must be 200 (failed mid-stream) or 400..599"
            in _error(data))


def test_tailroute_moves_off_a_route_that_fails_mid_stream() -> None:
    """Half of a's streams fail behind their 200: tailroute's clients see fewer errors
    than round robin's, which sends a third of the traffic there throughout."""
    sc = parse_scenario(_failing(0.5), "t.yaml")
    runs = {p: run_once(sc, p) for p in ("round_robin", "tailroute")}
    errors = {p: r["classes"]["interactive"]["outcomes"]["error"] for p, r in runs.items()}
    assert errors["tailroute"] < errors["round_robin"] / 2, errors
    # a is the fastest route: without the failures tailroute gives it the most traffic.
    healthy = run_once(parse_scenario(tiny(), "t.yaml"), "tailroute")["traffic_share"]["a"]
    assert runs["tailroute"]["traffic_share"]["a"] < healthy / 4
