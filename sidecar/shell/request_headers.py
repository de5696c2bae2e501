"""What the routing stream reads of a request's headers (and the observing stream of a
response's), out of the ext_proc messages Envoy sends.

* rich path: the request headers message (:func:`request_header_map`);
* one-message path: the request attributes the bootstrap lists
  (:func:`attribute_headers`, ``envoy_contract.ATTRIBUTE_HEADERS``);
* a response's headers (:func:`header_map`).

A routing stream lives as long as its HTTP request, a streamed answer included, so
what it keeps of the headers is kept that long: only the headers it reads
(:data:`KEPT_HEADERS`, the names the one-message path gets as attributes and the rich
path's own). It kept them all: 1,000 open rich-path streams whose requests carried 50 KiB
of other headers (cookies, tokens, padding; Envoy accepts 60 KiB) held 59 MB of Python
strings the sidecar never read.
"""

from __future__ import annotations

from typing import Final

from sidecar.pb.envoy.config.core.v3 import base_pb2
from sidecar.pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from sidecar.shell import envoy_contract as ec

# The hints classify reads, which API (the path) and the body's declared length (a
# declared body is never refused by gRPC, so its stream ending early is no fail-open:
# extproc.RouteStream._declared).
# By name, not by the x-tailroute- prefix: other names under it are as unread as any.
KEPT_HEADERS: Final = frozenset(
    (*ec.CLASSIFY_HEADERS, *ec.RICH_HEADERS, ":path", "content-length"))


def header_map(hm: base_pb2.HeaderMap) -> dict[str, str]:
    """Lower-cased header dict; Envoy sends values in raw_value (bytes). A repeated
    response header keeps its last value (see :func:`request_header_map` for requests)."""
    out: dict[str, str] = {}
    for h in hm.headers:
        out[h.key.lower()] = h.raw_value.decode("latin-1") if h.raw_value else h.value
    return out


def request_header_map(hm: base_pb2.HeaderMap,
                       trusted: frozenset[str] = frozenset()) -> dict[str, str]:
    """The request headers the routing stream reads (module docstring), a repeated
    header's lines joined with ``,``: Envoy sends each line of a repeated header as its
    own entry, but joins them for the one-message path's attributes
    (``request.headers['x']`` is ``1,1000``), and RFC 9110 section 5.3 reads the lines as
    that list. Keeping the last line instead read ``x-tailroute-priority: 1`` +
    ``x-tailroute-priority: 1000`` as 1000 on the rich path and as absent on the other;
    every hint is a single value, so a list is now ignored on both (README, "Running it
    beside your Envoy"). ``trusted``: the headers ``hints:`` takes hints from, kept too."""
    out: dict[str, str] = {}
    for h in hm.headers:
        key = h.key.lower()
        if key not in KEPT_HEADERS and key not in trusted:
            continue
        value = h.raw_value.decode("latin-1") if h.raw_value else h.value
        before = out.get(key)
        out[key] = value if before is None else f"{before},{value}"
    return out


_HEADER_EXPR: Final = ("request.headers['", "']")


def _header_of(expr: str) -> str | None:
    """The header a ``request.headers['name']`` attribute carries (the config's
    trusted headers, hint_rules.attribute_exprs, are not in the fixed table)."""
    head, tail = _HEADER_EXPR
    if expr.startswith(head) and expr.endswith(tail):
        return expr[len(head):-len(tail)].lower()
    return None


def attribute_headers(msg: pb.ProcessingRequest) -> dict[str, str]:
    """The headers the one-message path sends as request attributes (absent when unset)."""
    if ec.ATTRIBUTES_NS not in msg.attributes:
        return {}
    out: dict[str, str] = {}
    for expr, value in msg.attributes[ec.ATTRIBUTES_NS].fields.items():
        name = ec.ATTRIBUTE_HEADERS.get(expr) or _header_of(expr)
        if name is not None and value.WhichOneof("kind") == "string_value":
            out[name] = value.string_value
    return out
