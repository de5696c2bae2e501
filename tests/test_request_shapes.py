"""Request-side shapes an OpenAI-compatible gateway meets, through the stream handler
(in memory): hostile header values, body fields, endpoints and their token profiles."""

from __future__ import annotations

import pytest

from sidecar.core.config import Config
from sidecar.pb.envoy.config.core.v3 import base_pb2
from sidecar.pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from sidecar.shell.app import App
from sidecar.shell.extproc import RouteStream
from tests.streamharness import body_msg, body_only_msg, chat_request, routed_cluster


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
