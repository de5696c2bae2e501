"""Envoy's circuit breaker on a provider's cluster is never the tighter limit.

tailroute keeps each route within the provider's ``max_concurrency``; the rendered
breaker (``bootstrap.upstream_max_requests``) sits well above it. With Envoy's
defaults (1,024 connections and 1,024 pending requests per cluster over HTTP/1.1),
Envoy itself answered 503 (``upstream_overflow``, counted as the route's error)
beyond 2,048 requests in flight, whatever the provider was declared to take. Here
a real Envoy, rendered from a config declaring 1,000, holds more than that open to
one slow provider: every request is answered 200 and nothing overflows.
"""

from __future__ import annotations

import asyncio

import pytest

from sidecar.devtools.bench_load import envoy_counters
from sidecar.devtools.harness import Stack
from sidecar.devtools.http_load import _read_response, request_bytes
from sidecar.shell.bootstrap import upstream_max_requests

IN_FLIGHT = 2_100  # beyond Envoy's default 1,024 connections + 1,024 pending
TTFT = "8000:8000"  # long enough that every request is open at once
READ_TIMEOUT_S = 120.0  # bound on each response (a 4-token answer after the TTFT)


def _config(provider_port: int) -> dict[str, object]:
    return {
        "default_cluster": "p",
        "clusters": [{"name": "p", "address": f"127.0.0.1:{provider_port}",
                      "models": ["bench-model"], "max_concurrency": 1_000}],
        "models": [{"name": "bench-model", "candidates": ["p"]}],
    }


@pytest.mark.parametrize(("clusters", "max_concurrency", "queue_max"), [
    (1, 1_000_000, 1_000_000),  # the largest one cluster may declare
    (2_000, 1_000_000, 0),  # their sum, x 4, would not fit: the sidecar's breaker is capped
    (3, 64, 64),
])
def test_every_rendered_breaker_fits_envoys_uint32(clusters: int, max_concurrency: int,
                                                   queue_max: int) -> None:
    from sidecar.core.config import parse_config
    from sidecar.shell.bootstrap import UINT32_MAX, render_bootstrap

    data = {
        "default_cluster": "p0",
        "clusters": [{"name": f"p{i}", "address": f"127.0.0.1:{9000 + i % 1000}",
                      "models": ["m"], "max_concurrency": max_concurrency}
                     for i in range(clusters)],
        "models": [{"name": "m", "candidates": ["p0"]}],
        "admission": {"queue_max": queue_max},
    }
    boot = render_bootstrap(parse_config(data, "t.yaml"), grpc_target="127.0.0.1:50051")
    limits = [v for c in boot["static_resources"]["clusters"]
              for t in c.get("circuit_breakers", {}).get("thresholds", [])
              for k, v in t.items() if k.startswith("max_")]
    assert limits and all(0 < v <= UINT32_MAX for v in limits), max(limits)


async def _burst(port: int) -> list[int | str]:
    payload = request_bytes(stream=False, tokens=4)

    async def one() -> int | str:
        writer = None
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(payload)
            return await asyncio.wait_for(_read_response(reader), READ_TIMEOUT_S)
        except (OSError, asyncio.IncompleteReadError, TimeoutError) as e:
            return type(e).__name__
        finally:
            if writer is not None:
                writer.close()

    return list(await asyncio.gather(*(one() for _ in range(IN_FLIGHT))))


@pytest.mark.envoy
def test_envoy_lets_a_provider_have_more_than_its_default_breaker() -> None:
    with Stack() as st:
        pport = st.start_provider("p", ttft_ms=TTFT, tpot_ms="1:1",
                                  extra=["--max-tokens", "4"])
        st.write_config(_config(pport))
        assert st.config is not None
        assert upstream_max_requests(st.config.clusters[0]) > IN_FLIGHT
        port = st.start_envoy(with_sidecar=False)
        statuses = asyncio.run(_burst(port))
        stats = envoy_counters(st.ports["envoy_admin"])
    assert [s for s in statuses if s != 200] == []
    assert stats.get("cluster.p.upstream_rq_pending_overflow", 0) == 0
    assert stats.get("cluster.p.upstream_cx_overflow", 0) == 0
