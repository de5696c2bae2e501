"""Outcomes and TTFT from Envoy's access log, end to end: the real Envoy, the sidecar
process, fake providers and real HTTP clients on 127.0.0.1.

* Clients that abort 10 % of their streams mid-response: exactly those are
  ``cancel`` in the sidecar, every other request ``ok``.
* The OpenAI SDK's synchronous stream, which closes the connection at
  ``data: [DONE]`` without reading the end of the body, against a provider that
  ends its body 300 ms after ``[DONE]``: Envoy sees the client leave first, and
  every such request is still ``ok`` with its TTFT and TPOT.
* TTFT as tailroute records it against the provider's own write times (its
  ground truth, from ``GET /control/requests``), for a provider whose first
  event is a token and for one that opens with a role-only event: within 5 %
  or 5 ms (histogram resolution is 2 %; the rest is loopback and Envoy).

No wall-clock thresholds: every wait is a bounded readiness poll.
"""

from __future__ import annotations

import http.client
import json
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest

from sidecar.devtools.harness import Stack, http_json

pytestmark = pytest.mark.envoy

N_ABORT_RUN, EVERY = 40, 10  # every 10th stream of 40 is cut off by its client
N_TTFT = 40


def _config(ports: dict[str, int]) -> dict[str, Any]:
    return {
        "default_cluster": "cut",
        "clusters": [
            {"name": "cut", "address": f"127.0.0.1:{ports['cut']}", "models": ["cut-m"]},
            {"name": "tok", "address": f"127.0.0.1:{ports['tok']}", "models": ["tok-m"]},
            {"name": "role", "address": f"127.0.0.1:{ports['role']}", "models": ["role-m"]},
            {"name": "late", "address": f"127.0.0.1:{ports['late']}", "models": ["late-m"]},
        ],
        "models": [{"name": "cut-m", "candidates": ["cut"]},
                   {"name": "tok-m", "candidates": ["tok"]},
                   {"name": "role-m", "candidates": ["role"]},
                   {"name": "late-m", "candidates": ["late"]}],
        "stats": {"subwindow_s": 30, "subwindows": 2, "min_samples": 5},
        # Blind (role-first) routes: time every response at its first token, so the
        # recorded TTFT is the provider's whole distribution, not a sample of it.
        "timing": {"role_first_share": 1.0},
    }


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with Stack() as st:
        ports = {
            "cut": st.start_provider("cut", "20", "10", seed=1),
            "tok": st.start_provider("tok", "150:250", "2", seed=2),
            "role": st.start_provider("role", "150:250", "2", seed=3, extra=["--role-first"]),
            "late": st.start_provider("late", "20", "5", seed=4),
        }
        st.start_sidecar(st.write_config(_config(ports)))
        st.start_envoy()
        yield st


