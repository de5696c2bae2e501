"""What the rendered Envoy bootstrap adds to the sidecar cluster: health checks,
HTTP/2 keepalive and TLS.

* ``health_checks``: Envoy's active ``grpc_health_check`` against the sidecar's
  ``grpc.health.v1.Health`` (:mod:`sidecar.shell.health`) every
  ``envoy.sidecar_health_interval_s`` (also while the cluster has no traffic).
  Two failed checks mark the host unhealthy, one good check marks it healthy
  again. A draining sidecar answers NOT_SERVING, then refuses new streams, so
  Envoy sees it go. With a single sidecar host Envoy keeps sending to it even
  when unhealthy (panic routing, and ext_proc fails open anyway); with several
  hosts it stops picking the unhealthy one.
* ``connection_keepalive`` (HTTP/2): a PING every ``envoy.sidecar_keepalive_s``
  (Envoy adds 15 % jitter); no answer within :func:`keepalive_timeout_s` closes
  the connection. A sidecar that vanished without closing (host crash, network
  partition) otherwise keeps every stream on that connection hanging: each
  routing stream until its ``message_timeout`` (fail-open), and the access-log
  stream for good — Envoy writes into it until the write buffer is full, then
  drops entries (``logs_dropped``) and never opens a new one (it does only
  after a remote close). After the close, the next request and the next flush
  open new streams. The sidecar's gRPC server permits these pings
  (``sidecar.shell.server.KEEPALIVE_OPTIONS``); gRPC's default would answer a
  PING more often than every 5 minutes on an idle connection with a GOAWAY.
* ``transport_socket``: an ``UpstreamTlsContext`` matching ``listen.tls`` when
  ``envoy.sidecar_tls`` is set (never over the Unix socket, which is plaintext):
  ALPN ``h2``, the sidecar's certificate verified against ``ca_file`` with the DNS
  subject alternative name ``server_name`` (also sent as SNI), and for mutual TLS
  Envoy's own certificate. Envoy reads these files at start.
"""

from __future__ import annotations

from typing import Any

from sidecar.core.config import Config
from sidecar.shell.envoy_contract import duration

_TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"


def health_checks(config: Config) -> list[dict[str, Any]]:
    every = config.envoy.sidecar_health_interval_s
    if every <= 0:
        return []
    interval = duration(every)
    return [{
        "timeout": duration(min(every, 1.0)),
        "interval": interval,
        "no_traffic_interval": interval,  # the 60 s default would hide a drain for a minute
        "unhealthy_threshold": 2,
        "healthy_threshold": 1,
        "grpc_health_check": {"service_name": ""},
    }]


def keepalive_timeout_s(interval_s: float) -> float:
    """How long Envoy waits for the PING's answer: half the interval, 0.5 to 5 s."""
    return min(5.0, max(0.5, interval_s / 2))


def connection_keepalive(config: Config) -> dict[str, Any] | None:
    """``http2_protocol_options.connection_keepalive`` for the sidecar cluster."""
    every = config.envoy.sidecar_keepalive_s
    if every <= 0:
        return None
    return {"interval": duration(every), "timeout": duration(keepalive_timeout_s(every))}


def upstream_tls(config: Config) -> dict[str, Any] | None:
    tls = config.envoy.sidecar_tls
    if tls is None:
        return None
    common: dict[str, Any] = {
        "alpn_protocols": ["h2"],
        "validation_context": {
            "trusted_ca": {"filename": tls.ca_file},
            "match_typed_subject_alt_names": [
                {"san_type": "DNS", "matcher": {"exact": tls.server_name}}
            ],
        },
    }
    if tls.cert_file and tls.key_file:
        common["tls_certificates"] = [{"certificate_chain": {"filename": tls.cert_file},
                                       "private_key": {"filename": tls.key_file}}]
    return {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {"@type": _TLS, "sni": tls.server_name, "common_tls_context": common},
    }


def sidecar_cluster_extras(config: Config, over_unix: bool) -> dict[str, Any]:
    """Fields to add to the rendered sidecar cluster."""
    out: dict[str, Any] = {}
    checks = health_checks(config)
    if checks:
        out["health_checks"] = checks
    tls = None if over_unix else upstream_tls(config)
    if tls is not None:
        out["transport_socket"] = tls
    return out


def http2_options(config: Config) -> dict[str, Any]:
    """``http2_protocol_options`` of the sidecar cluster."""
    keepalive = connection_keepalive(config)
    return {"connection_keepalive": keepalive} if keepalive is not None else {}
