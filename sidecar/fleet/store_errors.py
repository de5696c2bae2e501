"""What a failed push/pull means to the operator: one log line per kind of failure.

The store can fail in ways that need different fixes, and redis-py's own text
names the protocol rather than the setting: an authentication failure speaks of
the RESP3 handshake (``HELLO``), an ACL refusal is ``NOPERM this user has no
permissions to run the 'evalsha' command``. :func:`describe` turns an exception
into a :class:`Problem` -- a kind (so the link logs again when the kind changes
while the store stays down: unreachable, then up but refusing the credentials),
a log level and a sentence naming ``fleet.url`` and, for an ACL refusal, the
command or keys the user lacks and the grant that covers everything the fleet
uses (:data:`ACL_GRANT`). The password never appears: URLs go through
:func:`~sidecar.core.store_url.redacted`.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from redis.exceptions import (
    AuthenticationError,
    NoPermissionError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
)

from sidecar.core.store_url import redacted

# Every command an exchange sends (sidecar.fleet.redis_store) and the ones its Lua
# scripts call (Redis checks those against the caller's ACL too). tests/test_fleet_store_errors.py
# runs the fleet as a user granted exactly this. LLEN and MEMORY USAGE let the inbox take
# drop a list holding a huge item unread; without them it reads the list (slower, same
# result): a grant from before they were used still works.
ACL_COMMANDS = ("evalsha", "eval", "script|load", "hlen", "hset", "hdel", "hget", "hgetall",
                "pexpire", "zadd", "zremrangebyscore", "zrangebyscore", "rpush", "lrange",
                "llen", "memory|usage", "exists", "rename", "del", "time")
_COMMAND = re.compile(r"permissions to run the '([^']+)' command")
# A command refused inside a Lua script is a plain error, without the command's name.
_IN_SCRIPT = "user executing the script can't run this command"


def acl_grant(prefix: str) -> str:
    """The ``ACL SETUSER`` arguments that let a user do what the fleet does (only that)."""
    return f"ACL SETUSER <user> ~{{{prefix}}}:* " + " ".join(f"+{c}" for c in ACL_COMMANDS)


class WrongTypeError(ResponseError):
    """A key the fleet reads and writes holds another type (``WRONGTYPE``): a string
    where it keeps a hash, say. Only someone else writing under ``fleet.key_prefix``
    does that, and no retry mends it, so it is said as such, naming the key."""

    def __init__(self, key: str, said: str) -> None:
        super().__init__(said)
        self.key = key


@dataclass(frozen=True, slots=True)
class Problem:
    kind: str  # "unreachable", "replica", "auth", "permission", "foreign", "config", "full"
    level: int
    text: str


def describe(exc: BaseException, url: str, prefix: str) -> Problem:
    """The log line for a cycle that failed with ``exc`` (without the trailing
    "continuing on local state" the link adds)."""
    shown = redacted(url)
    if isinstance(exc, AuthenticationError):
        return Problem("auth", logging.ERROR,
                       f"fleet store: authentication to the Redis at {shown} failed: "
                       f"{auth_problem(url)}")
    said = str(exc)
    if isinstance(exc, WrongTypeError):
        return Problem("foreign", logging.ERROR,
                       f"fleet store: the key {exc.key} in the Redis at {shown} holds another "
                       "type than the fleet keeps there (does another program write under "
                       f"fleet.key_prefix '{prefix}'?); the fleet cannot share until the key is "
                       "deleted or fleet.key_prefix is changed")
    if isinstance(exc, NoPermissionError) or (isinstance(exc, ResponseError)
                                              and _IN_SCRIPT in said):
        m = _COMMAND.search(said)
        if m:
            what = f"may not run {m.group(1).upper()}"
        elif _IN_SCRIPT in said:
            what = "may not run a command the fleet's Lua scripts call"
        elif "keys" in said:
            what = f"may not use the keys {{{prefix}}}:* (fleet.key_prefix)"
        else:
            what = f"was refused a command ({_short(said)})"
        return Problem("permission", logging.ERROR,
                       f"fleet store: the Redis at {shown} answers, but the user of "
                       f"fleet.url {what}; grant what the fleet uses with "
                       f"'{acl_grant(prefix)}'")
    if isinstance(exc, OutOfMemoryError):
        return Problem("full", logging.ERROR,
                       f"fleet store: the Redis at {shown} is full (its used memory is over "
                       "maxmemory) and refuses the fleet's writes; give it more memory, or an "
                       "eviction policy for keys with a TTL (every fleet key has one: "
                       "maxmemory-policy volatile-ttl, as deploy/ runs it)")
    if said.startswith("DB index is out of range"):
        return Problem("config", logging.ERROR,
                       f"fleet store: the Redis at {shown} has no such database (fleet.url's "
                       "/DB: a server has 'databases' of them, 16 unless configured, from 0)")
    if isinstance(exc, ReadOnlyError) or said.startswith("You can't write against a read only"):
        return Problem("replica", logging.WARNING,
                       f"fleet store {shown} is a read-only replica (a failover demoted it?); "
                       "reconnecting at every retry, so a name that now points at the new "
                       "primary is followed")
    return Problem("unreachable", logging.WARNING,
                   f"fleet store {shown} unreachable ({_short(said) or type(exc).__name__})"
                   f"{_tls_hint(url, exc)}")


def _tls_hint(url: str, exc: BaseException) -> str:
    """What a TLS mismatch looks like from here, said (measured against a redis-server
    with a TLS port and a plain one): a plain client meets a reset, a TLS client a
    plain server's silence (a timeout), and an unknown CA a verify failure."""
    said, tls = str(exc), url.lower().startswith("rediss:")
    if "CERTIFICATE_VERIFY_FAILED" in said:
        return ("; fleet.url needs the CA that signed the server's certificate: "
                "?ssl_ca_certs=/path/ca.pem")
    if tls and (isinstance(exc, TimeoutError) or "WRONG_VERSION_NUMBER" in said.upper()):
        return "; fleet.url is rediss:// (TLS): if that port does not speak TLS, use redis://"
    if not tls and url.lower().startswith("redis:") and (
            "reset by peer" in said or "Connection closed by server" in said):
        return "; fleet.url is redis:// (no TLS): if that port wants TLS, use rediss://"
    return ""


