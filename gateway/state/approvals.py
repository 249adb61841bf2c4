"""Pending approvals (gateway.approvals), where every replica finds them: in this process's memory,
or in the Redis replicas share. Records and decisions are opaque text here (their shape is
gateway.approvals'); the store keeps each approval until its time is up, takes the first decision
on it and refuses any later one, and holds at most `capacity` at a time."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from redis.asyncio import Redis

APPROVALS_HELD = 1000  # pending approvals at most, in all (each a request waiting)
# Hold a new approval, unless `capacity` are held already: the count and the write in one step, so
# that asks at the same moment on several replicas cannot pass the bound together.
_ADD = """
redis.call('zremrangebyscore', KEYS[1], '-inf', ARGV[1])
if redis.call('zcard', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('set', KEYS[2], ARGV[3], 'PX', ARGV[4])
redis.call('zadd', KEYS[1], ARGV[6], ARGV[5])
return 1
"""
# Set the decision only while the approval is held and undecided: the first decision wins.
_DECIDE = """
if redis.call('exists', KEYS[1]) == 0 then return 0 end
if redis.call('set', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
"""


class ApprovalStore(Protocol):
    async def add(self, approval_id: str, record: str, ttl_seconds: float) -> bool:
        """Hold a new approval; False when `capacity` approvals are held already."""

    async def held(self) -> list[tuple[str, str, str | None]]:
        """(id, record, decision or None) of every approval held."""

    async def get(self, approval_id: str) -> tuple[str, str | None] | None:
        """(record, decision or None) of one approval, if held."""

    async def decide(self, approval_id: str, decision: str) -> bool:
        """Record the decision, unless the approval is not held or was decided already."""

    async def decision(self, approval_id: str) -> str | None:
        """The decision on one approval, if any."""

    async def remove(self, approval_id: str) -> None:
        """Forget one approval and its decision."""


@dataclass
class _Held:
    record: str
    expires: float
    decision: str | None = None


@dataclass
class MemoryApprovals:
    """Approvals in this process's memory."""

    capacity: int = APPROVALS_HELD
    clock: Callable[[], float] = time.monotonic
    _held: dict[str, _Held] = field(default_factory=dict)

    def _live(self) -> dict[str, _Held]:
        now = self.clock()
        for approval_id in [i for i, held in self._held.items() if held.expires <= now]:
            del self._held[approval_id]
        return self._held

    async def add(self, approval_id: str, record: str, ttl_seconds: float) -> bool:
        if len(self._live()) >= self.capacity:
            return False
        self._held[approval_id] = _Held(record, self.clock() + ttl_seconds)
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
        held = self._live().get(approval_id)
        return None if held is None else held.decision

    async def remove(self, approval_id: str) -> None:
        self._held.pop(approval_id, None)


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
    its decision a key beside it, and an index of them by expiry. `run` bounds every command in
    time and makes a failure the state store's (gateway.state.RedisState)."""

    def __init__(self, redis: Redis, run: Callable[[Awaitable[Any]], Awaitable[Any]], prefix: str,
                 capacity: int = APPROVALS_HELD) -> None:
        self._redis = redis
        self._run = run
        self._index = f"{prefix}approvals"
        self._record = f"{prefix}approval:"
        self._decided = f"{prefix}approval-decision:"
        self._capacity = capacity

    async def add(self, approval_id: str, record: str, ttl_seconds: float) -> bool:
        now, ttl_ms = time.time(), max(1, int(ttl_seconds * 1000))
        added = await self._run(self._redis.eval(_ADD, 2, self._index, self._record + approval_id, now,
                                                 self._capacity, record, ttl_ms, approval_id, now + ttl_ms / 1000))
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

    async def remove(self, approval_id: str) -> None:
        pipe = self._redis.pipeline(transaction=True)
        pipe.delete(self._record + approval_id, self._decided + approval_id)
        pipe.zrem(self._index, approval_id)
        await self._run(pipe.execute())
