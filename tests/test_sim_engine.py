"""Providers, traffic, clients and workflows of the simulator; the CLI and the report."""

from __future__ import annotations

import heapq
import itertools
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_sim_fixtures import make_attempt, tiny, tiny_scenario

from sidecar.sim.cli import main
from sidecar.sim.dists import Stream
from sidecar.sim.engine import run_once
from sidecar.sim.loader import parse_scenario
from sidecar.sim.provider import Provider
from sidecar.sim.records import CLIENT, Attempt, finalize_unfinished
from sidecar.sim.scenario import EventSpec, Mmpp, OnOff, Poisson, SliceMatch, Trace
from sidecar.sim.traffic import arrivals

# ---------------------------------------------------------------- provider model


class Driver:
    """A minimal event loop around one Provider (what the engine does, stripped)."""

    def __init__(self, **spec: Any) -> None:
        data = tiny()
        data["providers"]["a"] = {"ttft_ms": 100, "tpot_ms": 10, **spec}
        self.sc = parse_scenario(data, "t.yaml")
        self.heap: list[tuple[float, int, Callable[[Any], None], Any]] = []
        self.seq = itertools.count()
        self.now = 0.0
        self.ended: list[tuple[float, Attempt]] = []
        self.prov = Provider(self.sc.providers["a"], [], Stream("t"), self.push, self.end)

    def push(self, t: float, fn: Callable[[Any], None], arg: Any) -> None:
        heapq.heappush(self.heap, (t, next(self.seq), fn, arg))

    def end(self, att: Attempt) -> None:
        if att.outcome is None:
            finalize_unfinished(att)
        self.ended.append((self.now, att))
        self.prov.finish(att, self.now)

    def send(self, at: float = 0.0, tokens: int = 11, deadline: float = 100.0) -> Attempt:
        att = make_attempt(self.sc, "a", output_tokens=tokens, sent_at=at)
        att.deadline = deadline
        self.push(at, lambda a: self.prov.submit(a, self.now), att)
        return att

    def run(self) -> None:
        while self.heap:
            t, _, fn, arg = heapq.heappop(self.heap)
            self.now = t
            fn(arg)


def test_capacity_queues_fifo_and_ttft_includes_the_wait() -> None:
    d = Driver(capacity=1, contention=0.0)
    a, b = d.send(), d.send()
    d.run()
    assert a.outcome == b.outcome == "ok"
    assert a.end_at == pytest.approx(0.2)  # 100 ms + 10 x 10 ms
    assert b.first_token_at == pytest.approx(0.3)  # waited for a's slot
    assert b.ttft_s == pytest.approx(0.3)


def test_full_queue_answers_429() -> None:
    d = Driver(capacity=1, queue_limit=0)
    d.send()
    b = d.send()
    d.run()
    assert (b.outcome, b.status) == ("error", 429)


def test_contention_slows_requests_started_while_busy() -> None:
    d = Driver(capacity=2, contention=1.0)
    a, b = d.send(), d.send()
    d.run()
    assert a.ttft_s == pytest.approx(0.1)
    assert b.ttft_s == pytest.approx(0.15)  # 1 + 1.0 x 1/2


def test_stalled_request_times_out_at_its_deadline() -> None:
    d = Driver(stall_rate=1.0)
    a = d.send(deadline=2.0)
    d.run()
    assert (a.outcome, a.end_at) == ("timeout", 2.0)


def test_abandoned_work_keeps_the_slot_when_the_provider_keeps_working() -> None:
    d = Driver(capacity=1, keeps_working_on_cancel=True, contention=0.0)
    a = d.send(tokens=101, deadline=0.5)  # would end at 1.1 s
    b = d.send(at=0.6)
    d.run()
    assert a.outcome == "timeout" and a.end_at == 0.5
    assert b.first_token_at == pytest.approx(1.2)  # slot busy until 1.1 s


def test_first_token_timeout_gives_up_early_as_a_client_cancel() -> None:
    d = Driver(capacity=1, contention=0.0)
    d.send(tokens=101)
    b = d.send()
    b.ttft_deadline = 0.5  # b would only start at 1.1 s
    d.run()
    assert b.deadline_kind == CLIENT and b.outcome == "cancel" and b.end_at == 0.5


