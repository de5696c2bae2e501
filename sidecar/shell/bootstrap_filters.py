"""The HTTP filters and the access log of the rendered Envoy bootstrap.

Filter chain (in this order, before the router), and why each is there:

1. ``tailroute.strip_client_routing`` (header_mutation): a client never sends
   tailroute's internal headers upstream.
2. ``tailroute.route`` (ext_proc, the common path): ``request_header_mode: SKIP``
   and a BUFFERED body, so one message and one answer per request. The request
   headers the classifier reads arrive as ext_proc *request attributes* (CEL
   ``request.headers['…']``, sent with that first message). The answer writes
   dynamic metadata (``metadata_options.receiving_namespaces``) that the route
   table matches; ``route_cache_action: CLEAR`` makes Envoy pick the route again.
   Skipped (``ExtensionWithMatcher``) when the request carries a rich header.
3. ``tailroute.route_rich`` (ext_proc, only for requests with
   ``x-tailroute-deadline-ms`` or ``x-tailroute-explain``): request headers +
   body, so the answer can set the upstream-timeout header, and response
   headers on request (explain), through ``allow_mode_override``.
4. ``envoy.filters.http.buffer``: holds the request until the whole body is in,
   so the route is chosen *after* the body answer (without it Envoy routes on
   the headers alone, before ext_proc has decided).
   ``tailroute.strip_client_hints`` (header_mutation) then removes the
   ``x-tailroute-*`` hints the routing filters read (extproc mode only: native
   and hybrid routes match ``x-tailroute-class`` at the router).
5. ``tailroute.usage`` (sse_to_metadata): lifts the stream's final
   ``usage.completion_tokens`` (Chat/Completions) or ``response.usage.output_tokens``
   (Responses API) into dynamic metadata, which the access log carries, and
   the error fields of its events (``stream_error`` and ``error_value.*``: a
   provider that failed mid-stream behind its 200). It parses every event of
   the stream as JSON (~7 us of Envoy CPU per event here), so with
   ``envoy.usage_sample`` below 1 it runs only on that share of requests,
   picked by the first hex digit of Envoy's ``x-request-id`` (and only those
   can show a mid-stream error).
   ``tailroute.done`` (lua, ``timing.done_mark``, on the same requests): marks a
   stream that passed its ``data: [DONE]`` line, so a client that then left is
   read as a complete answer, not a cancel (:mod:`sidecar.shell.bootstrap_done`).
6. ``tailroute.observe`` (ext_proc in observability mode): disabled on every
   route but the sampled ones; streams the response to the sidecar without
   waiting for answers, and the sidecar closes it at the first content token.

Every ext_proc filter has ``failure_mode_allow: true``: a dead, slow or
overflowing sidecar means the default route, never a 5xx; the access log then
shows a request without tailroute metadata, which the sidecar counts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sidecar.core.config import SIDECAR_CLUSTER as SIDECAR_CLUSTER  # reserved in the config
from sidecar.core.sse import MAX_EVENT_BYTES
from sidecar.core.timing import ERROR_SELECTORS
from sidecar.shell import envoy_contract as ec
from sidecar.shell.bootstrap_done import done_filter

if TYPE_CHECKING:
    from sidecar.core.config import Config

TYPE = "type.googleapis.com/"
_EXT_PROC = TYPE + "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
_HEADER_MUTATION = TYPE + "envoy.extensions.filters.http.header_mutation.v3.HeaderMutation"
_MATCHED = TYPE + "envoy.extensions.common.matching.v3.ExtensionWithMatcher"
_SKIP = TYPE + "envoy.extensions.filters.common.matcher.action.v3.SkipFilter"
_HEADER_INPUT = TYPE + "envoy.type.matcher.v3.HttpRequestHeaderMatchInput"
EXT_PROC_PER_ROUTE = TYPE + "envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute"

_ROUTE_ONLY = {"request_trailer_mode": "SKIP", "response_trailer_mode": "SKIP",
               "response_header_mode": "SKIP", "response_body_mode": "NONE"}


def _grpc() -> dict[str, Any]:
    return {"envoy_grpc": {"cluster_name": SIDECAR_CLUSTER}, "timeout": "5s"}


def strip_filter(removed: tuple[str, ...] = ec.STRIPPED_HEADERS) -> dict[str, Any]:
    """``removed``: hint_rules.listener_removed (early=False)."""
    return {
        "name": "tailroute.strip_client_routing",
        "typed_config": {
            "@type": _HEADER_MUTATION,
            "mutations": {"request_mutations": [{"remove": h} for h in removed]},
        },
    }


HINTS_FILTER = "tailroute.strip_client_hints"


def strip_hints_filter() -> dict[str, Any]:
    """After the routing filters have read them, the client's hints to tailroute
    (class, priority, tenant, deadline, ...) go no further: a provider never sees a
    caller's priority or tenant claims, nor keys its caching or logging on them."""
    return {
        "name": HINTS_FILTER,
        "typed_config": {
            "@type": _HEADER_MUTATION,
            "mutations": {"request_mutations": [{"remove": h} for h in ec.HINT_HEADERS]},
        },
    }


