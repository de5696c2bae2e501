"""``timing.ask_usage``: streamed chat/completions requests ask for usage (in memory).

Without usage a stream gives no token count (no TPOT), and a client that closes at
``[DONE]`` before Envoy saw the end of the body reads as a cancel (its entry has neither
usage nor an end time; ``tests/test_integration_ask_usage.py`` runs it through Envoy).
With the option on, the routing answer adds ``stream_options.include_usage`` to a
streamed request that does not say either way; nothing else changes.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from sidecar.core.classify import parse_body
from sidecar.core.config import parse_config
from sidecar.core.types import Api
from sidecar.shell.app import App
from sidecar.shell.upstream_body import upstream_body
from tests.conftest import base_config_dict
from tests.streamharness import chat_request
from tests.test_extproc import fast


def _app(ask_usage: bool | None) -> App:
    timing: dict[str, Any] = {"token_sample_share": 0.0, "token_sample_min": 0}
    if ask_usage is not None:
        timing["ask_usage"] = ask_usage
    return App.create(parse_config(base_config_dict(timing=timing), "t.yaml"), seed=1)


def _sent(app: App, body: bytes) -> dict[str, Any] | None:
    """The body the routing answer sends upstream instead (None: the client's)."""
    _s, resp = fast(app, body)
    mutation = resp.request_body.response.body_mutation  # type: ignore[attr-defined]
    return json.loads(mutation.body) if mutation.HasField("body") else None


def test_a_stream_asks_for_usage_when_the_option_is_on() -> None:
    sent = _sent(_app(True), chat_request(max_tokens=5))
    assert sent == {**json.loads(chat_request(max_tokens=5)),
                    "stream_options": {"include_usage": True}}


@pytest.mark.parametrize("ask_usage", [None, False])
def test_off_by_default_the_body_goes_as_it_came(ask_usage: bool | None) -> None:
    assert _sent(_app(ask_usage), chat_request()) is None


@pytest.mark.parametrize(("body", "api", "model", "want"), [
    # Only the option: nothing else in the body changes.
    ({"stream": True}, "chat", None, {"stream": True, "stream_options": {"include_usage": True}}),
    ({"stream": True, "prompt": "x"}, "completions", None,
     {"stream": True, "prompt": "x", "stream_options": {"include_usage": True}}),
    # Other stream options are kept.
    ({"stream": True, "stream_options": {"include_obfuscation": False}}, "chat", None,
     {"stream": True, "stream_options": {"include_obfuscation": False, "include_usage": True}}),
    # The client said: as it said, false too (it may not read the usage chunk).
    ({"stream": True, "stream_options": {"include_usage": False}}, "chat", None, None),
    ({"stream": True, "stream_options": {"include_usage": True}}, "chat", None, None),
    # Not a dict: not ours to fix (the provider answers the client's mistake).
    ({"stream": True, "stream_options": "yes"}, "chat", None, None),
    # Unstreamed, or the Responses API (its response.completed always has usage).
    ({"stream": False}, "chat", None, None),
    ({"stream": True, "input": "x"}, "responses", None, None),
    # With a model rewrite: both in one body.
    ({"model": "m", "stream": True}, "chat", "m-2",
     {"model": "m-2", "stream": True, "stream_options": {"include_usage": True}}),
    ({"model": "m", "stream": False}, "chat", "m-2", {"model": "m-2", "stream": False}),
])
def test_what_is_sent_upstream(body: dict[str, Any], api: Api, model: str | None,
                               want: dict[str, Any] | None) -> None:
    doc = {"messages": [{"role": "user", "content": "hi"}], **body} if api == "chat" else body
    parsed = parse_body(api, json.dumps(doc).encode())
    out = upstream_body(parsed, api, model, ask_usage=True)
    if want is None:
        assert out is None
    else:
        assert out is not None and json.loads(out) == {**doc, **want}


def test_the_option_is_a_boolean() -> None:
    from sidecar.core.fields import ConfigError

    with pytest.raises(ConfigError, match="ask_usage"):
        parse_config(base_config_dict(timing={"ask_usage": "yes"}), "t.yaml")


def test_the_rich_path_sends_the_new_length_with_the_new_body() -> None:
    """A request with a deadline comes headers first: Envoy does not fix the length
    there, so the answer sets it."""
    from tests.streamharness import set_headers
    from tests.test_extproc import rich

    _s, (_headers, resp) = rich(_app(True), chat_request(), {"x-tailroute-deadline-ms": "900"})
    body = resp.request_body.response.body_mutation.body  # type: ignore[attr-defined]
    assert json.loads(body)["stream_options"] == {"include_usage": True}
    assert set_headers(resp)["content-length"] == str(len(body))  # type: ignore[arg-type]
