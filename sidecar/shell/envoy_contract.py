"""Names shared by the rendered Envoy config and the sidecar's handlers.

The bootstrap renderer (:mod:`sidecar.shell.bootstrap`) and the stream and
access-log handlers must agree on every one of these; keeping them in one
module is what makes a mismatch impossible.

Per request, the routing answer writes the dynamic metadata namespace
:data:`METADATA_NS`::

    tailroute: {rid: "<prefix>-<n>", route: "<cluster>|<class>|<n|s>", slice: "<slice label>"}

* ``route`` selects the Envoy route (one per cluster x class x sampled): the
  cluster, the class's upstream timeout and whether the observing filter runs;
* ``rid`` matches the access-log entry (which logs the metadata) to the decision;
* ``slice`` lets an access-log entry be understood without the sidecar's
  in-memory state (after a restart, or for a reader that never decided it).
"""

from __future__ import annotations

import functools

METADATA_NS = "tailroute"
USAGE_NS = "tailroute.usage"  # written by Envoy's sse_to_metadata filter
RID_KEY = "rid"
ROUTE_KEY = "route"
SLICE_KEY = "slice"
# "1" on a request whose whole answer has a timeout: an unstreamed one (its route, matched
# before the stream's route of the same key, has the class timeout as its whole-answer
# timeout) and a stream whose caller gave a deadline (the rich path's timeout header
# overrides that route timeout: the deadline is its cap, not the stream routes' safety
# net, which would cut a deadline longer than it). A stream's route bounds only its
# silences and, as a safety net, its length. A separate key, not a part of the route
# key, so a bootstrap and a sidecar of different versions still agree on every route
# (the older one's reading).
UNARY_KEY = "unary"
TOKENS_KEY = "output_tokens"
# Written (a constant, never the provider's text) by the usage filter when an event of
# the stream has a field at one of sidecar.core.timing.ERROR_SELECTORS: the entry is
# then read field by field, where the field's value (below) decides whether it reported
# an error (a provider that failed mid-stream behind a 200). The mark is a constant so
# that nothing a provider sends ever reaches the '|'-separated entry tag below.
STREAM_ERROR_KEY = "stream_error"
STREAM_ERROR_MARK = 1
# The last value of each error field the stream carried, as Envoy lifted it (an object
# as its JSON text), under ERROR_VALUE_PREFIX + the path joined with dots
# ("error_value.response.error"). Only the access-log entry's metadata carries it.
ERROR_VALUE_PREFIX = "error_value."
# Written by the [DONE] mark (bootstrap_done) when the stream passed its "data: [DONE]"
# line: Envoy's clock then, microseconds since the epoch as text. A client that left
# after it had the whole answer.
DONE_KEY = "done"


def error_value_key(path: tuple[str, ...]) -> str:
    """The usage-namespace key of one error field's value (:data:`ERROR_VALUE_PREFIX`)."""
    return ERROR_VALUE_PREFIX + ".".join(path)


# The request id copied into metadata where usage is parsed on a sample of requests
# (bootstrap_filters.usage_sampled): the sampling matcher reads it there.
SAMPLE_NS = "tailroute.usage_sample"
SAMPLE_KEY = "request_id"

# The rendered bootstrap's last route: requests without a decision (and, in native or
# hybrid mode, without a slice route). A decided request logged on it was not routed as
# decided: its bootstrap has no route for the decision's key (sidecar.shell.outcomes).
DEFAULT_ROUTE = "tailroute_default"
ROUTE_FILTER = "tailroute.route"  # one message per request: the buffered body
RICH_FILTER = "tailroute.route_rich"  # headers + body (+ response headers on request)
OBSERVE_FILTER = "tailroute.observe"  # sampled: times the first content token
ACCESS_LOG_NAME = "tailroute"

# Headers a client may never set (stripped before routing and before the upstream).
ROUTE_HEADER = "x-tailroute-cluster"
REQUEST_ID_HEADER = "x-tailroute-rid"
STRIPPED_HEADERS = (ROUTE_HEADER, REQUEST_ID_HEADER)

# A request carrying any of these takes the rich path (it needs the request
# headers answered or the response headers seen): the deadline becomes the
# upstream timeout header, explain comes back as a response header.
RICH_HEADERS = ("x-tailroute-deadline-ms", "x-tailroute-explain")

