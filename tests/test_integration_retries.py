"""What tailroute sees of Envoy's own retries (real Envoy, a route retry_policy).

tailroute renders no retry_policy: Envoy sends each request upstream once. An operator
who adds one to the routes gets retries that stay on the cluster the route chose, each
attempt after a failure. Measured here: the sidecar decides each request once, holds
one in-flight slot for it and observes one outcome, its last attempt's (the access-log
entry's cluster, status and upstream timing are that attempt's); the failed attempts
before it are counted from the entry's ``upstream_request_attempt_count``, per
cluster, in ``tailroute_upstream_retries_total`` -- as many as Envoy's own
``upstream_rq_retry`` and the providers' surplus requests -- and each is learned as an
error of its route (``envoy_log.retried_attempts``), not as a request's outcome.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections import Counter
from typing import Any

import openai
import pytest

from sidecar.devtools.harness import Stack
from tests.ops_stack import MODEL, ops_config, start_providers, tailroute_metrics

pytestmark = pytest.mark.envoy

N = 24


def _retry_every_route(boot: dict[str, Any]) -> None:
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    for vhost in hcm["typed_config"]["route_config"]["virtual_hosts"]:
        for route in vhost["routes"]:
            if "route" in route:
                route["route"]["retry_policy"] = {
                    "retry_on": "5xx", "num_retries": 2,
                    "retry_back_off": {"base_interval": "0.005s", "max_interval": "0.01s"}}


async def _send(base_url: str) -> Counter[str]:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="t", max_retries=0, timeout=20)
    sem = asyncio.Semaphore(4)

    async def one(i: int) -> str:
        async with sem:
            try:
                stream = await client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": f"q{i}"}],
                    max_tokens=4, stream=True)
                async for _ in stream:
                    pass
                return "200"
            except openai.APIStatusError as exc:
                return str(exc.status_code)

    try:
        return Counter(await asyncio.gather(*(one(i) for i in range(N))))
    finally:
        await client.close()


def _envoy_retries(stack: Stack) -> int:
    port = stack.ports["envoy_admin"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5) as r:
        lines = r.read().decode().splitlines()
    return sum(int(line.rpartition(" ")[2]) for line in lines
               if line.startswith("cluster.provider-") and ".upstream_rq_retry:" in line)


def test_envoys_retries_are_counted_and_the_request_is_observed_once() -> None:
    with Stack() as stack:
        ports = start_providers(stack)
        stack.start_sidecar(stack.write_config(ops_config(ports)))
        stack.start_envoy(edit=_retry_every_route)
        for name in ports:
            stack.control(name, {"error_rate": 0.5, "error_status": 503})
        seen = asyncio.run(_send(stack.base_url))
        upstream = sum(stack.control(n, {})["counters"]["requests_total"] for n in ports)
        envoy_retries = _envoy_retries(stack)
        time.sleep(2)  # the access log flushes every envoy.access_log_flush_ms (100 ms)
        m = tailroute_metrics(stack)
        state: dict[str, Any] = stack.sidecar_state()
    decided = sum(v for k, v in m.items() if k.startswith("tailroute_decisions_total"))
    outcomes = sum(m.get(f'tailroute_outcomes_total{{outcome="{o}"}}', 0.0)
                   for o in ("ok", "error", "timeout", "cancel", "lost"))
    retries = {k: v for k, v in m.items() if k.startswith("tailroute_upstream_retries_total")}
    inflight = sum(v for k, v in m.items() if k.startswith("tailroute_inflight"))
    print(f"\nclient {dict(seen)}; upstream requests {upstream}; Envoy retries "
          f"{envoy_retries}; sidecar: decided {decided}, outcomes {outcomes}, "
          f"retries {retries}")
    assert sum(seen.values()) == N and set(seen) <= {"200", "503"}
    assert upstream > N  # 0.5 ** 24 that nothing failed: never in practice
    # One decision and one outcome per request, whatever Envoy did upstream ...
    assert decided == outcomes == N
    assert m.get('tailroute_outcomes_total{outcome="error"}', 0.0) == seen["503"]
    assert inflight == 0
    # ... and every attempt Envoy retried counted, by cluster.
    assert sum(retries.values()) == upstream - N == envoy_retries
    assert sum(state["envoy"]["upstream_retries"].values()) == upstream - N
    # ... and learned as the routes' errors: every upstream attempt is evidence (half
    # of them failed; without the retried ones the routes would show only the final
    # 503s, about 1 in 24).
    narrow = [r for r in state["routes"] if r["narrow"]]
    evidence = sum(r["requests"] for r in narrow)
    errors = sum(r["requests"] * r["error_rate"] for r in narrow)
    print(f"routes' evidence {evidence:.1f} requests, {errors:.1f} errors")
    assert evidence > N and errors / evidence > 0.2