def _rich_predicate(rich: tuple[str, ...]) -> dict[str, Any]:
    """True when the request carries any of the ``rich`` headers (any value)."""
    present = [
        {"single_predicate": {
            "input": {"name": h, "typed_config": {"@type": _HEADER_INPUT, "header_name": h}},
            "value_match": {"safe_regex": {"google_re2": {}, "regex": ".*"}},
        }}
        for h in rich
    ]
    if len(present) == 1:  # an or_matcher needs two
        return present[0]
    return {"or_matcher": {"predicate": present}}


def _skip_when(name: str, inner: dict[str, Any], predicate: dict[str, Any]) -> dict[str, Any]:
    """Wrap a filter so that Envoy skips it for requests matching ``predicate``."""
    return {
        "name": name,
        "typed_config": {
            "@type": _MATCHED,
            "extension_config": {"name": name, "typed_config": inner},
            "xds_matcher": {"matcher_list": {"matchers": [
                {"predicate": predicate,
                 "on_match": {"action": {"name": "skip", "typed_config": {"@type": _SKIP}}}},
            ]}},
        },
    }


def route_filters(timeout_ms: int, attributes: list[str] | None = None,
                  rich_headers: tuple[str, ...] = ec.RICH_HEADERS) -> list[dict[str, Any]]:
    """The two routing filters: the one-message path (sent ``attributes``) and the rich
    path, taken when a request carries one of ``rich_headers`` (none: never)."""
    common = {
        "@type": _EXT_PROC,
        "grpc_service": _grpc(),
        "failure_mode_allow": True,
        "message_timeout": f"{timeout_ms / 1000:.3f}s",
        "route_cache_action": "CLEAR",
        "metadata_options": {"receiving_namespaces": {"untyped": [ec.METADATA_NS]}},
    }
    fast = {
        **common,
        "stat_prefix": "tailroute_route",
        "request_attributes": list(ec.ATTRIBUTE_HEADERS) if attributes is None else attributes,
        "processing_mode": {"request_header_mode": "SKIP", "request_body_mode": "BUFFERED",
                            **_ROUTE_ONLY},
    }
    rich = {
        **common,
        "stat_prefix": "tailroute_route_rich",
        "allow_mode_override": True,
        # The upstream-timeout header is an x-envoy-* header: allowed explicitly.
        "mutation_rules": {"allow_all_routing": True, "allow_envoy": True},
        "processing_mode": {"request_header_mode": "SEND", "request_body_mode": "BUFFERED",
                            **_ROUTE_ONLY},
    }
    if not rich_headers:  # deadline and explain both ignored (hints:): no rich path
        return [{"name": ec.ROUTE_FILTER, "typed_config": fast}]
    rich_request = _rich_predicate(rich_headers)
    return [
        _skip_when(ec.ROUTE_FILTER, fast, rich_request),
        _skip_when(ec.RICH_FILTER, rich, {"not_matcher": rich_request}),
    ]


BUFFER_FILTER = "envoy.filters.http.buffer"


