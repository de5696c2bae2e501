"""Admission control end to end: real Envoy, the sidecar process, fake providers and
the `openai` client, all on 127.0.0.1.

No wall-clock thresholds: "immediately" is checked as "the provider never saw
the request", and "the timeout takes effect" as Envoy's own 504 plus the
``x-envoy-expected-rq-timeout-ms`` header Envoy forwards upstream.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest

from sidecar.devtools.harness import Stack, http_json

pytestmark = pytest.mark.envoy

MSG = [{"role": "user", "content": "hello there"}]
CONC = 2  # max_concurrency of each overload cluster


def _config(ports: dict[str, int]) -> dict[str, Any]:
    return {
        "default_cluster": "a",
        "clusters": [
            {"name": "a", "address": f"127.0.0.1:{ports['a']}", "models": ["m"],
             "max_concurrency": CONC},
            {"name": "b", "address": f"127.0.0.1:{ports['b']}", "models": ["m"],
             "max_concurrency": CONC},
            {"name": "t", "address": f"127.0.0.1:{ports['t']}", "models": ["tm"]},
        ],
        "models": [
            {"name": "m", "candidates": ["a", "b"]},
            {"name": "tm", "candidates": ["t"]},
        ],
        "admission": {"queue_wait_ms": 250},
        "limits": {"decision_timeout_ms": 500},
    }


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with Stack() as st:
        ports = {n: st.start_provider(n, "20", "2", seed=i) for i, n in enumerate("abt")}
        st.start_sidecar(st.write_config(_config(ports)))
        st.start_envoy()
        yield st


def _client(st: Stack, retries: int = 0, timeout: float = 20) -> openai.OpenAI:
    return openai.OpenAI(base_url=st.base_url, api_key="test", max_retries=retries,
                         timeout=timeout)


def _provider_requests(st: Stack, name: str) -> int:
    snap = http_json(f"http://127.0.0.1:{st.ports[f'provider:{name}']}/control")
    return int(snap["counters"]["requests_total"])


def _counter(st: Stack, key: str) -> int:
    return int(st.sidecar_state()["counters"].get(key, 0))


def test_optional_step_with_exhausted_budget_is_skipped(stack: Stack) -> None:
    before = _provider_requests(stack, "a") + _provider_requests(stack, "b")
    with pytest.raises(openai.APIStatusError) as info:
        _client(stack, retries=2).chat.completions.create(
            model="m", messages=MSG, max_tokens=2,
            extra_headers={"x-tailroute-deadline-ms": "0", "x-tailroute-step": "optional"},
        )
    err = info.value
    assert err.status_code == 412
    assert err.response.headers["x-tailroute-skipped"] == "optional-step"
    assert err.response.headers["x-tailroute-admission"] == "skip"
    assert err.type == "tailroute_skipped" and err.code == "deadline_exhausted"
    # Answered by the sidecar, once (the client did not retry), never sent upstream.
    assert _provider_requests(stack, "a") + _provider_requests(stack, "b") == before
    assert _counter(stack, "admission:skip") == 1


def test_upstream_timeout_is_the_remaining_budget(stack: Stack) -> None:
    client = _client(stack)
    client.chat.completions.create(model="tm", messages=MSG, max_tokens=2,
                                   extra_headers={"x-tailroute-deadline-ms": "1500"})
    client.chat.completions.create(model="tm", messages=MSG, max_tokens=2)
    recent = http_json(f"http://127.0.0.1:{stack.ports['provider:t']}/control/requests")
    # Envoy consumed x-envoy-upstream-rq-timeout-ms and tells the upstream what it applied.
    applied = [r["headers"].get("x-envoy-expected-rq-timeout-ms") for r in recent[-2:]]
    assert applied == ["1500", "30000"]  # the deadline, then the interactive class timeout
    # And it takes effect: an upstream slower than the budget gets Envoy's 504.
    stack.control("t", {"ttft_ms": {"fixed": 5000}})
    try:
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(model="tm", messages=MSG, max_tokens=2,
                                           extra_headers={"x-tailroute-deadline-ms": "300"})
        assert info.value.status_code == 504
        assert "upstream request timeout" in info.value.response.text
    finally:
        stack.control("t", {"reset": True})


def _wait(what: str, check: Callable[[], bool], detail: Callable[[], Any]) -> None:
    """Poll until ``check`` holds; bounded in count and time only so a broken run ends."""
    deadline = time.monotonic() + 60
    for _ in range(2_000):
        if check():
            return
        if time.monotonic() > deadline:
            break
        time.sleep(0.025)
    raise AssertionError(f"{what}: {detail()}")


def _wait_full(st: Stack) -> None:
    """Poll the sidecar until every overload cluster is at its limit."""
    def full() -> bool:
        clusters = st.sidecar_state()["clusters"]
        return all(clusters[c]["inflight"] >= CONC for c in ("a", "b"))

    _wait("clusters never filled", full, lambda: st.sidecar_state()["clusters"])


def test_overload_sheds_low_priority_and_serves_interactive(stack: Stack) -> None:
    # The providers hold what they receive until released: the clusters stay full for
    # as long as the test needs, however slowly a loaded machine gets through its steps.
    for p in ("a", "b"):
        stack.control(p, {"hold": True})
    try:
        with ThreadPoolExecutor(max_workers=2 * CONC + 1) as pool:
            # (a client timeout longer than every bounded wait below: held, not lost)
            hold = [pool.submit(_client(stack, timeout=300).chat.completions.create, model="m",
                                messages=MSG, max_tokens=2) for _ in range(2 * CONC)]
            _wait_full(stack)
            sent_before = _provider_requests(stack, "a") + _provider_requests(stack, "b")
            client = _client(stack, retries=2)  # the default client: retries 429/5xx
            with pytest.raises(openai.RateLimitError) as deferred:
                _client(stack).chat.completions.create(
                    model="m", messages=MSG, max_tokens=2,
                    extra_headers={"x-tailroute-class": "batch"})
            assert deferred.value.response.headers["retry-after"] == "2"
            # The wait the SDKs prefer, spread per answer (sidecar.shell.admission).
            assert 2000 <= int(deferred.value.response.headers["retry-after-ms"]) < 4000
            assert deferred.value.type == "tailroute_deferred"
            with pytest.raises(openai.InternalServerError) as shed:
                client.chat.completions.create(
                    model="m", messages=MSG, max_tokens=2,
                    extra_headers={"x-tailroute-class": "batch",
                                   "x-tailroute-deadline-ms": "1000"})
            assert shed.value.status_code == 503 and shed.value.type == "tailroute_shed"
            assert shed.value.response.headers["x-should-retry"] == "false"
            # Neither reached a provider; the shed one was not retried by the client.
            assert _provider_requests(stack, "a") + _provider_requests(stack, "b") == sent_before
            assert _counter(stack, "admission:shed") == 1
            # Interactive work at the same moment is queued briefly, then served: once
            # the providers are released, or (admission.beyond_capacity: shed) deferred
            # with reason ``full`` if they are still full when its wait is over, and
            # served when the client retries after Retry-After.
            queued = _counter(stack, "admission:queue")
            vip = pool.submit(client.chat.completions.create, model="m", messages=MSG,
                              max_tokens=2)
            _wait("interactive request never queued",
                  lambda: _counter(stack, "admission:queue") > queued,
                  lambda: stack.sidecar_state()["counters"])
            for p in ("a", "b"):
                stack.control(p, {"hold": False})
            assert vip.result(timeout=30).choices[0].message.content
            for f in hold:
                assert f.result(timeout=30).choices
        assert _counter(stack, "admission:queue") >= 1
        # The batch request's; a deferral of the interactive one would say ``full``.
        assert _counter(stack, "admission:defer") - _counter(stack, "admission_reason:full") == 1
        # The held request was answered by the sidecar, not abandoned by Envoy's
        # message_timeout (which would fail open and withdraw it from the queue).
        assert _counter(stack, "admission_reason:queue_abandoned") == 0
    finally:
        for p in ("a", "b"):
            stack.control(p, {"reset": True})


def test_interactive_beyond_capacity_is_deferred_after_its_queue_wait(stack: Stack) -> None:
    """Every route held full: an interactive request (above shed_below_priority) waits
    its queue_wait_ms, then gets a 429 with Retry-After and reason ``full`` instead of
    being sent beyond max_concurrency (admission.beyond_capacity: shed, the default)."""
    for p in ("a", "b"):
        stack.control(p, {"hold": True})
    try:
        with ThreadPoolExecutor(max_workers=2 * CONC) as pool:
            hold = [pool.submit(_client(stack, timeout=300).chat.completions.create, model="m",
                                messages=MSG, max_tokens=2) for _ in range(2 * CONC)]
            _wait_full(stack)
            sent_before = _provider_requests(stack, "a") + _provider_requests(stack, "b")
            full_before = _counter(stack, "admission_reason:full")
            with pytest.raises(openai.RateLimitError) as deferred:
                _client(stack).chat.completions.create(model="m", messages=MSG, max_tokens=2)
            err = deferred.value
            assert err.response.headers["retry-after"] == "2"
            assert err.response.headers["x-tailroute-admission"] == "defer"
            assert err.type == "tailroute_deferred" and err.code == "full"
            assert _provider_requests(stack, "a") + _provider_requests(stack, "b") == sent_before
            assert _counter(stack, "admission_reason:full") == full_before + 1
            for p in ("a", "b"):
                stack.control(p, {"hold": False})
            for f in hold:
                assert f.result(timeout=30).choices
    finally:
        for p in ("a", "b"):
            stack.control(p, {"reset": True})
