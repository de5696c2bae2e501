"""A provider's rate limit that declares its wait, read through the real Envoy: an
upstream 429's (or 503's) ``Retry-After`` (seconds) or ``retry-after-ms`` reaches the sidecar in
the access-log entry (both bootstraps log the two headers) and is recorded per
cluster -- every 429 a client got from that provider, with the wait it declared,
and nothing for tailroute's own admission 429s (those carry a Retry-After too).

Three providers: ``a`` healthy, ``b`` answering every request 429 with
``Retry-After: 7``, ``c`` with ``retry-after-ms: 2500`` and ``retry-after: 9`` (the
milliseconds win). Model ``m`` spreads over all three; ``mb`` and ``mc`` have one
candidate each, so both rate-limited providers are certainly asked. In both routing
modes: per request (extproc) and by published weights (native); and per request with
``b`` and ``c`` answering 503 instead (unavailable, declaring when to come back). Bounded load: 36
requests, at most 4 in flight; about 5 s per mode. A second run (per request) has
``b`` declare an HTTP-date already past (a wait of 0) and ``c`` the text ``soon``
(counted ``retry_after_unreadable``, no wait, nothing else changes).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import openai
import pytest

from sidecar.devtools.harness import Stack
from tests.ops_stack import tailroute_metrics, wait_for

pytestmark = pytest.mark.envoy

ROUNDS = 12  # each round: one request per model
IN_FLIGHT = 4
DECLARED = {"b": 7.0, "c": 2.5}


def _config(ports: dict[str, int], mode: str) -> dict[str, Any]:
    return {
        "routing": {"mode": mode},
        "default_cluster": "a",
        "clusters": [{"name": n, "address": f"127.0.0.1:{ports[n]}",
                      "models": ["m", f"m{n}"]} for n in ("a", "b", "c")],
        "models": [{"name": "m", "candidates": ["a", "b", "c"]},
                   {"name": "mb", "candidates": ["b"]}, {"name": "mc", "candidates": ["c"]}],
        "classes": {"interactive": {"slo": {"metric": "ttft", "percentile": 95,
                                            "budget_ms": 1000, "timeout_ms": 10000},
                                    "priority": 10}},
    }


async def _load(base_url: str) -> Counter[tuple[str, int]]:
    """(provider, status) of every answer a provider sent; tailroute's and Envoy's own
    answers carry no ``x-fake-provider`` and are counted as provider ``-``."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="t", max_retries=0, timeout=10)
    seen: Counter[tuple[str, int]] = Counter()
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one(model: str, stream: bool) -> None:
        async with gate:
            try:
                raw = await client.chat.completions.with_raw_response.create(
                    model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                    stream=stream)
                if stream:
                    async for _ in raw.parse():
                        pass
                seen[(raw.headers.get("x-fake-provider", "-"), raw.status_code)] += 1
            except openai.APIStatusError as exc:
                seen[(exc.response.headers.get("x-fake-provider", "-"),
                      exc.response.status_code)] += 1

    jobs = [one(model, i % 2 == 0) for i in range(ROUNDS) for model in ("mb", "mc", "m")]
    await asyncio.wait_for(asyncio.gather(*jobs), timeout=60)
    await client.close()
    return seen


@pytest.mark.parametrize(("mode", "status"), [("extproc", 429), ("native", 429),
                                              ("extproc", 503)])
def test_an_upstream_429s_declared_wait_is_recorded(mode: str, status: int) -> None:
    """A 503's Retry-After (unavailable for a while, RFC 9110) is read as a 429's."""
    with Stack() as st:
        limited = ["--error-rate", "1", "--error-status", str(status)]
        ports = {"a": st.start_provider("a", "5", "1", seed=1),
                 "b": st.start_provider("b", "5", "1", seed=2,
                                        extra=[*limited, "--retry-after", "7"]),
                 "c": st.start_provider("c", "5", "1", seed=3,
                                        extra=[*limited, "--retry-after-ms", "2500",
                                               "--retry-after", "9"])}
        st.start_sidecar(st.write_config(_config(ports, mode)))
        st.start_envoy()
        seen = asyncio.run(_load(st.base_url))
        limited_429s = {n: seen[(n, status)] for n in DECLARED}

        def recorded() -> dict[str, Any] | None:
            waits: dict[str, Any] = st.sidecar_state()["envoy"]["retry_after"]
            counts = {n: waits.get(n, {}).get("count", 0) for n in DECLARED}
            return waits if counts == limited_429s else None

        # The entries come with the next access-log flush (a readiness wait).
        waits = wait_for(recorded, "the 429s' entries", timeout_s=15)
        metrics = tailroute_metrics(st)
        state = st.sidecar_state()

    print(f"{mode}: answers {dict(seen)}; recorded {waits}")
    # Each was asked (mb, mc): push-back may defer some of their requests with
    # tailroute's own 429 (provider "-"), which the counts above leave out.
    assert all(n >= 1 for n in limited_429s.values()), seen
    assert not any(seen[(n, 200)] for n in DECLARED), seen
    for name, wait in DECLARED.items():
        assert waits[name] == {"count": limited_429s[name], "last_s": wait, "max_s": wait,
                               "mean_s": wait}
        assert metrics[f'tailroute_retry_after_total{{cluster="{name}"}}'] == limited_429s[name]
        assert metrics[f'tailroute_retry_after_seconds_total{{cluster="{name}"}}'] == (
            pytest.approx(wait * limited_429s[name]))
    assert "a" not in waits  # its 200s declared nothing
    assert not any(k.startswith("tailroute_errors_total") and "retry_after" in k
                   for k in metrics)
    assert state["envoy"]["fail_open"] == 0
    # A declared wait holds the cluster (sidecar.core.pushback); it never cuts the
    # concurrency limit, however little the cluster held when refused.
    for name in DECLARED:
        cluster = state["clusters"][name]
        assert cluster["concurrency_limit"] == cluster["max_concurrency"], cluster


