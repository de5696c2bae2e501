"""``hints:`` through the real Envoy. extproc mode: the class comes from a header an
in-Envoy "authentication" filter sets, a caller's priority and explain are not
believed, and a caller cannot forge the trusted header. native mode: the slice routes
read the class from the trusted header (README, "Headers and trust")."""

from __future__ import annotations

import http.client
import json
from typing import Any

import pytest

from sidecar.devtools.bench_native import RtdsThread
from sidecar.devtools.harness import Stack, free_port
from sidecar.shell.bootstrap_native import route_slices
from tests.ops_stack import MODEL, admin_get, ops_config, start_providers
from tests.test_integration_native_envoy import _route_header, _send_lines

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


@pytest.mark.parametrize(("headers", "klass"), [
    ({"x-auth-class": "agentic", "x-tailroute-class": "batch"}, "agentic"),
    ({"x-tailroute-class": "batch"}, "interactive"),  # removed at the listener
    ({"x-auth-class": "batch", "x-tailroute-priority": "1000"}, "batch"),
])
def test_native_routes_take_the_class_from_the_trusted_header(
    native_hinted: Stack, headers: dict[str, str], klass: str
) -> None:
    st = native_hinted
    assert st.config is not None
    status, route = _send_lines(st, list(headers.items()), MODEL)
    assert status == 200 and route_slices(st.config)[route].klass == klass, route


@pytest.fixture(scope="module")
def native_hinted() -> Any:
    """Native mode, no sidecar (the RTDS service in this process): the class from
    x-auth-class, set by a proxy in front (the test), the caller's class not believed."""
    with Stack() as st:
        ports = {n: st.start_provider(n, "1", "1", seed=i) for i, n in enumerate("ab")}
        st.write_config({
            "clusters": [{"name": n, "address": f"127.0.0.1:{p}", "models": [MODEL]}
                         for n, p in ports.items()],
            "models": [{"name": MODEL, "candidates": ["a", "b"]}],
            "routing": {"mode": "native"},
            "hints": {"class": {"header": "x-auth-class", "set_by": "front"},
                      "priority": "ignore"},
        })
        rtds = RtdsThread(free_port())
        try:
            st.start_envoy(sidecar_port=rtds.port, edit=_route_header)
            yield st
        finally:
            rtds.close()
