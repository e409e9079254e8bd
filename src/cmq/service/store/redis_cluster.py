"""The Redis Cluster store: for when one machine is not enough.

Theory of operation
-------------------
Every key of a queue carries the hash tag ``{name}``, so all of a queue
lives in one slot and each operation is ONE Lua script, atomic on the master
that owns the slot:

- ``cmq:{q}:attr`` hash of SQS attributes, ``cmq:{q}:meta`` created/modified
  times (its existence is the queue's existence), ``cmq:{q}:seq`` counter;
- ``cmq:{q}:vis`` sorted set of visible messages scored by sequence number
  (the BDQS sequence index), ``cmq:{q}:inv`` invisible ones (in flight or
  delayed) scored by the ms at which they become visible, and ``cmq:{q}:idx``
  every message that has been visible, scored by sequence number, until it
  is deleted: the visible and the in-flight ones in sequence order, which an
  atomic receive's window counts (:func:`~cmq.service.ordering.window_picks`;
  every script that makes a message visible or deletes it keeps it);
- hashes from sequence number to payload, FIFO group, receive count, first
  receive time and receipt token; ``cmq:{q}:dd`` the FIFO dedup window
  (``cmq:{q}:ddx`` its ids by expiry, pruned on send).

A receive first moves due messages from ``inv`` back to ``vis``, then picks
at random among the visible ones of the first K of ``idx`` (the random
numbers come from the caller, so the script is deterministic as Redis
requires).

A lock-free receive (``ReceiveMode=lock-free``) splits that in two round
trips: the ``peek`` script moves due messages back and returns the head of
``vis``; the node picks, then marks its picks with plain commands in one
pipeline (``ZREM`` from ``vis``, ``ZADD`` to ``inv``, ``HINCRBY`` the count,
``HSET`` the token, ``HGET`` the payload), no ``MULTI`` and no script, so
another node's commands may interleave and nothing checks that a pick is
still visible. A pick whose payload is gone (deleted in between) has the
entries the pipeline re-created removed again.

Routing is done here rather than by redis-py's cluster client, because a
send must be followed by ``WAIT`` on the SAME connection (WAIT counts the
replicas that have this connection's writes) and the cluster pipeline
refuses scripts: the slot map comes from ``CLUSTER SLOTS``, each master has
its own connection pool, and script and ``WAIT`` go down one connection as a
pipeline. A send is acknowledged only when ``WAIT`` confirms
``min(wait_replicas, replicas of that master)`` replicas have it. Moved
slots, failovers and dead nodes refresh the slot map and retry until
:data:`RETRY_SECONDS` have passed.

The queue registry for ListQueues is one set, ``cmq:queues``, updated after
the queue's own keys (a node that dies in between leaves a queue that
exists but is not listed until the next CreateQueue of that name).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from cmq._extras import optional_imports
from cmq.service.errors import QueueDoesNotExist, StoreUnavailable
from cmq.service.model import (
    Browsed,
    ChangeResult,
    NewMessage,
    QueueCounts,
    QueueRecord,
    Received,
    ReceiveSpec,
    SendResult,
)
from cmq.service.ordering import standard_picks
from cmq.service.store.base import Store

with optional_imports("the Redis Cluster store"):
    import redis.asyncio as aioredis
    from redis import exceptions as rexc
    from redis.asyncio.connection import Connection
    from redis.crc import key_slot

__all__ = ["RETRY_SECONDS", "RedisClusterStore"]

#: How long an operation keeps retrying through a failover before it fails
#: with StoreUnavailable (a failover with cluster-node-timeout 1-5 s fits).
RETRY_SECONDS = 20.0
#: The slot map (and so how many replicas each master has, which decides
#: what WAIT waits for) is re-read when older than this, seconds: a replica
#: that joins or finishes its sync is waited for from then on.
SLOT_MAP_TTL = 2.0
_REGISTRY = "cmq:queues"
_FIELDS = ("meta", "attr", "seq", "vis", "inv", "msg", "grp", "rc", "fr", "tok", "dd", "ddx", "idx")

_PROMOTE = """
local due = redis.call('ZRANGEBYSCORE', K.inv, '-inf', now, 'LIMIT', 0, 1000)
for _, s in ipairs(due) do
  redis.call('ZREM', K.inv, s)
  redis.call('ZADD', K.vis, tonumber(s), s)
  redis.call('ZADD', K.idx, tonumber(s), s)