def _stream(port: int, model: str, tokens: int, abort: bool) -> str:
    """One streamed chat completion; ``abort`` closes the connection after the first
    token. Returns "complete", "aborted" or the failure."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = json.dumps({"model": model, "stream": True, "max_tokens": tokens,
                       "messages": [{"role": "user", "content": "hi"}]})
    try:
        conn.request("POST", "/v1/chat/completions", body=body,
                     headers={"content-type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            return f"status {resp.status}"
        if abort:
            while b'"content"' not in resp.read1(65536):
                pass
            conn.sock.close()  # type: ignore[union-attr]  # the client goes away mid-stream
            return "aborted"
        data = resp.read()
        return "complete" if data.endswith(b"data: [DONE]\n\n") else "truncated"
    finally:
        conn.close()


def _counters(st: Stack) -> dict[str, int]:
    return {k: int(v) for k, v in st.sidecar_state()["counters"].items()}


def _wait(probe: Any, what: str, timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_exactly_the_aborted_streams_are_cancels(stack: Stack) -> None:
    before = _counters(stack)
    port = stack.ports["envoy"]
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda i: _stream(port, "cut-m", 20, i % EVERY == 0),
                                range(N_ABORT_RUN)))
    aborted = results.count("aborted")
    assert aborted == N_ABORT_RUN // EVERY
    assert results.count("complete") == N_ABORT_RUN - aborted, results

    def settled() -> dict[str, int] | None:
        now = _counters(stack)
        seen = {k: now.get(k, 0) - before.get(k, 0)
                for k in ("outcome:ok", "outcome:cancel", "outcome:error", "outcome:timeout")}
        return seen if sum(seen.values()) >= N_ABORT_RUN else None

    seen = _wait(settled, "an outcome for every request")
    assert seen == {"outcome:ok": N_ABORT_RUN - aborted, "outcome:cancel": aborted,
                    "outcome:error": 0, "outcome:timeout": 0}
    # Envoy reset the upstream streams of the clients that left, too.
    snap = http_json(f"http://127.0.0.1:{stack.ports['provider:cut']}/control")
    assert snap["counters"]["client_disconnects"] == aborted


def test_sdk_closing_at_done_is_ok_not_cancel(stack: Stack) -> None:
    stack.control("late", {"end_delay_ms": 300})
    control = f"http://127.0.0.1:{stack.ports['provider:late']}/control"
    before, gone = _counters(stack), http_json(control)["counters"]["client_disconnects"]
    client = openai.OpenAI(base_url=stack.base_url, api_key="test", max_retries=0, timeout=30)
    n = 6
    for _ in range(n):
        stream = client.chat.completions.create(
            model="late-m", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
            stream=True)
        assert sum(1 for ev in stream if ev.choices and ev.choices[0].delta.content) == 5
    # The SDK left before the body ended: Envoy reset the provider's stream each time.
    _wait(lambda: http_json(control)["counters"]["client_disconnects"] - gone >= n,
          "the provider to see every client leave")

    def settled() -> dict[str, int] | None:
        now = _counters(stack)
        seen = {k: now.get(k, 0) - before.get(k, 0) for k in ("outcome:ok", "outcome:cancel")}
        return seen if sum(seen.values()) >= n else None

    assert _wait(settled, "an outcome for every request") == {"outcome:ok": n,
                                                                "outcome:cancel": 0}
    route = _recorded_ttft(stack, "late", "late-m|interactive|short|stream", n)
    assert route["samples"] == n


def _recorded_ttft(st: Stack, cluster: str, label: str, n: int) -> dict[str, Any]:
    def route() -> dict[str, Any] | None:
        for r in st.sidecar_state()["routes"]:
            if r["cluster"] == cluster and r["slice"] == label and (
                    r["latency"]["ttft"]["samples"] >= n):
                return dict(r["latency"]["ttft"])
        return None

    return dict(_wait(route, f"{n} TTFT samples of {cluster}"))


@pytest.mark.parametrize("provider", ["tok", "role"])
def test_ttft_agrees_with_the_providers_own_write_times(stack: Stack, provider: str) -> None:
    port = stack.ports["envoy"]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda _i: _stream(port, f"{provider}-m", 4, False),
                                range(N_TTFT)))
    assert results == ["complete"] * N_TTFT
    recent = http_json(f"http://127.0.0.1:{stack.ports[f'provider:{provider}']}/control/requests")
    truth = [r["first_token_ms"] for r in recent[-N_TTFT:]]
    if provider == "role":  # the first body byte really came long before the first token
        assert statistics.median(r["first_byte_ms"] for r in recent[-N_TTFT:]) < 5
    ttft = _recorded_ttft(stack, provider, f"{provider}-m|interactive|short|stream", N_TTFT)
    assert ttft["samples"] == N_TTFT
    expected = statistics.median(truth)
    print(f"{provider}: recorded p50 {ttft['p50_ms']:.1f} ms, provider p50 {expected:.1f} ms")
    assert abs(ttft["p50_ms"] - expected) <= max(0.05 * expected, 5.0), (ttft, expected)
