"""The observing stream with bodies it cannot read: nothing invented, everything counted.

A sampled response whose body is compressed (``content-encoding: gzip`` and the
like; the sidecar does not decompress) or is not an event stream cannot yield a
first token. Before, the observer fed compressed bytes to the SSE parser until
the response ended, found nothing and counted nothing. Now it gives up at the
headers, reports no offset (the request keeps its access-log timing) and counts
the sample by result; ``/state`` and ``tailroute_first_token_samples_total`` show it.
"""

from __future__ import annotations

import gzip

import pytest

from sidecar.ops.metrics import build_registry
from sidecar.shell.observe import ObserveStream
from sidecar.shell.outcomes import OutcomeFeed
from tests.streamharness import chat_request, metadata, observe_msg, routed_cluster, token
from tests.test_extproc import SLICE, entry, fast, make_app

TOKENS = token("a") + token("b")


@pytest.mark.parametrize(
    ("headers", "body", "stops", "result"),
    [
        ({"content-type": "text/event-stream"}, TOKENS, [False, True], "timed"),
        (
            {"content-type": "text/event-stream", "content-encoding": "identity"},
            TOKENS,
            [False, True],
            "timed",
        ),
        (
            {"content-type": "text/event-stream", "content-encoding": "gzip"},
            gzip.compress(TOKENS),
            [True, True],
            "encoded",
        ),
        (
            {"content-type": "text/event-stream", "content-encoding": "br"},
            b"\x1b\x00",
            [True, True],
            "encoded",
        ),
        (
            {"content-type": "text/event-stream", "content-encoding": "GZIP, identity"},
            gzip.compress(TOKENS),
            [True, True],
            "encoded",
        ),
        (
            {"content-type": "application/json"},
            b'{"choices":[{"message":{"content":"a"}}]}',
            [True, True],
            "not_sse",
        ),
        (
            {"content-type": "text/event-stream"},
            b": keep-alive\n\ndata: [DONE]\n\n",
            [False, True],
            "no_token",
        ),
    ],
)
def test_unreadable_bodies_are_given_up_and_counted(
    headers: dict[str, str], body: bytes, stops: list[bool], result: str
) -> None:
    app = make_app(share=1.0, min_samples=1)
    s, r = fast(app, chat_request(), now=0.0)
    meta = metadata(r)  # type: ignore[arg-type]
    o = ObserveStream(app)
    got = [
        o.on_message(observe_msg("response_headers", meta, {":status": "200", **headers}), 0.01),
        o.on_message(observe_msg("response_body", meta, body=body, eos=True), 0.05),
    ]
    assert got == stops
    assert app.first_token_samples == {result: 1}
    assert app.shell_counters()[f"first_token:{result}"] == 1
    assert app.envoy_view(0.1)["first_token_samples"] == {result: 1}
    cluster = routed_cluster(r)  # type: ignore[arg-type]
    # Only a timed sample gives an offset; no other invents one.
    assert app.offsets.samples(cluster, SLICE) == (1 if result == "timed" else 0)
    s.close(0.3, cancelled=False)
    OutcomeFeed(app)(entry(s.rid, first_body_s=0.02, end_s=0.3, tokens=2), 0.4)
    assert app.router.counters[("outcome", "ok")] == 1  # the request is still observed


def test_the_metric_is_exported() -> None:
    app = make_app()
    app.first_token_samples["encoded"] += 2
    reg = build_registry(lambda: app.router, lambda: 0.0, app.shell_counters).registry
    assert reg.get_sample_value("tailroute_first_token_samples_total", {"result": "encoded"}) == 2
