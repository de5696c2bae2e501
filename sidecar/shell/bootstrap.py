"""Render the Envoy bootstrap from the sidecar config, so clusters never disagree.

The rendered bootstrap (see ``envoy/envoy.yaml`` for a readable copy) has:

* an HTTP connection manager early header mutation that removes any
  client-supplied ``x-tailroute-cluster`` *before routing* (Envoy computes and
  caches the route before HTTP filters run; with the sidecar down, nothing
  else would clear a spoofed choice);
* a listener with an HTTP connection manager whose filter chain is
  1. ``header_mutation`` that strips any client-supplied ``x-tailroute-cluster``
     (a client must never choose its own cluster) and our internal headers;
  2. ``ext_proc`` "tailroute-route": request headers + BUFFERED body, response
     headers; it sets ``x-tailroute-cluster`` and clears the route cache.
     ``failure_mode_allow: true`` so a dead sidecar means the default route,
     an explicit ``message_timeout`` (the 200 ms default turns a slow decision
     into a 504), ``allow_mode_override`` for per-request modes;
  3. ``ext_proc`` "tailroute-observe" in ``observability_mode``: it streams the
     response body to the sidecar without waiting for answers, so token
     timing costs the client nothing (see docs/response-timing.md);
  4. the router.
* routes: ``cluster_header: x-tailroute-cluster`` when the header is present,
  else the configured default cluster (fail-open never yields a 503
  no_cluster); a per-route buffer limit above Envoy's 1 MiB default so long
  prompts can be buffered for classification;
* the upstream clusters from the sidecar config and an HTTP/2 gRPC cluster for
  the sidecar over TCP or a Unix socket, health-checked with grpc.health.v1 and,
  with ``envoy.sidecar_tls``, over TLS (:mod:`sidecar.shell.sidecar_cluster`).
"""

from __future__ import annotations

import ipaddress
from typing import Any, Literal

import yaml

from sidecar.core.config import Config
from sidecar.shell.sidecar_cluster import sidecar_cluster_extras

ROUTE_HEADER = "x-tailroute-cluster"
REQUEST_ID_HEADER = "x-tailroute-rid"
SIDECAR_CLUSTER = "tailroute_sidecar"
ObserveMode = Literal["observability", "streamed", "headers_only"]

_TYPE = "type.googleapis.com/"
_EXT_PROC = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
_HCM = (
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
    ".HttpConnectionManager"
)
_HEADER_MUTATION = (
    "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation"
)
_HTTP_OPTS = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def _addr(hostport: str) -> dict[str, Any]:
    host, _, port = hostport.rpartition(":")
    return {"socket_address": {"address": host, "port_value": int(port)}}


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _cluster(
    name: str, address: dict[str, Any], http2: bool, timeout_s: float, tls: bool = False
) -> dict[str, Any]:
    host = address.get("socket_address", {}).get("address", "")
    c: dict[str, Any] = {
        "name": name,
        # Hostnames need DNS resolution; a STATIC cluster accepts IP addresses only.
        "type": "STRICT_DNS" if host and not _is_ip(host) else "STATIC",
        "connect_timeout": f"{timeout_s}s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address}}]}],
        },
    }
    if tls:
        c["transport_socket"] = {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": _TYPE
                + "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "sni": host,
            },
        }
    if http2:
        c["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": _HTTP_OPTS,
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        }
    return c


def _ext_proc(
    name: str, timeout_ms: int, mode: dict[str, str], observe: bool, overlap: bool = False
) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "@type": _EXT_PROC,
        "grpc_service": {
            "envoy_grpc": {"cluster_name": SIDECAR_CLUSTER},
            "timeout": "5s",
        },
        "failure_mode_allow": True,
        "message_timeout": f"{timeout_ms / 1000:.3f}s",
        "processing_mode": mode,
    }
    if observe:
        cfg["observability_mode"] = True
    else:
        if overlap:
            cfg["send_body_without_waiting_for_header_response"] = True
        else:
            cfg["allow_mode_override"] = True
        # Let the sidecar set headers the route table matches on; x-envoy-* stays forbidden
        # except the per-request upstream timeout.
        cfg["mutation_rules"] = {"allow_all_routing": True, "allow_envoy": True}
    return {"name": name, "typed_config": cfg}


def _only_with_rid(flt: dict[str, Any]) -> dict[str, Any]:
    """Skip the wrapped filter unless the request carries ``x-tailroute-rid``.

    The sidecar sets that header only on requests it wants timed, so the
    observing stream (and its CPU) exists only for sampled requests.
    """
    has_rid = {
        "single_predicate": {
            "input": {
                "name": "rid",
                "typed_config": {
                    "@type": _TYPE + "envoy.type.matcher.v3.HttpRequestHeaderMatchInput",
                    "header_name": REQUEST_ID_HEADER,
                },
            },
            "value_match": {"contains": "-"},  # every rid is "<prefix>-<n>"
        }
    }
    skip = {
        "name": "skip",
        "typed_config": {
            "@type": _TYPE + "envoy.extensions.filters.common.matcher.action.v3.SkipFilter"
        },
    }
    return {
        "name": flt["name"],
        "typed_config": {
            "@type": _TYPE + "envoy.extensions.common.matching.v3.ExtensionWithMatcher",
            "extension_config": flt,
            "xds_matcher": {
                "matcher_list": {
                    "matchers": [
                        {"predicate": {"not_matcher": has_rid}, "on_match": {"action": skip}}
                    ]
                }
            },
        },
    }


