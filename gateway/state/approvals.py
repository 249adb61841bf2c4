"""Pending approvals (gateway.tools.approval_gate), where every replica finds them: in this process's memory,
or in the Redis replicas share. Records and decisions are opaque text here (their shape is
gateway.tools.approval_gate'); the store keeps each approval until its time is up, takes the first decision
on it and refuses any later one, and holds at most as many as its `ApprovalBounds` allow: in all,
and for any one gateway key. Past the capacity the rule of gateway.state.fair holds: a key within
its fair share is never refused for another key's approvals, which give way instead (the one
nearest its end goes first, and its call is told that no approval could be had).

A store of its own beside the owned maps (gateway.state.maps), sharing their fairness rule and, in
Redis, their connection: an approval is held for a time its call chooses, not a table's; a key at
its share is refused rather than losing its oldest, which a reviewer may be reading; one pushed
out leaves its decision behind for its call to read; a decision is taken once (SET NX beside the
record); and the page lists every approval pending, of every key, which an owned map never does."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from redis.asyncio import Redis

from gateway.state.fair import fair_victim
from gateway.state.redis_fair import LIBRARY, owner_name


@dataclass(frozen=True)
class ApprovalBounds:
    """How many approvals may be pending at once: in all, and for any one gateway key."""

    capacity: int = 1000  # each a request waiting
    per_key: int = 250


PENDING_APPROVALS = ApprovalBounds()
# The decision an approval gets when it is pushed out for another key's (gateway.tools.approval_gate reads
# it: its call is told that no approval could be had, and does not run).
PUSHED_OUT = '{"decision": "unavailable"}'

# Hold a new approval, within the bounds, as one step (asks at the same moment on several replicas
# cannot pass a bound together): refused when the asker holds its share; past the capacity, the
# approval nearest its end of the key holding the most is pushed out (gateway.state.redis_fair),
# or, when that key is the asker, the new one is refused. Answers {1 or 0, reports}.
_ADD = LIBRARY + """
local index, counts, record = KEYS[1], KEYS[2], KEYS[3]
local sets, records, decisions, pushed_out = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local now, capacity, share, owner = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8]
local id, value, ttl_ms, ends = ARGV[9], ARGV[10], ARGV[11], ARGV[12]

local function push_out(victim)
  local popped = redis.call('zpopmin', sets .. victim)
  if #popped > 0 then
    redis.call('zrem', index, popped[1])
    local left = redis.call('pttl', records .. popped[1])
    redis.call('del', records .. popped[1])
    if tonumber(popped[2]) > now and left > 0 then
      redis.call('set', decisions .. popped[1], pushed_out, 'PX', left, 'NX')
    end
  end
  recount(counts, sets, victim)
end

usable(index)
usable(counts)
redis.call('zremrangebyscore', index, '-inf', now)
if usable(sets .. owner) then redis.call('zremrangebyscore', sets .. owner, '-inf', now) end
if share > 0 and recount(counts, sets, owner) >= share then return {0, unreadable} end
redis.call('set', record, value, 'PX', ttl_ms)
redis.call('zadd', index, ends, id)
redis.call('zadd', sets .. owner, ends, id)
recount(counts, sets, owner)
while redis.call('zcard', index) > capacity do
  local victim = fair_owner(counts, sets)
  if victim == nil or victim == owner then
    redis.call('del', record)
    redis.call('zrem', index, id)
    redis.call('zrem', sets .. owner, id)
    recount(counts, sets, owner)
    return {0, unreadable}
  end
  push_out(victim)
end
return {1, unreadable}
"""
# Forget an approval: its record, its decision, its places in the index and its owner's set.
_REMOVE = LIBRARY + """
local sets, id, owner = ARGV[1], ARGV[2], ARGV[3]
redis.call('del', KEYS[1], KEYS[2])
if usable(KEYS[3]) then redis.call('zrem', KEYS[3], id) end
if usable(sets .. owner) then redis.call('zrem', sets .. owner, id) end
usable(KEYS[4])
recount(KEYS[4], sets, owner)
return unreadable
"""
# Set the decision only while the approval is held and undecided: the first decision wins.
_DECIDE = """
if redis.call('exists', KEYS[1]) == 0 then return 0 end
if redis.call('set', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
"""


class ApprovalStore(Protocol):
    async def add(self, approval_id: str, record: str, ttl_seconds: float, principal: str | None) -> bool:
        """Hold a new approval of the principal's (a gateway key's name, None without keys); False
        when it holds its share already, or when all are held and it holds the most."""

    async def held(self) -> list[tuple[str, str, str | None]]:
        """(id, record, decision or None) of every approval held."""

    async def get(self, approval_id: str) -> tuple[str, str | None] | None:
        """(record, decision or None) of one approval, if held."""

    async def decide(self, approval_id: str, decision: str) -> bool:
        """Record the decision, unless the approval is not held or was decided already."""

    async def decision(self, approval_id: str) -> str | None:
        """The decision on one approval, if any (PUSHED_OUT for one pushed out)."""

    async def remove(self, approval_id: str, principal: str | None) -> None:
        """Forget one approval of the principal's and its decision."""


@dataclass
class _Held:
    record: str
    expires: float
    principal: str | None = None
    decision: str | None = None


