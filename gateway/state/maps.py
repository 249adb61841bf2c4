"""The one primitive all of the state is kept in: owned maps. Each kind of entry is a `Table` (its
name, its bounds, and how Redis holds its values); the maps keep every table's entries by
(principal, id), so that another gateway key never finds one, each within the table's `Bounds`
(gateway.state.fair decides what goes when a table is full) and each expiring when unused.

`OwnedMaps` is implemented twice, in this process's memory (gateway.state.memory) and in Redis
(gateway.state.redis_maps); each verb takes several tables at once, so that what one request reads
or writes of several kinds is one round trip to Redis. `OwnedMap` is one table on the maps, typed
by its values: what callers use (gateway.state.store)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from gateway.state.base import Bounds, StateKind

V = TypeVar("V")


@dataclass(frozen=True)
class Table(Generic[V]):
    """One kind of entry. `kind` names its keys in Redis and its count of unreadable values;
    `encode` is what Redis holds for a value, `decode` reads it back and raises
    gateway.state.redis_values.Unreadable for anything else. Memory holds the values themselves."""

    kind: StateKind
    bounds: Bounds
    encode: Callable[[V], str]
    decode: Callable[[bytes], V]


Ids = tuple[Table[Any], Collection[str]]  # ids to read, take, delete or touch in one table
Entries = tuple[Table[Any], Mapping[str, Any]]  # values to write into one table, by id


class Rows:
    """What a read found, by table: the values by id, in the order the ids were asked for (the
    ids not held are left out)."""

    def __init__(self) -> None:
        self._found: dict[str, dict[str, Any]] = {}

    def add(self, table: Table[Any], key: str, value: object) -> None:
        self._found.setdefault(table.kind, {})[key] = value

    def of(self, table: Table[V]) -> dict[str, V]:
        return self._found.get(table.kind, {})


class OwnedMaps(Protocol):
    """Entries by table and (principal, id): a principal is a gateway key's name, None without keys."""

    async def put(self, principal: str | None, *entries: Entries) -> None:
        """Write the principal's entries, each with its table's expiry, each table kept within its
        bounds (the writer's own least recently used go first, gateway.state.fair past the capacity)."""

    async def get(self, principal: str | None, *ids: Ids) -> Rows:
        """The principal's values of these ids, each entry's expiry refreshed by the read."""

    async def take(self, principal: str | None, *ids: Ids) -> Rows:
        """The principal's values of these ids, each entry forgotten as it is read (in Redis, in
        one step: of two replicas taking the same entry, one gets it)."""

    async def delete(self, principal: str | None, *ids: Ids) -> None:
        """Forget the principal's entries of these ids."""

    async def touch(self, principal: str | None, *ids: Ids) -> None:
        """Refresh the expiry of the principal's entries of these ids, reading nothing."""

    def may_hold(self, table: Table[Any]) -> bool:
        """Whether a read of the table could find anything: memory knows it is empty, and a
        caller may skip the work of asking."""

    async def status(self) -> str | None:
        """None in memory; else "up" or "unavailable"."""

    async def aclose(self) -> None:
        """Let go of connections."""


@dataclass(frozen=True)
class OwnedMap(Generic[V]):
    """One table on the maps, its values typed: the verbs of `OwnedMaps` for this table alone, and
    `at` / `entries` to name it in a read or write of several tables at once."""

    maps: OwnedMaps
    table: Table[V]

    def at(self, ids: Collection[str]) -> Ids:
        return self.table, ids

    def entries(self, values: Mapping[str, V]) -> Entries:
        return self.table, values

    async def put(self, principal: str | None, values: Mapping[str, V]) -> None:
        await self.maps.put(principal, (self.table, values))

    async def get(self, principal: str | None, ids: Collection[str]) -> dict[str, V]:
        return (await self.maps.get(principal, (self.table, ids))).of(self.table)

    async def take(self, principal: str | None, ids: Collection[str]) -> dict[str, V]:
        return (await self.maps.take(principal, (self.table, ids))).of(self.table)

    async def delete(self, principal: str | None, ids: Collection[str]) -> None:
        await self.maps.delete(principal, (self.table, ids))

    async def touch(self, principal: str | None, ids: Collection[str]) -> None:
        await self.maps.touch(principal, (self.table, ids))

    def may_hold(self) -> bool:
        return self.maps.may_hold(self.table)
