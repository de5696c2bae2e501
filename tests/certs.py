"""Throw-away certificates for the TLS tests: a CA, a server and a client certificate."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))


def _issue(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
           issuer_key: ec.EllipticCurvePrivateKey, ca: bool, usage: list[x509.ObjectIdentifier],
           sans: list[x509.GeneralName]) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    b = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer)
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5))
         .not_valid_after(now + datetime.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if usage:
        b = b.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    if sans:
        b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def make_pki(d: Path, server_name: str = "localhost", ca_name: str = "tailroute test CA",
             ips: tuple[str, ...] = ("127.0.0.1",)) -> Pki:
    """``ips``: the IP addresses the server certificate names besides ``server_name``."""
    d.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _issue(ca_name, ca_key, _name(ca_name), ca_key, True, [], [])
    pem = serialization.Encoding.PEM
    (d / "ca.crt").write_bytes(ca.public_bytes(pem))
    sans: list[x509.GeneralName] = [x509.DNSName(server_name)]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    for who, usage, alt in (("server", ExtendedKeyUsageOID.SERVER_AUTH, sans),
                            ("client", ExtendedKeyUsageOID.CLIENT_AUTH, [])):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _issue(f"tailroute {who}", key, ca.subject, ca_key, False, [usage], alt)
        (d / f"{who}.crt").write_bytes(cert.public_bytes(pem))
        _write_key(key, d / f"{who}.key")
    return Pki(d / "ca.crt", d / "server.crt", d / "server.key", d / "client.crt",
               d / "client.key")