def buffer_filter(max_bytes: int) -> dict[str, Any]:
    return {
        "name": BUFFER_FILTER,
        "typed_config": {"@type": TYPE + "envoy.extensions.filters.http.buffer.v3.Buffer",
                         "max_request_bytes": max_bytes},
    }


USAGE_FILTER = "tailroute.usage"
SAMPLE_FILTER = "tailroute.usage_sample"
_REQUEST_ID = "x-request-id"
_HEX = "0123456789abcdef"


def usage_share(config: Config) -> float:
    """The share of requests whose stream is parsed for usage, in sixteenths.

    ``envoy.usage_sample`` when set, else every request in extproc mode (the
    per-request exchange dwarfs the parse there) and a quarter in native and
    hybrid mode (whose point is that Envoy does little per request).
    """
    want = config.envoy.usage_sample
    if want is None:
        want = 1.0 if config.routing.mode == "extproc" else 0.25
    return max(1, min(16, round(want * 16))) / 16


def usage_sampled(inners: list[dict[str, Any]], share: float) -> list[dict[str, Any]]:
    """``inners`` for a share of 1; else a ``header_to_metadata`` filter copying
    ``x-request-id`` into dynamic metadata, then each of ``inners`` skipped unless that
    id starts with one of the first ``16 * share`` hex digits (the same requests).

    Why through metadata: Envoy's ``ExtensionWithMatcher`` around a filter that
    only sees the response never receives the request headers to match on, but
    a dynamic-metadata input is there for it. Envoy generates the id (a random
    UUID) before any filter runs, so that digit is uniform and independent of
    everything the policy looks at; a caller's own id (kept on internal
    requests) only decides whether its tokens are counted.
    """
    k = round(share * 16)
    if k >= 16:
        return inners
    copy = {
        "name": SAMPLE_FILTER,
        "typed_config": {
            "@type": TYPE + "envoy.extensions.filters.http.header_to_metadata.v3.Config",
            "request_rules": [{"header": _REQUEST_ID, "on_header_present": {
                "metadata_namespace": ec.SAMPLE_NS, "key": ec.SAMPLE_KEY, "type": "STRING"}}],
        },
    }
    rest = "".join(dict.fromkeys(_HEX[k:] + _HEX[k:].upper()))  # either case, once each
    unsampled = {"single_predicate": {
        "input": {"name": "request_id", "typed_config": {
            "@type": TYPE + "envoy.extensions.matching.common_inputs.network.v3"
                            ".DynamicMetadataInput",
            "filter": ec.SAMPLE_NS, "path": [{"key": ec.SAMPLE_KEY}]}},
        "custom_match": {"name": "request_id_digit", "typed_config": {
            "@type": TYPE + "envoy.extensions.matching.input_matchers.metadata.v3.Metadata",
            "value": {"string_match": {"safe_regex": {
                "regex": f"[{rest}].*"}}}}},
    }}
    return [copy, *(_skip_when(f["name"], f["typed_config"], unsampled) for f in inners)]


