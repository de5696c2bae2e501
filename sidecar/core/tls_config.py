"""TLS settings of the sidecar's gRPC listener and of the Envoy that reaches it (pure).

Two frozen sub-configs, validated here with errors naming the file and the field:

* ``listen.tls`` (:class:`ListenTlsConfig`): the sidecar serves ext_proc (and
  the health service) over TLS on its TCP listener; with ``client_ca_file`` it
  is mutual TLS and a client without a certificate signed by that CA is refused
  during the handshake. The Unix socket listener stays plaintext (file
  permissions guard it).
* ``envoy.sidecar_tls`` (:class:`SidecarTlsConfig`): what the rendered Envoy
  bootstrap puts in the sidecar cluster's ``UpstreamTlsContext``: the CA it
  verifies the sidecar with, the name it expects (SNI and subject alternative
  name) and, for mutual TLS, its own certificate.

Only paths are checked here (the core does no I/O); :mod:`sidecar.shell.tls`
reads and validates the files at start-up and on every change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sidecar.core.fields import ConfigReader

# Where Debian, Ubuntu and Alpine (and images built on them) keep the system's CA
# bundle: what a provider's cluster with ``tls: true`` trusts by default.
SYSTEM_CA_FILE: Final = "/etc/ssl/certs/ca-certificates.crt"


@dataclass(frozen=True, slots=True)
class ListenTlsConfig:
    """TLS on the sidecar's gRPC TCP listener; ``client_ca_file`` makes it mutual TLS."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None


@dataclass(frozen=True, slots=True)
class SidecarTlsConfig:
    """How the rendered Envoy bootstrap connects to a TLS sidecar."""

    ca_file: str
    server_name: str = "localhost"  # SNI, and the DNS SAN Envoy requires in the sidecar's cert
    cert_file: str | None = None  # Envoy's client certificate, for mutual TLS
    key_file: str | None = None


def parse_listen_tls(r: ConfigReader) -> ListenTlsConfig | None:
    if not r.data:
        return None
    cfg = ListenTlsConfig(
        cert_file=r.str_("cert_file", required=True),
        key_file=r.str_("key_file", required=True),
        client_ca_file=r.opt_str("client_ca_file") or None,
    )
    r.done()
    return cfg


def parse_sidecar_tls(r: ConfigReader) -> SidecarTlsConfig | None:
    if not r.data:
        return None
    cfg = SidecarTlsConfig(
        ca_file=r.str_("ca_file", required=True),
        server_name=r.str_("server_name", "localhost"),
        cert_file=r.opt_str("cert_file") or None,
        key_file=r.opt_str("key_file") or None,
    )
    if (cfg.cert_file is None) != (cfg.key_file is None):
        r.fail("cert_file and key_file go together (Envoy's client certificate and its key)")
    r.done()
    return cfg


def check_tls_pair(root: ConfigReader, listen: ListenTlsConfig | None,
                   envoy: SidecarTlsConfig | None) -> None:
    """Both ends must agree, or the rendered Envoy could not talk to the sidecar."""
    if listen is not None and envoy is None:
        root.fail("required when listen.tls is set (the rendered Envoy must speak TLS to the "
                  "sidecar): give at least ca_file", "envoy.sidecar_tls")
    if envoy is not None and listen is None:
        root.fail("set, but listen.tls is not: the sidecar would not speak TLS",
                  "envoy.sidecar_tls")
    if listen is not None and envoy is not None and listen.client_ca_file and not envoy.cert_file:
        root.fail("listen.tls.client_ca_file asks for mutual TLS: Envoy needs cert_file and "
                  "key_file", "envoy.sidecar_tls")
