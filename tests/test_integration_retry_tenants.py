"""Retry budgets per tenant through the real Envoy and the openai client.

A client that marks every request a retry (``x-stainless-retry-count: 1``, the OpenAI
SDKs' own counter) spends its tenant's budget only: after its floor it gets 503
``retry_budget`` naming the tenant, and another tenant's real retries still pass.
Before, the first tenant spent every route's budget and the second one's retries
were refused (sidecar.core.retry_budget, "Per tenant as well")."""

from __future__ import annotations

import openai
import pytest

from sidecar.devtools.harness import Stack
from tests.ops_stack import MODEL, start_stack

pytestmark = pytest.mark.envoy

# Long sub-windows: the budgets' counts decay over six of them, so not within the test.
STATS = {"subwindow_s": 60.0, "subwindows": 5, "min_samples": 3}


def _send(client: openai.OpenAI, tenant: str, retry: int, n: int) -> list[str]:
    """``n`` chat requests of ``tenant``; each answer's status, or its refusal's reason."""
    out = []
    for i in range(n):
        headers = {"x-tailroute-tenant": tenant, "x-stainless-retry-count": str(retry)}
        try:
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"{tenant} {i}"}],
                max_tokens=2, extra_headers=headers)
            out.append("200")
        except openai.APIStatusError as exc:
            assert exc.status_code == 503, exc
            out.append(exc.response.headers.get("x-tailroute-reason", "?"))
    return out


def test_one_tenants_marked_retries_do_not_spend_anothers_budget() -> None:
    with Stack() as stack:
        start_stack(stack, stats=STATS, admission={"retry_budget_ratio": 0.2})
        client = openai.OpenAI(base_url=stack.base_url, api_key="t", max_retries=0,
                               timeout=30)
        try:
            assert _send(client, "good", 0, 9) == ["200"] * 9  # first attempts
            noisy = _send(client, "noisy", 1, 12)
            assert noisy == ["200"] * 3 + ["retry_budget"] * 9  # its own floor, no more
            assert _send(client, "good", 1, 3) == ["200"] * 3  # its retries still pass
            counters = stack.sidecar_state()["counters"]
            assert int(counters["admission_reason:retry_budget"]) == 9
        finally:
            client.close()
