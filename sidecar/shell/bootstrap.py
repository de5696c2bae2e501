"""Render the Envoy bootstrap from the sidecar config, so clusters never disagree.

The rendered bootstrap (see ``envoy/envoy.yaml`` for a readable copy) has:

* an HTTP connection manager early header mutation that removes any
  client-supplied ``x-tailroute-cluster`` / ``x-tailroute-rid`` *before routing*
  (Envoy computes and caches the route before HTTP filters run);
* the HTTP filters of :mod:`sidecar.shell.bootstrap_filters` (strip, the
  one-message routing filter, the rich routing filter, buffer, usage lifting,
  the sampled first-token observer, router);
* routes that match the ``tailroute.route`` dynamic metadata the sidecar's
  answer writes: one per cluster x class x {unsampled, sampled}, each with the
  class's upstream timeout, the observing filter switched off unless sampled;
  then the default route (the configured default cluster), which is where a
  request without a decision goes (fail-open never yields a 503 no_cluster);
  a per-route buffer limit above Envoy's 1 MiB default so long prompts fit;
* an access log (gRPC Access Log Service) to the sidecar: every request's
  outcome and Envoy-side timing, batched over one stream per Envoy worker;
* the upstream clusters from the sidecar config, with circuit breakers well above
  their ``max_concurrency`` (:func:`upstream_max_requests`), with ``tls`` over TLS
  that verifies the provider's certificate (:func:`provider_tls`), and an HTTP/2 gRPC cluster for
  the sidecar over TCP or a Unix socket, with explicit circuit breakers
  (:func:`sidecar_max_requests`): Envoy's default of 1024 streams would make it
  fail open under load; health-checked with grpc.health.v1, HTTP/2 keepalive
  pings and, with ``envoy.sidecar_tls``, over TLS (:mod:`sidecar.shell.sidecar_cluster`).
"""

from __future__ import annotations

import ipaddress
from typing import Any

import yaml

from sidecar.core.admission import stream_cap_s
from sidecar.core.config import ClusterConfig, Config
from sidecar.core.hostport import split_hostport
from sidecar.shell import bootstrap_filters as bf
from sidecar.shell import envoy_contract as ec
from sidecar.shell import hint_rules as hr
from sidecar.shell.bootstrap_filters import SIDECAR_CLUSTER
from sidecar.shell.envoy_contract import REQUEST_ID_HEADER as REQUEST_ID_HEADER
from sidecar.shell.envoy_contract import ROUTE_HEADER as ROUTE_HEADER
from sidecar.shell.sidecar_cluster import http2_options, sidecar_cluster_extras

_TYPE = bf.TYPE
_HCM = (
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
    ".HttpConnectionManager"
)
_HTTP_OPTS = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
_UPSTREAM_TLS = _TYPE + "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"


def _addr(hostport: str) -> dict[str, Any]:
    host, port = split_hostport(hostport, port_zero=True)  # IPv6: without its brackets
    return {"socket_address": {"address": host, "port_value": port}}


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def provider_tls(cluster: ClusterConfig) -> dict[str, Any] | None:
    """The ``transport_socket`` of a provider's cluster with ``tls: true``.

    Envoy verifies the provider's certificate by default: signed by a CA in
    ``tls_ca_file`` and naming the address's host as a subject alternative name
    (a DNS name, or an IP address for an IP literal). Envoy matches a DNS name the
    way browsers do, so a wildcard certificate (``*.example.com``) covers
    ``api.example.com``. Without it anyone on the path could pose as the provider
    and read the API keys. ``tls_verify: false`` leaves the check out.
    """
    if not cluster.tls:
        return None
    host = split_hostport(cluster.address)[0]
    ip = _is_ip(host)
    # SNI names a host; an IP literal is not allowed there (RFC 6066, section 3).
    context: dict[str, Any] = {"@type": _UPSTREAM_TLS, **({} if ip else {"sni": host})}
    if cluster.tls_verify:
        # Envoy compares an IP SAN in its printed form: the compressed one for IPv6.
        san = ({"san_type": "IP_ADDRESS", "matcher": {"exact": ipaddress.ip_address(host)
                                                       .compressed}}
               if ip else {"san_type": "DNS", "matcher": {"exact": host}})
        context["common_tls_context"] = {"validation_context": {
            "trusted_ca": {"filename": cluster.tls_ca_file},
            "match_typed_subject_alt_names": [san],
        }}
    return {"name": "envoy.transport_sockets.tls", "typed_config": context}