def usage_filters(share: float = 1.0, done_mark: bool = True) -> list[dict[str, Any]]:
    """Token counts from the stream's final usage object into dynamic metadata, and the
    error fields of its events (``ERROR_SELECTORS``: a provider that failed mid-stream
    behind a 200), on ``share`` of the requests (:func:`usage_sampled`); with
    ``done_mark`` (``timing.done_mark``) the ``[DONE]`` mark on the same requests
    (:mod:`sidecar.shell.bootstrap_done`).

    Each error field has two rules. One writes a constant mark on the field's first
    presence, so the entry leaves native mode's fast path (which reads only the entry
    tag) for the record path. The other lifts the field's value every time it is
    present (the last one stays), and the sidecar judges it there
    (``sidecar.core.timing.is_error_value``): Envoy's parser matches on presence alone,
    so ``{"error": ""}`` or ``{"error": false}``, a provider's "no error", would
    otherwise count as a failure.
    """
    def rule(*path: str) -> dict[str, Any]:
        return {"rule": {
            "selectors": [{"key": k} for k in path],
            "on_present": {"metadata_namespace": ec.USAGE_NS, "key": ec.TOKENS_KEY,
                           "type": "NUMBER"},
        }}

    def error_rules(path: tuple[str, ...]) -> list[dict[str, Any]]:
        selectors = [{"key": k} for k in path]
        # The mark is a constant, never the selected text: the provider's message must
        # not reach the access log's '|'-separated entry tag. One match is enough.
        mark = {"rule": {
            "selectors": selectors,
            "on_present": {"metadata_namespace": ec.USAGE_NS, "key": ec.STREAM_ERROR_KEY,
                           "value": ec.STREAM_ERROR_MARK},
        }, "stop_processing_after_matches": 1}
        # The value as it is (a string, number or boolean; an object as its JSON text):
        # no limit, so a stream that carries ``"error": ""`` on every event and then a
        # real error ends with the real one.
        value = {"rule": {
            "selectors": selectors,
            "on_present": {"metadata_namespace": ec.USAGE_NS, "key": ec.error_value_key(path),
                           "type": "PROTOBUF_VALUE"},
        }}
        return [mark, value]

    usage = {
        "name": USAGE_FILTER,
        "typed_config": {
            "@type": TYPE + "envoy.extensions.filters.http.sse_to_metadata.v3.SseToMetadata",
            # Envoy drops an event that grows past this while its reads arrive (8 KiB by
            # default): a Responses API response.completed carries the whole answer, so
            # every answer over ~8 KiB lost its usage there, and a long error event its
            # error. The sidecar's own parser's limit (sidecar.core.sse).
            "response_rules": {"max_event_size": MAX_EVENT_BYTES, "content_parser": {
                "name": "envoy.content_parsers.json",
                "typed_config": {
                    "@type": TYPE + "envoy.extensions.content_parsers.json.v3.JsonContentParser",
                    "rules": [rule("usage", "completion_tokens"),
                              rule("response", "usage", "output_tokens"),
                              *(r for p in ERROR_SELECTORS for r in error_rules(p))],
                },
            }},
        },
    }
    return usage_sampled([usage, done_filter()] if done_mark else [usage], share)


def observe_filter() -> dict[str, Any]:
    return {
        "name": ec.OBSERVE_FILTER,
        "typed_config": {
            "@type": _EXT_PROC,
            "grpc_service": _grpc(),
            "failure_mode_allow": True,
            "observability_mode": True,
            "stat_prefix": "tailroute_observe",
            # The sidecar closes the stream itself at the first token; this only
            # bounds a stream whose close got lost.
            "deferred_close_timeout": "1s",
            "metadata_options": {"forwarding_namespaces": {"untyped": [ec.METADATA_NS]}},
            "processing_mode": {"request_header_mode": "SKIP", "request_body_mode": "NONE",
                                "response_header_mode": "SEND",
                                "response_body_mode": "STREAMED",
                                "request_trailer_mode": "SKIP",
                                "response_trailer_mode": "SKIP"},
        },
    }


def observe_disabled() -> dict[str, Any]:
    """Per-route config that turns the observing filter off (all unsampled routes)."""
    return {ec.OBSERVE_FILTER: {"@type": EXT_PROC_PER_ROUTE, "disabled": True}}


def router_filter() -> dict[str, Any]:
    return {"name": "envoy.filters.http.router",
            "typed_config": {"@type": TYPE + "envoy.extensions.filters.http.router.v3.Router"}}


def access_log(flush_ms: int) -> list[dict[str, Any]]:
    """One gRPC Access Log Service stream per Envoy worker to the sidecar, batched;
    each entry with the upstream's Retry-After headers when it sent them."""
    return [{
        "name": "tailroute.access_log",
        "typed_config": {
            "@type": TYPE + "envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig",
            "common_config": {
                "log_name": ec.ACCESS_LOG_NAME,
                "transport_api_version": "V3",
                "grpc_service": {"envoy_grpc": {"cluster_name": SIDECAR_CLUSTER}},
                "buffer_flush_interval": f"{flush_ms / 1000:.3f}s",
                "custom_tags": [{"tag": k, "value": v} for k, v in ec.CUSTOM_TAGS.items()],
            },
            "additional_response_headers_to_log": list(ec.LOGGED_RESPONSE_HEADERS),
        },
    }]
