"""Classify an OpenAI-compatible request into a workload slice.

Pure functions over already-parsed inputs: the shell hands in the lower-cased
header mapping and the raw body bytes; nothing here touches the network.

Headers read (all optional, all treated as untrusted; the shell first drops the hints
the config's ``hints`` section does not believe and puts a trusted header's value in
their place, :mod:`sidecar.core.hints`):

==========================  ===================================================
``x-tailroute-class``       workload class name; unknown -> default class
``x-tailroute-priority``    integer 0..1000; default = the class's priority
``x-tailroute-tenant``      tenant id (never used as a metrics label)
``x-tailroute-deadline-ms`` remaining end-to-end budget of the workflow, ms (0 or less: exhausted)
``x-tailroute-step``        ``critical`` or ``optional``
``x-tailroute-fanout``      parallel calls of this workflow step, 1..256 (default 1)
``x-tailroute-explain``     ``1`` asks for the explain response header
``x-request-id``            request id (retry recognition)
``x-envoy-attempt-count``   Envoy's attempt counter; > 1 means a retry
``x-stainless-retry-count`` the openai client's retry counter
==========================  ===================================================
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from sidecar.core.config import Config
from sidecar.core.input_limits import GZIP_MAGIC, GZIPPED, NOT_UTF8, utf16_or_32
from sidecar.core.types import NAME_OK, UNKNOWN_MODEL, Api, RequestInfo, SliceKey, Step

# Token-profile buckets: (name, upper bound of expected output tokens). Output
# length dominates end-to-end time, input length dominates TTFT (prefill), so
# the bucket combines both: a long prompt is "long" even with a short answer.
_PROFILES: Final[tuple[tuple[str, int, int], ...]] = (
    ("short", 256, 2048),  # name, max output tokens, max input tokens
    ("medium", 1024, 16384),
)
_LONG: Final = "long"
_DEFAULT_MAX_TOKENS: Final = 256  # when the client gives none: a typical chat answer
# Public view of the bounds above for code that buckets requests outside Python
# (native mode's Envoy routes, sidecar.shell.bootstrap_native).
TOKEN_PROFILES: Final = _PROFILES
LONG_PROFILE: Final = _LONG
DEFAULT_MAX_TOKENS: Final = _DEFAULT_MAX_TOKENS
CHARS_PER_TOKEN: Final = 4  # approx_tokens: ceil(chars / 4)
_NAME_OK: Final = NAME_OK

API_PATHS: Final[dict[str, Api]] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/responses": "responses",
}


class BadRequest(ValueError):
    """The request itself is invalid; the shell answers 400 with this message."""


def api_for_path(path: str) -> Api:
    """Map a request path (query string ignored) to the API it targets."""
    return API_PATHS.get(path.split("?", 1)[0].rstrip("/") or "/", "other")


def token_profile(input_tokens: int, max_tokens: int | None) -> str:
    """Bucket a request by its token profile: ``short``, ``medium`` or ``long``."""
    out = max_tokens if max_tokens is not None else _DEFAULT_MAX_TOKENS
    for name, out_cap, in_cap in _PROFILES:
        if out <= out_cap and input_tokens <= in_cap:
            return name
    return _LONG


def approx_tokens(text_chars: int) -> int:
    """Rough token count: ~4 characters per token for English-like text."""
    return (text_chars + 3) // 4


# What the prompt walk reads in a message, content part or Responses input item: text,
# the arguments of earlier tool calls and the outputs returned for them.
_PROMPT_KEYS: Final = ("content", "text", "input", "prompt", "tool_calls", "function",
                       "function_call", "arguments", "output")
# An image part costs tokens its URL or base64 data does not show: OpenAI bills 85 at
# detail "low" and 170 per 512-px tile + 85 otherwise (765 for a 1024 x 1024 image).
IMAGE_TOKENS_LOW: Final = 85
IMAGE_TOKENS: Final = 765
_IMAGE_PARTS: Final = frozenset({"image_url", "input_image"})


def _image_chars(part: dict[str, Any]) -> int:
    """An image content part (Chat ``image_url``, Responses ``input_image``) in chars."""
    url = part.get("image_url")
    detail = url.get("detail") if isinstance(url, dict) else part.get("detail")
    return (IMAGE_TOKENS_LOW if detail == "low" else IMAGE_TOKENS) * CHARS_PER_TOKEN


def _text_chars(value: Any) -> int:
    """Characters of prompt in a messages/prompt/input value, walked defensively: text,
    tool-call arguments and outputs; an image part as its token cost; a list of token
    ids (the Completions API's pre-tokenised prompt) as one token each. Iterative (an
    explicit stack): no nesting the parser accepted can raise RecursionError here."""
    total = 0
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v)
        elif isinstance(v, list):
            if v and isinstance(v[0], int):
                total += len(v) * CHARS_PER_TOKEN
            else:
                stack.extend(v[:10000])
        elif isinstance(v, dict):
            kind = v.get("type")
            if isinstance(kind, str) and kind in _IMAGE_PARTS:  # a list is unhashable
                total += _image_chars(v)
            else:
                stack.extend(v[key] for key in _PROMPT_KEYS if key in v)
    return total


def _tools_chars(data: dict[str, Any]) -> int:
    """Tool (function) definitions are part of the prompt the model reads: their JSON
    length, serialised in C (no walk in Python; only requests that carry tools pay)."""
    total = 0
    for key in ("tools", "functions"):
        tools = data.get(key)
        if isinstance(tools, list) and tools:
            total += len(json.dumps(tools, ensure_ascii=False, separators=(",", ":")))
    return total


@dataclass(frozen=True, slots=True)
class ParsedBody:
    model: str | None
    stream: bool
    max_tokens: int | None
    input_tokens: int
    # The decoded JSON object, kept so a model rewrite need not parse the body again.
    # Treat as read-only: callers copy before changing it.
    document: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


_UTF8_BOM: Final = b"\xef\xbb\xbf"


class _NotJson(ValueError):
    """A token ``json.loads`` reads that JSON does not have: ``NaN``, ``Infinity``,
    ``-Infinity``, or a number no double holds (1e400 read as inf): a model rewrite
    would serialise them as ``NaN``/``Infinity``, which is not JSON either."""


def _no_constant(name: str) -> Any:
    raise _NotJson(f"{name} is not a JSON value")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _NotJson(f"the number {text[:32]} is too large for a double")
    return value


def _json_text(body: bytes) -> str:
    """The body as text, read as UTF-8 only (a UTF-8 BOM is skipped): ``json.loads(bytes)``
    would also read UTF-16/32, whose nesting the depth check cannot see."""
    if body[:2] == GZIP_MAGIC:
        raise BadRequest(GZIPPED)
    if utf16_or_32(body):
        raise BadRequest(NOT_UTF8)
    raw = body.removeprefix(_UTF8_BOM)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"{NOT_UTF8}, byte {raw[exc.start]:#04x} at {exc.start}") from None


def parse_body(api: Api, body: bytes) -> ParsedBody:
    """Extract what routing needs from a JSON request body.

    Raises :class:`BadRequest` for bodies an upstream would reject anyway
    (not UTF-8, not JSON -- ``NaN``, ``Infinity`` and numbers beyond a double's range
    included --, not an object, wrong types for model/stream/max_tokens).
    """
    text = _json_text(body)
    try:
        data = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except (ValueError, RecursionError) as exc:
        # ValueError: not JSON (_NotJson: NaN, Infinity, 1e400), or an integer beyond
        # Python's digit limit (a 5,000-digit max_tokens); RecursionError: nesting
        # deeper than the stack.
        if type(exc) is ValueError:  # the digit limit: its own text names a Python call
            exc = ValueError("a number has too many digits (Python reads up to 4300)")
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object")
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string")
    stream = data.get("stream")
    if stream is None:
        stream = False  # absent or null: the OpenAI API's "boolean or null", default false
    elif not isinstance(stream, bool):
        raise BadRequest("'stream' must be true or false")
    max_tokens: int | None = None
    for key in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        v = data.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise BadRequest(f"'{key}' must be a non-negative integer")
        max_tokens = v
        break
    try:  # the walk is iterative; the tools' serialiser recurses (in C)
        chars = _prompt_chars(api, data)
    except RecursionError:
        raise BadRequest("request body nests too deeply to read") from None
    return ParsedBody(model, stream, max_tokens, approx_tokens(chars), data)


def _prompt_chars(api: Api, data: dict[str, Any]) -> int:
    if api == "chat":
        return _text_chars(data.get("messages")) + _tools_chars(data)
    if api == "completions":
        return _text_chars(data.get("prompt"))
    return (_text_chars(data.get("input")) + _text_chars(data.get("instructions"))
            + _tools_chars(data))


# Marks a truncated unknown model name (configured names are matched whole, so a kept
# prefix plus this mark names no configured model unless one ends in it).
_CUT: Final = "\u2026"


def _int_header(headers: Mapping[str, str], name: str, lo: int, hi: int) -> int | None:
    raw = headers.get(name)
    if raw is None:
        return None
    raw = raw.strip()
    digits = raw[1:] if raw[:1] in ("-", "+") else raw
    # ASCII digits only: str.isdigit() also accepts superscripts and other scripts'
    # digits, some of which int() refuses (a ValueError here failed the whole request
    # open, past admission) and some of which it reads ("\u0663" as 3).
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 12:
        return None  # hostile or garbled: ignore rather than fail the request
    # Signed values clamp like any other out-of-range one: a workflow that computes
    # "deadline - elapsed" sends a negative remaining budget, which is exhausted (0).
    return min(max(int(raw), lo), hi)


def _safe_name(raw: str | None, limit: int) -> str | None:
    if raw is None:
        return None
    raw = raw.strip()[:limit]
    return raw if _NAME_OK.match(raw) else None


def classify(
    config: Config,
    headers: Mapping[str, str],
    body: ParsedBody | None,
    api: Api,
) -> RequestInfo:
    """Build the :class:`RequestInfo` and slice key for one request.

    ``headers`` must have lower-case keys. Hostile header values are ignored
    (bounded length, strict character set), never echoed into labels.
    """
    limit = config.limits.max_header_value_bytes
    klass_name = _safe_name(headers.get("x-tailroute-class"), limit)
    klass = config.workload_class(klass_name) if klass_name else None
    class_known = klass is not None or klass_name is None
    if klass is None:
        klass = config.workload_class(config.default_class)
    assert klass is not None  # default_class is validated at load

    priority = _int_header(headers, "x-tailroute-priority", 0, 1000)
    model = body.model if body else None
    model_known = model is not None and config.model(model) is not None
    if model is not None and not model_known and len(model) > limit:
        # An unknown model is kept (RequestInfo, Decision.detail, the recent-decision
        # ring) until its access-log entry comes: whole, a body-sized string each.
        model = model[:limit] + _CUT
    stream = body.stream if body else False
    max_tokens = body.max_tokens if body else None
    input_tokens = body.input_tokens if body else 0

    attempt = _int_header(headers, "x-envoy-attempt-count", 1, 1000) or 1
    client_retry = _int_header(headers, "x-stainless-retry-count", 0, 1000) or 0
    deadline = _int_header(headers, "x-tailroute-deadline-ms", 0, 86_400_000)
    step_raw = (headers.get("x-tailroute-step") or "").strip().lower()
    fanout = _int_header(headers, "x-tailroute-fanout", 1, 256) or 1
    step: Step | None = "critical" if step_raw == "critical" else None
    if step_raw == "optional":
        step = "optional"

    slice_model = model if model_known and model is not None else UNKNOWN_MODEL
    return RequestInfo(
        api=api,
        model=model,
        stream=stream,
        max_tokens=max_tokens,
        input_tokens=input_tokens,
        klass=klass.name,
        priority=klass.priority if priority is None else priority,
        tenant=_safe_name(headers.get("x-tailroute-tenant"), limit),
        slice=SliceKey(slice_model, klass.name, token_profile(input_tokens, max_tokens), stream),
        request_id=_safe_name(headers.get("x-request-id"), limit),
        retry_attempt=max(attempt - 1, client_retry),
        deadline_ms=float(deadline) if deadline is not None else None,
        step=step,
        fanout=fanout,
        explain=headers.get("x-tailroute-explain", "").strip() == "1",
        class_known=class_known,
        model_known=model_known,
    )
