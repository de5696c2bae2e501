"""``hints:`` through the real Envoy (extproc mode): the class comes from a header an
in-Envoy "authentication" filter sets, a caller's priority and explain are not
believed, and a caller cannot forge the trusted header (README, "Headers and trust")."""

from __future__ import annotations

import http.client
import json
from typing import Any

import pytest

from sidecar.devtools.harness import Stack
from tests.ops_stack import MODEL, admin_get, ops_config, start_providers

pytestmark = pytest.mark.envoy

HINTS = {"class": {"header": "x-auth-class"}, "priority": "ignore", "explain": "ignore"}
CLAIM = "x-test-claim"  # what the stand-in for jwt_authn's claim_to_headers copies


def _authenticate(boot: dict[str, Any]) -> None:
    """A filter first in the chain (before tailroute.strip_client_routing), where
    jwt_authn usually is, doing what its ``claim_to_headers`` does: x-auth-class set
    from the (test's) claim."""
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"]
    auth = {"name": "test.auth", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3"
                 ".HeaderMutation",
        "mutations": {"request_mutations": [{"append": {
            "header": {"key": "x-auth-class", "value": f"%REQ({CLAIM})%"},
            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}}]}}}
    hcm["http_filters"].insert(0, auth)


def _post(stack: Stack, headers: dict[str, str]) -> http.client.HTTPResponse:
    body = json.dumps({"model": MODEL, "max_tokens": 2,
                       "messages": [{"role": "user", "content": "hi"}]})
    conn = http.client.HTTPConnection("127.0.0.1", stack.ports["envoy"], timeout=20)
    conn.request("POST", "/v1/chat/completions", body,
                 {"content-type": "application/json", **headers})
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp


def _last(stack: Stack) -> tuple[str, int]:
    (last,) = json.loads(admin_get(stack, "/explain?limit=1"))
    return last["request"]["class"], last["request"]["priority"]


def _ignored(stack: Stack) -> float:
    for line in admin_get(stack, "/metrics").splitlines():
        if line.startswith('tailroute_errors_total{kind="hint_ignored"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


CLAIMS = {"x-tailroute-class": "batch", "x-tailroute-priority": "1000"}


@pytest.mark.parametrize(("headers", "want"), [
    # authenticated as agentic: its class and priority, whatever the caller claims
    ({CLAIM: "agentic", **CLAIMS}, ("agentic", 8)),
    ({CLAIM: "agentic", **CLAIMS, "x-tailroute-deadline-ms": "20000"}, ("agentic", 8)),
    # a forged trusted header is removed at the listener: the default class
    ({"x-auth-class": "batch", **CLAIMS}, ("interactive", 10)),
    ({"x-auth-class": "batch", **CLAIMS, "x-tailroute-deadline-ms": "20000"},
     ("interactive", 10)),
], ids=["one-message", "rich", "forged", "forged-rich"])
def test_only_the_authenticated_class_counts(hinted: Stack, headers: dict[str, str],
                                             want: tuple[str, int]) -> None:
    before = _ignored(hinted)
    assert _post(hinted, headers).status == 200
    assert _last(hinted) == want
    assert _ignored(hinted) == before + 1


def test_an_ignored_explain_takes_the_plain_path(hinted: Stack) -> None:
    before = _ignored(hinted)
    resp = _post(hinted, {"x-tailroute-explain": "1"})
    assert resp.status == 200 and resp.getheader("x-tailroute-explain-result") is None
    assert _last(hinted) == ("interactive", 10)
    assert _ignored(hinted) == before + 1


@pytest.fixture(scope="module")
def hinted() -> Any:
    with Stack() as stack:
        ports = start_providers(stack)
        path = stack.write_config(ops_config(ports, hints=HINTS))
        stack.start_sidecar(path)
        stack.start_envoy(edit=_authenticate)
        yield stack