def test_degradation_events_match_slices_and_repeat() -> None:
    ev = EventSpec("a", at=10.0, duration=5.0, every=20.0, count=3, ttft_factor=2.0)
    assert [ev.active(t) for t in (9.9, 10.0, 14.9, 15.0, 30.0, 54.9, 70.0)] == [
        False, True, True, False, True, True, False]
    assert ev.windows(45.0) == [(10.0, 15.0), (30.0, 35.0)]
    m = SliceMatch(stream=True, profile="long", min_output_tokens=500)
    assert m.matches("interactive", "m", True, "long", 10, 600)
    assert not m.matches("interactive", "m", False, "long", 10, 600)
    assert not m.matches("interactive", "m", True, "short", 10, 600)
    assert not m.matches("interactive", "m", True, "long", 10, 400)


# ---------------------------------------------------------------- traffic


def _times(spec: Any, end: float = 1000.0) -> list[float]:
    return [t for t, _, _ in arrivals(spec, Stream("x"), 0.0, end)]


def test_poisson_rate_and_rate_changes() -> None:
    ts = _times(Poisson(5.0, ((500.0, 1.0),)))
    first, second = sum(t < 500 for t in ts), sum(t >= 500 for t in ts)
    assert abs(first - 2500) < 4 * math.sqrt(2500)
    assert abs(second - 500) < 4 * math.sqrt(500)
    assert ts == sorted(ts)


def test_onoff_and_mmpp_are_bursty() -> None:
    ts = _times(OnOff(rate_on=20.0, rate_off=0.0, on_s=10.0, off_s=40.0))
    assert all((t % 50.0) < 10.0 for t in ts)
    assert abs(len(ts) - 4000) < 4 * math.sqrt(4000)
    ms = _times(Mmpp(((0.5, 30.0), (30.0, 10.0))), end=5000.0)
    per_10s = [sum(1 for t in ms if k * 10 <= t < (k + 1) * 10) for k in range(500)]
    mean = sum(per_10s) / len(per_10s)
    var = sum((x - mean) ** 2 for x in per_10s) / len(per_10s)
    assert var > 5 * mean  # overdispersed: a Poisson process would have var ~= mean


def test_trace_replay_offsets_and_compresses_time(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:00:00.0000000,100,10\n"
                 "2023-11-16 18:00:10.0000000,200,0\n"
                 "2023-11-16 18:00:30.5000000,300,30\n", encoding="utf-8")
    got = list(arrivals(Trace(f, speedup=2.0, offset_s=5.0), Stream("x"), 1.0, 100.0))
    assert got == [(1.0 + 2.5, 200, 1), (1.0 + 12.75, 300, 30)]  # 0 generated -> 1


# ---------------------------------------------------------------- clients and workflows


def test_retries_recover_from_an_outage() -> None:
    data = tiny(events=[{"provider": "a", "at_s": 0, "outage": True}])
    data["workloads"][0]["client"] = {"retries": 2, "backoff_ms": 50}
    sc = parse_scenario(data, "t.yaml")
    out = run_once(sc, "round_robin")
    cls = out["classes"]["interactive"]
    assert out["attempts"] > out["calls"]
    assert cls["outcomes"]["error"] == 0  # every call found b or c on a retry
    no_retry = tiny(events=data["events"])
    out2 = run_once(parse_scenario(no_retry, "t.yaml"), "round_robin")
    assert out2["classes"]["interactive"]["outcomes"]["error"] > 0


def _workflow(deadline_ms: float, **extra: Any) -> dict[str, Any]:
    data = tiny()
    data["workloads"][0]["workflow"] = {
        "deadline_ms": deadline_ms,
        "steps": [{"name": "plan"}, {"name": "fan", "fanout": 3},
                  {"name": "critique", "step": "optional", "min_budget_ms": 5000},
                  {"name": "answer"}],
        **extra,
    }
    data["workloads"][0]["arrival"]["rate_per_s"] = 1
    return data


def test_workflow_runs_steps_and_skips_optional_when_budget_is_short() -> None:
    roomy = run_once(parse_scenario(_workflow(60000), "t.yaml"), "round_robin")
    wf = roomy["classes"]["interactive"]["workflows"]
    assert wf["completed"] == wf["started"] > 0
    assert roomy["classes"]["interactive"]["outcomes"]["skipped"] == 0
    tight = run_once(parse_scenario(_workflow(4000), "t.yaml"), "round_robin")
    cls = tight["classes"]["interactive"]
    # the critique is skipped in every workflow that reaches it (all but a rare failure)
    assert cls["outcomes"]["skipped"] >= 0.9 * cls["workflows"]["started"]
    assert 0 < cls["workflows"]["completed"] < cls["workflows"]["started"]  # 4 s is tight


def test_a_failed_critical_step_fails_the_workflow() -> None:
    data = _workflow(60000)
    data["events"] = [{"provider": p, "at_s": 0, "error_rate": 1.0} for p in ("a", "b", "c")]
    out = run_once(parse_scenario(data, "t.yaml"), "round_robin")
    wf = out["classes"]["interactive"]["workflows"]
    assert wf["started"] > 0 and wf["completed"] == 0
    assert out["unfinished"] == 0