end
"""

_PRELUDE = (
    "\nlocal K = {}\nlocal names = {"
    + ", ".join(f"'{f}'" for f in _FIELDS)
    + """}
for i, n in ipairs(names) do K[n] = KEYS[i] end
if redis.call('EXISTS', K.meta) == 0 then return redis.error_reply('NOQUEUE') end
"""
)

_SCRIPTS = {
    "create": """
local K = {meta = KEYS[1], attr = KEYS[2]}
if redis.call('EXISTS', K.meta) == 1 then
  return {0, redis.call('HGETALL', K.meta), redis.call('HGETALL', K.attr)}
end
redis.call('HSET', K.meta, 'created', ARGV[1], 'modified', ARGV[1])
for i = 2, #ARGV, 2 do redis.call('HSET', K.attr, ARGV[i], ARGV[i + 1]) end
return {1, {}, {}}
""",
    "get": _PRELUDE
    + """
return {redis.call('HGETALL', K.meta), redis.call('HGETALL', K.attr)}
""",
    "set": _PRELUDE
    + """
redis.call('HSET', K.meta, 'modified', ARGV[1])
for i = 2, #ARGV, 2 do redis.call('HSET', K.attr, ARGV[i], ARGV[i + 1]) end
return 1
""",
    "drop": _PRELUDE
    + """
redis.call('DEL', unpack(KEYS))
return 1
""",
    "purge": _PRELUDE
    + """
redis.call('DEL', K.vis, K.inv, K.msg, K.grp, K.rc, K.fr, K.tok, K.idx)
return 1
""",
    "counts": _PRELUDE
    + """
local now = tonumber(ARGV[1])
local visible = redis.call('ZCARD', K.vis) + redis.call('ZCOUNT', K.inv, '-inf', now)
local in_flight, delayed = 0, 0
for _, s in ipairs(redis.call('ZRANGEBYSCORE', K.inv, '(' .. now, '+inf')) do
  if redis.call('HEXISTS', K.rc, s) == 1 then in_flight = in_flight + 1
  else delayed = delayed + 1 end
end
return {visible, in_flight, delayed}
""",
    "send": _PRELUDE
    + """
local now = tonumber(ARGV[1])
local out = {}
-- Forget dedup ids whose window has ended (a bounded number per send).
local expired = redis.call('ZRANGEBYSCORE', K.ddx, '-inf', now, 'LIMIT', 0, 100)
for _, d in ipairs(expired) do
  redis.call('HDEL', K.dd, d); redis.call('ZREM', K.ddx, d)