def render_bootstrap(
    config: Config,
    grpc_target: str | None = None,
    unix_socket: str | None = None,
    listen: str | None = None,
    admin: str | None = None,
    observe_mode: ObserveMode | None = None,
    with_sidecar: bool = True,
) -> dict[str, Any]:
    """Build the bootstrap as a plain mapping (serialise with :func:`to_yaml`).

    ``grpc_target`` (host:port) or ``unix_socket`` selects how Envoy reaches the
    sidecar; default is the config's ``listen.grpc`` (or ``listen.grpc_unix``).
    ``with_sidecar=False`` renders the same proxy without ext_proc (the
    overhead benchmark's baseline).
    """
    mode = observe_mode or config.envoy.observe_mode
    timeout_ms = config.limits.decision_timeout_ms
    if unix_socket is None and grpc_target is None:
        unix_socket = config.listen.grpc_unix
        grpc_target = None if unix_socket else config.listen.grpc
    sidecar_addr = (
        {"pipe": {"path": unix_socket}} if unix_socket else _addr(grpc_target or "")
    )
    route_mode = {
        "request_header_mode": "SEND",
        "request_body_mode": "BUFFERED",
        # With the observing filter, status and timing come from it: the routing
        # stream skips response headers (one synchronous round trip less per request).
        "response_header_mode": "SKIP" if mode == "observability" else "SEND",
        "response_body_mode": "STREAMED" if mode == "streamed" else "NONE",
        "request_trailer_mode": "SKIP",
        "response_trailer_mode": "SKIP",
    }
    filters: list[dict[str, Any]] = [
        {
            "name": "tailroute.strip_client_routing",
            "typed_config": {
                "@type": _HEADER_MUTATION,
                "mutations": {
                    "request_mutations": [
                        {"remove": ROUTE_HEADER},
                        {"remove": REQUEST_ID_HEADER},
                    ]
                },
            },
        },
        _ext_proc("tailroute.route", timeout_ms, route_mode, observe=False,
                  overlap=config.envoy.overlap_headers),
    ]
    if not with_sidecar:
        filters = filters[:1]
    if mode == "observability" and with_sidecar:
        observe_pm = {
            "request_header_mode": "SEND",
            "request_body_mode": "NONE",
            "response_header_mode": "SEND",
            "response_body_mode": "STREAMED",
            "request_trailer_mode": "SKIP",
            "response_trailer_mode": "SKIP",
        }
        filters.append(_only_with_rid(
            _ext_proc("tailroute.observe", timeout_ms, observe_pm, observe=True)
        ))
    filters.append(
        {
            "name": "envoy.filters.http.router",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
            },
        }
    )
    max_timeout_s = max(c.slo.timeout_ms for c in config.classes) / 1000.0
    route_common = {
        "timeout": f"{max_timeout_s:g}s",
        "idle_timeout": f"{max_timeout_s:g}s",
    }
    routes = [
        {
            "name": "tailroute_routed",
            "match": {"prefix": "/", "headers": [{"name": ROUTE_HEADER, "present_match": True}]},
            "route": {"cluster_header": ROUTE_HEADER, **route_common},
            "request_headers_to_remove": [REQUEST_ID_HEADER, ROUTE_HEADER],
            "request_body_buffer_limit": config.envoy.route_buffer_bytes,
        },
        {
            "name": "tailroute_default",
            "match": {"prefix": "/"},
            "route": {"cluster": config.default_cluster, **route_common},
            "request_headers_to_remove": [REQUEST_ID_HEADER, ROUTE_HEADER],
            "request_body_buffer_limit": config.envoy.route_buffer_bytes,
        },
    ]
    hcm = {
        "@type": _HCM,
        "stat_prefix": "tailroute",
        # Envoy picks (and caches) the route before any HTTP filter runs, so a
        # filter alone cannot stop a spoofed routing header when the sidecar is down
        # (nothing would clear the route cache): strip it before routing as well.
        "early_header_mutation_extensions": [
            {
                "name": "tailroute.strip_client_routing_early",
                "typed_config": {
                    "@type": _TYPE + "envoy.extensions.http.early_header_mutation"
                    ".header_mutation.v3.HeaderMutation",
                    "mutations": [
                        {"remove": ROUTE_HEADER},
                        {"remove": REQUEST_ID_HEADER},
                    ],
                },
            }
        ],
        "codec_type": "AUTO",
        "stream_idle_timeout": f"{max_timeout_s:g}s",
        "request_timeout": "0s",
        "route_config": {
            "name": "tailroute",
            "virtual_hosts": [{"name": "llm", "domains": ["*"], "routes": routes}],
        },
        "http_filters": filters,
    }
    clusters = [
        _cluster(c.name, _addr(c.address), http2=False, timeout_s=2.0, tls=c.tls)
        for c in config.clusters
    ]
    sidecar = _cluster(SIDECAR_CLUSTER, sidecar_addr, http2=True, timeout_s=0.25)
    if with_sidecar:  # health checks and TLS (sidecar.shell.sidecar_cluster)
        sidecar.update(sidecar_cluster_extras(config, over_unix=bool(unix_socket)))
    clusters.append(sidecar)
    return {
        "admin": {"address": _addr(admin or config.envoy.admin)},
        "static_resources": {
            "listeners": [
                {
                    "name": "llm_ingress",
                    "address": _addr(listen or config.envoy.listen),
                    "per_connection_buffer_limit_bytes": config.envoy.route_buffer_bytes,
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": hcm,
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": clusters,
        },
    }


def to_yaml(bootstrap: dict[str, Any]) -> str:
    """Serialise a bootstrap mapping with a header comment."""
    head = "# Rendered by `tailroute envoy-config`; edit the sidecar config, not this file.\n"
    return head + yaml.safe_dump(bootstrap, sort_keys=False, width=100)
