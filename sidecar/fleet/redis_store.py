"""The Redis/Valkey store: one :class:`~sidecar.fleet.exchange.Exchange` = one pipelined round trip.

Keys (``P`` = ``fleet.key_prefix``; the braces are a Redis Cluster hash tag, so
every key lives in one slot and the lease script may touch several)::

    {P}:replicas          ZSET  replica id -> wall-clock ms of its last push
    {P}:stats:<replica>   HASH  one field per live sub-window of each of its narrow
                                series (codec.stats_field), plus "_meta"; PEXPIRE stats_ttl
    {P}:leases            HASH  route field -> "<holder> <expiry ms on the server clock>"
    {P}:health            HASH  route field -> the owner's published state
    {P}:probes:<replica>  LIST  probe results forwarded to that owner
    {P}:entries:<prefix>  LIST  ids of requests that process decided whose access-log
                                entries reached another one (sidecar.shell.app, forwarding)
    {P}:<list>:taken:<g>  LIST  what the consumer took in its take number g, kept until it
                                acknowledges (its next take), so a lost reply loses nothing

A take drops items over ``INBOX_ITEM_MAX_BYTES`` on the server (:data:`_TAKE_LUA`):
forwarded request ids and probe results are tens of bytes, and a huge item (a corrupt
or hostile write) must not cross the network, nor be read at all if it can be helped.

Commands per exchange: EVALSHA (leases; it also deletes the health fields
``Exchange.prune`` offers, once no replica renewed their lease for the health
hash's TTL), HLEN, HSET, HDEL (when sub-windows left
the window), PEXPIRE x2, HSET (health, when changed),
RPUSH + PEXPIRE per owner with forwarded probes, RPUSH + PEXPIRE per decider with
forwarded entries, EVAL x2 (take the forwarded entries and probes, acknowledging
the last take: :data:`_TAKE_LUA`), EVAL (membership: :data:`_MEMBERS_LUA`), HGETALL
(health), and one HGETALL per
peer. That is about 14 + peers commands per push interval per replica, whatever the
request rate.

Key count: 4 + 3 x replicas. Fields: series x sub-windows per replica (series
are capped by ``stats.max_slices``), routes in the lease and health hashes.

The lease and membership scripts use the server's clock (``TIME``), so hosts whose
clocks disagree still agree on who holds a lease and who is live. Scripts replicate by effects (the
default since Redis 5; Valkey likewise).
"""

from __future__ import annotations

import hashlib
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import NoPermissionError, NoScriptError, ResponseError

from sidecar.fleet.exchange import (
    INBOX_ITEM_ALLOWANCE,
    INBOX_ITEM_MAX_BYTES,
    INBOX_SLACK_BYTES,
    Exchange,
    Oversized,
    Reply,
)
from sidecar.fleet.store_errors import WrongTypeError

META_FIELD = "_meta"

# KEYS[1] = the lease hash, KEYS[2] = the health hash; ARGV = me, ttl_ms, grace_ms, n,
# n route fields, then route fields to prune (Exchange.prune) -> holder of each route.
_LEASE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local me, ttl, grace, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
-- The holder and expiry of a lease value. One no replica wrote (no space, no number,
-- or an expiry further off than ten leases: never renewed, it would hold the route
-- for ever) is a free lease: expiry 0.
local function lease(v)
  local holder, exp = nil, 0
  local sep = v and string.find(v, ' ', 1, true)
  if sep then
    holder, exp = string.sub(v, 1, sep - 1), tonumber(string.sub(v, sep + 1)) or 0
  end
  if exp > now + 10 * ttl then exp = 0 end
  return holder, exp
