"""The bound on honoured ``x-tailroute-explain`` requests (sidecar.shell.explain_limit):
the bucket's arithmetic as a property, and the stream handler routing an explain
request over the bound as a plain one, counted."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.config import parse_config
from sidecar.core.router import Router
from sidecar.shell.app import App
from sidecar.shell.explain_limit import BURST, RATE_PER_S, ExplainBudget
from sidecar.shell.extproc import RouteStream
from tests.conftest import base_config_dict
from tests.streamharness import (
    POST_CHAT,
    body_msg,
    chat_request,
    headers_msg,
    metadata,
    set_headers,
)


@given(st.lists(st.floats(min_value=0.0, max_value=5.0), min_size=1, max_size=200))
def test_never_more_than_the_burst_plus_the_rate_over_the_time_taken(gaps: list[float]) -> None:
    b, now, honoured = ExplainBudget(), 0.0, 0
    for gap in gaps:
        now += gap
        honoured += b.take(now)
    assert honoured <= BURST + RATE_PER_S * now + 1e-9


@given(st.integers(min_value=1, max_value=500))
def test_requests_at_the_rate_are_all_honoured(n: int) -> None:
    b = ExplainBudget()
    assert all(b.take(i / RATE_PER_S) for i in range(n))


def test_a_clock_that_goes_back_mints_nothing() -> None:
    b = ExplainBudget()
    assert sum(b.take(100.0) for _ in range(50)) == BURST
    assert not b.take(99.0) and not b.take(100.0)


def _explained(app: App, now: float) -> bool:
    """One explained request on the rich path: did it get the explain header?"""
    s = RouteStream(app)
    first = s.on_message(headers_msg({**POST_CHAT, "x-tailroute-explain": "1"}), now)
    routed = s.on_message(body_msg(chat_request()), now)
    assert "route" in metadata(routed)  # routed either way  # type: ignore[arg-type]
    if not first.HasField("mode_override"):  # type: ignore[union-attr]
        return False
    r = s.on_message(headers_msg({":status": "200"}, response=True), now + 0.1)
    return r is not None and "x-tailroute-explain-result" in set_headers(r)


def test_explain_requests_over_the_bound_are_routed_plain_and_counted() -> None:
    cfg = parse_config(base_config_dict(), "t.yaml")
    app = App(cfg, Router(cfg))
    got = [_explained(app, 0.0) for _ in range(30)]
    assert got.count(True) == BURST and got[: int(BURST)] == [True] * int(BURST)
    assert app.errors["explain_limited"] == 30 - BURST
    assert _explained(app, 1.0)  # refilled at RATE_PER_S
