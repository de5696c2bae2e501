"""Shared helpers for the policy-lab tests (and tests of the helpers themselves)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from sidecar.core.classify import token_profile
from sidecar.core.timing import ResponseTimer
from sidecar.core.types import SliceKey
from sidecar.sim.loader import parse_scenario
from sidecar.sim.records import Attempt, Call
from sidecar.sim.scenario import Scenario

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO / "sidecar" / "sim" / "scenarios"
TRACES = Path(__file__).parents[1].parent / "shared" / "traces"
CONV_TRACE = TRACES / "AzureLLMInferenceTrace_conv.csv"

TINY: dict[str, Any] = {
    "name": "tiny",
    "seed": 3,
    "duration_s": 60,
    "warmup_s": 5,
    "config": {
        "default_cluster": "a",
        "clusters": [
            {"name": "a", "address": "127.0.0.1:9001", "models": ["m"], "max_concurrency": 8},
            {"name": "b", "address": "127.0.0.1:9002", "models": ["m"], "max_concurrency": 8},
            {"name": "c", "address": "127.0.0.1:9003", "models": ["m"], "max_concurrency": 8},
        ],
        "models": [{"name": "m", "candidates": ["a", "b", "c"]}],
        "classes": {
            "interactive": {"slo": {"metric": "ttft", "budget_ms": 1000, "timeout_ms": 10000}},
            "batch": {"slo": {"metric": "e2e", "budget_ms": 20000, "timeout_ms": 60000},
                      "latency_sensitive": False},
        },
    },
    "providers": {
        "a": {"ttft_ms": {"median": 200, "p99": 500}, "tpot_ms": 10},
        "b": {"ttft_ms": {"median": 300, "p99": 600}, "tpot_ms": 10},
        "c": {"ttft_ms": 400, "tpot_ms": 12},
    },
    "workloads": [
        {
            "name": "chat",
            "class": "interactive",
            "arrival": {"process": "poisson", "rate_per_s": 5},
            "input_tokens": {"median": 300, "p99": 2000},
            "output_tokens": {"median": 50, "p99": 200},
        }
    ],
}


def tiny(**overrides: Any) -> dict[str, Any]:
    """A deep copy of :data:`TINY` with top-level keys replaced."""
    data = copy.deepcopy(TINY)
    data.update(overrides)
    return data


def tiny_scenario(**overrides: Any) -> Scenario:
    return parse_scenario(tiny(**overrides), "tiny.yaml")


def make_attempt(
    sc: Scenario,
    cluster: str = "",
    *,
    stream: bool = True,
    klass: str = "interactive",
    input_tokens: int = 100,
    output_tokens: int = 10,
    sent_at: float = 0.0,
) -> Attempt:
    """An attempt for policy unit tests, built like the engine builds one."""
    wl = sc.workloads[0]
    cls = sc.config.workload_class(klass)
    assert cls is not None
    model = sc.config.models[0]
    sk = SliceKey(model.name, klass, token_profile(input_tokens, None), stream)
    call = Call(0, wl, cls, model.name, stream, input_tokens, output_tokens, None, sk,
                model.candidates, sent_at, True)
    att = Attempt(call, 0, sent_at)
    att.cluster = cluster
    att.deadline = sent_at + cls.slo.timeout_ms / 1000.0
    return att


def finished(sc: Scenario, cluster: str, *, ttft: float, tokens: int = 10,
             tpot: float = 0.01, stream: bool = True, outcome: str = "ok",
             status: int = 200, at: float = 0.0) -> Attempt:
    """A finished attempt with the given measurements (for on_result)."""
    att = make_attempt(sc, cluster, stream=stream, output_tokens=tokens, sent_at=at)
    att.outcome = outcome  # type: ignore[assignment]
    att.status = status
    if outcome == "ok":
        att.first_token_at = at + ttft
        att.end_at = at + ttft + tpot * (tokens - 1)
        att.tokens_done = tokens
        att.tpot_s = tpot
    else:
        att.end_at = at + ttft
    return att


def test_tiny_scenario_parses() -> None:
    sc = tiny_scenario()
    assert sc.name == "tiny"
    assert set(sc.providers) == {"a", "b", "c"}
    assert sc.providers["c"].ttft.sigma == 0.0  # a plain number is a fixed latency
    assert abs(sc.providers["a"].ttft.median - 0.2) < 1e-12  # milliseconds -> seconds


def test_finished_attempt_reads_like_an_observation() -> None:
    sc = tiny_scenario()
    att = finished(sc, "a", ttft=0.5, tokens=11, tpot=0.02)
    obs = att.observation()
    assert obs is not None
    assert obs.outcome == "ok" and obs.cluster == "a"
    assert obs.ttft_s is not None and abs(obs.ttft_s - 0.5) < 1e-12
    assert obs.e2e_s is not None and abs(obs.e2e_s - 0.7) < 1e-12
    unary = finished(sc, "a", ttft=0.5, stream=False)
    uobs = unary.observation()
    assert uobs is not None and uobs.ttft_s is None and uobs.tpot_s is None  # as ResponseTimer


@pytest.mark.parametrize("status", [400, 404, 408, 413, 422, 429, 500, 502, 503, 504])
def test_an_error_answer_is_evidence_exactly_when_the_sidecar_reads_it_as_one(
        status: int) -> None:
    """A 400 for a prompt past a route's context window is the caller's fault to the
    server's ResponseTimer, not evidence about the route; the lab's observation of the
    same answer says the same (it was an error against the route: the hunt's
    ``context_limits``). A 429 or a 5xx is an error in both, a 408 or 504 a timeout
    (the lab passed those on as errors)."""
    sc = tiny_scenario()
    att = finished(sc, "a", ttft=0.0, outcome="error", status=status, at=1.0)
    att.end_at = 1.03
    timer = ResponseTimer("a", att.call.slice, 1.0, True)
    timer.on_headers(status, "application/json", 1.03)
    timer.on_body(b"{}", 1.03, end=True)
    served = timer.observation(1.03)
    observed = att.observation()
    if status < 500 and status not in (408, 429):
        assert served is None and observed is None
    else:  # a 408 or 504 is a (censored) timeout to both, the rest an error
        assert served is not None and observed is not None
        assert (observed.outcome, observed.status, observed.censored) == (
            served.outcome, served.status, served.censored)
        assert observed.outcome == ("timeout" if status in (408, 504) else "error")
        assert (observed.ttft_s, observed.e2e_s) == pytest.approx((served.ttft_s, served.e2e_s))
