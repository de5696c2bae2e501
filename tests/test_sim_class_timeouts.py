"""The lab's class timeout, as Envoy's routes apply it (docs/scenarios.md): an
unstreamed answer is cut at the class timeout; a stream only if its first byte does not
come within it, never for its length (tokens follow every TPOT)."""

from __future__ import annotations

from typing import Any

import pytest
from test_sim_fixtures import tiny

from sidecar.sim.engine import Simulation
from sidecar.sim.loader import parse_scenario

# 150 tokens at 100 ms each: 15 s of steady streaming, past the 10 s interactive timeout.
LONG: dict[str, Any] = {"median": 150, "p99": 151}


def _run(policy: str, stream: bool, providers: dict[str, Any] | None = None
         ) -> tuple[dict[str, int], Simulation]:
    data = tiny(workloads=[{
        "name": "chat", "class": "interactive", "stream": stream,
        "arrival": {"process": "poisson", "rate_per_s": 2},
        "input_tokens": 100, "output_tokens": LONG,
    }])
    # Room for every stream at once (2/s for 15 s over three providers): nothing queues.
    data["providers"] = providers or {c: {"ttft_ms": 200, "tpot_ms": 100, "capacity": 64}
                                      for c in "abc"}
    sim = Simulation(parse_scenario(data, "t.yaml"), policy)
    return sim.run()["classes"]["interactive"]["outcomes"], sim


@pytest.mark.parametrize("policy", ["tailroute", "tailroute_native", "round_robin"])
def test_a_steady_stream_longer_than_the_class_timeout_completes(policy: str) -> None:
    outcomes, sim = _run(policy, stream=True)
    assert outcomes["ok"] > 50 and outcomes["timeout"] == 0, outcomes
    router = getattr(sim.policy, "router", None)
    assert router is None or not router.transitions  # nothing held against a provider


def test_an_unstreamed_answer_that_long_is_cut_at_the_class_timeout() -> None:
    outcomes, _ = _run("round_robin", stream=False)
    assert outcomes["ok"] == 0 and outcomes["timeout"] > 50, outcomes


def test_a_stream_whose_first_byte_never_comes_is_cut_at_the_class_timeout() -> None:
    stalled = {c: {"ttft_ms": 200, "tpot_ms": 100, "stall_rate": 1.0, "capacity": 64}
               for c in "abc"}
    outcomes, _ = _run("round_robin", stream=True, providers=stalled)
    assert outcomes["ok"] == 0 and outcomes["timeout"] > 50, outcomes