@dataclass
class MemoryApprovals:
    """Approvals in this process's memory."""

    bounds: ApprovalBounds = PENDING_APPROVALS
    clock: Callable[[], float] = time.monotonic
    _held: dict[str, _Held] = field(default_factory=dict)
    _pushed_out: dict[str, _Held] = field(default_factory=dict)  # until their calls have read it

    def _live(self) -> dict[str, _Held]:
        now = self.clock()
        for approvals in (self._held, self._pushed_out):
            for approval_id in [i for i, held in approvals.items() if held.expires <= now]:
                del approvals[approval_id]
        return self._held

    async def add(self, approval_id: str, record: str, ttl_seconds: float, principal: str | None) -> bool:
        counts = Counter(held.principal for held in self._live().values())
        if principal is not None and counts[principal] >= self.bounds.per_key:
            return False
        counts[principal] += 1
        ends = self.clock() + ttl_seconds
        while len(self._held) >= self.bounds.capacity:
            victim = fair_victim(counts, lambda owner: min(
                (held.expires for held in self._held.values() if held.principal == owner), default=ends))
            if victim == principal:
                return False
            gone = min((i for i, held in self._held.items() if held.principal == victim),
                       key=lambda i: self._held[i].expires)
            self._pushed_out[gone] = replace(self._held.pop(gone), decision=PUSHED_OUT)
            counts[victim] -= 1
        self._held[approval_id] = _Held(record, ends, principal)
        return True

    async def held(self) -> list[tuple[str, str, str | None]]:
        return [(approval_id, held.record, held.decision) for approval_id, held in self._live().items()]

    async def get(self, approval_id: str) -> tuple[str, str | None] | None:
        held = self._live().get(approval_id)
        return None if held is None else (held.record, held.decision)

    async def decide(self, approval_id: str, decision: str) -> bool:
        held = self._live().get(approval_id)
        if held is None or held.decision is not None:
            return False
        held.decision = decision
        return True

    async def decision(self, approval_id: str) -> str | None:
        held = self._live().get(approval_id) or self._pushed_out.get(approval_id)
        return None if held is None else held.decision

    async def remove(self, approval_id: str, principal: str | None) -> None:
        self._held.pop(approval_id, None)
        self._pushed_out.pop(approval_id, None)


def _text(value: Any) -> str | None:
    """A value read from Redis as text; anything else (not UTF-8, another Redis type) is missing."""
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return None
    return value if isinstance(value, str) else None


class RedisApprovals:
    """Approvals in the Redis replicas share: each a key with the time it is held as its expiry,
    its decision a key beside it, an index of them by expiry, and each owner's set of them by
    expiry with the owners' counts (gateway.state.redis_fair). `run` bounds every command in time
    and makes a failure the state store's (gateway.state.RedisState); `report` hears what the
    scripts found there that the gateway did not write (gateway.state.redis_fair)."""

    def __init__(self, redis: Redis, run: Callable[[Awaitable[Any]], Awaitable[Any]], prefix: str,
                 bounds: ApprovalBounds = PENDING_APPROVALS,
                 report: Callable[[object], None] = lambda reports: None) -> None:
        self._redis = redis
        self._run = run
        self._index = f"{prefix}approvals"
        self._sets = f"{prefix}approvals:"
        self._counts = f"{prefix}approvals-owners"
        self._record = f"{prefix}approval:"
        self._decided = f"{prefix}approval-decision:"
        self._bounds = bounds
        self._report = report
        self._add = redis.register_script(_ADD)
        self._remove = redis.register_script(_REMOVE)

    async def add(self, approval_id: str, record: str, ttl_seconds: float, principal: str | None) -> bool:
        now, ttl_ms = time.time(), max(1, int(ttl_seconds * 1000))
        share = self._bounds.per_key if principal is not None else 0
        answer = await self._run(self._add(
            keys=[self._index, self._counts, self._record + approval_id],
            args=[self._sets, self._record, self._decided, PUSHED_OUT, now, self._bounds.capacity, share,
                  owner_name(principal), approval_id, record, ttl_ms, now + ttl_ms / 1000]))
        if not isinstance(answer, list):  # stopped by garbage (a WRONGTYPE error): not held
            self._report(answer)
            return False
        added, reports = answer
        self._report(reports)
        return bool(added == 1)

    async def held(self) -> list[tuple[str, str, str | None]]:
        ids = [i for raw in await self._run(self._redis.zrangebyscore(self._index, time.time(), "+inf"))
               if (i := _text(raw)) is not None]
        if not ids:
            return []
        records = await self._run(self._redis.mget([self._record + i for i in ids]))
        decisions = await self._run(self._redis.mget([self._decided + i for i in ids]))
        return [(i, record, _text(decision)) for i, raw, decision in zip(ids, records, decisions, strict=True)
                if (record := _text(raw)) is not None]

    async def get(self, approval_id: str) -> tuple[str, str | None] | None:
        record, decision = await self._run(self._redis.mget([self._record + approval_id,
                                                             self._decided + approval_id]))
        text = _text(record)
        return None if text is None else (text, _text(decision))

    async def decide(self, approval_id: str, decision: str) -> bool:
        ttl = await self._run(self._redis.pttl(self._record + approval_id))
        if not isinstance(ttl, int) or ttl <= 0:
            return False
        done = await self._run(self._redis.eval(_DECIDE, 2, self._record + approval_id,
                                                self._decided + approval_id, decision, str(ttl)))
        return bool(done == 1)

    async def decision(self, approval_id: str) -> str | None:
        return _text(await self._run(self._redis.get(self._decided + approval_id)))

    async def remove(self, approval_id: str, principal: str | None) -> None:
        self._report(await self._run(self._remove(
            keys=[self._record + approval_id, self._decided + approval_id, self._index, self._counts],
            args=[self._sets, approval_id, owner_name(principal)])))
