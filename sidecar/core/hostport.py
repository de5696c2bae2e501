"""``host:port`` addresses of the config file and the command line, checked in one place.

Every address tailroute listens on or renders into Envoy's bootstrap is read here:
at parse time a mistake is a config error naming the field, instead of a traceback
from ``int()`` when the sidecar binds or ``tailroute envoy-config`` renders. IPv6
hosts go in brackets (``[::1]:50051``); the host comes back without them, which is
what sockets and Envoy's ``socket_address`` take.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Final

# A host name (RFC 1123 labels, '_' tolerated as resolvers do) or a dotted IPv4 address.
_HOST: Final = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,62})"
                          r"(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,62}))*\.?$")


def join_hostport(host: str, port: int) -> str:
    """The inverse of :func:`split_hostport`: an IPv6 host goes back in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_hostport(addr: str, port_zero: bool = False) -> tuple[str, int]:
    """``(host, port)`` of ``host:port`` or ``[ipv6]:port``; ValueError saying what is wrong.

    ``port_zero``: port 0 (any free port) is allowed, for an address something binds.
    """
    host, sep, port = addr.rpartition(":")
    if not sep or not host:
        raise ValueError(f"must be host:port, got {addr!r}")
    lo = 0 if port_zero else 1
    if not (port.isascii() and port.isdigit()) or not lo <= int(port) <= 65535:
        raise ValueError(f"must be host:port with a port of {lo}..65535, got {addr!r}")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"must be host:port with an IPv6 address in the brackets, "
                             f"got {addr!r}") from None
        return host[1:-1], int(port)
    if ":" in host:
        raise ValueError(f"must be host:port with an IPv6 host in brackets ([{host}]:{port}), "
                         f"got {addr!r}")
    if not _HOST.match(host):
        raise ValueError(f"must be host:port with a host name or IP address, got {addr!r}")
    return host, int(port)


def same_port(a: str, b: str) -> bool:
    """Whether two listen addresses (``host:port``) hold the same port, so the second
    bind must fail: one non-zero port, and one host, or a wildcard host (``0.0.0.0``,
    ``[::]``) with an address of its family. Host names are compared as written (no
    lookup), so ``localhost`` and ``127.0.0.1`` count as two hosts."""
    try:
        (host_a, port_a), (host_b, port_b) = (split_hostport(a, port_zero=True),
                                              split_hostport(b, port_zero=True))
    except ValueError:
        return False
    if port_a != port_b or port_a == 0:
        return False
    ips = [_ip(host_a), _ip(host_b)]
    if None in ips:
        return host_a.lower().rstrip(".") == host_b.lower().rstrip(".")
    ip_a, ip_b = (ip for ip in ips if ip is not None)
    return ip_a == ip_b or (ip_a.version == ip_b.version
                            and (ip_a.is_unspecified or ip_b.is_unspecified))


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None
