"""The state in this process's memory (the default: one process, no `state_url`): the owned maps
(gateway.state.maps) and the failure records."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from gateway.provider.cooldowns import CooldownRule, Cooldowns, MemoryCooldowns
from gateway.state.approvals import PENDING_APPROVALS, ApprovalBounds, MemoryApprovals
from gateway.state.base import DEFAULT_FAILURE_BOUNDS, OWNED_RESPONSES, Bounds, FailureBounds
from gateway.state.fair import fair_victim
from gateway.state.maps import Entries, Ids, Rows, Table
from gateway.state.store import StateStore

V = TypeVar("V")
_Key = tuple[str | None, str]  # (principal, id): another key's id is another entry, never a hit


@dataclass
class _Entry(Generic[V]):
    value: V
    expires: float


class _Bounded(Generic[V]):
    """Values by (principal, id), within `Bounds`: past a gateway key's own share that key's least
    recently used go; past the capacity, the least recently used of the key holding the most
    (gateway.state.fair), so a key within its fair share never loses one to another key's writes;
    expired after `ttl` unused. Every write and read moves its entry to the end with the same
    `ttl`, so the entries stay in order of expiry: the expired ones are dropped from the front."""

    def __init__(self, bounds: Bounds, clock: Callable[[], float]) -> None:
        self._items: OrderedDict[_Key, _Entry[V]] = OrderedDict()
        # Each owner's entries, in the same order: a gateway key's, or (None) those made without keys.
        self._by_key: dict[str | None, OrderedDict[_Key, None]] = {}
        self._bounds = bounds
        self._clock = clock

    def __len__(self) -> int:
        return len(self._items)

    def put(self, principal: str | None, key: str, value: V) -> None:
        now = self._clock()
        item = (principal, key)
        self._drop(item)  # written again: it goes to the end
        while self._items and next(iter(self._items.values())).expires <= now:
            self._drop(next(iter(self._items)))
        share = self._bounds.per_key or self._bounds.capacity
        while principal is not None and (own := self._by_key.get(principal)) and len(own) >= share:
            self._drop(next(iter(own)))
        self._items[item] = _Entry(value, now + self._bounds.ttl_seconds)
        self._by_key.setdefault(principal, OrderedDict())[item] = None
        while len(self._items) > self._bounds.capacity:
            self._drop(next(iter(self._by_key[self._fair_victim()])))

    def _fair_victim(self) -> str | None:
        """The owner whose least recently used entry goes (gateway.state.fair)."""
        if len(self._by_key) == 1:  # one owner (no keys, or one key in use): its oldest, the oldest of all
            return next(iter(self._by_key))
        return fair_victim({owner: len(own) for owner, own in self._by_key.items()},
                           lambda owner: self._items[next(iter(self._by_key[owner]))].expires)

    def get(self, principal: str | None, key: str) -> V | None:
        """The principal's value, its expiry refreshed; None when absent or expired."""
        now, item = self._clock(), (principal, key)
        entry = self._items.get(item)
        if entry is None:
            return None
        if entry.expires <= now:
            self._drop(item)
            return None
        entry.expires = now + self._bounds.ttl_seconds
        self._items.move_to_end(item)
        self._by_key[principal].move_to_end(item)
        return entry.value

    def delete(self, principal: str | None, key: str) -> None:
        self._drop((principal, key))

    def _drop(self, item: _Key) -> None:
        if self._items.pop(item, None) is not None:
            own = self._by_key[item[0]]
            del own[item]
            if not own:
                del self._by_key[item[0]]


_Trajectory = tuple[str | None, str]  # (principal, trajectory id)


@dataclass
class _Failures:
    expires: float
    by_tool: OrderedDict[str, str]