# ---------------------------------------------------------------- CLI and report


def _write_tiny(tmp_path: Path) -> Path:
    f = tmp_path / "tiny.yaml"
    f.write_text(yaml.safe_dump(tiny(events=[{"provider": "a", "at_s": 20, "duration_s": 10,
                                              "ttft_factor": 5, "label": "slow"}])),
                 encoding="utf-8")
    return f


def test_cli_simulate_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = _write_tiny(tmp_path)
    rc = main(["simulate", "--scenario", str(f), "--policy", "round_robin", "oracle",
               "--json", "-q"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema_version"] == 2
    sc = doc["scenarios"][0]
    assert list(sc["policies"]) == ["round_robin", "oracle"]
    assert sc["events"][0]["windows"] == [[20.0, 30.0]]
    assert {"violation_rate", "best_baseline", "gap_closed"} <= set(sc["summary"])


def test_cli_table_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = _write_tiny(tmp_path)
    assert main(["simulate", "--scenario", str(f), "--policy", "random", "-q"]) == 0
    out = capsys.readouterr().out
    assert "== tiny" in out and "random" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(tiny(duration_s=-1)), encoding="utf-8")
    assert main(["simulate", "--scenario", str(bad), "-q"]) == 2
    assert "bad.yaml: duration_s: must be >= 1" in capsys.readouterr().err


def test_report_writes_markdown_and_plots(tmp_path: Path) -> None:
    _write_tiny(tmp_path)
    out = tmp_path / "report"
    rc = main(["report", "--suite", str(tmp_path), "--out", str(out), "--policy",
               "round_robin", "tailroute", "-q"])
    assert rc == 0
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "tiny-share.png" in md and "tiny-p99.png" in md
    for png in ("tiny-share.png", "tiny-p99.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert doc["schema_version"] == 2
    rc = main(["report", "--from-json", str(out / "results.json"), "--out", str(tmp_path / "r2")])
    assert rc == 0 and (tmp_path / "r2" / "report.md").exists()


def test_tiny_scenario_has_sane_latencies() -> None:
    out = run_once(tiny_scenario(), "least_inflight")
    ttft = out["classes"]["interactive"]["ttft_ms"]
    assert 150 < ttft["p50"] < 600  # medians 200-400 ms plus a little prefill


# ---------------------------------------------------------------- admission answers


class _Queueing:
    """A policy that answers ``queue`` ``times`` times per call, then admits to ``a``."""

    name = "queueing"
    needs_tick = False

    def __init__(self, times: int) -> None:
        self.times = times
        self.asked: dict[int, int] = {}
        self.withdrawn: list[int] = []

    def choose(self, att: Attempt, now: float, rng: Any) -> Any:
        from sidecar.core.types import Decision

        n = self.asked.get(att.call.id, 0)
        self.asked[att.call.id] = n + 1
        if n < self.times:
            return Decision("a", "admission", admission="queue")
        return "a"

    def queue_until(self, call: Any) -> float | None:
        return None  # engine default: admission.queue_wait_ms

    def withdraw(self, call: Any) -> None:
        self.withdrawn.append(call.id)

    def on_start(self, att: Attempt, now: float) -> None: ...
    def on_result(self, att: Attempt, now: float) -> None: ...
    def tick(self, now: float) -> None: ...
    def next_deadline(self) -> float | None:
        return None


def _with_policy(policy: _Queueing, **client: Any) -> dict[str, Any]:
    from sidecar.sim.engine import Simulation

    data = tiny()
    data["workloads"][0]["client"] = client
    sim = Simulation(parse_scenario(data, "t.yaml"), "round_robin")
    sim.policy = policy  # type: ignore[assignment]
    sim._on_start = sim._on_result = None
    return sim.run()


def test_queue_answers_hold_the_call_then_it_reasks() -> None:
    pol = _Queueing(times=2)
    out = _with_policy(pol)
    assert out["classes"]["interactive"]["outcomes"]["ok"] == out["calls"] > 0
    assert all(n == 3 for n in pol.asked.values())
    assert not pol.withdrawn


def test_a_client_that_gives_up_while_held_is_withdrawn() -> None:
    pol = _Queueing(times=10**9)
    out = _with_policy(pol, first_token_timeout_ms=1000)
    assert out["classes"]["interactive"]["outcomes"]["timeout"] == out["calls"] > 0
    assert len(pol.withdrawn) == len(pol.asked)
