"""A deferred request coming back as told, through the real Envoy and the `openai`
client with its default retries.

Batch requests are deferred (429, ``Retry-After``, ``x-should-retry: true``) while
every route is held full; the routes then empty, and the client retries each one
after ``Retry-After``, marked ``x-stainless-retry-count: 1``. Each comeback is taken
as the first attempt it is (the deferred one reached no route) and served. Before,
the comebacks met the retry budget: of 8, 6 were served and 2 refused with 503
``retry_budget`` and ``x-should-retry: false``, on idle routes
(sidecar.core.retry_budget, "A deferred request's comeback is a first attempt")."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import openai
import pytest

from sidecar.devtools.harness import Stack

pytestmark = pytest.mark.envoy

MSG = [{"role": "user", "content": "hello"}]
CONC = 4  # max_concurrency of each route: the comebacks fit once the routes empty
N = 2 * CONC  # batch requests deferred, as many as the two routes hold


def _config(ports: dict[str, int]) -> dict[str, Any]:
    return {
        "default_cluster": "a",
        "clusters": [{"name": n, "address": f"127.0.0.1:{ports[n]}", "models": ["m"],
                      "max_concurrency": CONC} for n in ("a", "b")],
        "models": [{"name": "m", "candidates": ["a", "b"]}],
        "admission": {"queue_wait_ms": 250},
        "limits": {"decision_timeout_ms": 500},
    }


def _wait(what: str, check: Callable[[], bool]) -> None:
    """Poll until ``check`` holds; bounded so a broken run ends."""
    deadline = time.monotonic() + 60
    for _ in range(3_000):
        if check():
            return
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
    raise AssertionError(what)


def test_deferred_requests_retried_after_retry_after_are_served() -> None:
    with Stack() as st:
        ports = {n: st.start_provider(n, "20", "2", seed=i) for i, n in enumerate("ab")}
        st.start_sidecar(st.write_config(_config(ports)))
        st.start_envoy()

        def counter(key: str) -> int:
            return int(st.sidecar_state()["counters"].get(key, 0))

        def client(retries: int) -> openai.OpenAI:
            return openai.OpenAI(base_url=st.base_url, api_key="t", max_retries=retries,
                                 timeout=120)

        for p in ("a", "b"):
            st.control(p, {"hold": True})
        try:
            with ThreadPoolExecutor(max_workers=2 * N) as pool:
                held = [pool.submit(client(0).chat.completions.create, model="m",
                                    messages=MSG, max_tokens=2) for _ in range(N)]
                _wait("routes never filled", lambda: all(
                    c["inflight"] >= CONC for c in st.sidecar_state()["clusters"].values()))
                batch = client(2)  # the SDK's default: two retries, after Retry-After

                def one() -> Any:
                    return batch.chat.completions.with_raw_response.create(
                        model="m", messages=MSG, max_tokens=2,
                        extra_headers={"x-tailroute-class": "batch"})

                futures: list[Future[Any]] = [pool.submit(one) for _ in range(N)]
                _wait("batch never deferred", lambda: counter("admission:defer") >= N)
                for p in ("a", "b"):
                    st.control(p, {"hold": False})
                for f in held:
                    assert f.result(timeout=60).choices
                raws = [f.result(timeout=60) for f in futures]  # a refusal raises here
            assert all(r.retries_taken >= 1 for r in raws)  # each came back at least once
            assert counter("admission_reason:retry_budget") == 0
        finally:
            for p in ("a", "b"):
                st.control(p, {"reset": True})
