from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from sidecar.core.classify import (
    BadRequest,
    _text_chars,
    api_for_path,
    classify,
    parse_body,
    token_profile,
)
from sidecar.core.config import Config
from sidecar.core.types import SliceKey


@pytest.mark.parametrize(
    ("path", "api"),
    [
        ("/v1/chat/completions", "chat"),
        ("/v1/chat/completions?x=1", "chat"),
        ("/v1/completions", "completions"),
        ("/v1/responses", "responses"),
        ("/v1/models", "other"),
        ("/", "other"),
    ],
)
def test_api_for_path(path: str, api: str) -> None:
    assert api_for_path(path) == api


@pytest.mark.parametrize(
    ("inp", "out", "profile"),
    [(100, 50, "short"), (100, None, "short"), (100, 800, "medium"), (50000, 10, "long"),
     (100, 5000, "long"), (3000, 100, "medium")],
)
def test_token_profile(inp: int, out: int | None, profile: str) -> None:
    assert token_profile(inp, out) == profile


def _chat(**kw: object) -> bytes:
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 400}], **kw}
    return json.dumps(body).encode()


def test_parse_chat_body() -> None:
    p = parse_body("chat", _chat(stream=True, max_completion_tokens=30))
    assert (p.model, p.stream, p.max_tokens, p.input_tokens) == ("m", True, 30, 100)


@pytest.mark.parametrize(
    ("fields", "stream", "max_tokens"),
    [({"stream": None}, False, None), ({"stream": False}, False, None),
     ({"stream": True, "stream_options": None}, True, None),
     ({"stream": None, "max_tokens": None, "max_completion_tokens": 7}, False, 7)],
)
def test_null_means_absent(fields: dict[str, object], stream: bool, max_tokens: int | None
                           ) -> None:
    """The OpenAI API types ``stream`` and the token limits "or null": null is the default,
    not a 400 (openai clients and proxies that serialise unset fields send it)."""
    p = parse_body("chat", _chat(**fields))
    assert (p.stream, p.max_tokens) == (stream, max_tokens)


def test_gzip_body_gets_a_message_that_says_so() -> None:
    import gzip

    with pytest.raises(BadRequest, match="gzip-compressed"):
        parse_body("chat", gzip.compress(_chat()))


@pytest.mark.parametrize(
    "body",
    [b"{not json", b"[1,2]", b'{"model": 5}', b'{"stream": "yes"}', b'{"max_tokens": -1}',
     b'{"max_tokens": true}', b"\xff\xfe",
     # Beyond Python's integer digit limit: json.loads raises a plain ValueError.
     b'{"model": "m", "max_tokens": 1' + b"0" * 5000 + b"}",
     b"[" * 100_000 + b"]" * 100_000],
)
def test_bad_bodies_raise(body: bytes) -> None:
    with pytest.raises(BadRequest) as raised:
        parse_body("chat", body)
    # The client reads this message: Python's own text for the digit limit told it to
    # call sys.set_int_max_str_digits().
    assert "sys." not in str(raised.value)


_DEEP = '{"model": "m", "x": "\u2200", "messages": ' + "[" * 900 + "]" * 900 + "}"
_TEXT = '{"model": "m", "messages": [{"role": "user", "content": "\u2200\u7b7b"}]}'


@pytest.mark.parametrize(
    "body",
    [_DEEP.encode("utf-16-le"),  # raised RecursionError in the prompt walk
     _TEXT.encode("utf-16-le"), _TEXT.encode("utf-16-be"), _TEXT.encode("utf-16"),
     _TEXT.encode("utf-32"), _TEXT.encode("utf-32-le"),
     b'{"model": "m", "messages": [{"content": "caf\xe9"}]}'],  # Latin-1
)
def test_a_body_not_in_utf8_is_refused(body: bytes) -> None:
    """JSON between systems is UTF-8 (RFC 8259 section 8.1): json.loads(bytes) also reads
    UTF-16/32, whose brackets the depth check (bytes read as UTF-8) cannot see."""
    with pytest.raises(BadRequest, match="not UTF-8"):
        parse_body("chat", body)


@pytest.mark.parametrize(
    ("value", "says"),
    [(b"NaN", "NaN is not a JSON value"), (b"Infinity", "Infinity is not"),
     (b"-Infinity", "-Infinity is not"), (b"1e400", "1e400 is too large"),
     (b"-1.5E+309", "-1.5E+309 is too large"), (b"1" * 400 + b".0", "too large")],
)
def test_numbers_json_does_not_have_are_refused(value: bytes, says: str) -> None:
    """json.loads reads NaN/Infinity (not JSON) and turns 1e400 into inf; a model
    rewrite then sent the upstream ``Infinity``, which is not JSON."""
    with pytest.raises(BadRequest, match="not valid JSON") as raised:
        parse_body("chat", b'{"model": "m", "temperature": ' + value + b', "messages": []}')
    assert says in str(raised.value)


