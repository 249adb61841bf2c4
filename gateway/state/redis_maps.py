"""The owned maps (gateway.state.maps) in a Redis that replicas share."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from gateway.state.base import Bounds
from gateway.state.maps import Entries, Ids, Rows, Table
from gateway.state.redis_connection import RedisConnection, pipeline_answers
from gateway.state.redis_fair import PUT, TAKE, owner_name

_Named = list[tuple[Table[Any], str, str]]  # (table, id, its key in Redis) of each entry named


def _ttl_ms(bounds: Bounds) -> int:
    return max(1, int(bounds.ttl_seconds * 1000))


class RedisMaps:
    """Each entry is a key of its own with a TTL (the expiry, refreshed on use by GETEX), named by
    its table's kind, a digest of its gateway key and a digest of (gateway key, id)
    (`RedisConnection.key`): another key's lookup never finds it. Each table keeps a sorted set of
    its entries by last use, a set for each owner (gateway key) and the owners' counts: a write
    keeps the writer within its share (its least recently used go) and the table within its
    capacity (the least recently used of the key holding the most go, gateway.state.redis_fair),
    in one step inside Redis. Every read and write checks whether Redis lost its data on the way
    (`RedisConnection.check_epoch`), so a loss is reported when it bites."""

    def __init__(self, connection: RedisConnection) -> None:
        self._connection = connection
        self._redis = connection.redis
        self._prefix = connection.prefix
        self._put_script = self._redis.register_script(PUT)
        self._take_script = self._redis.register_script(TAKE)

    def _recency(self, kind: str, owner: str | None = None) -> str:
        """The sorted set of a table's entries by last use: all of them, or one owner's."""
        return f"{self._prefix}lru:{kind}" if owner is None else f"{self._prefix}lru:{kind}:{owner}"

    def _bookkeeping(self, kind: str) -> tuple[list[str], list[str]]:
        """The keys and arguments every script of gateway.state.redis_fair takes first for a table:
        its set of all entries and its owners' counts; its owners' sets' prefix and its entries'."""
        return ([self._recency(kind), f"{self._prefix}owners:{kind}"],
                [f"{self._prefix}lru:{kind}:", f"{self._prefix}{kind}:"])

    def _named(self, principal: str | None, ids: Sequence[Ids]) -> _Named:
        return [(table, i, self._connection.key(table.kind, principal, i))
                for table, keys in ids for i in dict.fromkeys(keys)]

    async def put(self, principal: str | None, *entries: Entries) -> None:
        """The entries, and each table kept within its bounds (redis_fair's PUT), with the check
        of the epoch, as one transaction."""
        by_kind: dict[str, tuple[Table[Any], dict[str, Any]]] = {}
        for table, values in entries:
            if values:
                by_kind.setdefault(table.kind, (table, {}))[1].update(values)
        if not by_kind:
            return
        now, owner = time.time(), owner_name(principal)
        pipe = self._redis.pipeline(transaction=True)
        pipe.get(self._connection.epoch_key)
        for kind, (table, values) in sorted(by_kind.items()):
            keys, args = self._bookkeeping(kind)
            bounds = table.bounds
            share = (bounds.per_key or bounds.capacity) if principal is not None else 0
            await self._put_script(keys=[*keys, *(self._connection.key(kind, principal, i) for i in values)],
                                   args=[*args, now, _ttl_ms(bounds), bounds.capacity, share, owner,
                                         *(table.encode(value) for value in values.values())], client=pipe)
        epoch, *reports = await self._connection.run(pipeline_answers(pipe))
        await self._connection.check_epoch(epoch)
        for found in reports:
            self._connection.report(found)

    async def get(self, principal: str | None, *ids: Ids) -> Rows:
        named = self._named(principal, ids)
        return self._rows(named, await self._refresh(principal, named, read=True))

    async def touch(self, principal: str | None, *ids: Ids) -> None:
        await self._refresh(principal, self._named(principal, ids), read=False)

    async def _refresh(self, principal: str | None, named: _Named, read: bool) -> list[object]:
        """The entries' TTLs and recency refreshed, and (`read`) their values (for a key of
        another Redis type, its WRONGTYPE error). A recency set that is garbage fails its refresh
        here unseen: the next write counts it and replaces it."""
        if not named:
            return []
        now, owner = time.time(), owner_name(principal)
        pipe = self._redis.pipeline(transaction=False)
        pipe.get(self._connection.epoch_key)
        for table, _, key in named:
            if read:
                pipe.getex(key, px=_ttl_ms(table.bounds))
            else:
                pipe.pexpire(key, _ttl_ms(table.bounds))
            pipe.zadd(self._recency(table.kind), {key: now}, xx=True)
            pipe.zadd(self._recency(table.kind, owner), {key: now}, xx=True)
        epoch, *answers = await self._connection.run(pipeline_answers(pipe))
        await self._connection.check_epoch(epoch)
        return list(answers[::3])

    def _rows(self, named: _Named, raws: list[object]) -> Rows:
        """What each value read is, garbage (counted and logged) left out as missing."""
        rows = Rows()
        for (table, entry_id, key), raw in zip(named, raws, strict=False):
            if (value := self._connection.read(table.kind, key, raw, table.decode)) is not None:
                rows.add(table, entry_id, value)
        return rows

    async def take(self, principal: str | None, *ids: Ids) -> Rows:
        """Read and forgotten in one step: of two replicas given the same entry, one gets it."""
        named = self._named(principal, ids)
        return self._rows(named, await self._take(principal, named))

    async def delete(self, principal: str | None, *ids: Ids) -> None:
        """The entries, and their places in the recency sets."""
        await self._take(principal, self._named(principal, ids))

    async def _take(self, principal: str | None, named: _Named) -> list[object]:
        """The raw values of the entries, each forgotten (redis_fair's TAKE, a script a table; a
        transaction when there are several), in the order named: None for those a script stopped
        by garbage did not read."""
        places: dict[str, list[int]] = {}
        for place, (table, _, _) in enumerate(named):
            places.setdefault(table.kind, []).append(place)
        if not places:
            return []
        pipe = self._redis.pipeline(transaction=len(places) > 1)
        for kind, kept in places.items():
            bookkeeping, args = self._bookkeeping(kind)
            await self._take_script(keys=[*bookkeeping, *(named[place][2] for place in kept)],
                                    args=[*args, owner_name(principal)], client=pipe)
        raws: list[object] = [None] * len(named)
        for answer, kept in zip(await self._connection.run(pipeline_answers(pipe)), places.values(), strict=True):
            for place, raw in zip(kept, self._taken(answer), strict=False):
                raws[place] = raw
        return raws

    def _taken(self, answer: Any) -> list[object]:
        """The values of a TAKE's answer (0, no text, for a key of another Redis type: garbage,
        which `_rows` counts), its reports counted."""
        if not isinstance(answer, list):  # stopped by garbage: nothing read
            self._connection.report(answer)
            return []
        values, reports = answer
        self._connection.report(reports)
        return list(values)

    def may_hold(self, table: Table[Any]) -> bool:
        return True  # another replica may have written one

    async def status(self) -> str | None:
        return await self._connection.status()

    async def aclose(self) -> None:
        await self._connection.aclose()
