"""A provider that fails mid-stream behind its 200 is counted as errors (real Envoy).

The fake providers answer a share of the streams with 200, half the tokens, then an
error event in each shape real servers use (OpenAI, Anthropic, vLLM, the Responses
API's ``error`` and ``response.failed``, a plain-string ``error``, an error object
without a message), then the end of the body. Before the access log read the error
fields Envoy lifts, every one of them was logged ``ok`` with a short e2e; now each is
an ``error`` outcome, counted apart in ``tailroute_stream_errors_total``, and every
complete stream (Responses events with ``"error": null`` included) stays ``ok``.

In native mode Envoy parses the events of ``envoy.usage_sample`` of the streams only
(a quarter by default): a failure on any other stream is logged ``ok``, timed like a
complete one (its TTFT and its e2e up to the failure). The native test checks that
exactly the failures on the parsed share are errors, and all of them with a share of 1.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import openai
import pytest

from sidecar.devtools.harness import Stack, http_json
from sidecar.shell.bootstrap_filters import usage_share
from tests.ops_stack import MODEL, ops_config, start_providers, tailroute_metrics

pytestmark = pytest.mark.envoy

PER_SHAPE = 16
RATE = 0.4  # a shape without any failure in 16 streams: 0.6 ** 16, 3e-4
# Shape -> the API its streams come through.
SHAPES = {
    "openai": "chat",
    "anthropic": "chat",
    "vllm": "chat",
    "responses_error": "responses",
    "response_failed": "responses",
    "plain_string": "chat",
    "error_code": "chat",
}


async def _send(base_url: str, api: str, n: int) -> Counter[str]:
    """``n`` streamed requests; what the client saw of each (``done``: the stream
    ended, whatever it carried; ``raised``: the SDK raised at an error event)."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="t", max_retries=0, timeout=20)
    sem = asyncio.Semaphore(4)

    async def one(i: int) -> str:
        async with sem:
            try:
                if api == "chat":
                    chat = await client.chat.completions.create(
                        model=MODEL,
                        messages=[{"role": "user", "content": f"q{i}"}],
                        max_tokens=8,
                        stream=True,
                    )
                    async for _ in chat:
                        pass
                else:
                    resp = await client.responses.create(
                        model=MODEL, input=f"q{i}", max_output_tokens=8, stream=True
                    )
                    async for _ in resp:
                        pass
                return "done"
            except openai.APIStatusError as exc:
                return str(exc.status_code)
            except openai.APIError:
                return "raised"

    try:
        return Counter(await asyncio.gather(*(one(i) for i in range(n))))
    finally:
        await client.close()


def _midstream_errors(stack: Stack, names: list[str]) -> int:
    return sum(stack.control(n, {})["counters"]["midstream_errors"] for n in names)


def test_a_provider_failing_mid_stream_is_counted_as_errors_not_ok() -> None:
    with Stack() as stack:
        ports = start_providers(stack)
        stack.start_sidecar(stack.write_config(ops_config(ports)))
        stack.start_envoy()
        seen: Counter[str] = Counter()
        failed: dict[str, int] = {}
        for shape, api in SHAPES.items():
            before = _midstream_errors(stack, list(ports))
            for name in ports:
                stack.control(name, {"midstream_error_rate": RATE, "midstream_error_shape": shape})
            seen += asyncio.run(_send(stack.base_url, api, PER_SHAPE))
            failed[shape] = _midstream_errors(stack, list(ports)) - before
        time.sleep(2)  # the access log flushes every envoy.access_log_flush_ms (100 ms)
        m = tailroute_metrics(stack)
        state: dict[str, Any] = stack.sidecar_state()
    total, n_failed = PER_SHAPE * len(SHAPES), sum(failed.values())
    outcome = {
        o: m.get(f'tailroute_outcomes_total{{outcome="{o}"}}', 0.0)
        for o in ("ok", "error", "timeout", "cancel", "lost")
    }
    marked = {k: v for k, v in m.items() if k.startswith("tailroute_stream_errors_total")}
    print("\nmid-stream failures by shape:", failed, "client:", dict(seen))
    print("outcomes:", outcome, "stream errors:", marked)
    assert all(failed.values()), failed  # every shape failed some streams
    assert set(seen) <= {"done", "raised"}, seen  # every answer was a 200
    # Each failed stream is an error outcome, every other one ok: none of them is lost.
    assert outcome["error"] == n_failed
    assert outcome["ok"] == total - n_failed
    assert outcome["timeout"] == outcome["cancel"] == outcome["lost"] == 0
    # ... and told apart from status errors, per upstream cluster.
    assert sum(marked.values()) == n_failed
    assert sum(state["envoy"]["stream_errors"].values()) == n_failed


def _failures(stack: Stack, ports: dict[str, int]) -> list[str]:
    """The request ids (Envoy's ``x-request-id``) of the streams the providers failed."""
    ids = []
    for port in ports.values():
        for r in http_json(f"http://127.0.0.1:{port}/control/requests"):
            if r.get("midstream_error"):
                ids.append(r["request_id"])
    return ids


NATIVE_STREAMS = 48


@pytest.mark.parametrize("sample", [None, 1.0])
def test_native_mode_sees_mid_stream_failures_on_the_streams_envoy_parses(
        sample: float | None) -> None:
    with Stack() as stack:
        ports = start_providers(stack)
        envoy = {} if sample is None else {"usage_sample": sample}
        cfg = stack.write_config(ops_config(ports, routing={"mode": "native"}, envoy=envoy))
        stack.start_sidecar(cfg)
        stack.start_envoy()
        for name in ports:
            stack.control(name, {"midstream_error_rate": RATE, "midstream_error_shape": "openai"})
        seen = asyncio.run(_send(stack.base_url, "chat", NATIVE_STREAMS))
        failed = _failures(stack, ports)
        # The access log flushes every envoy.access_log_flush_ms (100 ms); on a loaded
        # machine the last entries took more than the 2 s this once waited for.
        deadline = time.monotonic() + 20
        while True:
            m = tailroute_metrics(stack)
            outcomes = sum(v for k, v in m.items() if k.startswith("tailroute_outcomes_total"))
            if outcomes >= NATIVE_STREAMS or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        share = usage_share(stack.config) if stack.config is not None else 1.0
    # The usage filter runs on the streams whose id starts with one of the first
    # 16 x share hex digits (bootstrap_filters.usage_sampled).
    digits = "0123456789abcdef"[:round(share * 16)]
    parsed = [i for i in failed if i and i[0].lower() in digits]
    errors = m.get('tailroute_outcomes_total{outcome="error"}', 0.0)
    ok = m.get('tailroute_outcomes_total{outcome="ok"}', 0.0)
    marked = sum(v for k, v in m.items() if k.startswith("tailroute_stream_errors_total"))
    print(f"\nshare {share}: {len(failed)} failed, {len(parsed)} on parsed streams; "
          f"client {dict(seen)}; outcomes ok {ok} error {errors}; stream errors {marked}")
    assert set(seen) <= {"done", "raised"}, seen
    assert failed  # 0.6 ** 48: never in practice
    assert errors == marked == len(parsed)
    # Every other stream, the unparsed failures included, is an ok outcome.
    assert ok == NATIVE_STREAMS - len(parsed)
    if sample == 1.0:
        assert len(parsed) == len(failed)
