"""Endpoint-shaped JSON and SSE events of the fake provider's simulated generations.

Chat Completions, legacy Completions and the Responses API, streaming or not,
with fake tokens (a fixed word cycle) and usage counts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

_WORDS = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit")


def error_body(message: str, type_: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": None}}


def _sse(obj: Mapping[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _piece(i: int) -> str:
    word = _WORDS[i % len(_WORDS)]
    return word if i == 0 else " " + word


def _text_of(obj: object) -> str:
    if isinstance(obj, str):
        return obj
    if isinstance(obj, list):
        return " ".join(_text_of(x) for x in obj)
    if isinstance(obj, dict):
        return _text_of(obj.get("content", obj.get("text", "")))
    return ""


def prompt_tokens(body: Mapping[str, Any]) -> int:
    # ~4 characters per token: real tokenisation is irrelevant for latency tests.
    source = body.get("messages", body.get("prompt", body.get("input", "")))
    return max(1, len(_text_of(source)) // 4)


class Reply:
    """Endpoint-shaped JSON for one simulated generation of ``n`` tokens."""

    def __init__(self, kind: str, model: str, prompt_tokens: int, n: int, rid: str) -> None:
        self.kind, self.model, self.prompt_tokens, self.n = kind, model, prompt_tokens, n
        self.created = int(time.time())
        self.id = {"chat": "chatcmpl-", "completion": "cmpl-", "response": "resp_"}[kind] + rid
        self._seq = 0  # Responses-API sequence_number

    def usage(self) -> dict[str, int]:
        p, n = self.prompt_tokens, self.n
        if self.kind == "response":
            return {"input_tokens": p, "output_tokens": n, "total_tokens": p + n}
        return {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n}

    def _envelope(self, obj: str, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": "fp_fake", "choices": choices, **extra}

    def _response(self, status: str, text: str | None) -> dict[str, Any]:
        output = [] if text is None else [{
            "type": "message", "id": f"msg_{self.id}", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}]
        usage = None if text is None else self.usage()
        # "error": null as OpenAI sends it on every event but response.failed.
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "error": None, "model": self.model, "output": output, "usage": usage}

    def full(self) -> dict[str, Any]:
        """The non-streaming response body."""
        text = "".join(_piece(i) for i in range(self.n))
        if self.kind == "chat":
            msg = {"role": "assistant", "content": text, "refusal": None}
            choice = {"index": 0, "message": msg, "logprobs": None, "finish_reason": "stop"}
            return self._envelope("chat.completion", [choice], usage=self.usage())
        if self.kind == "completion":
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "stop"}
            return self._envelope("text_completion", [choice], usage=self.usage())
        return self._response("completed", text)

    def _delta(self, i: int | None) -> dict[str, Any]:
        """Streaming chunk carrying token ``i``, or the finish chunk when ``i`` is None."""
        finish = "stop" if i is None else None
        if self.kind == "chat":
            delta: dict[str, str] = {"role": "assistant"} if i == 0 else {}
            if i is not None:
                delta["content"] = _piece(i)
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return self._envelope("chat.completion.chunk", [choice])
        text = "" if i is None else _piece(i)
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return self._envelope("text_completion", [choice])

    def _event(self, type_: str, **fields: Any) -> bytes:
        payload = {"type": type_, "sequence_number": self._seq, **fields}
        self._seq += 1
        return f"event: {type_}\ndata: {json.dumps(payload)}\n\n".encode()

    def role_event(self) -> bytes:
        """A role-only chat chunk (no token), for providers that open with one."""
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                  "finish_reason": None}
        return _sse(self._envelope("chat.completion.chunk", [choice]))

    def token_events(self, i: int) -> list[bytes]:
        """SSE events carrying token ``i``."""
        if self.kind != "response":
            return [_sse(self._delta(i))]
        # response.created goes out with the first token rather than at once so
        # that "first body byte" still means "first token" for TTFT measurement.
        events = []
        if i == 0:
            created = self._response("in_progress", None)
            events.append(self._event("response.created", response=created))
        events.append(self._event("response.output_text.delta", item_id=f"msg_{self.id}",
                                  output_index=0, content_index=0, delta=_piece(i), logprobs=[]))
        return events

    def error_event(self, shape: str, provider: str) -> bytes:
        """The event a provider failing mid-stream sends before it ends the body, as
        each kind of server words it (``latency.MIDSTREAM_ERROR_SHAPES``)."""
        message = f"simulated mid-stream failure of {provider}"
        error = {"message": message, "type": "server_error", "param": None, "code": None}
        if shape == "openai":
            return _sse({"error": error})
        if shape == "plain_string":  # the error is a string, not an object
            return _sse({"error": f"upstream overloaded: {message}"})
        if shape == "error_code":  # an error object without a message
            return _sse({"error": {"code": 500, "type": "server_error"}})
        if shape == "anthropic":
            payload = {"type": "error", "error": {"type": "overloaded_error", "message": message}}
            return b"event: error\ndata: " + json.dumps(payload).encode() + b"\n\n"
        if shape == "vllm":
            return _sse({"object": "error", "message": message, "type": "InternalServerError",
                         "param": None, "code": 500})
        if shape == "responses_error":
            return self._event("error", code="server_error", message=message, param=None)
        failed = {**self._response("failed", None),
                  "error": {"code": "server_error", "message": message}}
        return self._event("response.failed", response=failed)

    def tail_events(self) -> list[bytes]:
        """SSE events after the last token: finish, usage and the terminator."""
        if self.kind == "response":
            return [self._event("response.completed", response=self.full())]
        finish = self._delta(None)
        usage = self._envelope(finish["object"], [], usage=self.usage())
        return [_sse(finish), _sse(usage), b"data: [DONE]\n\n"]
