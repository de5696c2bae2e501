"""Every routing mode on the real Envoy 1.40: what the class timeout cuts.

A class's ``slo.timeout_ms`` bounds an unstreamed answer and a stream's silences
(before the first byte, between events), never the length of a steady stream: that
is the client's ``max_tokens``. Each model here has one provider, so the route is
certain: ``long`` streams steadily for about twice the class timeout, ``silent``
never sends a first token within it. ``native`` routes on slice routes, ``extproc``
on the sidecar's per-request routes (the one-message path; the rich path with a
caller's deadline, which does cap the whole answer, is here too), ``hybrid`` on
slice routes but for requests with a deadline.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from sidecar.devtools.harness import Stack, http_json
from tests.ops_stack import wait_for

pytestmark = pytest.mark.envoy

TIMEOUT_MS = 2_000
TOKENS = 200  # at 20 ms each: a stream of about 4 s, twice the class timeout


@pytest.fixture(scope="module", params=["native", "extproc", "hybrid"])
def stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    with Stack() as st:
        long = st.start_provider("long", "20", "20", extra=["--max-tokens", str(TOKENS)])
        silent = st.start_provider("silent", "60000", "20")
        st.start_sidecar(st.write_config({
            "clusters": [{"name": "long", "address": f"127.0.0.1:{long}", "models": ["m-long"]},
                         {"name": "silent", "address": f"127.0.0.1:{silent}",
                          "models": ["m-silent"]}],
            "models": [{"name": "m-long", "candidates": ["long"]},
                       {"name": "m-silent", "candidates": ["silent"]}],
            "classes": {"interactive": {"slo": {"metric": "ttft", "percentile": 95,
                                                "budget_ms": 1_000,
                                                "timeout_ms": TIMEOUT_MS}}},
            "routing": {"mode": request.param, "publish_interval_s": 0.5},
        }))
        st.start_envoy()
        yield st


def _stream(st: Stack, model: str, stream: bool = True,
            headers: dict[str, str] | None = None) -> tuple[int, bytes, str | None]:
    """One request through Envoy, read to its end (or to the connection's end)."""
    body = json.dumps({"model": model, "stream": stream, "max_tokens": TOKENS,
                       "messages": [{"role": "user", "content": "hi"}]})
    conn = http.client.HTTPConnection("127.0.0.1", st.ports["envoy"], timeout=30)
    try:
        conn.request("POST", "/v1/chat/completions", body,
                     {"content-type": "application/json", **(headers or {})})
        r = conn.getresponse()
        data = b""
        try:
            while chunk := r.read1(65536):
                data += chunk
        except http.client.IncompleteRead as exc:  # the stream was cut
            data += exc.partial
        return r.status, data, r.getheader("x-fake-provider")
    finally:
        conn.close()


def test_a_stream_longer_than_the_class_timeout_is_not_cut_nor_held_against_its_cluster(
    stack: Stack,
) -> None:
    # Three at once: before, each was cut at the route timeout (200, no [DONE]) and
    # the sidecar read the three as a run of hard failures and quarantined the route.
    got: list[tuple[int, bytes, str | None]] = []
    threads = [threading.Thread(target=lambda: got.append(_stream(stack, "m-long")))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(got) == 3
    for status, data, who in got:
        assert (status, who) == (200, "long")
        assert data.rstrip().endswith(b"data: [DONE]"), data[-200:]
    state = stack.sidecar_state()
    assert not [t for t in state["transitions"] if t["cluster"] == "long"], state["transitions"]


def test_a_silent_provider_is_still_cut_by_the_class_timeout(stack: Stack) -> None:
    for stream in (True, False):
        status, data, _ = _stream(stack, "m-silent", stream)  # would answer after 60 s
        assert b"[DONE]" not in data and b"choices" not in data, (status, data[:200])
    counters = _envoy_counters(stack)
    # the stream by the route's idle timeout, the unstreamed answer by its route timeout
    # (native: the slice route's; extproc: the sidecar's per-request timeout, or the
    # route's idle timeout on the one-message path, which sends none: either cuts it)
    assert counters.get("http.tailroute.downstream_rq_idle_timeout", 0) >= 1, counters
    assert (counters.get("cluster.silent.upstream_rq_timeout", 0)
            + counters.get("http.tailroute.downstream_rq_idle_timeout", 0)) >= 2, counters


def _envoy_counters(stack: Stack) -> dict[str, Any]:
    stats: Any = http_json(f"http://127.0.0.1:{stack.ports['envoy_admin']}/stats?format=json")
    return {s["name"]: s.get("value") for s in stats["stats"] if "name" in s}


def test_a_callers_deadline_caps_a_stream_and_is_not_held_against_its_cluster(
    stack: Stack,
) -> None:
    """A deadline is a whole-answer budget: longer than the class timeout, the steady
    stream fits in it; shorter than the stream, Envoy cuts it there (the per-request
    path, which a deadline selects in every mode but native), and that is the caller's
    giving up, not the route failing."""
    status, data, who = _stream(stack, "m-long", headers={"x-tailroute-deadline-ms": "20000"})
    assert (status, who) == (200, "long")
    assert data.rstrip().endswith(b"data: [DONE]"), data[-200:]
    assert stack.config is not None
    if stack.config.routing.mode == "native":
        return  # native ignores the header: no per-request path
    for _ in range(3):  # three cuts in a row on one route used to eject it
        status, data, _ = _stream(stack, "m-long", headers={"x-tailroute-deadline-ms": "1000"})
        assert b"[DONE]" not in data, data[-200:]
    state = stack.sidecar_state()
    assert not [t for t in state["transitions"] if t["cluster"] == "long"], state["transitions"]


def _start_half_second_class(st: Stack, name: str, port: int, mode: str,
                             net_ms: int | None = None) -> None:
    """The sidecar and Envoy for one provider ``name`` serving model ``m-<name>`` in an
    interactive class with a 500 ms timeout: its streams' safety net is at 10 s, or
    ``net_ms`` (``slo.max_stream_ms``)."""
    slo = {"metric": "ttft", "percentile": 95, "budget_ms": 250, "timeout_ms": 500,
           **({} if net_ms is None else {"max_stream_ms": net_ms})}
    st.start_sidecar(st.write_config({
        "clusters": [{"name": name, "address": f"127.0.0.1:{port}", "models": [f"m-{name}"]}],
        "models": [{"name": f"m-{name}", "candidates": [name]}],
        "classes": {"interactive": {"slo": slo}},
        "routing": {"mode": mode, "publish_interval_s": 0.5},
    }))
    st.start_envoy()


@pytest.mark.parametrize("mode", ["extproc", "native"])
def test_a_stream_that_never_ends_is_cut_at_its_safety_net(mode: str) -> None:
    """A provider that keeps a stream open with ``: keep-alive`` comments and never
    sends a token resets the idle timeout for ever: only the stream routes'
    ``max_stream_duration`` (20 class timeouts: 10 s here) ends it, and the route is
    charged with a timeout."""
    with Stack() as st:
        kept = st.start_provider("kept", "60000", "20")
        st.control("kept", {"waiting_comment_ms": 100})
        _start_half_second_class(st, "kept", kept, mode)
        status, data, _ = _stream(st, "m-kept")  # the client would wait 30 s
        assert b"[DONE]" not in data and b"choices" not in data, (status, data[:200])
        counters = _envoy_counters(st)
        assert counters.get("http.tailroute.downstream_rq_max_duration_reached", 0) == 1, counters
        assert counters.get("http.tailroute.downstream_rq_idle_timeout", 0) == 0, counters
        # Its entry (200, no flag, details max_duration_timeout) is the route's timeout;
        # it read as ok before.
        wait_for(lambda: st.sidecar_state()["counters"].get("outcome:timeout"),
                 "the cut stream's outcome", timeout_s=30)


@pytest.mark.parametrize("mode", ["extproc", "hybrid"])
def test_a_callers_deadline_longer_than_the_safety_net_is_the_streams_cap(mode: str) -> None:
    """The safety net (20 class timeouts: 10 s here) is for streams nobody bounds. A
    caller's deadline bounds its stream: a steady 14 s stream with a 20 s deadline
    runs to its end, while the same stream without a deadline is cut at 10 s. The
    route's first streams are sampled (``timing.token_sample_min``), so this is the
    sampled route's bounded variant."""
    with Stack() as st:
        steady = st.start_provider("steady", "20", "70", extra=["--max-tokens", str(TOKENS)])
        _start_half_second_class(st, "steady", steady, mode)
        with_deadline = _stream(st, "m-steady", headers={"x-tailroute-deadline-ms": "20000"})
        assert with_deadline[0] == 200
        assert with_deadline[1].rstrip().endswith(b"data: [DONE]"), with_deadline[1][-200:]
        assert _envoy_counters(st).get("http.tailroute.downstream_rq_max_duration_reached",
                                       0) == 0
        _status, data, _ = _stream(st, "m-steady")
        assert b"[DONE]" not in data, data[-200:]
        assert _envoy_counters(st).get("http.tailroute.downstream_rq_max_duration_reached",
                                       0) == 1


@pytest.mark.parametrize("mode", ["extproc", "native"])
def test_a_class_with_its_own_safety_net_lets_its_long_streams_finish(mode: str) -> None:
    """``slo.max_stream_ms`` 20 s instead of 20 class timeouts (10 s): the same steady
    14 s stream, without a deadline, runs to its end."""
    with Stack() as st:
        steady = st.start_provider("steady", "20", "70", extra=["--max-tokens", str(TOKENS)])
        _start_half_second_class(st, "steady", steady, mode, net_ms=20_000)
        status, data, _ = _stream(st, "m-steady")
        assert status == 200 and data.rstrip().endswith(b"data: [DONE]"), data[-200:]
        assert _envoy_counters(st).get("http.tailroute.downstream_rq_max_duration_reached",
                                       0) == 0
