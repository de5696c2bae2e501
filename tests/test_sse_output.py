"""What counts as generated output (a token event) in each OpenAI stream format.

The rule (docs/response-timing.md, "What counts as the first token"): an event is a
token when it carries output the client receives -- text, refusal, reasoning text,
tool or function-call arguments, audio data or its transcript. Framing (a role, an
empty delta, a finish reason, usage, ``[DONE]``, lifecycle events, ``*.done``
summaries that repeat what the deltas carried) is not.
"""

from __future__ import annotations

import gzip
import json

import pytest

from sidecar.core.timing import ResponseTimer
from sidecar.core.types import SliceKey

S = SliceKey("m", "interactive", "short", True)


def _chat(delta: dict[str, object], **choice: object) -> dict[str, object]:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": None, **choice}],
    }


def _resp(kind: str, **fields: object) -> dict[str, object]:
    return {"type": kind, "sequence_number": 3, **fields}


@pytest.mark.parametrize(
    ("chunk", "token"),
    [
        # Chat completions
        (_chat({"role": "assistant", "content": "", "refusal": None}), False),
        (_chat({"role": "assistant"}), False),
        (_chat({"content": None}), False),
        (_chat({}, finish_reason="stop"), False),
        (_chat({"content": ""}, finish_reason="length"), False),
        ({"choices": [], "usage": {"completion_tokens": 3}}, False),  # include_usage
        ({"choices": [], "prompt_filter_results": [{"prompt_index": 0}]}, False),  # Azure
        (_chat({"content": "Hi"}), True),
        (_chat({"content": " "}), True),  # whitespace is output too
        (_chat({"refusal": "I can't"}), True),
        (_chat({"reasoning_content": "Let me"}), True),  # DeepSeek, vLLM
        (_chat({"reasoning": "Let me"}), True),  # OpenRouter, Ollama
        (
            _chat(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "f", "arguments": ""},
                        }
                    ]
                }
            ),
            True,
        ),
        (_chat({"tool_calls": [{"index": 0, "function": {"arguments": '{"'}}]}), True),
        (_chat({"tool_calls": []}), False),
        (_chat({"function_call": {"name": "f", "arguments": ""}}), True),  # legacy
        (_chat({"role": "assistant", "audio": {"id": "audio_1"}}), False),  # id only
        (_chat({"audio": {"expires_at": 1733000000}}), False),  # the final audio update
        (_chat({"audio": {"transcript": "Hel"}}), True),
        (_chat({"audio": {"data": "UklGRg=="}}), True),
        # n > 1: any choice with output makes the event a token event
        ({"choices": [{"index": 1, "delta": {"content": "b"}}]}, True),
        ({"choices": [{"index": 0, "delta": {}}, {"index": 1, "delta": {"content": "b"}}]}, True),
        # Completions (legacy)
        ({"object": "text_completion", "choices": [{"index": 0, "text": "Hi"}]}, True),
        (
            {
                "object": "text_completion",
                "choices": [{"index": 0, "text": "", "finish_reason": "stop"}],
            },
            False,
        ),
        # Responses API
        (_resp("response.created", response={"status": "in_progress"}), False),
        (_resp("response.in_progress", response={}), False),
        (_resp("response.output_item.added", item={"type": "message"}), False),
        (_resp("response.content_part.added", part={"type": "output_text", "text": ""}), False),
        (_resp("response.output_text.delta", delta="Hi"), True),
        (_resp("response.output_text.delta", delta=""), False),
        (_resp("response.output_text.done", text="Hi there"), False),  # repeats the deltas
        (_resp("response.output_text.annotation.added", annotation={}), False),
        (_resp("response.refusal.delta", delta="no"), True),
        (_resp("response.function_call_arguments.delta", delta='{"a"'), True),
        (_resp("response.function_call_arguments.done", arguments="{}"), False),
        (_resp("response.reasoning_text.delta", delta="Let"), True),
        (_resp("response.reasoning_summary_text.delta", delta="First"), True),
        (_resp("response.audio.delta", delta="UklGRg=="), True),
        (_resp("response.audio.transcript.delta", delta="Hel"), True),
        (_resp("response.code_interpreter_call_code.delta", delta="print("), True),
        (_resp("response.custom_tool_call_input.delta", delta="SELECT"), True),
        (_resp("response.mcp_call_arguments.delta", delta='{"q"'), True),
        (_resp("response.completed", response={"usage": {"output_tokens": 9}}), False),
        (_resp("response.incomplete", response={}), False),
    ],
)
def test_token_or_not(chunk: dict[str, object], token: bool) -> None:
    t = ResponseTimer("a", S, t0=0.0, streaming=True)
    t.on_headers(200, "text/event-stream", 0.0)
    t.on_body(b"data: " + json.dumps(chunk).encode() + b"\n\n", 1.5)
    assert (t.first_token_at == 1.5, t.token_events) == ((True, 1) if token else (False, 0))
    assert not t.stream_error


@pytest.mark.parametrize("ctype", ["text/event-stream", "application/json"])
@pytest.mark.parametrize("encoding", ["gzip", "br", "deflate", "zstd", "gzip, identity"])
def test_an_encoded_body_is_not_read(ctype: str, encoding: str) -> None:
    """Compressed bytes are not events: no token, no usage, outcome and e2e only."""
    body = gzip.compress(
        b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
        b'data: {"choices":[],"usage":{"completion_tokens":7}}\n\n'
    )
    t = ResponseTimer("a", S, t0=0.0, streaming=True)
    t.on_headers(200, ctype, 0.1, content_encoding=encoding)
    t.on_body(body, 0.2, end=True)
    obs = t.observation(0.2)
    assert t.unreadable == "encoded" and obs is not None and obs.outcome == "ok"
    assert (obs.ttft_s, obs.tpot_s, obs.output_tokens, obs.e2e_s) == (None, None, None, 0.2)
