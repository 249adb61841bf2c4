"""The failure records (the retry state of telemetry.trajectory) in a Redis that replicas share:
one hash per trajectory, a field per tool whose value starts with the time it was written.

A store of its own beside the owned maps (gateway.state.maps): a record is one field of its
trajectory's hash, written by one HSET whichever replica writes it, the oldest fields going past
`tools_per_trajectory`; the trajectories go least recently written first, with no share per gateway
key; and a read does not refresh them."""

from __future__ import annotations

import math
import re
import time

from gateway.state.base import DEFAULT_FAILURE_BOUNDS, FailureBounds
from gateway.state.redis_connection import RedisConnection, pipeline_answers
from gateway.state.redis_values import REPLACED, WRONG_TYPE, Unreadable, failure_record, written_at, wrong_type


class RedisFailures:
    """`FailureBook` in Redis, within `FailureBounds` (the trajectories held are trimmed by a
    sorted set of them by last write)."""

    def __init__(self, connection: RedisConnection, bounds: FailureBounds = DEFAULT_FAILURE_BOUNDS) -> None:
        self._connection = connection
        self._redis = connection.redis
        self._bounds = bounds
        self._ttl_ms = max(1, int(bounds.ttl_seconds * 1000))
        self._recency = f"{connection.prefix}lru:fail"
        # The entries the recency set may name: anything else in it is never deleted by a trim.
        self._entry = re.compile(re.escape(connection.prefix.encode()) + rb"fail:(-|[0-9a-f]{16}):[0-9a-f]{40}")

    async def failure(self, principal: str | None, trajectory_id: str, tool: str) -> str | None:
        key = self._connection.key("fail", principal, trajectory_id)
        return self._connection.read("fail", key, await self._connection.run(self._redis.hget(key, tool)),
                                     failure_record)

    async def remember_failure(self, principal: str | None, trajectory_id: str, tool: str,
                               record: str | None) -> None:
        """The record written, the trajectory's expiry refreshed; trajectories trimmed like the rest."""
        key, lru, now = self._connection.key("fail", principal, trajectory_id), self._recency, time.time()
        pipe = self._redis.pipeline(transaction=True)
        if record is None:
            pipe.hdel(key, tool)
        else:
            pipe.hset(key, tool, f"{now:.6f} {record}")
        pipe.pexpire(key, self._ttl_ms)
        pipe.zadd(lru, {key: now})
        pipe.zremrangebyscore(lru, "-inf", now - self._ttl_ms / 1000)
        pipe.zcard(lru)
        pipe.hlen(key)
        written, *_, trajectories, tools = await self._connection.run(pipeline_answers(pipe))
        if wrong_type(written):  # not a hash: garbage, which this write replaces
            self._connection.unreadable("fail", key, WRONG_TYPE, REPLACED)
            tools = await self._replace(key, tool, None if record is None else f"{now:.6f} {record}")
        per_trajectory = self._bounds.tools_per_trajectory
        if tools > per_trajectory:
            await self._drop_oldest(key, tools - per_trajectory)
        await self._trim(trajectories, self._bounds.trajectories)

    async def _replace(self, key: str, tool: str, value: str | None) -> int:
        """The trajectory's hash, of another Redis type, replaced by one holding only `value` (if
        any); how many records it holds."""
        pipe = self._redis.pipeline(transaction=True)
        pipe.delete(key)
        if value is not None:
            pipe.hset(key, tool, value)
            pipe.pexpire(key, self._ttl_ms)
        await self._connection.run(pipeline_answers(pipe))
        return 0 if value is None else 1

    async def _drop_oldest(self, key: str, excess: int) -> None:
        """Drop the `excess` oldest records of a trajectory: first those whose time is unreadable."""
        fields = await self._connection.run(self._redis.hgetall(key))
        if not isinstance(fields, dict):  # became garbage meanwhile: the next write replaces it
            return

        def age(field: bytes) -> float:
            try:
                return written_at(fields[field])
            except Unreadable as exc:
                self._connection.unreadable("fail", key, exc.reason)
                return -math.inf

        await self._connection.run(self._redis.hdel(key, *sorted(fields, key=age)[:excess]))

    async def _trim(self, counted: object, bound: int) -> None:
        """Trim the recency set, of `counted` entries by its ZCARD, to `bound`, least recently used
        first. A set that is another Redis type is garbage, deleted: the next write makes it anew
        (the entries written meanwhile are in no set, and still expire)."""
        recency, run = self._recency, self._connection.run
        if not isinstance(counted, int):
            self._connection.unreadable("lru", recency, WRONG_TYPE, REPLACED)
            await run(self._redis.delete(recency))
            return
        if counted <= bound:
            return
        popped = await run(self._redis.zpopmin(recency, counted - bound))
        if wrong_type(popped):  # became garbage since it was counted: the next write replaces it
            return
        dropped = self._entries([member for member, _ in popped])
        if dropped:
            await run(self._redis.delete(*dropped))

    def _entries(self, members: list[bytes]) -> list[str]:
        """The members of the recency set that name failure records. Any other is garbage, and
        never a key to delete: it could name anything in Redis."""
        entries = []
        for member in members:
            if self._entry.fullmatch(member) is not None:
                entries.append(member.decode("ascii"))
            else:
                self._connection.unreadable("lru", self._recency, "a member that names no entry of its kind",
                                            "dropped from the set")
        return entries
