"""The request body sent upstream when tailroute changes it: a model rewrite, and usage asked for.

``timing.ask_usage`` (off by default) adds ``"stream_options": {"include_usage": true}``
to a streamed Chat Completions or Completions request that does not say either way.
Why: the access log reads a stream's token count (TPOT) and its completeness from the
usage event, and most clients never ask for it. Without it, a client that closes the
connection at ``data: [DONE]`` (the OpenAI Python SDK's synchronous stream does) before
Envoy has seen the end of the body leaves an entry with neither usage nor an end time,
which reads as a client gone mid-answer: a ``cancel`` (docs/response-timing.md, "A
client that never asks for usage"), where Envoy's ``[DONE]`` mark does not run
(``timing.done_mark``, :mod:`sidecar.shell.bootstrap_done`: it makes such an entry an
``ok``, still without a token count). Usage also gives the TPOT the mark cannot.

The client then receives one more chunk, ``choices: []`` with the usage, before
``[DONE]``: the OpenAI SDKs read it, code that indexes ``choices[0]`` of every chunk does
not -- hence opt-in. An explicit ``include_usage`` (``false`` too) is left as the client
sent it; the Responses API always ends with its usage and is never changed.
"""

from __future__ import annotations

import json
from typing import Any

from sidecar.core.classify import ParsedBody
from sidecar.core.types import Api

_ASKS_USAGE = ("chat", "completions")


def upstream_body(parsed: ParsedBody | None, api: Api, model: str | None,
                  ask_usage: bool) -> bytes | None:
    """The body to send instead of the client's, or None to send it unchanged."""
    if parsed is None or not (model or (ask_usage and parsed.stream)):
        return None  # the common case, on every request: nothing to build
    changes: dict[str, Any] = {}
    if model:
        changes["model"] = model
    if ask_usage and parsed.stream and api in _ASKS_USAGE:
        options = parsed.document.get("stream_options")
        if options is None:
            changes["stream_options"] = {"include_usage": True}
        elif isinstance(options, dict) and "include_usage" not in options:
            changes["stream_options"] = {**options, "include_usage": True}
    if not changes:
        return None
    return json.dumps({**parsed.document, **changes}, separators=(",", ":")).encode()