class FailureRecords:
    """The last failed call of each tool, per (principal, trajectory), in this process's memory,
    within `FailureBounds`."""

    def __init__(self, bounds: FailureBounds = DEFAULT_FAILURE_BOUNDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._items: OrderedDict[_Trajectory, _Failures] = OrderedDict()
        self._bounds = bounds
        self._clock = clock
        self.count = 0  # records held, over every trajectory

    def __len__(self) -> int:
        return len(self._items)

    async def failure(self, principal: str | None, trajectory_id: str, tool: str) -> str | None:
        entry = self._items.get((principal, trajectory_id))
        if entry is None or entry.expires <= self._clock():
            return None
        return entry.by_tool.get(tool)

    async def remember_failure(self, principal: str | None, trajectory_id: str, tool: str,
                               record: str | None) -> None:
        key, now = (principal, trajectory_id), self._clock()
        entry = self._items.get(key)
        if entry is None or entry.expires <= now:
            if record is None:
                return
            entry = self._admit(key, now)
        entry.expires = now + self._bounds.ttl_seconds
        self._items.move_to_end(key)
        self.count -= len(entry.by_tool)
        entry.by_tool.pop(tool, None)
        if record is not None:
            entry.by_tool[tool] = record
            while len(entry.by_tool) > self._bounds.tools_per_trajectory:
                entry.by_tool.popitem(last=False)
        self.count += len(entry.by_tool)
        self._evict(now, keep=key)

    def _admit(self, key: _Trajectory, now: float) -> _Failures:
        stale = self._items.pop(key, None)  # expired: its records go
        self.count -= len(stale.by_tool) if stale is not None else 0
        self._evict(now, room=1)
        entry = _Failures(now + self._bounds.ttl_seconds, OrderedDict())
        self._items[key] = entry
        return entry

    def _evict(self, now: float, room: int = 0, keep: _Trajectory | None = None) -> None:
        """Drop the least recently written trajectories while they are expired or past a capacity
        (leaving `room` trajectories free); never `keep`, the one just written."""
        while self._items:
            oldest_key, oldest = next(iter(self._items.items()))
            if oldest_key == keep or (oldest.expires > now and len(self._items) + room <= self._bounds.trajectories
                                      and self.count <= self._bounds.records):
                break
            del self._items[oldest_key]
            self.count -= len(oldest.by_tool)


class MemoryMaps:
    """`OwnedMaps` in this process's memory: a `_Bounded` map for each table, made at its first use.
    The values are held as they are given (memory holds only what the gateway put there)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._maps: dict[str, _Bounded[Any]] = {}
        self._clock = clock

    def _map(self, table: Table[Any]) -> _Bounded[Any]:
        bounded = self._maps.get(table.kind)
        if bounded is None:
            bounded = self._maps[table.kind] = _Bounded(table.bounds, self._clock)
        return bounded

    async def put(self, principal: str | None, *entries: Entries) -> None:
        for table, values in entries:
            bounded = self._map(table)
            for key, value in values.items():
                bounded.put(principal, key, value)

    async def get(self, principal: str | None, *ids: Ids) -> Rows:
        rows = Rows()
        for table, keys in ids:
            bounded = self._map(table)
            for key in keys:
                if (value := bounded.get(principal, key)) is not None:
                    rows.add(table, key, value)
        return rows

    async def take(self, principal: str | None, *ids: Ids) -> Rows:
        rows = await self.get(principal, *ids)
        await self.delete(principal, *ids)
        return rows

    async def delete(self, principal: str | None, *ids: Ids) -> None:
        for table, keys in ids:
            bounded = self._map(table)
            for key in keys:
                bounded.delete(principal, key)

    async def touch(self, principal: str | None, *ids: Ids) -> None:
        await self.get(principal, *ids)

    def count(self, table: Table[Any]) -> int:
        """How many entries the table holds (the expired among them until a write drops them)."""
        return len(self._map(table))

    def may_hold(self, table: Table[Any]) -> bool:
        bounded = self._maps.get(table.kind)  # read on every request offered tools: no map made for it
        return bounded is not None and len(bounded) > 0

    async def status(self) -> str | None:
        return None

    async def aclose(self) -> None:
        return None


class MemoryState(StateStore):
    """The state in this process's memory (the default: one process, no `state_url`): the tables
    over `MemoryMaps`, `FailureRecords` and `MemoryApprovals`."""

    def __init__(self, capacity: int, ttl_seconds: float, clock: Callable[[], float] = time.monotonic,
                 failure_bounds: FailureBounds = DEFAULT_FAILURE_BOUNDS, per_key: int | None = None,
                 owned: Bounds = OWNED_RESPONSES, approvals: ApprovalBounds = PENDING_APPROVALS) -> None:
        self.memory = MemoryMaps(clock)
        self._clock = clock
        super().__init__(self.memory, FailureRecords(failure_bounds, clock), MemoryApprovals(approvals, clock),
                         Bounds(capacity, ttl_seconds, per_key), owned)

    def cooldowns(self, rule: CooldownRule) -> Cooldowns:
        return MemoryCooldowns(rule, self._clock)

    def __len__(self) -> int:
        """How many turns are held."""
        return self.memory.count(self.turns.table)