end
for i = 2, #ARGV, 6 do
  local mid, payload, vat = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local grp, dd, till = ARGV[i + 3], ARGV[i + 4], ARGV[i + 5]
  local dup = false
  if dd ~= '' then
    local seen = redis.call('HGET', K.dd, dd)
    if seen then
      local sm, ss, su = string.match(seen, '(%S+) (%S+) (%S+)')
      if tonumber(su) > now then
        out[#out + 1] = sm; out[#out + 1] = tonumber(ss); out[#out + 1] = 1
        dup = true
      end
    end
  end
  if not dup then
    local seq = redis.call('INCR', K.seq)
    redis.call('HSET', K.msg, seq, payload)
    if grp ~= '' then redis.call('HSET', K.grp, seq, grp) end
    if vat <= now then
      redis.call('ZADD', K.vis, seq, seq); redis.call('ZADD', K.idx, seq, seq)
    else redis.call('ZADD', K.inv, vat, seq) end
    if dd ~= '' then
      redis.call('HSET', K.dd, dd, mid .. ' ' .. seq .. ' ' .. till)
      redis.call('ZADD', K.ddx, till, dd)
    end
    out[#out + 1] = mid; out[#out + 1] = seq; out[#out + 1] = 0
  end
end
return out
""",
    "receive": _PRELUDE
    + """
local now, n, vis_ms, k = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local fifo, token = ARGV[5], ARGV[6]
"""
    + _PROMOTE
    + """
local picks = {}
if fifo == '0' then
  -- ordering.window_picks: the first k + n - 1 messages visible or in flight
  -- (idx, merged with the head of vis for messages that predate idx), then
  -- the visible ones after them that a pick may fall back on.
  local want = k + n - 1
  local seqs, known = {}, {}
  for _, key in ipairs({K.idx, K.vis}) do
    for _, s in ipairs(redis.call('ZRANGE', key, 0, want - 1)) do
      if not known[s] then known[s] = true; seqs[#seqs + 1] = tonumber(s) end
    end
  end
  table.sort(seqs)
  local window, shown = {}, 0
  for i = 1, math.min(want, #seqs) do
    local s = string.format('%d', seqs[i])
    local visible = redis.call('ZSCORE', K.vis, s) ~= false
    if visible then shown = shown + 1 end
    window[#window + 1] = {s, visible}
  end
  if #window == want and shown < n then
    local last = window[#window][1]
    for _, s in ipairs(redis.call('ZRANGEBYSCORE', K.vis, '(' .. last, '+inf', 'LIMIT', 0, n - shown)) do
      window[#window + 1] = {s, true}
    end
  end
  for i = 1, n do
    local open = {}
    for j = 1, math.min(k, #window) do
      if window[j][2] then open[#open + 1] = j end
    end
    local at = nil
    if #open > 0 then
      at = open[math.floor(tonumber(ARGV[6 + i]) * #open) % #open + 1]
    else
      for j = k + 1, #window do
        if window[j][2] then at = j; break end
      end
    end
    if at == nil then break end
    picks[#picks + 1] = table.remove(window, at)[1]
  end
else
  local all = redis.call('HKEYS', K.msg)
  local seqs = {}
  for _, s in ipairs(all) do seqs[#seqs + 1] = tonumber(s) end
  table.sort(seqs)
  local blocked = {}
  for _, s in ipairs(seqs) do
    if #picks >= n then break end
    local g = redis.call('HGET', K.grp, s) or ''
    if not blocked[g] then
      if redis.call('ZSCORE', K.vis, s) then picks[#picks + 1] = tostring(s)
      else blocked[g] = true end
    end
  end
end
local out = {}
for _, s in ipairs(picks) do
  redis.call('ZREM', K.vis, s)
  redis.call('ZADD', K.inv, now + vis_ms, s)
  local count = redis.call('HINCRBY', K.rc, s, 1)
  if count == 1 then redis.call('HSET', K.fr, s, now) end
  redis.call('HSET', K.tok, s, token)
  out[#out + 1] = {tonumber(s), redis.call('HGET', K.msg, s), count, tonumber(redis.call('HGET', K.fr, s))}
end
return out
""",
    "peek": _PRELUDE
    + """
local now, w = tonumber(ARGV[1]), tonumber(ARGV[2])
"""
    + _PROMOTE
    + """
return redis.call('ZRANGE', K.vis, 0, w - 1)
""",
    "delete": _PRELUDE
    + """
for i = 1, #ARGV, 2 do
  local s = ARGV[i]
  if redis.call('HGET', K.tok, s) == ARGV[i + 1] then
    redis.call('ZREM', K.vis, s); redis.call('ZREM', K.inv, s); redis.call('ZREM', K.idx, s)
    redis.call('HDEL', K.msg, s); redis.call('HDEL', K.grp, s); redis.call('HDEL', K.rc, s)
    redis.call('HDEL', K.fr, s); redis.call('HDEL', K.tok, s)
  end
end
return 1
""",
    "change": _PRELUDE
    + """
local s, token, vat, now = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
if redis.call('HEXISTS', K.msg, s) == 0 then return 'NOTFOUND' end
local deadline = redis.call('ZSCORE', K.inv, s)
if not deadline or tonumber(deadline) <= now or redis.call('HGET', K.tok, s) ~= token then
  return 'NOTINFLIGHT'
end
if vat <= now then
  redis.call('ZREM', K.inv, s); redis.call('ZADD', K.vis, tonumber(s), s)
  redis.call('ZADD', K.idx, tonumber(s), s)
else
  redis.call('ZADD', K.inv, vat, s)
end
return 'OK'
""",
}
_SHAS = {name: hashlib.sha1(body.encode()).hexdigest() for name, body in _SCRIPTS.items()}

_RETRYABLE = (
    rexc.ConnectionError,
    rexc.TimeoutError,
    rexc.ClusterDownError,
    rexc.TryAgainError,
    rexc.MovedError,
    rexc.AskError,
    rexc.ReadOnlyError,
    rexc.MasterDownError,
    rexc.BusyLoadingError,
    OSError,
)


def _pack_args(args: Sequence[Any]) -> bytes:
    """RESP bulk strings of ``args`` (no array header)."""
    out = []
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%b\r\n" % (len(b), b))
    return b"".join(out)


@functools.lru_cache(maxsize=4096)
def _evalsha_head(script: str, keys: tuple[bytes, ...]) -> bytes:
    """EVALSHA, sha and keys of a call, packed; the arguments follow."""
    return _pack_args(("EVALSHA", _SHAS[script], len(keys), *keys))


@functools.lru_cache(maxsize=4096)
def _keys(name: str) -> tuple[bytes, ...]:
    # Bytes, cached: redis-py re-encodes str arguments on every call.
    return tuple(f"cmq:{{{name}}}:{f}".encode() for f in _FIELDS)


class RedisClusterStore(Store):
    """Queues in a Redis Cluster, one hash slot per queue."""

    def __init__(
        self,
        nodes: Sequence[tuple[str, int]],
        *,
        wait_replicas: int = 1,
        wait_timeout_ms: int = 1000,
    ) -> None:
        self._seeds = list(nodes)
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
        self._clients: dict[tuple[str, int], aioredis.Redis] = {}
        # The hot path's own idle connections per node: redis-py's pool and
        # command packing cost more CPU than the Lua script they carry.
        self._idle: dict[tuple[str, int], list[Connection]] = {}
        # slot -> (master address, number of live replicas)
        self._slots: list[tuple[tuple[str, int], int] | None] = [None] * 16384
        self._refresh_lock = asyncio.Lock()
        self._refreshed_at = 0.0

    async def open(self) -> None:
        """Read the slot map. Raises StoreUnavailable."""
        await self._refresh()

    async def close(self) -> None:
        """Close every connection pool."""
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()
        for idle in self._idle.values():
            for conn in idle:
                await conn.disconnect()
        self._idle.clear()

    def _conns(self, addr: tuple[str, int]) -> list[Connection]:
        idle = self._idle.get(addr)
        if idle is None:
            idle = self._idle[addr] = []
        return idle

    @staticmethod
    def _new_conn(addr: tuple[str, int]) -> Connection:
        return Connection(
            host=addr[0], port=addr[1], socket_timeout=5.0, socket_connect_timeout=2.0
        )

    def _client(self, addr: tuple[str, int]) -> aioredis.Redis:
        client = self._clients.get(addr)
        if client is None:
            client = self._clients[addr] = aioredis.Redis(
                host=addr[0], port=addr[1], socket_timeout=5.0, socket_connect_timeout=2.0
            )
        return client

    async def _refresh(self) -> None:
        """Reload the slot map from the first node that answers."""
        requested = time.monotonic()
        async with self._refresh_lock:
            if self._refreshed_at > requested:
                return  # another task refreshed it while this one waited
            last: BaseException | None = None
            for addr in [*self._seeds, *self._clients]:
                try:
                    slots = await self._client(addr).execute_command("CLUSTER SLOTS")  # type: ignore[no-untyped-call]
                except (rexc.RedisError, OSError) as exc:
                    last = exc
                    continue
                table: list[tuple[tuple[str, int], int] | None] = [None] * 16384
                online: dict[tuple[str, int], int] = {}
                for entry in slots:
                    start, end, master = entry[0], entry[1], entry[2]
                    host = master[0].decode() if isinstance(master[0], bytes) else master[0]
                    owner = ((host or addr[0]), int(master[1]))
                    if owner not in online:
                        online[owner] = await self._online_replicas(owner)
                    for slot in range(int(start), int(end) + 1):
                        table[slot] = (owner, online[owner])
                self._slots = table
                self._refreshed_at = time.monotonic()
                return
            raise StoreUnavailable(f"no Redis Cluster node answers: {last}") from last

    async def _online_replicas(self, addr: tuple[str, int]) -> int:
        """Replicas that the master itself reports online: the ones WAIT counts.

        (CLUSTER SLOTS lists a new replica only seconds after it is in sync.)
        """
        try:
            info = await self._client(addr).info("replication")
        except (rexc.RedisError, OSError):
            return 0
        return sum(
            1
            for key, value in info.items()
            if key.startswith("slave")
            and isinstance(value, dict)
            and value.get("state") == "online"
        )

    async def _call(
        self, script: str, name: str, args: Sequence[Any], *, wait: bool = False
    ) -> Any:
        """Run ``script`` on the master of ``name``'s slot, retrying through failovers.

        Raises QueueDoesNotExist (the script's NOQUEUE) and StoreUnavailable.
        """
        keys = _keys(name)
        return await self._retrying(
            name, script, lambda slot: self._call_once(script, name, slot, keys, args, wait)
        )

    async def _commands(self, name: str, cmds: Sequence[Sequence[Any]]) -> list[Any]:
        """Send plain commands to the master of ``name``'s slot as one pipeline
        (no ``MULTI``: other clients' commands may run between them) and
        return their replies, retrying through failovers (a retry re-sends
        them all). Raises StoreUnavailable."""
        return await self._retrying(  # type: ignore[no-any-return]
            name, "commands", lambda slot: self._commands_once(slot, cmds)
        )

    async def _commands_once(self, slot: int, cmds: Sequence[Sequence[Any]]) -> list[Any]:
        entry = self._slots[slot]
        if entry is None:
            raise rexc.ClusterDownError(f"slot {slot} is not served")
        addr = entry[0]
        packed = b"".join(b"*%d\r\n" % len(c) + _pack_args(c) for c in cmds)
        conns = self._conns(addr)
        conn = conns.pop() if conns else self._new_conn(addr)
        replies: list[Any] = []
        try:
            await conn.send_packed_command(packed, check_health=False)
            for _ in cmds:
                try:
                    replies.append(await conn.read_response())
                except rexc.ResponseError as exc:
                    replies.append(exc)  # the later replies are still to be read
        except BaseException:
            await conn.disconnect()
            raise
        conns.append(conn)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    async def _retrying(
        self, name: str, what: str, attempt: Callable[[int], Awaitable[Any]]
    ) -> Any:
        """``attempt(slot)`` of ``name``'s slot until it succeeds, a failover
        allowing. Raises QueueDoesNotExist (NOQUEUE) and StoreUnavailable."""
        slot = key_slot(_keys(name)[0])
        deadline = time.monotonic() + RETRY_SECONDS
        delay = 0.05
        while True:
            if time.monotonic() - self._refreshed_at > SLOT_MAP_TTL:
                try:
                    await self._refresh()
                except StoreUnavailable:
                    if time.monotonic() >= deadline:
                        raise
                    await asyncio.sleep(delay)
                    continue
            try:
                return await attempt(slot)
            except rexc.ResponseError as exc:
                if str(exc).startswith("NOQUEUE"):
                    raise QueueDoesNotExist(f"The specified queue {name} does not exist.") from None
                if not isinstance(exc, _RETRYABLE) and not str(exc).startswith(
                    ("MOVED", "ASK", "CLUSTERDOWN", "TRYAGAIN", "READONLY", "LOADING")
                ):
                    raise StoreUnavailable(f"Redis refused {what}: {exc}") from exc
                failure: BaseException = exc
            except _RETRYABLE as exc:
                failure = exc
            if time.monotonic() >= deadline:
                raise StoreUnavailable(f"Redis Cluster unavailable: {failure}") from failure
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)
            try:
                await self._refresh()
            except StoreUnavailable:
                continue

    async def _call_once(
        self,
        script: str,
        name: str,
        slot: int,
        keys: tuple[bytes, ...],
        args: Sequence[Any],
        wait: bool,
    ) -> Any:
        entry = self._slots[slot]
        if entry is None:
            raise rexc.ClusterDownError(f"slot {slot} is not served")
        addr, replicas = entry
        want = min(self.wait_replicas, replicas) if wait else 0
        head = _evalsha_head(script, keys)
        for _ in range(2):
            packed = b"*%d\r\n" % (3 + len(keys) + len(args)) + head + _pack_args(args)
            if want:
                packed += b"*3\r\n" + _pack_args(("WAIT", want, self.wait_timeout_ms))
            conns = self._conns(addr)
            conn = conns.pop() if conns else self._new_conn(addr)
            try:
                await conn.send_packed_command(packed, check_health=False)
                try:
                    first: Any = await conn.read_response()
                except rexc.ResponseError as exc:
                    first = exc  # the WAIT reply, if any, is still to be read
                second: Any = await conn.read_response() if want else 0
            except BaseException:
                # A broken or cancelled exchange leaves unread replies on the
                # connection: never reuse it.
                await conn.disconnect()
                raise
            conns.append(conn)
            if isinstance(first, rexc.NoScriptError):
                await self._client(addr).script_load(_SCRIPTS[script])
                continue
            if isinstance(first, Exception):
                raise first
            if want and int(second) < want:
                # The master has the write but no replica confirmed it in
                # time: do not acknowledge (the client's retry may duplicate,
                # which at-least-once allows; a lost ack'd send it does not).
                raise StoreUnavailable(
                    f"only {second} of {want} replicas confirmed the write in "
                    f"{self.wait_timeout_ms} ms"
                )
            return first
        raise StoreUnavailable(f"cannot load script {script}")

    # -- operations --------------------------------------------------------

    async def create_queue(self, record: QueueRecord) -> tuple[QueueRecord, bool]:
        args: list[Any] = [record.created_at]
        for key, value in record.attributes.items():
            args += [key, value]
        created, meta, attrs = await self._call("create", record.name, args, wait=True)
        await self._registry("SADD", record.name)
        if created:
            return record, True
        return _record(record.name, meta, attrs), False

    async def _registry(self, op: str, name: str) -> None:
        slot = key_slot(_REGISTRY.encode())
        deadline = time.monotonic() + RETRY_SECONDS
        while True:
            entry = self._slots[slot]
            try:
                if entry is None:
                    raise rexc.ClusterDownError("registry slot not served")
                await self._client(entry[0]).execute_command(op, _REGISTRY, name)  # type: ignore[no-untyped-call]
                return
            except (rexc.RedisError, OSError) as exc:
                if time.monotonic() >= deadline:
                    raise StoreUnavailable(f"Redis Cluster unavailable: {exc}") from exc
                await asyncio.sleep(0.1)
                await self._refresh()

    async def get_queue(self, name: str) -> QueueRecord:
        meta, attrs = await self._call("get", name, [])
        return _record(name, meta, attrs)

    async def list_queues(self, prefix: str) -> list[str]:
        slot = key_slot(_REGISTRY.encode())
        entry = self._slots[slot]
        if entry is None:
            await self._refresh()
            entry = self._slots[slot]
        try:
            assert entry is not None
            names = await self._client(entry[0]).smembers(_REGISTRY)
        except (rexc.RedisError, OSError, AssertionError) as exc:
            raise StoreUnavailable(f"Redis Cluster unavailable: {exc}") from exc
        decoded = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
        return sorted(n for n in decoded if n.startswith(prefix))

    async def delete_queue(self, name: str) -> None:
        await self._call("drop", name, [], wait=True)
        await self._registry("SREM", name)

    async def set_attributes(self, name: str, attributes: Mapping[str, str], now: int) -> None:
        args: list[Any] = [now]
        for key, value in attributes.items():
            args += [key, value]
        await self._call("set", name, args, wait=True)

    async def browse(self, name: str, limit: int) -> list[Browsed]:
        # Two read-only round trips: the heads of both indexes, then the
        # chosen messages (one deleted in between is left out).
        k = dict(zip(_FIELDS, _keys(name), strict=True))
        exists, vis, inv = await self._commands(name, [
            ("EXISTS", k["meta"]),
            ("ZRANGE", k["vis"], 0, limit - 1),
            ("ZRANGE", k["inv"], 0, limit - 1, "WITHSCORES"),
        ])  # fmt: skip
        if not exists:
            raise QueueDoesNotExist(f"The specified queue {name} does not exist.")
        at = {int(s): 0 for s in vis}
        # WITHSCORES: flat (RESP2) or as [member, score] pairs (RESP3).
        flat = [x for pair in inv for x in pair] if inv and isinstance(inv[0], list) else inv
        at.update({int(flat[i]): int(float(flat[i + 1])) for i in range(0, len(flat), 2)})
        seqs = sorted(at)[:limit]
        if not seqs:
            return []
        replies = await self._commands(
            name, [c for s in seqs for c in (("HGET", k["msg"], s), ("HGET", k["rc"], s))]
        )
        return [
            Browsed(seq=s, payload=replies[2 * i].decode(), visible_at=at[s],
                    receive_count=int(replies[2 * i + 1] or 0))
            for i, s in enumerate(seqs)
            if replies[2 * i] is not None
        ]

    async def counts(self, name: str, now: int) -> QueueCounts:
        visible, in_flight, delayed = await self._call("counts", name, [now])
        return QueueCounts(visible=visible, in_flight=in_flight, delayed=delayed)

    async def send(self, name: str, messages: Sequence[NewMessage], now: int) -> list[SendResult]:
        args: list[Any] = [now]
        for m in messages:
            args += [
                m.message_id,
                m.payload,
                m.visible_at,
                m.group_id or "",
                m.dedup_id or "",
                m.dedup_until,
            ]
        flat = await self._call("send", name, args, wait=True)
        return [
            SendResult(
                message_id=flat[i].decode(), seq=int(flat[i + 1]), duplicate=bool(flat[i + 2])
            )
            for i in range(0, len(flat), 3)
        ]

    async def receive_atomic(self, name: str, spec: ReceiveSpec) -> list[Received]:
        args = [
            spec.now,
            spec.max_messages,
            spec.visibility_ms,
            spec.k,
            "1" if spec.fifo else "0",
            spec.token,
            *(repr(r) for r in spec.rand),
        ]
        rows = await self._call("receive", name, args)
        return [
            Received(
                seq=int(seq),
                payload=payload.decode(),
                receive_count=int(count),
                first_receive_at=int(first),
                token=spec.token,
            )
            for seq, payload, count, first in rows
        ]

    async def peek(self, name: str, spec: ReceiveSpec) -> list[int]:
        window = await self._call("peek", name, [spec.now, spec.k + spec.max_messages - 1])
        return standard_picks([int(s) for s in window], spec.k, spec.max_messages, spec.rand)

    async def mark(self, name: str, spec: ReceiveSpec, picks: Sequence[int]) -> list[Received]:
        if not picks:
            return []
        k = dict(zip(_FIELDS, _keys(name), strict=True))
        deadline = spec.now + spec.visibility_ms
        cmds: list[tuple[Any, ...]] = []
        for seq in picks:
            cmds += [
                ("ZREM", k["vis"], seq),
                ("ZADD", k["inv"], deadline, seq),
                ("HINCRBY", k["rc"], seq, 1),
                ("HSETNX", k["fr"], seq, spec.now),
                ("HSET", k["tok"], seq, spec.token),
                ("HGET", k["fr"], seq),
                ("HGET", k["msg"], seq),
            ]
        replies = await self._commands(name, cmds)
        out, gone = [], []
        for i, seq in enumerate(picks):
            count, first, payload = replies[7 * i + 2], replies[7 * i + 5], replies[7 * i + 6]
            if payload is None:
                gone.append(seq)
                continue
            out.append(
                Received(
                    seq=seq,
                    payload=payload.decode(),
                    receive_count=int(count),
                    first_receive_at=int(first),
                    token=spec.token,
                )
            )
        if gone:
            # Deleted between the read and the write: drop what the write
            # re-created (sequence numbers are never reused, so this can
            # remove nothing that belongs to a live message).
            await self._commands(
                name,
                [(op, k[f], seq) for seq in gone
                 for op, f in (("ZREM", "inv"), ("HDEL", "rc"), ("HDEL", "fr"), ("HDEL", "tok"))],
            )  # fmt: skip
        return out

    async def delete(self, name: str, receipts: Sequence[tuple[int, str]]) -> None:
        await self._call("delete", name, [x for receipt in receipts for x in receipt])

    async def change_visibility(
        self, name: str, seq: int, token: str, visible_at: int, now: int
    ) -> ChangeResult:
        result = await self._call("change", name, [seq, token, visible_at, now])
        return {
            b"OK": ChangeResult.OK,
            b"NOTFOUND": ChangeResult.NOT_FOUND,
        }.get(result, ChangeResult.NOT_IN_FLIGHT)

    async def purge(self, name: str) -> None:
        await self._call("purge", name, [])

    async def usage(self) -> int:
        """Memory the cluster's masters use (``used_memory``, summed)."""
        masters = {entry[0] for entry in self._slots if entry is not None}
        try:
            infos = [await self._client(addr).info("memory") for addr in sorted(masters)]
        except (rexc.RedisError, OSError) as exc:
            raise StoreUnavailable(f"Redis Cluster unavailable: {exc}") from exc
        return sum(int(info.get("used_memory", 0)) for info in infos)


def _pairs(flat: list[bytes]) -> dict[str, str]:
    return {flat[i].decode(): flat[i + 1].decode() for i in range(0, len(flat), 2)}


def _record(name: str, meta: list[bytes], attrs: list[bytes]) -> QueueRecord:
    m = _pairs(meta)
    return QueueRecord(
        name=name,
        attributes=_pairs(attrs),
        created_at=int(m.get("created", "0")),
        modified_at=int(m.get("modified", "0")),
    )
