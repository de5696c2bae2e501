"""Request-side shapes an OpenAI-compatible gateway meets, through the stream handler
(in memory): hostile header values, body fields, endpoints and their token profiles."""

from __future__ import annotations

import json

import pytest

from sidecar.core.config import Config
from sidecar.pb.envoy.config.core.v3 import base_pb2
from sidecar.pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from sidecar.shell.app import App
from sidecar.shell.extproc import RouteStream
from tests.streamharness import body_msg, body_only_msg, chat_request, headers_msg, routed_cluster


@pytest.fixture
def app(config: Config) -> App:
    return App.create(config, seed=1)


def _raw_headers(headers: dict[str, bytes]) -> pb.ProcessingRequest:
    """Request headers as Envoy sends them: raw bytes, whatever the client wrote."""
    hm = base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v) for k, v in headers.items()]
    )
    return pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=hm))


# Integer headers with digits str.isdigit() accepts but int() refuses or misreads: one
# of them raised ValueError in the handler, which answered CONTINUE to the default
# route (past admission) and logged a traceback per request.
HOSTILE_INTS = [
    "\u00b2",
    "1\u00b2",
    "\u2460",
    "\u0663",
    "\uff11\uff10\uff10\uff10",
    "NaN",
    "-inf",
    "1e3",
    "0x10",
    "10, 1000",
    "-99999999999999",
]


@pytest.mark.parametrize("value", HOSTILE_INTS)
@pytest.mark.parametrize(
    "header",
    [
        "x-tailroute-priority",
        "x-tailroute-fanout",
        "x-envoy-attempt-count",
        "x-stainless-retry-count",
    ],
)
def test_hostile_integer_header_is_ignored_on_the_one_message_path(
    app: App, header: str, value: str
) -> None:
    s = RouteStream(app)
    r = s.on_message(body_only_msg(chat_request(), {header: value}), 0.0)
    assert r is not None and routed_cluster(r) in {"a", "b", "c"}  # type: ignore[arg-type]
    assert s.info is not None and s.decision is not None
    assert s.decision.reason != "unknown_model"  # classified and decided, not failed open
    klass = app.config.workload_class(app.config.default_class)
    assert klass is not None
    if value != "-99999999999999":
        assert s.info.priority == klass.priority
    assert s.info.fanout == 1 and s.info.retry_attempt == 0


@pytest.mark.parametrize("raw", [b"\xb2", b"1\xb2", b"\xb9\xb9", b"\xc2\xb2"])
def test_latin1_superscripts_on_the_rich_path_are_ignored(app: App, raw: bytes) -> None:
    """Envoy hands header bytes over raw; the handler reads them as Latin-1, where 0xB2
    is a superscript two (a digit to str.isdigit())."""
    s = RouteStream(app)
    s.on_message(
        _raw_headers(
            {
                ":method": b"POST",
                ":path": b"/v1/chat/completions",
                "x-tailroute-deadline-ms": raw,
                "x-tailroute-priority": raw,
            }
        ),
        0.0,
    )
    r = s.on_message(body_msg(chat_request()), 0.0)
    assert r is not None and routed_cluster(r) in {"a", "b", "c"}  # type: ignore[arg-type]
    assert s.info is not None and s.info.deadline_ms is None


@pytest.mark.parametrize(
    ("stream", "answer"),
    [(None, "unary"), (True, "stream"), (False, "unary"), ("true", 400), (1, 400), (0, 400)],
)
def test_stream_field_types(app: App, stream: object, answer: str | int) -> None:
    """``stream`` is "boolean or null" in the OpenAI API: null is false; a string or a
    number is a 400 (OpenAI refuses it too)."""
    s = RouteStream(app)
    r = s.on_message(body_only_msg(chat_request(stream=stream)), 0.0)  # type: ignore[arg-type]
    assert r is not None
    if isinstance(answer, int):
        assert r.immediate_response.status.code == answer  # type: ignore[union-attr]
    else:
        assert s.info is not None and s.info.slice.label().endswith(answer)