def test_an_http_date_and_garbage_through_envoy() -> None:
    """``b`` declares a date already past (a wait of 0), ``c`` text that is no wait:
    its 429s are counted unreadable and nothing else changes (per request only: the
    entry is read by the same code in both modes)."""
    with Stack() as st:
        limited = ["--error-rate", "1", "--error-status", "429"]
        ports = {"a": st.start_provider("a", "5", "1", seed=1),
                 "b": st.start_provider("b", "5", "1", seed=2, extra=[
                     *limited, "--retry-after", "Wed, 21 Oct 2015 07:28:00 GMT"]),
                 "c": st.start_provider("c", "5", "1", seed=3,
                                        extra=[*limited, "--retry-after", "soon"])}
        st.start_sidecar(st.write_config(_config(ports, "extproc")))
        st.start_envoy()
        seen = asyncio.run(_load(st.base_url))
        key = 'tailroute_errors_total{kind="retry_after_unreadable"}'

        def recorded() -> dict[str, float] | None:
            m = tailroute_metrics(st)
            done = (m.get('tailroute_retry_after_total{cluster="b"}') == seen[("b", 429)]
                    and m.get(key) == seen[("c", 429)])
            return m if done else None

        metrics = wait_for(recorded, "the 429s' entries", timeout_s=15)
        state = st.sidecar_state()

    print(f"answers {dict(seen)}; recorded {state['envoy']['retry_after']}")
    assert seen[("b", 429)] >= 1 and seen[("c", 429)] >= 1, seen
    assert state["envoy"]["retry_after"] == {
        "b": {"count": seen[("b", 429)], "last_s": 0.0, "max_s": 0.0, "mean_s": 0.0}}
    assert metrics['tailroute_retry_after_seconds_total{cluster="b"}'] == 0.0
    assert state["envoy"]["fail_open"] == 0


def test_a_429_without_a_wait_through_native_routing_is_a_quota_not_a_limit() -> None:
    """Native routing counts no requests in flight, so its 429s come back "holding
    nothing": a quota's (sidecar.core.pushback). They hold the cluster with a backoff
    and leave its concurrency limit alone -- one such 429 used to set it to 1 until a
    restart, after which the weights kept the cluster empty."""
    with Stack() as st:
        limited = ["--error-rate", "1", "--error-status", "429"]
        ports = {"a": st.start_provider("a", "5", "1", seed=1),
                 "b": st.start_provider("b", "5", "1", seed=2, extra=limited),
                 "c": st.start_provider("c", "5", "1", seed=3, extra=limited)}
        st.start_sidecar(st.write_config(_config(ports, "native")))
        st.start_envoy()
        seen = asyncio.run(_load(st.base_url))

        def recorded() -> dict[str, Any] | None:
            clusters: dict[str, Any] = st.sidecar_state()["clusters"]
            return clusters if all(clusters[n]["quota_429"] for n in DECLARED) else None

        clusters = wait_for(recorded, "the 429s' entries", timeout_s=15)
        state = st.sidecar_state()

    print(f"answers {dict(seen)}; clusters {clusters}")
    assert seen[("b", 429)] >= 1 and seen[("c", 429)] >= 1, seen
    for name in DECLARED:
        assert clusters[name]["concurrency_limit"] == clusters[name]["max_concurrency"]
    assert state["envoy"]["retry_after"] == {}  # none declared a wait
    assert state["envoy"]["fail_open"] == 0
