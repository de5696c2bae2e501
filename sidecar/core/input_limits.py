"""Hostile-input checks that run before anything parses a request (pure functions).

Whatever handles the ext_proc streams calls these first, so the answers below
stay the same however the handlers are arranged. Each problem has one
documented answer and one counter label, ``tailroute_errors_total{kind=...}``
(README, "Running it beside your Envoy"):

* ``body_too_large`` — body over ``limits.max_body_bytes``: not parsed, default route;
* ``body_too_deep`` — JSON nested deeper than ``limits.max_json_depth``: 400
  ``invalid_request_error``;
* ``body_too_complex`` — JSON with more arrays and objects than
  ``limits.max_json_containers``: 400 ``invalid_request_error``;
* ``bad_request`` — not JSON, not an object, mistyped fields
  (:func:`sidecar.core.classify.parse_body`), not UTF-8 (UTF-16/32 is refused here,
  before the depth check, which reads bytes as UTF-8 does), gzip-compressed (refused
  here too, saying so): 400 ``invalid_request_error``;
* ``header_ignored`` — a header the sidecar reads (``x-tailroute-*``,
  ``x-request-id``, retry counters) longer than ``limits.max_header_value_bytes``
  or holding control characters: ignored, as if absent;
* ``bad_status`` — a response ``:status`` that is not three digits in
  100..599: the response is not evidence (no sample).

Why a depth limit before parsing: Python's JSON decoder and every recursive
walk over the document use the interpreter stack; a body nested a few
thousand levels deep raises ``RecursionError`` instead of a clean answer.
The check finds brackets outside strings with bytes methods and numpy (C
speed: tens of milliseconds for a hostile 8 MiB body, less than parsing it).

Why a container limit: the decoder builds a Python object per array and object,
on the event loop every decision shares. 8 MiB of ``[],`` is 2.8 million lists:
730 ms to parse on the development machine, past Envoy's 500 ms
``message_timeout`` for every request waiting behind it. The same scan counts the
brackets that open outside strings; a real body has thousands (2,000 chat messages
about 2,000, 128 tool schemas about 8,000), so at the default of 100,000 the
check and the parse take about 15 ms, and the 8 MiB body is refused after 53 ms of
checking. Scalars are not counted: 4 million numbers parse in ~170 ms.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

import numpy as np

from sidecar.core.config import Config, LimitsConfig

Refused = Literal["body_too_large", "body_too_deep", "body_too_complex", "bad_request"]
# Headers the classifier reads (the rest pass through to the upstream untouched).
READ_PREFIX: Final = "x-tailroute-"
READ_HEADERS: Final = frozenset({"x-request-id", "x-envoy-attempt-count",
                                 "x-stainless-retry-count"})
# gRPC framing and the request headers ride in the same message as the body.
GRPC_HEADROOM_BYTES: Final = 1 << 20

# JSON exchanged between systems is UTF-8 (RFC 8259 section 8.1); the one answer for a
# body that is not, here and in sidecar.core.classify.parse_body.
NOT_UTF8: Final = ("request body is not valid JSON: not UTF-8 (JSON exchanged between "
                   "systems must be UTF-8, RFC 8259 section 8.1)")
GZIP_MAGIC: Final = b"\x1f\x8b"  # gzip's first two bytes: never the start of JSON
GZIPPED: Final = ("request body is gzip-compressed (Content-Encoding: gzip); tailroute reads "
                  "only uncompressed JSON: send it uncompressed, or decompress it in Envoy "
                  "before the routing filters")
_UTF16_32_BOMS: Final = (b"\xff\xfe", b"\xfe\xff")
_CONTROL: Final = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_NOT_STRUCTURE: Final = bytes(b for b in range(256) if b not in b'"[]{}')
_BLOCK = 1 << 20  # not Final: tests/test_input_limits.py rebinds it
_STEP: Final = np.zeros(256, dtype=np.int32)
_STEP[list(b"[{")] = 1
_STEP[list(b"]}")] = -1


@dataclass(frozen=True, slots=True)
class BodyRefusal:
    """Why a request body is not parsed; ``status`` None means "continue to the default route"."""

    reason: Refused
    status: int | None
    message: str


def nests_deeper_than(body: bytes, limit: int) -> bool:
    """True if ``[``/``{`` nesting outside JSON strings exceeds ``limit`` levels."""
    return structure_problem(body, limit, None) == "body_too_deep"


def structure_problem(body: bytes, max_depth: int, max_containers: int | None
                      ) -> Literal["body_too_deep", "body_too_complex"] | None:
    """``body_too_deep`` if ``[``/``{`` nesting outside JSON strings exceeds
    ``max_depth`` levels, ``body_too_complex`` if more than ``max_containers`` of them
    open outside strings (None: not counted), else None.

    Exact for valid JSON in UTF-8 (the only encoding the parser accepts); for anything
    else it may say either, which is harmless (the parser then refuses the body anyway).
    """
    opens = body.count(b"[") + body.count(b"{")
    if opens <= max_depth and (max_containers is None or opens <= max_containers):
        return None  # cheap and common: too few brackets to nest that deep at all
    # Drop escaped backslashes, then escaped quotes (left to right, as JSON reads
    # them): every quote left delimits a string. Then only quotes and brackets matter.
    structure = body.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    depth, in_string, containers = 0, 0, 0
    for start in range(0, len(structure), _BLOCK):  # in blocks: bounded temporaries
        arr = np.frombuffer(structure, dtype=np.uint8, count=min(_BLOCK, len(structure) - start),
                            offset=start)
        steps = _STEP[arr]
        quotes = np.cumsum(arr == 0x22, dtype=np.int32) + in_string
        steps[(quotes & 1) == 1] = 0  # after an odd number of quotes: inside a string
        levels = np.cumsum(steps) + depth
        if int(levels.max()) > max_depth:
            return "body_too_deep"
        containers += int(np.count_nonzero(steps > 0))
        if max_containers is not None and containers > max_containers:
            return "body_too_complex"
        depth, in_string = int(levels[-1]), int(quotes[-1]) & 1
    return None


def utf16_or_32(body: bytes) -> bool:
    """True if the body starts as UTF-16 or UTF-32 JSON does: a byte-order mark, or a
    zero byte among the first four (JSON starts with an ASCII character, and a raw zero
    byte is never valid UTF-8 JSON). Its brackets are invisible to the depth check."""
    return body[:2] in _UTF16_32_BOMS or 0 in body[:4]


def check_body(body: bytes, limits: LimitsConfig) -> BodyRefusal | None:
    """The answer for a body that must not be parsed, or None if parsing is safe."""
    if len(body) > limits.max_body_bytes:
        return BodyRefusal("body_too_large", None,
                           f"request body over {limits.max_body_bytes} bytes is not classified")
    if body[:2] == GZIP_MAGIC:  # before the next check: its fourth byte is often zero
        return BodyRefusal("bad_request", 400, GZIPPED)
    if utf16_or_32(body):
        return BodyRefusal("bad_request", 400, NOT_UTF8)
    problem = structure_problem(body, limits.max_json_depth, limits.max_json_containers)
    if problem == "body_too_deep":
        return BodyRefusal("body_too_deep", 400,
                           f"request body nests deeper than {limits.max_json_depth} levels")
    if problem == "body_too_complex":
        return BodyRefusal("body_too_complex", 400,
                           f"request body holds more than {limits.max_json_containers} JSON "
                           "arrays and objects")
    return None


def screen_headers(headers: Mapping[str, str], limit: int) -> tuple[dict[str, str], list[str]]:
    """Drop values of headers the sidecar reads that are too long or hold control characters.

    Returns the headers to classify and the names dropped (count them once per
    request). Other headers are left alone: the sidecar never reads them.
    """
    dropped = [k for k, v in headers.items()
               if (k.startswith(READ_PREFIX) or k in READ_HEADERS)
               and (len(v) > limit or _CONTROL.search(v) is not None)]
    if not dropped:
        return dict(headers), []
    return {k: v for k, v in headers.items() if k not in dropped}, dropped


def parse_status(raw: str | None) -> int | None:
    """An HTTP response status from ``:status``; None unless it is 3 digits in 100..599."""
    if raw is None:
        return None
    raw = raw.strip()
    if len(raw) != 3 or not raw.isascii() or not raw.isdigit():
        return None
    status = int(raw)
    return status if 100 <= status <= 599 else None


def grpc_receive_limit(config: Config) -> int:
    """Largest gRPC message the sidecar accepts: any body the rendered Envoy may buffer
    (``envoy.route_buffer_bytes``) must reach the handler, which then answers and counts
    it; a smaller limit would fail the stream with RESOURCE_EXHAUSTED instead."""
    return max(config.limits.max_body_bytes, config.envoy.route_buffer_bytes) + GRPC_HEADROOM_BYTES
