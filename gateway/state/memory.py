"""The state in this process's memory (the default: one process, no `state_url`)."""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from gateway.state.approvals import PENDING_APPROVALS, ApprovalBounds, ApprovalStore, MemoryApprovals
from gateway.state.base import (
    DEFAULT_FAILURE_BOUNDS,
    OWNED_RESPONSES,
    REPLAYS,
    SENT_CALLS,
    TRAJECTORY_LINKS,
    Bounds,
    FailureBounds,
    Found,
    HeldTurn,
)
from gateway.state.fair import fair_victim

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


class MemoryState:
    """The state in this process's memory: held turns, the items their clients saw, response
    aliases and owners, and the retry state."""

    def __init__(self, capacity: int, ttl_seconds: float, clock: Callable[[], float] = time.monotonic,
                 failure_bounds: FailureBounds = DEFAULT_FAILURE_BOUNDS, per_key: int | None = None,
                 owned: Bounds = OWNED_RESPONSES, approvals: ApprovalBounds = PENDING_APPROVALS) -> None:
        turns = Bounds(capacity, ttl_seconds, per_key)
        self._turns: _Bounded[HeldTurn] = _Bounded(turns, clock)
        self._items: _Bounded[str] = _Bounded(turns, clock)  # shown item id -> token
        self._responses: _Bounded[str] = _Bounded(turns, clock)  # the client's response id -> the provider's
        self._owned: _Bounded[bool] = _Bounded(owned, clock)  # provider response ids, by the key that made them
        self._links: _Bounded[str] = _Bounded(TRAJECTORY_LINKS, clock)  # call or response id -> trajectory
        self._answers: _Bounded[str] = _Bounded(turns, clock)  # the client's response id -> what it was given
        self._threads: _Bounded[str] = _Bounded(turns, clock)  # a Messages answer's id -> its thread's conversation
        self._rounds: _Bounded[str] = _Bounded(REPLAYS, clock)  # a failed request's digest -> its rounds
        self._sent: _Bounded[str] = _Bounded(SENT_CALLS, clock)  # a client call handed back -> its record
        self.failures = FailureRecords(failure_bounds, clock)
        self.approvals: ApprovalStore = MemoryApprovals(approvals, clock)

    def __len__(self) -> int:
        return len(self._turns)

    async def hold(self, turn: HeldTurn, principal: str | None) -> str:
        token = secrets.token_hex(6)
        self._turns.put(principal, token, turn)
        for item_id in turn.shown:
            self._items.put(principal, item_id, token)
        return token

    async def alias(self, client_id: str, provider_id: str, principal: str | None) -> None:
        self._responses.put(principal, client_id, provider_id)

    async def claim(self, response_ids: Collection[str], principal: str) -> None:
        for response_id in response_ids:
            self._owned.put(principal, response_id, True)

    async def lookup(self, principal: str | None, tokens: Collection[str], item_ids: Collection[str] = (),
                     response_id: str | None = None) -> Found:
        owners = {i: t for i in item_ids if (t := self._items.get(principal, i)) is not None}
        turns = {t: turn for t in {*tokens, *owners.values()} if (turn := self._turns.get(principal, t)) is not None}
        if response_id is None:
            return Found(turns, owners)
        response = self._responses.get(principal, response_id)
        owned = response is not None or bool(self._owned.get(principal, response_id))
        return Found(turns, owners, response, owned)

    async def failure(self, principal: str | None, trajectory_id: str, tool: str) -> str | None:
        return await self.failures.failure(principal, trajectory_id, tool)

    async def remember_failure(self, principal: str | None, trajectory_id: str, tool: str,
                               record: str | None) -> None:
        await self.failures.remember_failure(principal, trajectory_id, tool, record)

    async def link(self, principal: str | None, ids: Collection[str], trajectory_id: str) -> None:
        for linked_id in ids:
            self._links.put(principal, linked_id, trajectory_id)

    async def linked(self, principal: str | None, ids: Collection[str]) -> str | None:
        for linked_id in ids:
            if (trajectory_id := self._links.get(principal, linked_id)) is not None:
                return trajectory_id
        return None

    async def keep_answer(self, principal: str | None, response_id: str, record: str) -> None:
        self._answers.put(principal, response_id, record)

    async def kept_answer(self, principal: str | None, response_id: str) -> str | None:
        return self._answers.get(principal, response_id)

    async def forget_answer(self, principal: str | None, response_id: str) -> None:
        self._answers.delete(principal, response_id)
        self._responses.delete(principal, response_id)

    async def keep_thread(self, principal: str | None, message_id: str, record: str) -> None:
        self._threads.put(principal, message_id, record)

    async def kept_thread(self, principal: str | None, message_id: str) -> str | None:
        return self._threads.get(principal, message_id)

    async def keep_sent(self, principal: str | None, records: Mapping[str, str]) -> None:
        for call_id, record in records.items():
            self._sent.put(principal, call_id, record)

    async def taken_sent(self, principal: str | None, call_ids: Collection[str]) -> dict[str, str]:
        taken = {}
        for call_id in call_ids:
            if (record := self._sent.get(principal, call_id)) is not None:
                taken[call_id] = record
                self._sent.delete(principal, call_id)
        return taken

    async def keep_rounds(self, principal: str | None, request_key: str, record: str) -> None:
        self._rounds.put(principal, request_key, record)

    def may_hold_rounds(self) -> bool:
        return len(self._rounds) > 0

    async def kept_rounds(self, principal: str | None, request_key: str) -> str | None:
        record = self._rounds.get(principal, request_key)
        self._rounds.delete(principal, request_key)
        return record

    async def status(self) -> str | None:
        return None

    async def aclose(self) -> None:
        return None
