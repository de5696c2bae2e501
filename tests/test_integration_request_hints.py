"""Client hints to tailroute through the real Envoy (extproc mode): the routing filters
read them, the upstream never sees them (README, "What is read from a request")."""

from __future__ import annotations

import json
import uuid
from typing import Any

import openai
import pytest

from sidecar.devtools.harness import Stack, http_json
from tests.ops_stack import MODEL, PROVIDERS, admin_get, start_stack

pytestmark = pytest.mark.envoy

MSG: list[Any] = [{"role": "user", "content": "hello"}]
HINTS = {
    "x-tailroute-class": "batch",
    "x-tailroute-priority": "1000",
    "x-tailroute-tenant": "acme",
    "x-tailroute-step": "critical",
    "x-tailroute-fanout": "4",
}


def _forwarded(stack: Stack, marker: str) -> dict[str, str]:
    """The x-* headers the provider received with the request marked ``marker``."""
    for name in PROVIDERS:
        recent = http_json(f"http://127.0.0.1:{stack.ports[f'provider:{name}']}/control/requests")
        for r in recent:
            if r["headers"].get("x-test-id") == marker:
                return dict(r["headers"])
    raise AssertionError(f"no provider received {marker}")


@pytest.mark.parametrize("rich", [False, True], ids=["one-message", "rich"])
def test_hints_are_read_then_removed_before_the_upstream(rich: bool) -> None:
    with Stack() as stack:
        start_stack(stack)
        client = openai.OpenAI(base_url=stack.base_url, api_key="t", max_retries=0, timeout=30)
        extra = {**HINTS, **({"x-tailroute-deadline-ms": "20000"} if rich else {})}
        marker = uuid.uuid4().hex
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=MSG, max_tokens=2, extra_headers={**extra, "x-test-id": marker}
        )
        assert raw.parse().choices[0].message.content
        got = _forwarded(stack, marker)
        assert not [h for h in got if h.startswith("x-tailroute-")], got
        assert got["x-request-id"]  # Envoy's own id still goes through
        if rich:  # the deadline became the upstream timeout before it was removed
            assert 0 < int(got["x-envoy-expected-rq-timeout-ms"]) <= 20000
        # ... and the sidecar read them: the decision is the batch class's.
        (last,) = json.loads(admin_get(stack, "/explain?limit=1"))
        assert last["request"]["class"] == "batch" and last["request"]["priority"] == 1000


def _post_lines(stack: Stack, lines: list[tuple[str, str]]) -> int:
    """POST a chat request with header ``lines`` as written (a name may repeat)."""
    import http.client

    body = json.dumps({"model": MODEL, "messages": MSG, "max_tokens": 2}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", stack.ports["envoy"], timeout=20)
    try:
        conn.putrequest("POST", "/v1/chat/completions")
        for name, value in [("content-type", "application/json"),
                            ("content-length", str(len(body))), *lines]:
            conn.putheader(name, value)
        conn.endheaders(body)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def test_a_repeated_hint_is_ignored_on_both_paths() -> None:
    """``x-tailroute-priority: 1`` then ``x-tailroute-priority: 1000``: Envoy joins the
    lines into one request attribute (``1,1000``, ignored) on the one-message path and
    sends them as two header entries on the rich one, where the sidecar kept the last
    (priority 1000). Both now read the list as absent: the class's priority."""
    with Stack() as stack:
        start_stack(stack)
        for rich in (False, True):
            lines = [("x-tailroute-class", "batch"), ("x-tailroute-class", "agentic"),
                     ("x-tailroute-priority", "1"), ("x-tailroute-priority", "1000")]
            if rich:
                lines.append(("x-tailroute-deadline-ms", "20000"))
            assert _post_lines(stack, lines) == 200
            (last,) = json.loads(admin_get(stack, "/explain?limit=1"))
            assert (last["request"]["class"], last["request"]["priority"]) == (
                "interactive", 10), (rich, last["request"])
