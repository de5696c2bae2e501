"""Counters reconcile exactly with what was sent (issue 13, item 4).

Sends a known mix through the real Envoy and compares the sidecar's counters with
it: streamed and unary requests served ok, upstream errors (500), unknown models
(default route, counted as fail-open), invalid bodies (400). Outcomes come from
Envoy's access log (one entry per request), so every count must match exactly.
(Before the access-log data path, the observing stream's deferred close turned some
complete responses into ``cancel``.) Restarts: see tests/test_reliability.py.
"""

from __future__ import annotations

import asyncio
import http.client
import time

import openai
import pytest

from sidecar.devtools.harness import Stack
from tests.ops_stack import MODEL, ops_config, start_providers, tailroute_metrics

pytestmark = pytest.mark.envoy

N_STREAM, N_UNARY, N_ERROR, N_UNKNOWN, N_BAD = 30, 20, 10, 15, 5


async def _send(base_url: str, model: str, n: int, stream: bool) -> list[int]:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="t", max_retries=0, timeout=20)

    async def one(i: int) -> int:
        try:
            if stream:
                s = await client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": f"q{i}"}],
                    max_tokens=4, stream=True)
                async for _ in s:
                    pass
            else:
                await client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": f"q{i}"}], max_tokens=4)
            return 200
        except openai.APIStatusError as exc:
            return exc.status_code

    try:
        sem = asyncio.Semaphore(4)

        async def bounded(i: int) -> int:
            async with sem:
                return await one(i)

        return list(await asyncio.gather(*(bounded(i) for i in range(n))))
    finally:
        await client.close()


def test_counters_reconcile_with_requests_sent() -> None:
    with Stack() as stack:
        ports = start_providers(stack)
        stack.start_sidecar(stack.write_config(ops_config(ports)))
        stack.start_envoy()
        url = stack.base_url
        sent = {"stream": asyncio.run(_send(url, MODEL, N_STREAM, True)),
                "unary": asyncio.run(_send(url, MODEL, N_UNARY, False)),
                "unknown": asyncio.run(_send(url, "never-configured", N_UNKNOWN, False))}
        for name in ports:
            stack.control(name, {"error_rate": 1.0, "error_status": 500})
        sent["error"] = asyncio.run(_send(url, MODEL, N_ERROR, False))
        for _ in range(N_BAD):
            conn = http.client.HTTPConnection("127.0.0.1", stack.ports["envoy"], timeout=10)
            conn.request("POST", "/v1/chat/completions", body=b"{nope",
                         headers={"content-type": "application/json"})
            assert conn.getresponse().status == 400
            conn.close()
        assert sent["stream"] == [200] * N_STREAM and sent["unary"] == [200] * N_UNARY
        assert sent["error"] == [500] * N_ERROR
        time.sleep(2)  # the access log flushes every envoy.access_log_flush_ms (100 ms)
        m = tailroute_metrics(stack)
    outcome = {o: m.get(f'tailroute_outcomes_total{{outcome="{o}"}}', 0.0)
               for o in ("ok", "error", "timeout", "cancel")}
    print("\naccounting:", outcome, {k: v for k, v in m.items() if "fail_open" in k
                                      or "errors_total" in k or "decisions_total" in k})
    # Unknown models are served by the default cluster: ok outcomes, counted as fail-open.
    assert m.get('tailroute_fail_open_total{reason="unknown_model"}') == N_UNKNOWN
    assert m.get('tailroute_errors_total{kind="bad_request"}') == N_BAD
    assert outcome["error"] == N_ERROR
    assert outcome["cancel"] == 0 and outcome["timeout"] == 0
    assert outcome["ok"] == N_STREAM + N_UNARY + N_UNKNOWN
    decisions = sum(v for k, v in m.items() if k.startswith("tailroute_decisions_total"))
    assert decisions == N_STREAM + N_UNARY + N_UNKNOWN + N_ERROR
