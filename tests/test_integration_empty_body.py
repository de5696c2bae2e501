"""An empty POST is one request however its emptiness is framed: ``content-length: 0``
or a chunked body with no bytes (the terminal chunk alone). Through the real Envoy,
on the one-message and the rich path, both go to the default route and its upstream
answers for itself, as any request without a body (README, the answers table)."""

from __future__ import annotations

import http.client
import json

import pytest

from sidecar.devtools.harness import Stack
from tests.ops_stack import start_stack

pytestmark = pytest.mark.envoy

_FRAMINGS = ("content-length", "chunked")
_PATHS = {"one message": {}, "rich": {"x-tailroute-deadline-ms": "9000"}}


def _empty_post(port: int, framing: str, extra: dict[str, str]) -> tuple[int, str | None, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        conn.putrequest("POST", "/v1/chat/completions")
        conn.putheader("content-type", "application/json")
        for k, v in extra.items():
            conn.putheader(k, v)
        if framing == "chunked":
            conn.putheader("transfer-encoding", "chunked")
            conn.endheaders()
            conn.send(b"0\r\n\r\n")  # the terminal chunk: a body of no bytes
        else:
            conn.putheader("content-length", "0")
            conn.endheaders()
        resp = conn.getresponse()
        return resp.status, resp.getheader("x-fake-provider"), resp.read()
    finally:
        conn.close()


def test_an_empty_post_gets_one_answer_whatever_its_framing() -> None:
    with Stack() as stack:
        start_stack(stack)
        assert stack.config is not None
        default = stack.config.default_cluster
        answers = {(path, framing): _empty_post(stack.ports["envoy"], framing, extra)
                   for path, extra in _PATHS.items() for framing in _FRAMINGS}
        # The default cluster's upstream answers each (the fake provider refuses a body
        # that is not JSON). The chunked one on the one-message path got the sidecar's
        # own 400 instead, from no upstream: Envoy sends that filter an empty chunked
        # body, and never a content-length: 0 one.
        for (path, framing), (status, provider, body) in answers.items():
            assert (status, provider) == (400, default), (path, framing, body)
        assert len({body for _, _, body in answers.values()}) == 1
        state = stack.sidecar_state()
        assert state["counters"].get("decision:not_llm", 0) >= 1
        assert json.loads(next(iter(answers.values()))[2])  # the upstream's own error