end
local out = {}
for i = 5, 4 + n do
  local v = redis.call('HGET', KEYS[1], ARGV[i])
  local holder, exp = lease(v)
  if (not v) or exp <= now or holder == me then
    redis.call('HSET', KEYS[1], ARGV[i], me .. ' ' .. (now + ttl))
    holder = me
  end
  out[#out + 1] = holder
end
-- A route whose lease no replica renewed for grace_ms (what the health hash itself
-- outlives its last writer by): its health field is no one's any more.
for i = 5 + n, #ARGV do
  local _, exp = lease(redis.call('HGET', KEYS[1], ARGV[i]))
  if exp + grace <= now then
    redis.call('HDEL', KEYS[2], ARGV[i])
    redis.call('HDEL', KEYS[1], ARGV[i])
  end
end
redis.call('PEXPIRE', KEYS[1], ttl * 10)
return out
"""


# Taking a list (forwarded request ids, probe results) so that a lost reply loses
# nothing. KEYS[1] = the list others push to; KEYS[2] = this take's generation
# (``<list>:taken:<g>``); KEYS[3] = the generation the caller processed last, deleted
# when ARGV[1] == '1' (its acknowledgement). A generation that exists already was
# taken by a round trip whose reply never arrived: it is delivered again, unchanged.
# Otherwise the whole list is renamed to it (O(1), pushes after that start a new list).
# ARGV[2] = its TTL in ms (a consumer that vanished leaves nothing behind for long).
# ARGV[3] = the largest item returned (INBOX_ITEM_MAX_BYTES): larger ones are dropped
# here, on the server, so they never cross the network. A list whose memory (MEMORY
# USAGE: counted, not read) is over ARGV[4] per item + ARGV[5] holds such an item too
# big to read cheaply: every item is dropped unread. Without LLEN or MEMORY (an older
# ACL grant, a managed Redis without it), every list is read. Returns {items dropped,
# the largest one's size or, all dropped unread, the list's, 1 if so, the items...}.
_TAKE_LUA = """
if ARGV[1] == '1' then redis.call('DEL', KEYS[3]) end
if redis.call('EXISTS', KEYS[2]) == 0 then
  if redis.call('EXISTS', KEYS[1]) == 0 then return {0, 0, 0} end
  redis.call('RENAME', KEYS[1], KEYS[2])
end
redis.call('PEXPIRE', KEYS[2], ARGV[2])
local n = redis.pcall('LLEN', KEYS[2])
local size = redis.pcall('MEMORY', 'USAGE', KEYS[2], 'SAMPLES', '0')
if type(n) == 'number' and type(size) == 'number'
    and size > n * tonumber(ARGV[4]) + tonumber(ARGV[5]) then
  return {n, size, 1}
end
local max, out, dropped, largest = tonumber(ARGV[3]), {0, 0, 0}, 0, 0
for _, item in ipairs(redis.call('LRANGE', KEYS[2], 0, -1)) do
  if #item > max then
    dropped = dropped + 1
    largest = math.max(largest, #item)
  else
    out[#out + 1] = item
  end
end
out[1], out[2] = dropped, largest
return out
"""


# Membership on the server's clock. KEYS[1] = the replicas ZSET; ARGV = me, stats TTL in
# ms -> {server time in ms, live replicas...}. Scored by each replica's own wall clock,
# one whose clock ran minutes ahead removed every other replica at each push (their
# scores looked older than the TTL to it) and saw none itself: with one replica 300 s
# ahead of two others (stats TTL 60 s), it merged none of their requests and one of
# the others lost the third, silently.
_MEMBERS_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
redis.call('PEXPIRE', KEYS[1], ttl)
local out = redis.call('ZRANGEBYSCORE', KEYS[1], now - ttl, '+inf')
table.insert(out, 1, now)
return out
"""


class RedisStore:
    """Carries out exchanges against one Redis/Valkey (``redis.asyncio``)."""

    def __init__(self, url: str, prefix: str, timeout_s: float) -> None:
        self.url = url
        self.prefix = prefix
        self.client: aioredis.Redis = aioredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
            health_check_interval=0, retry_on_timeout=False,
        )
        self._lease_sha = hashlib.sha1(_LEASE_LUA.encode()).hexdigest()
        self.commands_sent = 0  # client-issued commands (the lease script's inner calls aside)

    def key(self, *parts: str) -> str:
        return ":".join((f"{{{self.prefix}}}", *parts))

    async def close(self) -> None:
        await self.client.aclose()

    async def exchange(self, ex: Exchange, now_ms: float) -> Reply:
        k_replicas, k_mine = self.key("replicas"), self.key("stats", ex.rid)
        k_leases, k_health = self.key("leases"), self.key("health")
        p = self.client.pipeline(transaction=False)
        lease_args: list[str | int] = [k_leases, k_health, ex.rid, ex.lease_ttl_ms,
                                       ex.health_ttl_ms, len(ex.routes), *ex.routes,
                                       *ex.prune]
        leasing = bool(ex.routes or ex.prune)
        if leasing:
            p.evalsha(self._lease_sha, 2, *lease_args)
        p.hlen(k_mine)
        mine = {META_FIELD: ex.meta, **ex.stats_set}
        p.hset(k_mine, mapping=mine)  # type: ignore[arg-type]
        if ex.stats_del:
            p.hdel(k_mine, *ex.stats_del)
        p.pexpire(k_mine, ex.stats_ttl_ms)
        if ex.health_set:
            p.hset(k_health, mapping=ex.health_set)  # type: ignore[arg-type]
        p.pexpire(k_health, ex.health_ttl_ms)
        for owner, values in ex.probes.items():
            p.rpush(self.key("probes", owner), *values)
            p.pexpire(self.key("probes", owner), ex.lease_ttl_ms * 4)
        for prefix, rids in ex.entries.items():
            p.rpush(self.key("entries", prefix), *rids)
            p.pexpire(self.key("entries", prefix), ex.lease_ttl_ms * 4)
        ttl = str(ex.lease_ttl_ms * 4)
        for inbox in (self.key("entries", ex.entries_for or ex.rid), self.key("probes", ex.rid)):
            self._take(p, inbox, ex.take_gen, ex.ack_gen, ttl)
        p.eval(_MEMBERS_LUA, 1, k_replicas, ex.rid, str(ex.stats_ttl_ms))
        p.hgetall(k_health)
        for peer in ex.fetch:
            p.hgetall(self.key("stats", peer))
        self.commands_sent += len(p.command_stack)
        keys = [_key_of(args) for args, _ in p.command_stack]
        res: list[Any] = await p.execute(raise_on_error=False)
        if leasing and isinstance(res[0], NoScriptError):
            # First use, or the server restarted: load the script and take the leases
            # alone (the rest of the round trip went through and must not be repeated).
            await self.client.script_load(_LEASE_LUA)
            res[0] = await self.client.evalsha(self._lease_sha, 2, *lease_args)
        unreadable = []
        for j in range(len(res) - len(ex.fetch), len(res)):
            if _wrong_type(res[j]):  # one peer's key, not the store: skip it, count it
                unreadable.append(keys[j])
                res[j] = {}
        if (j := next((j for j, r in enumerate(res) if _wrong_type(r)), -1)) >= 0:
            # A key of the fleet's that holds another type (another program writes under
            # this prefix): no reconnect mends that, the operator must (store_errors).
            raise WrongTypeError(keys[j], str(res[j]))
        errors = [r for r in res if isinstance(r, Exception)]
        if errors:
            # The server answered, but not as a primary serving us would (READONLY after
            # a failover demoted it, LOADING, an ACL or OOM refusal). Drop the pool's
            # connections so the next attempt connects afresh: redis-py keeps a healthy
            # socket to the demoted node forever, and a name (DNS) that now points at
            # the new primary would never be looked up again.
            await self.client.connection_pool.disconnect()
            # An ACL refusal names its command (a refusal inside a script does not):
            # that one says best what to grant (sidecar.fleet.store_errors).
            r = next((e for e in errors if isinstance(e, NoPermissionError)), errors[0])
            raise r if isinstance(r, ResponseError) else ResponseError(str(r))
        reply = self._reply(ex, res)
        reply.unreadable = unreadable
        return reply

    @staticmethod
    def _take(p: Any, inbox: str, gen: int, ack: int | None, ttl: str) -> None:
        """Queue the take of ``inbox`` (:data:`_TAKE_LUA`) on pipeline ``p``."""
        acked = f"{inbox}:taken:{ack}" if ack is not None else f"{inbox}:taken:none"
        p.eval(_TAKE_LUA, 3, inbox, f"{inbox}:taken:{gen}", acked,
               "1" if ack is not None else "0", ttl, str(INBOX_ITEM_MAX_BYTES),
               str(INBOX_ITEM_ALLOWANCE), str(INBOX_SLACK_BYTES))

    @staticmethod
    def _reply(ex: Exchange, res: list[Any]) -> Reply:
        i = 0
        holders: list[str] = []
        if ex.routes or ex.prune:
            holders = [_text(h) for h in res[0]]
            i = 1
        stored = max(int(res[i]) - 1, 0)  # minus the meta field
        peers_raw = res[len(res) - len(ex.fetch):] if ex.fetch else []
        health_raw = res[len(res) - len(ex.fetch) - 1]
        server_ms, *replicas_raw = res[len(res) - len(ex.fetch) - 2]
        oversized: dict[str, Oversized] = {}
        probes_raw = _taken(res[len(res) - len(ex.fetch) - 3], "probes", oversized)
        entries_raw = _taken(res[len(res) - len(ex.fetch) - 4], "entries", oversized)
        stats: dict[str, dict[str, bytes]] = {}
        metas: dict[str, bytes | None] = {}
        for peer, fields in zip(ex.fetch, peers_raw, strict=True):
            decoded = {_text(f): bytes(v) for f, v in fields.items()}
            metas[peer] = decoded.pop(META_FIELD, None)
            stats[peer] = decoded
        health = {_text(f): bytes(v) for f, v in health_raw.items()}
        return Reply(holders, [_text(r) for r in replicas_raw], stats, metas, health,
                     probes_raw, stored, entries_raw, server_ms=float(server_ms),
                     oversized=oversized)


def _taken(raw: list[Any], inbox: str, oversized: dict[str, Oversized]) -> list[bytes]:
    """The items of a take (:data:`_TAKE_LUA`); what it dropped goes in ``oversized``."""
    dropped, size, whole, *items = raw
    if int(dropped):
        oversized[inbox] = Oversized(int(dropped), int(size), bool(int(whole)))
    return [bytes(v) for v in items]


def _key_of(args: tuple[Any, ...]) -> str:
    """The key a queued command works on (EVAL/EVALSHA: its first key)."""
    at = 3 if str(args[0]).upper() in ("EVAL", "EVALSHA") else 1
    return _text(args[at]) if len(args) > at else ""


def _wrong_type(r: Any) -> bool:
    return isinstance(r, ResponseError) and str(r).startswith("WRONGTYPE")


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
