"""The fleet store's URL (``fleet.url``): shown without its secrets, checked before use.

redis-py reads ``redis://[user:password@]host:port/db`` with :func:`urllib.parse.urlsplit`,
whose authority ends at the first ``/``, ``?`` or ``#``. A password holding one of
them unencoded (``redis://app:pa/ss@redis:6379/0``) is therefore cut short: the
authority becomes ``app:pa``, ``pa`` is read as the port, and the client either
refuses the URL with an error quoting that piece of the password, or -- when the
piece is digits -- connects to the user name as a host and logs that as
unreachable. :func:`url_problem` finds such a URL at config time, and
:func:`redacted` hides everything up to the last ``@`` (the only place an ``@`` has
in a Redis URL is after the credentials), so no spelling of a password reaches a
log line or an error.

(String work only: the core imports no ``urllib``; the rules mirror ``urlsplit``'s.)
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from typing import Final

_SCHEME: Final = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:(//)?")
_PERCENT: Final = re.compile(r"%([0-9A-Fa-f]{2})")
# Query arguments redis-py reads as credentials (after percent-decoding the name).
_SECRET_ARGS: Final = ("password", "username")


def redacted(url: str) -> str:
    """``url`` fit for a log line or an error: a user name or password
    (``redis://user:secret@host``, ``?password=secret``) becomes ``***``, whatever
    characters it holds; anything else is unchanged."""
    m = _SCHEME.match(url)
    head, rest = (url[:m.end()], url[m.end():]) if m else ("", url)
    secret, at, tail = rest.rpartition("@")
    if at and secret:
        rest = f"***@{tail}"
    path, q, query = rest.partition("?")
    if not q:
        return head + rest
    args = re.split(r"([&;])", query)
    for i in range(0, len(args), 2):
        name, eq, _value = args[i].partition("=")
        if eq and _decode(name).lower() in _SECRET_ARGS:
            args[i] = f"{name}=***"
    return head + path + q + "".join(args)


def url_problem(url: str) -> str | None:
    """Why the Redis client would misread ``url`` (None if it reads it as written).

    The answer never quotes the URL: the usual cause is a password character that
    needs percent-encoding, so any part of it could be secret."""
    _scheme, sep, rest = url.partition("://")
    if not sep:
        return None  # the scheme check says what is wrong
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, after = rest[:end], rest[end:]
    if "@" in after:
        return ("has an '@' after the host: a '/', '?' or '#' in the user name or password "
                "ends the host early; percent-encode them as %2F, %3F, %23 (and '@' as %40)")
    if any(c in url for c in "\t\r\n"):
        return "holds a tab or a line break (the client drops them; percent-encode them)"
    userinfo = authority.rpartition("@")[0]
    if ("[" in authority) != ("]" in authority) or "[" in userinfo or "]" in userinfo:
        # urlsplit reads the text between the first '[' and ']' of the whole authority,
        # credentials included, as an IPv6 host and refuses the URL when it is not one.
        return ("has a '[' or ']' in the user name or password (or an unmatched one); "
                "percent-encode them as %5B, %5D")
    if any(c in unicodedata.normalize("NFKC", c) for c in authority if not c.isascii()
           for c in "/?#@:"):
        return ("has a character in the user name, password or host that reads as one of "
                "'/?#@:' once normalised; percent-encode it")
    hostport = authority.rpartition("@")[2]
    if hostport.startswith("["):
        host, _, port = hostport[1:].partition("]")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return "has a malformed [IPv6] host"
        if port and not port.startswith(":"):
            return "has a malformed [IPv6] host"
        port = port[1:]
    elif "[" in hostport:
        return "has a '[' in the host"
    else:
        port = hostport.rpartition(":")[2] if ":" in hostport else ""
    if port and not (port.isascii() and port.isdigit() and int(port) <= 65535):
        return "has a port that is not a number from 0 to 65535"
    return _db_problem(_scheme, after)


def _db_problem(scheme: str, after: str) -> str | None:
    """The database: the client reads a path that is no number (``/abc``, ``/-1``) as
    database 0, silently, and takes ``?db=`` as written."""
    path, _, query = after.partition("#")[0].partition("?")
    dbs = [] if scheme.lower() == "unix" else [_decode(path).replace("/", "")]
    dbs += [_decode(v) for n, eq, v in (a.partition("=") for a in re.split(r"[&;]", query))
            if eq and _decode(n) == "db"]
    if any(db and not (db.isascii() and db.isdigit()) for db in dbs):
        return "has a database (the path, or ?db=) that is not a number from 0 up"
    return None


def _decode(text: str) -> str:
    """Percent-decode (and ``+`` as a space, as query strings are read)."""
    return _PERCENT.sub(lambda m: chr(int(m.group(1), 16)), text.replace("+", " "))
