"""A caller's short deadline through the real Envoy: the per-request upstream timeout
(x-envoy-upstream-rq-timeout-ms) passes, Envoy answers 504 and logs an upstream request
timeout. That is the caller's deadline, not a failing route: no route is ejected
(sidecar.core.envoy_log.at_callers_deadline)."""

from __future__ import annotations

import json

import openai
import pytest

from sidecar.devtools.harness import Stack
from tests.ops_stack import MODEL, PROVIDERS, start_stack, wait_for

pytestmark = pytest.mark.envoy

N = 12  # three routes; three timeouts in a row on one route used to quarantine it


def _counters(stack: Stack) -> dict[str, int]:
    return {k: int(v) for k, v in stack.sidecar_state()["counters"].items()}


def _all_judged(stack: Stack) -> dict[str, int] | None:
    """The counters once all N requests have their outcome (a cancel or a timeout)."""
    c = _counters(stack)
    return c if c.get("outcome:cancel", 0) + c.get("outcome:timeout", 0) >= N else None


def test_timeouts_at_the_callers_deadline_eject_no_route() -> None:
    with Stack() as stack:
        start_stack(stack)
        for p in PROVIDERS:  # every provider holds what it gets: no answer within 200 ms
            stack.control(p, {"hold": True})
        try:
            client = openai.OpenAI(base_url=stack.base_url, api_key="t", max_retries=0,
                                   timeout=30)
            for i in range(N):
                with pytest.raises(openai.APIStatusError) as info:
                    client.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": f"hi {i}"}],
                        max_tokens=2, extra_headers={"x-tailroute-deadline-ms": "200"})
                assert info.value.status_code == 504
            # The entries reach the sidecar with Envoy's access-log flush: wait for all.
            c = wait_for(lambda: _all_judged(stack), f"{N} outcomes of the held requests",
                         timeout_s=60)
            state = stack.sidecar_state()
            assert c.get("outcome:timeout", 0) == 0, c
            assert state["transitions"] == [], json.dumps(state["transitions"])
            assert {v["state"] for v in state["clusters"].values()} == {"healthy"}
        finally:
            for p in PROVIDERS:
                stack.control(p, {"hold": False})