def unverified_providers(config: Config) -> list[str]:
    """Warnings for the clusters whose provider Envoy reaches over TLS unverified."""
    return [f"{config.source}: clusters[{i}] ({c.name}): tls_verify: false: Envoy does not "
            "verify the provider's certificate (anyone on the path can pose as it)"
            for i, c in enumerate(config.clusters) if c.tls and not c.tls_verify]


def _cluster(
    name: str, address: dict[str, Any], http2: dict[str, Any] | None, timeout_s: float,
    tls: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A STATIC/STRICT_DNS cluster; ``http2`` (its ``http2_protocol_options``) makes it
    HTTP/2, None leaves it HTTP/1.1."""
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
    if tls is not None:
        c["transport_socket"] = tls
    if http2 is not None:
        c["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": _HTTP_OPTS,
                "explicit_http_config": {"http2_protocol_options": http2},
            }
        }
    return c


def sidecar_max_requests(config: Config) -> int:
    """Streams Envoy may hold open to the sidecar at once (its circuit breaker).

    Each request in flight holds at most two (routing + a sampled observer) and
    Envoy holds requests beyond the clusters' capacity while admission answers
    them, so: ``4 x (sum of max_concurrency + admission.queue_max)``, at least
    1024 (Envoy's default), unless ``envoy.sidecar_max_requests`` says otherwise.
    """
    if config.envoy.sidecar_max_requests is not None:
        return config.envoy.sidecar_max_requests
    capacity = sum(c.max_concurrency for c in config.clusters) + config.admission.queue_max
    return min(max(1024, 4 * capacity), UINT32_MAX)  # Envoy rejects a larger threshold


UINT32_MAX = 2**32 - 1  # Envoy's circuit-breaker thresholds are UInt32Value


def upstream_max_requests(cluster: ClusterConfig) -> int:
    """Envoy's circuit breaker on a provider's cluster: connections, pending and active
    requests it lets through at once.

    tailroute keeps each route within ``max_concurrency`` itself (the capacity filter
    and admission), so this breaker is a backstop that must never be the tighter
    limit: its overflow is a local 503 (``upstream_overflow``), which the access log
    counts as the route's error. Envoy's defaults (1,024 connections, 1,024 pending,
    1,024 requests) were: a provider declared at 4,096 got 503s from Envoy itself at
    2,048 concurrent requests. ``4 x max_concurrency`` as for the sidecar's cluster,
    at least Envoy's 1,024 (so it only ever raises the defaults); it still bounds
    what reaches a provider when nobody decides (fail-open, native mode).
    """
    return max(1024, 4 * cluster.max_concurrency)


def _circuit_breakers(limit: int) -> dict[str, Any]:
    return {"thresholds": [{"priority": "DEFAULT", "max_connections": limit,
                            "max_pending_requests": limit, "max_requests": limit,
                            "max_retries": 3}]}


def _meta_is(key: str, value: str) -> dict[str, Any]:
    """A route match on one ``tailroute`` dynamic-metadata field."""
    return {"filter": ec.METADATA_NS, "path": [{"key": key}],
            "value": {"string_match": {"exact": value}}}


def _routes(config: Config) -> list[dict[str, Any]]:
    common = {
        "request_headers_to_remove": list(ec.STRIPPED_HEADERS),
        "request_body_buffer_limit": config.envoy.route_buffer_bytes,
    }
    routes: list[dict[str, Any]] = []
    for cluster in config.cluster_names:
        for klass in config.classes:
            # A stream's class timeout is its route's idle timeout (the longest silence:
            # before the first byte, between events), never a whole-answer timeout: a
            # steady stream may outlast it (its length is the client's max_tokens), and
            # cut mid-answer it read as the provider's hard failure. An unstreamed answer
            # (metadata ec.UNARY_KEY) keeps the class timeout as its whole timeout. A
            # caller's deadline comes as a header that overrides it, and a stream with
            # one takes that route too (sampled or not): the deadline is its cap. Any
            # other stream's length has only the safety net of admission.stream_cap_s.
            timeout = ec.duration(klass.slo.timeout_ms / 1000.0)
            cap = {"max_stream_duration": ec.duration(stream_cap_s(klass))}
            for sampled, unary in ((False, True), (False, False), (True, True), (True, False)):
                key = ec.route_key(cluster, klass.name, sampled)
                match = [_meta_is(ec.ROUTE_KEY, key)] + ([_meta_is(ec.UNARY_KEY, "1")]
                                                         if unary else [])
                route: dict[str, Any] = {
                    "name": f"tailroute|{key}" + ("|unary" if unary else ""),
                    "match": {"prefix": "/", "dynamic_metadata": match},
                    "route": {"cluster": cluster, "timeout": timeout if unary else "0s",
                              "idle_timeout": timeout,
                              **({} if unary else {"max_stream_duration": cap})},
                    **common,
                }
                if not sampled:
                    route["typed_per_filter_config"] = bf.observe_disabled()
                routes.append(route)
    longest = ec.duration(max(c.slo.timeout_ms for c in config.classes) / 1000.0)
    routes.append({
        "name": ec.DEFAULT_ROUTE,
        "match": {"prefix": "/"},
        # No decision (non-LLM paths, unknown models, fail-open): the longest class
        # timeout caps the whole answer, stream or not (whether it streams is unknown).
        "route": {"cluster": config.default_cluster, "timeout": longest, "idle_timeout": longest},
        "typed_per_filter_config": bf.observe_disabled(),
        **common,
    })
    return routes


def render_bootstrap(
    config: Config,
    grpc_target: str | None = None,
    unix_socket: str | None = None,
    listen: str | None = None,
    admin: str | None = None,
    with_sidecar: bool = True,
) -> dict[str, Any]:
    """Build the bootstrap as a plain mapping (serialise with :func:`to_yaml`).

    ``grpc_target`` (host:port) or ``unix_socket`` selects how Envoy reaches the
    sidecar; default is the config's ``listen.grpc`` (or ``listen.grpc_unix``).
    ``with_sidecar=False`` renders the same proxy without tailroute's filters,
    routes and access log (the benchmarks' baseline).
    """
    if unix_socket is None and grpc_target is None:
        unix_socket = config.listen.grpc_unix
        grpc_target = None if unix_socket else config.listen.grpc
    sidecar_addr = (
        {"pipe": {"path": unix_socket}} if unix_socket else _addr(grpc_target or "")
    )
    longest_s = max(c.slo.timeout_ms for c in config.classes) / 1000.0
    early_removed = hr.listener_removed(config) if with_sidecar else ec.STRIPPED_HEADERS
    if with_sidecar:
        filters = [bf.strip_filter(hr.listener_removed(config, early=False)),
                   *bf.route_filters(config.limits.decision_timeout_ms,
                                     hr.attribute_exprs(config), hr.rich_headers(config)),
                   bf.buffer_filter(config.envoy.route_buffer_bytes), bf.strip_hints_filter(),
                   *bf.usage_filters(bf.usage_share(config), config.timing.done_mark),
                   bf.observe_filter(), bf.router_filter()]
        routes = _routes(config)
    else:
        filters = [bf.strip_filter(), bf.router_filter()]
        routes = [{"name": "default", "match": {"prefix": "/"},
                   "route": {"cluster": config.default_cluster, "timeout": ec.duration(longest_s),
                             "idle_timeout": ec.duration(longest_s)},
                   "request_body_buffer_limit": config.envoy.route_buffer_bytes}]
    hcm: dict[str, Any] = {
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
                    "mutations": [{"remove": h} for h in early_removed],
                },
            }
        ],
        "codec_type": "AUTO",
        "stream_idle_timeout": ec.duration(longest_s),
        "request_timeout": "0s",
        "route_config": {
            "name": "tailroute",
            "virtual_hosts": [{"name": "llm", "domains": ["*"], "routes": routes}],
        },
        "http_filters": filters,
    }
    if with_sidecar:
        hcm["access_log"] = bf.access_log(config.envoy.access_log_flush_ms)
    clusters = [
        {**_cluster(c.name, _addr(c.address), http2=None, timeout_s=2.0,
                   tls=provider_tls(c)),
         "circuit_breakers": _circuit_breakers(upstream_max_requests(c))}
        for c in config.clusters
    ]
    if with_sidecar:
        sidecar = _cluster(SIDECAR_CLUSTER, sidecar_addr, http2=http2_options(config),
                           timeout_s=0.25)
        sidecar["circuit_breakers"] = _circuit_breakers(sidecar_max_requests(config))
        # health checks and TLS (sidecar.shell.sidecar_cluster)
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


class _PlainDumper(yaml.SafeDumper):
    """Spell shared sub-mappings out in full: a bootstrap is read by people too."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    """A multi-line string (the ``[DONE]`` mark's Lua) as a literal block, readable as the
    code it is; every other string as PyYAML would write it."""
    if "\n" in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    return dumper.represent_str(data)


_PlainDumper.add_representer(str, _str)


def to_yaml(bootstrap: dict[str, Any]) -> str:
    """Serialise a bootstrap mapping with a header comment."""
    head = "# Rendered by `tailroute envoy-config`; edit the sidecar config, not this file.\n"
    return head + yaml.dump(bootstrap, Dumper=_PlainDumper, sort_keys=False, width=100)