@pytest.mark.parametrize("value", [b"1e308", b"-2.5e-400", b"0.1", b"1" * 300 + b".5"])
def test_large_but_finite_numbers_are_read(value: bytes) -> None:
    assert parse_body("chat", b'{"model": "m", "top_p": ' + value + b"}").model == "m"


def test_a_utf8_bom_is_skipped() -> None:
    assert parse_body("chat", b"\xef\xbb\xbf" + _chat()).input_tokens == 100


def _nested(depth: int, leaf: object, wrap: Callable[[object], object]) -> object:
    for _ in range(depth):
        leaf = wrap(leaf)
    return leaf


@pytest.mark.parametrize(
    ("value", "chars"),
    [(_nested(100_000, ["abcd"], lambda v: [v]), 4),
     (_nested(100_000, "ab", lambda v: {"content": v}), 2),
     ([{"type": [], "text": "abc"}, {"type": {}, "content": "d"}], 4),
     ([{"type": "image_url", "image_url": {"detail": "low"}}], 85 * 4),
     ([[1, 2, 3], "ab"], 3 * 4 + 2)],
)
def test_the_prompt_walk_never_raises(value: object, chars: int) -> None:
    """Nesting the parser accepted (or any nesting, built in Python) and a ``type``
    that is a list or an object: the walk counts, it does not raise."""
    assert _text_chars(value) == chars


def test_classify_headers(config: Config) -> None:
    body = parse_body("chat", _chat(stream=True))
    info = classify(
        config,
        {"x-tailroute-class": "batch", "x-tailroute-priority": "3", "x-tailroute-tenant": "t1",
         "x-envoy-attempt-count": "2"},
        body,
        "chat",
    )
    assert info.klass == "batch" and info.priority == 3 and info.tenant == "t1"
    assert info.slice == SliceKey("m", "batch", "short", True)
    assert info.retry_attempt == 1


@pytest.mark.parametrize(
    "headers",
    [
        {"x-tailroute-class": "no-such-class"},
        {"x-tailroute-class": "a" * 5000},
        {"x-tailroute-class": "inter\nactive"},
        {"x-tailroute-priority": "99999999999999999999"},
        {"x-tailroute-tenant": "<script>"},
        {"x-tailroute-priority": "\u00b2"},  # superscript two: int() raised ValueError
        {"x-tailroute-priority": "\uff11\uff10\uff10\uff10"},  # full-width 1000
        {"x-tailroute-priority": "-5"},
        {"x-tailroute-fanout": "\u00b9"},
        {"x-envoy-attempt-count": "\u00b3"},
        {"x-stainless-retry-count": "\u2462"},
    ],
)
def test_hostile_headers_fall_back_to_defaults(config: Config, headers: dict[str, str]) -> None:
    info = classify(config, headers, parse_body("chat", _chat()), "chat")
    assert info.klass == config.default_class
    assert info.tenant is None
    assert 0 <= info.priority <= 1000
    assert info.retry_attempt == 0 and info.fanout == 1


@pytest.mark.parametrize(
    ("raw", "remaining"),
    [("750", 750), ("0", 0), ("-1", 0), ("-250", 0), ("+40", 40), (" 12 ", 12),
     ("1e3", None), ("-", None), ("--5", None), ("12ms", None), ("9" * 13, None),
     # Non-ASCII digits: str.isdigit() says yes, int() refuses some and reads others.
     ("\u00b2", None), ("1\u00b2", None), ("\u2460", None), ("\u0663", None),
     ("\uff15", None), ("NaN", None), ("inf", None), ("0x10", None), ("10, 20", None)],
)
def test_deadline_header(config: Config, raw: str, remaining: int | None) -> None:
    """A negative remaining budget (``deadline - elapsed`` gone past) is exhausted,
    not ignored; garbage is ignored."""
    info = classify(config, {"x-tailroute-deadline-ms": raw}, parse_body("chat", _chat()), "chat")
    assert info.deadline_ms == (None if remaining is None else float(remaining))


def test_unknown_model_marks_slice(config: Config) -> None:
    info = classify(config, {}, parse_body("chat", _chat(model="nope")), "chat")
    assert not info.model_known and info.slice.model == "_unknown"


@pytest.mark.parametrize(
    ("model", "kept", "known"),
    [("m", "m", True), ("nope", "nope", False), ("x" * 256, "x" * 256, False),
     ("x" * 257, "x" * 256 + "\u2026", False), ("y" * 4_000_000, "y" * 256 + "\u2026", False)],
)
def test_an_unknown_model_is_kept_bounded(config: Config, model: str, kept: str, known: bool
                                          ) -> None:
    """Kept until the access-log entry comes (the recent-decision ring, Decision.detail):
    a 4 MiB model name was kept whole, like tenant and request id now cut at
    limits.max_header_value_bytes."""
    info = classify(config, {}, parse_body("chat", _chat(model=model)), "chat")
    assert (info.model, info.model_known) == (kept, known)


def test_slice_hierarchy() -> None:
    s = SliceKey("m", "interactive", "short", True)
    assert [b.label() for b in s.broader()] == ["m|interactive|*|*", "m|*|*|*"]
    assert SliceKey.parse(s.label()) == s
