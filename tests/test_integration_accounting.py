"""Counters reconcile with what was sent (issue 13, item 4) — prepared for stage 2.

Sends a known mix through the real Envoy and compares the sidecar's counters with it:
streamed and unary requests served ok, upstream errors (500), unknown models
(default route), invalid bodies (400), optional steps skipped (412).

Marked xfail until the one-exchange data path lands: today the observing stream's
deferred close and the unordered route/observe streams turn some complete 200s into
``cancel`` (and a restart adds more), so ``outcomes{ok}`` can fall short of the 200s
sent. What changes with the new path: outcomes come from Envoy's access log (one
record per request), so every line below must hold exactly; drop the xfail then.
"""

from __future__ import annotations

import asyncio
import http.client
import time

import openai
import pytest

from sidecar.devtools.harness import Stack
from tests.ops_stack import MODEL, admin_get, ops_config, start_providers

pytestmark = pytest.mark.envoy

N_STREAM, N_UNARY, N_ERROR, N_UNKNOWN, N_BAD = 30, 20, 10, 15, 5


def _metrics(stack: Stack) -> dict[str, float]:
    out = {}
    for line in admin_get(stack, "/metrics").splitlines():
        if line.startswith("tailroute_") and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


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


@pytest.mark.xfail(reason="stage 2: exact outcome accounting arrives with the one-exchange "
                          "data path (access-log outcomes)", strict=False)
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
        time.sleep(7)  # past Envoy's deferred close of observing streams
        m = _metrics(stack)
    outcome = {o: m.get(f'tailroute_outcomes_total{{outcome="{o}"}}', 0.0)
               for o in ("ok", "error", "timeout", "cancel")}
    print("\naccounting:", outcome, {k: v for k, v in m.items() if "fail_open" in k
                                      or "errors_total" in k or "decisions_total" in k})
    # The unknown-model requests are served by the default cluster unobserved... or observed:
    # either way they are not errors, and each reached the sidecar once.
    assert m.get('tailroute_fail_open_total{reason="unknown_model"}') == N_UNKNOWN
    assert m.get('tailroute_errors_total{kind="bad_request"}') == N_BAD
    assert outcome["error"] == N_ERROR
    assert outcome["cancel"] == 0 and outcome["timeout"] == 0
    assert outcome["ok"] == N_STREAM + N_UNARY + N_UNKNOWN
    decisions = sum(v for k, v in m.items() if k.startswith("tailroute_decisions_total"))
    assert decisions == N_STREAM + N_UNARY + N_UNKNOWN + N_ERROR
