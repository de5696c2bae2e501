"""Hybrid mode end to end on real parts: Envoy 1.40 sends requests that need a
per-request decision through ext_proc and routes the rest by published weights.

Checked: which path each kind of request takes (the sidecar's access-log
view counts them), a deadline request still gets its upstream timeout, a
spoofed ``x-tailroute-cluster`` is ignored on both paths, and a SIGKILLed
sidecar under load (10 % per-request traffic) fails no request.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from test_integration_native import MODEL, Load, native_config, wait_for

from sidecar.devtools.harness import Stack
from sidecar.shell.bootstrap_native import route_slices
from tests.test_integration_native_envoy import _route_header, _send_lines

pytestmark = pytest.mark.envoy

SLOW_MODEL = "slow-model"


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with Stack() as st:
        ports = {n: st.start_provider(n, "20", "2", seed=i) for i, n in enumerate("ab")}
        slow = st.start_provider("slow", "1500", "2", seed=9)
        cfg = native_config(ports, "hybrid", per_request_classes=["batch"])
        cfg["clusters"].append({"name": "slow", "address": f"127.0.0.1:{slow}",
                                "models": [SLOW_MODEL]})
        cfg["models"].append({"name": SLOW_MODEL, "candidates": ["slow"]})
        st.start_sidecar(st.write_config(cfg))
        st.start_envoy(edit=_route_header)  # x-test-route: the route Envoy took
        yield st


def _post(st: Stack, model: str = MODEL, headers: dict[str, str] | None = None,
          stream: bool = False) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", st.ports["envoy"], timeout=30)
    body = json.dumps({"model": model, "stream": stream, "max_tokens": 2,
                       "messages": [{"role": "user", "content": "hi"}]})
    conn.request("POST", "/v1/chat/completions", body,
                 {"content-type": "application/json", **(headers or {})})
    r = conn.getresponse()
    r.read()
    conn.close()
    return r


def _envoy_view(st: Stack) -> dict[str, Any]:
    view: dict[str, Any] = st.sidecar_state()["envoy"]
    return view


def test_deadline_request_still_gets_its_upstream_timeout(stack: Stack) -> None:
    # The slow upstream needs 1.5 s to its first token. With a 300 ms deadline the
    # per-request path sets Envoy's upstream timeout from it: Envoy answers 504.
    r = _post(stack, SLOW_MODEL, {"x-tailroute-deadline-ms": "300"})
    assert r.status == 504, (r.status, r.getheader("x-envoy-upstream-service-time"))
    # The same request without a deadline is native: the class timeout (30 s) applies.
    assert _post(stack, SLOW_MODEL).status == 200


def _settled(st: Stack) -> dict[str, Any]:
    """The access-log view once no entry arrived for 0.3 s (earlier tests' entries in)."""
    def same() -> dict[str, Any] | None:
        first = _envoy_view(st)
        time.sleep(0.3)
        return first if _envoy_view(st)["entries"] == first["entries"] else None

    view: dict[str, Any] = wait_for("the access log to settle", same)
    return view


def test_each_request_takes_the_path_it_needs(stack: Stack) -> None:
    wait_for("access log stream", lambda: _envoy_view(stack)["log_streams_open"] >= 1)
    before = _settled(stack)
    for _ in range(5):
        assert _post(stack).status == 200  # no per-request need: native
    for headers in ({"x-tailroute-class": "batch"}, {"x-tailroute-step": "critical"},
                    {"x-tailroute-fanout": "4"}):
        assert _post(stack, headers=headers).status == 200  # per request
    explained = _post(stack, headers={"x-tailroute-explain": "1"})
    assert explained.status == 200 and explained.getheader("x-tailroute-explain-result")
    plain = _post(stack, headers={"x-tailroute-class": "interactive"})
    assert plain.getheader("x-tailroute-explain-result") is None
    # A model no slice route serves: the native path's default route, not the sidecar
    # failing open (it was counted fail_open and paged TailrouteEnvoyFailOpen).
    assert _post(stack, model="no-such-model").status == 200

    def counted() -> bool:
        now = _envoy_view(stack)
        return (now["native"] - before["native"] >= 6
                and now["decided"] - before["decided"] >= 4
                and now["native_default"] - before["native_default"] >= 1)

    wait_for("the access log to count both paths", counted)
    now = _envoy_view(stack)
    assert now["native"] - before["native"] == 6
    assert now["decided"] - before["decided"] == 4
    assert now["native_default"] - before["native_default"] == 1
    assert now["fail_open"] == before["fail_open"]


@pytest.mark.parametrize(("classes", "path", "klass"), [
    (["batch"], "decided", "batch"),
    (["batch", "batch"], "native", "interactive"),
    (["interactive", "batch"], "native", "interactive"),
])
def test_a_repeated_class_header_is_no_class_on_either_path(
    stack: Stack, classes: list[str], path: str, klass: str
) -> None:
    """``batch`` is a per-request class. Sent on two lines, the hybrid matcher reads
    ``batch,batch`` (Envoy joins the lines), no per-request class: the native path. Its
    slice routes took the batch route there (Envoy's route header matcher takes any
    line), a batch request that skipped admission; now they read the joined list as
    the classifier does: no class, the default one."""
    assert stack.config is not None
    status, route = _send_lines(stack, [("x-tailroute-class", c) for c in classes], MODEL)
    assert status == 200
    if path == "decided":  # the sidecar's route: tailroute|<cluster>|<class>|...
        assert route.split("|")[2] == klass, route
    else:
        assert route_slices(stack.config)[route].klass == klass, route


@pytest.mark.parametrize("headers", [{}, {"x-tailroute-class": "batch"}])
def test_spoofed_cluster_header_is_ignored_on_both_paths(
    stack: Stack, headers: dict[str, str]
) -> None:
    # "slow" does not serve the model: only a spoofed choice could send it there.
    for _ in range(5):
        r = _post(stack, headers={"x-tailroute-cluster": "slow", **headers})
        assert r.status == 200 and r.getheader("x-fake-provider") in ("a", "b")


def test_sidecar_sigkill_under_load_fails_nothing(stack: Stack) -> None:
    ld = Load(stack.ports["envoy"], 8, every=(10, {"x-tailroute-class": "batch"}))
    result = ld.across(lambda: os.killpg(stack.procs["sidecar"].pid, signal.SIGKILL))
    assert not result.failures, result.failures
    assert set(result.statuses) == {200}, result.statuses