# What the one-message path sends instead of the request headers: ext_proc
# request attributes (CEL expressions, keyed by the expression text, in the
# ``ProcessingRequest.attributes`` entry :data:`ATTRIBUTES_NS`).
ATTRIBUTES_NS = "envoy.filters.http.ext_proc"
# Every header sidecar.core.classify reads but the rich-path ones: a header missing
# here is silently absent on the one-message path (x-tailroute-fanout was).
CLASSIFY_HEADERS = (
    "x-tailroute-class", "x-tailroute-priority", "x-tailroute-tenant", "x-tailroute-step",
    "x-tailroute-fanout", "x-request-id", "x-envoy-attempt-count", "x-stainless-retry-count",
)
ATTRIBUTE_HEADERS: dict[str, str] = {
    "request.path": ":path",
    **{f"request.headers['{h}']": h for h in CLASSIFY_HEADERS},
}

# The hints a client sends tailroute: read by the routing filters, then removed
# (bootstrap_filters.strip_hints_filter) so the upstream never sees them (in extproc
# mode; native and hybrid routes match x-tailroute-class at the router and keep them).
# Derived, so a header classify learns to read is stripped without a second list.
HINT_HEADERS = (
    *(h for h in CLASSIFY_HEADERS if h.startswith("x-tailroute-")), *RICH_HEADERS,
)

# Access-log custom tags (Envoy substitution formatters), microseconds from US_TX_BEG.
TAG_FIRST_BODY_US = "tr_first_body_us"
TAG_END_US = "tr_end_us"
CUSTOM_TAGS = {
    TAG_FIRST_BODY_US: "%COMMON_DURATION(US_TX_BEG:US_RX_BODY_BEG:us)%",
    TAG_END_US: "%COMMON_DURATION(US_TX_BEG:US_RX_END:us)%",
}

# Native mode logs the same two durations, with what the common entry's reading needs,
# as one tag (one map lookup instead of four message reads per logged request):
# "<status>|<response flags>|<first body us>|<end us>|<output tokens>|<rid>|<stream
# error>", where Envoy prints "-" for no response flag and "" for a missing duration or
# metadata key (the stream-error part is "1" when the usage filter marked the stream).
TAG_ENTRY = "tr"
ENTRY_TAG_FORMAT = "|".join((
    "%RESPONSE_CODE%", "%RESPONSE_FLAGS%", CUSTOM_TAGS[TAG_FIRST_BODY_US],
    CUSTOM_TAGS[TAG_END_US], f"%DYNAMIC_METADATA({USAGE_NS}:{TOKENS_KEY})%",
    f"%DYNAMIC_METADATA({METADATA_NS}:{RID_KEY})%",
    f"%DYNAMIC_METADATA({USAGE_NS}:{STREAM_ERROR_KEY})%",
))

# Upstream response headers every access-log entry carries when the response had them
# (HttpGrpcAccessLogConfig.additional_response_headers_to_log -> the entry's
# response.response_headers): a 429's declared wait (sidecar.core.retry_after). Envoy
# adds only the headers a response has, so a 2xx entry carries none of them. The
# response's ``date`` is not among them: every response has one, and every native entry
# would carry it to help the rare HTTP-date form; the entry's own end time stands in.
RETRY_AFTER_HEADER = "retry-after"
RETRY_AFTER_MS_HEADER = "retry-after-ms"
LOGGED_RESPONSE_HEADERS = (RETRY_AFTER_HEADER, RETRY_AFTER_MS_HEADER)

SAMPLED, UNSAMPLED = "s", "n"


@functools.lru_cache(maxsize=4096)
def route_key(cluster: str, klass: str, sampled: bool) -> str:
    """The ``route`` metadata value that selects one rendered Envoy route (cached: the
    set of routes is small and fixed by the config, and this runs per request)."""
    return f"{cluster}|{klass}|{SAMPLED if sampled else UNSAMPLED}"


def duration(seconds: float) -> str:
    """``seconds`` as a protobuf JSON ``Duration`` (``"30s"``, ``"0.25s"``): a plain
    decimal with at most nine fractional digits. ``f"{x:g}s"`` wrote a class timeout
    of 1,000,000 s as ``1e+06s``, which Envoy refuses to load, and 1,234.567 s as
    ``1234.57s``."""
    return f"{seconds:.9f}".rstrip("0").rstrip(".") + "s"