def client_problem(url: str) -> str | None:
    """Why the Redis client would refuse ``url`` when it first connects (None: it
    takes it). A query argument it cannot read (``?socket_timeout=abc``), does not
    know (``?foo=1``) or refuses (``?protocol=9``, ``?ssl_cert_reqs=bogus``) raised
    only then: at the link's construction (serve stopped with a traceback) or at
    every retry, as "unreachable". Building a connection object does no I/O."""
    import redis.asyncio as aioredis

    try:
        aioredis.ConnectionPool.from_url(url).make_connection()  # type: ignore[no-untyped-call]
    except (ValueError, TypeError, RedisError) as exc:
        said = str(exc)
        if (m := re.search(r"unexpected keyword argument '([^']*)'", said)) is not None:
            return f"it takes no query argument '{m.group(1)}' with {url.partition(':')[0]}://"
        return _short(said)
    return None


def auth_problem(url: str) -> str:
    """Why a server refused ``url``'s authentication, in words that name the setting
    (never the password itself)."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    given = "@" in parts.netloc or "password" in query or "username" in query
    if given:
        return ("it refused the user name and password in fleet.url (a wrong password, or "
                "an unknown or disabled user)")
    return ("it requires a password and fleet.url gives none (redis://:PASSWORD@HOST:PORT/DB, "
            "or redis://USER:PASSWORD@... for an ACL user)")


def _short(text: str) -> str:
    text = text.strip()
    return text if len(text) < 200 else text[:200] + "..."
