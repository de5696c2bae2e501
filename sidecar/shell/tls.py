"""TLS and mutual TLS for the gRPC TCP listener, certificates from files, reloaded on change.

The files named in ``listen.tls`` (:class:`~sidecar.core.tls_config.ListenTlsConfig`)
are read and checked at start-up with the standard library's ``ssl`` module
(PEM syntax, key matches certificate, CA bundle parses); a problem is a
:class:`~sidecar.core.config.ConfigError` naming the config file, the field and
the certificate file, e.g.
``tailroute.yaml: listen.tls.key_file: /etc/tls/tls.key does not match listen.tls.cert_file``.

Hot reload: the listener uses gRPC's dynamic server credentials, whose fetcher
gRPC calls on every new TLS handshake. :class:`CertificateWatcher` then looks at
the files' (mtime, size) at most once per ``check_every_s``; when they changed
and have settled, the new set is validated and served from the next handshake
on (connections already open keep theirs). An invalid new set is logged, counted
(``tailroute_errors_total{kind="tls_reload_invalid"}``) and the last good one
stays in force. Kubernetes secret updates swap a symlink, which the stat sees.
"""

from __future__ import annotations

import logging
import os
import ssl
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import grpc

from sidecar.core.config import ConfigError
from sidecar.core.tls_config import ListenTlsConfig
from sidecar.ops.config_file import TooLarge, read_capped

log = logging.getLogger("tailroute.tls")

Fingerprint = tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class TlsMaterial:
    cert_chain: bytes
    private_key: bytes
    client_ca: bytes | None


# A CA bundle is some 200 KiB: a larger file is a mistake (/dev/zero was read until
# memory ran out, at start and at every change the watcher saw).
MAX_PEM_BYTES: Final = 16 << 20


def _read(path: str, field: str, source: str) -> bytes:
    try:
        data = read_capped(Path(path), MAX_PEM_BYTES)
    except OSError as exc:
        raise ConfigError(f"{source}: listen.tls.{field}: cannot read {path}: "
                          f"{exc.strerror or exc}") from None
    except TooLarge as exc:
        raise ConfigError(f"{source}: listen.tls.{field}: {path} is larger than {exc}: "
                          "refused") from None
    if b"-----BEGIN " not in data:
        raise ConfigError(f"{source}: listen.tls.{field}: {path} is not PEM "
                          "(no -----BEGIN line)")
    return data


def load_material(cfg: ListenTlsConfig, source: str) -> TlsMaterial:
    """Read and check the files; ConfigError naming file and field on any problem."""
    cert = _read(cfg.cert_file, "cert_file", source)
    key = _read(cfg.key_file, "key_file", source)
    ca = _read(cfg.client_ca_file, "client_ca_file", source) if cfg.client_ca_file else None
    _check_pair(cfg, source)
    if ca is not None:
        try:
            ssl.create_default_context().load_verify_locations(cadata=ca.decode("ascii"))
        except (ssl.SSLError, ValueError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{source}: listen.tls.client_ca_file: {cfg.client_ca_file} "
                              f"holds no usable CA certificate: {exc}") from None
    return TlsMaterial(cert, key, ca)


def _check_pair(cfg: ListenTlsConfig, source: str) -> None:
    """Does the key match the certificate? (``ssl`` loads a chain only from files; the
    files were just read, and the watcher only reloads after they have settled.)"""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc) or "key values mismatch" in str(exc):
            raise ConfigError(f"{source}: listen.tls.key_file: {cfg.key_file} does not "
                              "match listen.tls.cert_file") from None
        raise ConfigError(f"{source}: listen.tls.cert_file: {cfg.cert_file} with "
                          f"{cfg.key_file}: not a usable certificate and key: "
                          f"{exc.reason or exc}") from None
    except OSError as exc:
        raise ConfigError(f"{source}: listen.tls.cert_file: cannot read {cfg.cert_file}: "
                          f"{exc.strerror or exc}") from None


def _credentials_config(m: TlsMaterial) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration([(m.private_key, m.cert_chain)],
                                                     root_certificates=m.client_ca)


class CertificateWatcher:
    """gRPC's certificate-config fetcher: hands over a new, valid set when the files change."""

    def __init__(self, cfg: ListenTlsConfig, source: str, check_every_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.source = source
        self.check_every_s = check_every_s
        self.clock = clock
        self.counts: Counter[str] = Counter()
        self.material = load_material(cfg, source)
        self._applied = self._seen = self._fingerprint()
        self._checked_at = clock()

    def _paths(self) -> list[str]:
        return [p for p in (self.cfg.cert_file, self.cfg.key_file, self.cfg.client_ca_file) if p]

    def _fingerprint(self) -> Fingerprint | None:
        try:
            return tuple((st.st_mtime_ns, st.st_size) for st in map(os.stat, self._paths()))
        except OSError:
            return None

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            _credentials_config(self.material),
            self.fetch,  # type: ignore[arg-type]  # gRPC documents None as "keep the current"
            require_client_authentication=self.material.client_ca is not None)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """Called by gRPC per handshake: None keeps the current certificates."""
        try:
            return self._fetch()
        except Exception:  # never fail a handshake over a watcher bug
            log.exception("certificate reload check failed; keeping the current certificates")
            return None

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        now = self.clock()
        if now - self._checked_at < self.check_every_s:
            return None
        self._checked_at = now
        fp = self._fingerprint()
        settled, self._seen = fp == self._seen, fp
        if fp is None or fp == self._applied or not settled:
            return None  # unchanged, or still being written (wait for two equal looks)
        self._applied = fp
        try:
            material = load_material(self.cfg, self.source)
        except ConfigError as exc:
            self.counts["invalid"] += 1
            log.error("TLS certificate reload rejected, keeping the current ones: %s", exc)
            return None
        self.material = material
        self.counts["ok"] += 1
        log.info("TLS certificates reloaded from %s", self.cfg.cert_file)
        return _credentials_config(material)

    def counters(self) -> dict[str, int]:
        """``error:tls_reload_invalid`` for the metrics collector."""
        invalid = self.counts["invalid"]
        return {"error:tls_reload_invalid": invalid} if invalid else {}