class _Recording(dict[str, str]):
    """A header mapping that remembers every name looked up."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: set[str] = set()

    def get(self, key: str, default: object = None) -> object:  # type: ignore[override]
        self.asked.add(key)
        return super().get(key, default)


def test_every_header_classify_reads_reaches_it_on_some_path(config: Config) -> None:
    """The one-message path sends only the headers it lists as request attributes; the
    rich path is chosen by its own headers. A header classify reads that is in neither
    list is silently absent on the common path (x-tailroute-fanout was)."""
    from sidecar.core.classify import classify, parse_body
    from sidecar.shell.envoy_contract import CLASSIFY_HEADERS, RICH_HEADERS

    headers = _Recording()
    classify(config, headers, parse_body("chat", chat_request()), "chat")
    assert headers.asked and headers.asked <= set(CLASSIFY_HEADERS) | set(RICH_HEADERS)


def test_fanout_is_read_on_the_one_message_path(app: App) -> None:
    s = RouteStream(app)
    s.on_message(body_only_msg(chat_request(), {"x-tailroute-fanout": "8"}), 0.0)
    assert s.info is not None and s.info.fanout == 8


def _image(detail: str | None = None) -> dict[str, object]:
    url: dict[str, object] = {"url": "data:image/png;base64," + "A" * 200_000}
    if detail is not None:
        url["detail"] = detail
    return {"type": "image_url", "image_url": url}


_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"tool_{i}",
            "description": "d" * 4000,
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
    for i in range(4)
]
_TOOL_TURN = [
    {"role": "user", "content": "look it up"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "a" * 40_000}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "r" * 40_000},
]


def _user(content: object) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": content}]}


# (path, body, input tokens at least, at most, token profile)
SHAPES: list[tuple[str, dict[str, object], int, int, str]] = [
    ("/v1/chat/completions", _user("x" * 400), 100, 100, "short"),
    # An image's base64 data is not text; its token cost is (765, 85 at detail "low").
    (
        "/v1/chat/completions",
        _user([{"type": "text", "text": "what is it"}, _image()]),
        765,
        800,
        "short",
    ),
    ("/v1/chat/completions", _user([_image("low")] * 4), 340, 340, "short"),
    ("/v1/chat/completions", _user([_image("high")] * 20), 15_300, 15_300, "medium"),
    ("/v1/chat/completions", _user([_image("auto")] * 30), 22_950, 22_950, "long"),
    # Tool definitions are prompt too; so are earlier calls' arguments and results.
    ("/v1/chat/completions", {**_user("hi"), "tools": _TOOLS}, 4_000, 4_200, "medium"),
    ("/v1/chat/completions", {"model": "m", "messages": _TOOL_TURN}, 20_000, 20_010, "long"),
    ("/v1/chat/completions", {"model": "m", "messages": []}, 0, 0, "short"),
    ("/v1/completions", {"model": "m", "prompt": "x" * 8000}, 2000, 2000, "short"),
    # Pre-tokenised prompts: one token per id.
    ("/v1/completions", {"model": "m", "prompt": list(range(3000))}, 3000, 3000, "medium"),
    ("/v1/completions", {"model": "m", "prompt": [list(range(9000))] * 2}, 18_000, 18_000, "long"),
    (
        "/v1/responses",
        {"model": "m", "input": "x" * 400, "instructions": "y" * 400},
        200,
        200,
        "short",
    ),
    (
        "/v1/responses",
        {
            "model": "m",
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "x" * 4000},
                        {
                            "type": "input_image",
                            "image_url": "data:image/png;base64,AAAA",
                            "detail": "low",
                        },
                    ],
                }
            ],
        },
        1085,
        1085,
        "short",
    ),
    (
        "/v1/responses",
        {
            "model": "m",
            "input": [
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "a" * 40_000},
                {"type": "function_call_output", "call_id": "c", "output": "o" * 40_000},
            ],
            "tools": [{"type": "function", "name": "f", "description": "d" * 400}],
        },
        20_100,
        20_200,
        "long",
    ),
    ("/v1/responses", {"model": "m", "input": "hi", "max_output_tokens": 4000}, 1, 1, "long"),
]


@pytest.mark.parametrize(("path", "body", "lo", "hi", "profile"), SHAPES)
def test_input_token_estimate_per_endpoint_shape(
    app: App, path: str, body: dict[str, object], lo: int, hi: int, profile: str
) -> None:
    s = RouteStream(app)
    s.on_message(body_only_msg(json.dumps(body).encode(), {":path": path}), 0.0)
    assert s.info is not None and s.info.model_known
    assert lo <= s.info.input_tokens <= hi
    assert s.info.slice.profile == profile


# (method, path, body or None, decision reason): what counts as an LLM request.
PATHS = [
    ("POST", "/v1/chat/completions", chat_request(), "no_data"),
    ("POST", "/v1/chat/completions/", chat_request(), "no_data"),
    ("POST", "/v1/chat/completions?api-version=2024-10-21", chat_request(), "no_data"),
    ("POST", "/v1/completions", b'{"model": "m", "prompt": "x"}', "no_data"),
    ("POST", "/v1/responses", b'{"model": "m", "input": "x"}', "no_data"),
    ("POST", "/v1/chat/completions", chat_request(model="gpt-unknown"), "unknown_model"),
    ("POST", "/v1/chat/completions", b'{"messages": []}', "unknown_model"),
    ("POST", "/v1/embeddings", b'{"model": "m", "input": "x"}', "not_llm"),
    ("POST", "/V1/Chat/Completions", chat_request(), "not_llm"),
    ("POST", "/openai/v1/chat/completions", chat_request(), "not_llm"),
    ("POST", "//v1/chat/completions", chat_request(), "not_llm"),
    ("GET", "/v1/models", None, "not_llm"),
    ("GET", "/v1/chat/completions", None, "not_llm"),  # lists stored completions
    ("GET", "/v1/responses/resp_1", None, "not_llm"),
    # A chunked POST of no bytes: the request a content-length: 0 one is (no body),
    # which Envoy never sends the one-message filter; it got the sidecar's 400.
    ("POST", "/v1/chat/completions", b"", "not_llm"),
]


@pytest.mark.parametrize(("method", "path", "body", "reason"), PATHS)
def test_what_counts_as_an_llm_request(
    app: App, method: str, path: str, body: bytes | None, reason: str
) -> None:
    """Only a missing or unknown model on an LLM API path counts as a fail-open
    (``unknown_model``: TailrouteUnknownModel, on a share); other traffic takes the
    default route by design."""
    s = RouteStream(app)
    hdrs = {":method": method, ":path": path}
    if body is None:
        r = s.on_message(headers_msg(hdrs, eos=True), 0.0)
    else:
        s.on_message(headers_msg({**hdrs, "content-type": "application/json"}), 0.0)
        r = s.on_message(body_msg(body), 0.0)
    assert r is not None and s.decision is not None and s.decision.reason == reason
    failopen = {k for k in app.shell_counters() if k.startswith("failopen:")}
    assert failopen == ({"failopen:unknown_model"} if reason == "unknown_model" else set())
    if reason in ("not_llm", "unknown_model"):
        assert routed_cluster(r) == app.config.default_cluster  # type: ignore[arg-type]
    # Its outcome is evidence about the cluster's LLM routes only if it is an LLM request.
    (pending,) = app.pending.values()
    assert pending.observed is (reason != "not_llm")


# A hint sent twice, the two lines differing: on the rich path Envoy sends each line as
# its own header entry; the one-message path gets them as one attribute, joined by ','
# (both seen through the real Envoy: tests/test_integration_request_hints.py).
REPEATED = [
    ("x-tailroute-priority", [b"1", b"1000"]),
    ("x-tailroute-class", [b"batch", b"agentic"]),
    ("x-tailroute-step", [b"critical", b"optional"]),
    ("x-tailroute-deadline-ms", [b"20000", b"0"]),
    ("x-tailroute-fanout", [b"1", b"256"]),
]


@pytest.mark.parametrize(("header", "lines"), REPEATED)
def test_a_repeated_hint_is_read_alike_on_both_paths(app: App, header: str,
                                                     lines: list[bytes]) -> None:
    """A repeated single-valued hint is a list (RFC 9110 section 5.3), ignored as if
    absent on both paths; the rich path used to keep the last line (priority 1000, class
    agentic, an optional step with an exhausted deadline skipped with 412)."""
    hm = base_pb2.HeaderMap(headers=[
        base_pb2.HeaderValue(key=k, raw_value=v) for k, v in
        [(":method", b"POST"), (":path", b"/v1/chat/completions"),
         *((header, line) for line in lines)]])
    rich = RouteStream(app)
    rich.on_message(pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=hm)), 0.0)
    rich_answer = rich.on_message(body_msg(chat_request()), 0.0)
    one = RouteStream(app)
    joined = ",".join(line.decode() for line in lines)
    one.on_message(body_only_msg(chat_request(), {header: joined}), 0.0)
    absent = RouteStream(app)
    absent.on_message(body_only_msg(chat_request()), 0.0)
    assert rich.info is not None and one.info is not None and absent.info is not None
    for s in (rich, one):
        assert s.info is not None
        got = (s.info.klass, s.info.priority, s.info.step, s.info.deadline_ms, s.info.fanout)
        assert got == (absent.info.klass, absent.info.priority, None, None, 1), (s, got)
    assert rich_answer is not None and routed_cluster(rich_answer) in {"a", "b", "c"}  # type: ignore[arg-type]
