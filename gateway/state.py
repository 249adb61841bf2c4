"""What the gateway remembers between requests: mixed turns held for the client's follow-up, the
provider response a client-facing response id stands for, and the last failed call of each tool
in a trajectory (telemetry classifies retries by it, see telemetry.trajectory).

When one model turn calls both gateway tools and client tools, the client only sees its own
calls. The gateway keeps its part (its calls and their results) under a token, and gives the
client's calls ids that name the token, so that the turn can be put together again when the
conversation comes back. Entries are bounded in number, expire when unused, and belong to the
gateway key that made them.

Two stores, one interface (`StateStore`): `HeldTurns`, in this process's memory (the default),
and `RedisState`, shared by replicas (`state_url`). A request first looks up, in one go, what it
names (`StateStore.lookup`: tokens, ids of shown items, a response id); the conversation is then
put back from that `Found`, synchronously. A store that cannot answer raises `StateUnavailable`
(a 503 with retry-after), never a wrong history. Failure records are opaque text here: their
shape is telemetry's.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Protocol, TypeVar

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from gateway.errors import Conflict, Unavailable

log = logging.getLogger("toolspan.state")

PREFIX = "tspan_"
RESPONSE_PREFIX = f"resp_{PREFIX}"  # ids of answers the gateway gave over several provider responses
V = TypeVar("V")


@dataclass(frozen=True)
class HeldTurn:
    """What the gateway added to a conversation that the client's copy of it lacks, in the wire
    shape of the API it came from, to put back when the client sends the conversation again."""

    api: str  # "chat" or "responses": a turn is put back only into the API it came from
    calls: tuple[Mapping[str, Any], ...]  # what goes in place of the client's copy (messages / items)
    results: tuple[Mapping[str, Any], ...] = ()  # the gateway's results, before the client's own
    shown: tuple[str, ...] = ()  # Responses: ids of the items the client saw, by which it is found


def client_call_id(token: str, original: str) -> str:
    """The id a client call of a held turn travels under."""
    return f"{PREFIX}{token}_{original}"


def split_call_id(call_id: object) -> tuple[str, str] | None:
    """(token, original id) of an id made by `client_call_id`, else None."""
    if not isinstance(call_id, str) or not call_id.startswith(PREFIX):
        return None
    token, sep, original = call_id[len(PREFIX):].partition("_")
    return (token, original) if sep and token else None


@dataclass(frozen=True)
class _Entry(Generic[V]):
    value: V
    principal: str | None
    expires: float


class _Bounded(Generic[V]):
    """Values by key: least recently used dropped past `capacity`, expired after `ttl` unused.
    Every write and read moves its key to the end with the same `ttl`, so the entries stay in
    order of expiry: the expired ones are dropped from the front."""

    def __init__(self, capacity: int, ttl_seconds: float, clock: Callable[[], float]) -> None:
        self._items: OrderedDict[str, _Entry[V]] = OrderedDict()
        self._capacity = capacity
        self._ttl = ttl_seconds
        self._clock = clock

    def __len__(self) -> int:
        return len(self._items)

    def put(self, key: str, value: V, principal: str | None) -> None:
        now = self._clock()
        self._items.pop(key, None)  # written again: it goes to the end
        while self._items and (len(self._items) >= self._capacity or next(iter(self._items.values())).expires <= now):
            self._items.popitem(last=False)
        self._items[key] = _Entry(value, principal, now + self._ttl)

    def get(self, key: str, principal: str | None) -> V | None:
        """The value, its expiry refreshed; None when absent, expired, or another caller's."""
        now = self._clock()
        entry = self._items.get(key)
        if entry is None:
            return None
        if entry.expires <= now:
            del self._items[key]
            return None
        if entry.principal != principal:
            return None
        self._items[key] = replace(entry, expires=now + self._ttl)
        self._items.move_to_end(key)
        return entry.value


_Trajectory = tuple[str | None, str]  # (principal, trajectory id)


@dataclass
class _Failures:
    expires: float
    by_tool: OrderedDict[str, str]


@dataclass(frozen=True)
class FailureBounds:
    """How much failure state is kept: trajectories (least recently written dropped first), records
    per trajectory, records overall (memory only; in Redis at most trajectories x per trajectory),
    and how long an unwritten trajectory is kept."""

    trajectories: int = 10_000
    ttl_seconds: float = 3600.0
    tools_per_trajectory: int = 64
    records: int = 50_000


class FailureRecords:
    """The last failed call of each tool, per (principal, trajectory), in this process's memory,
    within `FailureBounds`."""

    def __init__(self, bounds: FailureBounds = FailureBounds(), clock: Callable[[], float] = time.monotonic) -> None:
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


class StateUnavailable(Unavailable):
    def __init__(self) -> None:
        super().__init__("the gateway's state store (Redis) is unavailable, and this request continues a turn the "
                         "gateway holds there; retry shortly", code="state_unavailable", retry_after=2)


_NOT_HELD = ("this conversation continues a model turn in which the gateway ran its own tools, and the gateway no "
             "longer holds that turn (it expired or the gateway restarted); resend the conversation from before "
             "that turn")
_RESPONSE_NOT_HELD = ("this response was answered over several provider responses, and the gateway no longer knows "
                      "the last of them (it expired or the gateway restarted); resend the conversation instead of "
                      "continuing from it")


@dataclass(frozen=True)
class Found:
    """What one request's lookup found: held turns by token, tokens by shown item id, and the
    provider response behind the response id it sent."""

    turns: Mapping[str, HeldTurn] = field(default_factory=dict)
    owners: Mapping[str, str] = field(default_factory=dict)
    response: str | None = None

    def take(self, token: str, param: str, api: str) -> HeldTurn:
        """The held turn (it stays held: a conversation may be sent again), or a 409."""
        turn = self.turns.get(token)
        if turn is None or turn.api != api:
            raise Conflict(_NOT_HELD, code="turn_not_held", param=param)
        return turn

    def owner(self, item_id: str) -> str | None:
        """The token of the held turn whose client saw the item of this id, if any."""
        return self.owners.get(item_id)

    def resolve(self, response_id: str) -> str:
        """The provider response to continue from, for a `previous_response_id` a client sent. An id
        the gateway made up and no longer knows is a 409; any other unknown id is the provider's."""
        if self.response is None and response_id.startswith(RESPONSE_PREFIX):
            raise Conflict(_RESPONSE_NOT_HELD, code="response_not_held", param="previous_response_id")
        return self.response or response_id


NOTHING = Found()


class FailureBook(Protocol):
    """The last failed call of each tool in a trajectory, as text telemetry gives and reads back."""

    async def failure(self, principal: str | None, trajectory_id: str, tool: str) -> str | None:
        """The record of `tool`'s last failed call in the principal's trajectory, if held."""

    async def remember_failure(self, principal: str | None, trajectory_id: str, tool: str,
                               record: str | None) -> None:
        """Hold `record` as `tool`'s last failure in the trajectory (None: forget it), refreshing
        the trajectory's expiry."""


class StateStore(FailureBook, Protocol):
    async def hold(self, turn: HeldTurn, principal: str | None) -> str:
        """Keep `turn`; returns the token its client calls' ids carry (see `client_call_id`)."""

    async def alias(self, client_id: str, provider_id: str, principal: str | None) -> None:
        """Remember that the response the client knows as `client_id` continues at `provider_id`."""

    async def lookup(self, principal: str | None, tokens: Collection[str], item_ids: Collection[str] = (),
                     response_id: str | None = None) -> Found:
        """The held turns of these tokens and of these shown items, and the response behind
        `response_id`, each as the principal's own and with its expiry refreshed."""

    async def status(self) -> str | None:
        """None for a store in memory; else "up" or "unavailable"."""

    async def aclose(self) -> None:
        """Let go of connections."""


class HeldTurns:
    """Held turns in this process's memory: one process."""

    def __init__(self, capacity: int, ttl_seconds: float, clock: Callable[[], float] = time.monotonic,
                 failure_bounds: FailureBounds = FailureBounds()) -> None:
        self._turns: _Bounded[HeldTurn] = _Bounded(capacity, ttl_seconds, clock)
        self._items: _Bounded[str] = _Bounded(capacity, ttl_seconds, clock)  # shown item id -> token
        self._responses: _Bounded[str] = _Bounded(capacity, ttl_seconds, clock)
        self.failures = FailureRecords(failure_bounds, clock)

    def __len__(self) -> int:
        return len(self._turns)

    async def hold(self, turn: HeldTurn, principal: str | None) -> str:
        token = secrets.token_hex(6)
        self._turns.put(token, turn, principal)
        for item_id in turn.shown:
            self._items.put(item_id, token, principal)
        return token

    async def alias(self, client_id: str, provider_id: str, principal: str | None) -> None:
        self._responses.put(client_id, provider_id, principal)

    async def lookup(self, principal: str | None, tokens: Collection[str], item_ids: Collection[str] = (),
                     response_id: str | None = None) -> Found:
        owners = {i: t for i in item_ids if (t := self._items.get(i, principal)) is not None}
        turns = {t: turn for t in {*tokens, *owners.values()} if (turn := self._turns.get(t, principal)) is not None}
        response = self._responses.get(response_id, principal) if response_id is not None else None
        return Found(turns, owners, response)

    async def failure(self, principal: str | None, trajectory_id: str, tool: str) -> str | None:
        return await self.failures.failure(principal, trajectory_id, tool)

    async def remember_failure(self, principal: str | None, trajectory_id: str, tool: str,
                               record: str | None) -> None:
        await self.failures.remember_failure(principal, trajectory_id, tool, record)

    async def status(self) -> str | None:
        return None

    async def aclose(self) -> None:
        return None


def _turn_json(turn: HeldTurn) -> str:
    return json.dumps({"api": turn.api, "calls": turn.calls, "results": turn.results, "shown": turn.shown},
                      separators=(",", ":"))


def _turn_of(raw: bytes) -> HeldTurn:
    data = json.loads(raw)
    return HeldTurn(data["api"], tuple(data["calls"]), tuple(data["results"]), tuple(data["shown"]))


class RedisState:
    """Held turns in a Redis that replicas share. Each entry is a key of its own with a TTL (the
    expiry, refreshed on use by GETEX), named by a digest of (principal, id): another key's
    lookup never finds it. Each kind keeps a sorted set of its keys by last use, trimmed to the
    capacity (least recently used dropped). Every command is bounded by `timeout_seconds`; one
    that fails or times out is a `StateUnavailable`, and the client reconnects on the next."""

    def __init__(self, url: str, capacity: int, ttl_seconds: float, timeout_seconds: float,
                 observe: Callable[[bool], None] = lambda up: None, prefix: str = "toolspan:",
                 failure_bounds: FailureBounds = FailureBounds(), lost: Callable[[], None] = lambda: None) -> None:
        # A connection found broken (Redis restarted) is replaced at once, for one more try.
        self._redis: Redis = Redis.from_url(url, socket_timeout=timeout_seconds, socket_connect_timeout=timeout_seconds,
                                            retry=Retry(NoBackoff(), 1))
        self._capacity = capacity
        self._ttl_ms = max(1, int(ttl_seconds * 1000))
        self._timeout = timeout_seconds
        self._observe = observe
        self._prefix = prefix
        self._up: bool | None = None
        self._failure_bounds = failure_bounds
        self._failure_ttl_ms = max(1, int(failure_bounds.ttl_seconds * 1000))
        self._lost = lost
        self._epoch_key = f"{prefix}epoch"
        self._epoch: bytes | None = None  # the marker this gateway last found in Redis

    def _key(self, kind: str, principal: str | None, key: str) -> str:
        digest = hashlib.sha256(json.dumps([principal, key]).encode("utf-8", "surrogatepass")).hexdigest()[:40]
        return f"{self._prefix}{kind}:{digest}"

    async def _run(self, command: Awaitable[Any]) -> Any:
        try:
            async with asyncio.timeout(self._timeout):
                answer = await command
        except (TimeoutError, OSError, RedisError) as exc:
            if self._up is not False:
                log.warning("the state store (Redis) is unavailable: %s", type(exc).__name__)
            self._up = False
            self._observe(False)
            raise StateUnavailable() from exc
        if self._up is not True:
            if self._up is False:
                log.info("the state store (Redis) answers again")
            self._up = True
            self._observe(True)
        return answer

    async def _put(self, entries: list[tuple[str, str, str]]) -> None:
        """(kind, key, value) entries, each with the TTL, in its kind's recency set."""
        now = time.time()
        pipe = self._redis.pipeline(transaction=True)
        pipe.get(self._epoch_key)
        kinds = sorted({kind for kind, _, _ in entries})
        for kind, key, value in entries:
            pipe.set(key, value, px=self._ttl_ms)
            pipe.zadd(f"{self._prefix}lru:{kind}", {key: now})
        for kind in kinds:
            pipe.zremrangebyscore(f"{self._prefix}lru:{kind}", "-inf", now - self._ttl_ms / 1000)
            pipe.zcard(f"{self._prefix}lru:{kind}")
        epoch, *answers = await self._run(pipe.execute())
        await self._check_epoch(epoch)
        for kind, count in zip(kinds, answers[len(entries) * 2 + 1::2], strict=True):
            await self._trim(kind, count - self._capacity)

    async def _trim(self, kind: str, excess: int) -> None:
        """Drop the `excess` least recently used keys of a kind."""
        if excess <= 0:
            return
        dropped = await self._run(self._redis.zpopmin(f"{self._prefix}lru:{kind}", excess))
        if dropped:
            await self._run(self._redis.delete(*(key for key, _ in dropped)))

    async def _get(self, keys: list[str], kinds: list[str]) -> list[bytes | None]:
        """Values of keys, their TTLs and recency refreshed; whether Redis lost its data is
        checked on the way (`_check_epoch`), so a loss is reported when it bites."""
        if not keys:
            return []
        now = time.time()
        pipe = self._redis.pipeline(transaction=False)
        pipe.get(self._epoch_key)
        for key, kind in zip(keys, kinds, strict=True):
            pipe.getex(key, px=self._ttl_ms)
            pipe.zadd(f"{self._prefix}lru:{kind}", {key: now}, xx=True)
        epoch, *answers = await self._run(pipe.execute())
        await self._check_epoch(epoch)
        return list(answers[::2])

    async def _check_epoch(self, found: bytes | None) -> None:
        """Redis holds a marker key without expiry. Found gone or changed since this gateway last
        saw it, Redis lost what it held (restarted without persistence, flushed, failed over to an
        empty replica): the held turns and retry state written before are gone, and `lost` (a
        metric) and the log say so; clients learn it as a 409 naming the turn no longer held."""
        if found is not None and found == self._epoch:
            return
        if found is None:  # a new marker, unless another replica set one just now
            mine = secrets.token_hex(8).encode()
            found = await self._run(self._redis.set(self._epoch_key, mine, nx=True, get=True)) or mine
        if self._epoch is not None and found != self._epoch:
            log.warning("the state store (Redis) lost its data since this gateway last looked: turns held "
                        "and retry state from before are gone")
            self._lost()
        self._epoch = found

    async def hold(self, turn: HeldTurn, principal: str | None) -> str:
        token = secrets.token_hex(6)
        await self._put([("turn", self._key("turn", principal, token), _turn_json(turn)),
                         *(("item", self._key("item", principal, i), token) for i in turn.shown)])
        return token

    async def alias(self, client_id: str, provider_id: str, principal: str | None) -> None:
        await self._put([("resp", self._key("resp", principal, client_id), provider_id)])

    async def lookup(self, principal: str | None, tokens: Collection[str], item_ids: Collection[str] = (),
                     response_id: str | None = None) -> Found:
        items = list(dict.fromkeys(item_ids))
        keys = [self._key("item", principal, i) for i in items]
        kinds = ["item"] * len(items)
        if response_id is not None:
            keys.append(self._key("resp", principal, response_id))
            kinds.append("resp")
        first = await self._get(keys, kinds)
        owners = {i: raw.decode() for i, raw in zip(items, first[:len(items)], strict=True) if raw is not None}
        response = first[-1].decode() if response_id is not None and first[-1] is not None else None
        wanted = list(dict.fromkeys([*tokens, *owners.values()]))
        raws = await self._get([self._key("turn", principal, t) for t in wanted], ["turn"] * len(wanted))
        turns = {t: _turn_of(raw) for t, raw in zip(wanted, raws, strict=True) if raw is not None}
        return Found(turns, owners, response)

    async def failure(self, principal: str | None, trajectory_id: str, tool: str) -> str | None:
        raw = await self._run(self._redis.hget(self._key("fail", principal, trajectory_id), tool))
        return raw.decode().partition(" ")[2] if raw is not None else None

    async def remember_failure(self, principal: str | None, trajectory_id: str, tool: str,
                               record: str | None) -> None:
        """One hash per trajectory, a field per tool whose value starts with the time it was
        written (the oldest go past `tools_per_trajectory`); trajectories trimmed like the rest."""
        key, lru, now = self._key("fail", principal, trajectory_id), f"{self._prefix}lru:fail", time.time()
        pipe = self._redis.pipeline(transaction=True)
        if record is None:
            pipe.hdel(key, tool)
        else:
            pipe.hset(key, tool, f"{now:.6f} {record}")
        pipe.pexpire(key, self._failure_ttl_ms)
        pipe.zadd(lru, {key: now})
        pipe.zremrangebyscore(lru, "-inf", now - self._failure_ttl_ms / 1000)
        pipe.zcard(lru)
        pipe.hlen(key)
        *_, trajectories, tools = await self._run(pipe.execute())
        per_trajectory = self._failure_bounds.tools_per_trajectory
        if tools > per_trajectory:
            fields = await self._run(self._redis.hgetall(key))
            oldest = sorted(fields, key=lambda field: float(fields[field].partition(b" ")[0]))
            await self._run(self._redis.hdel(key, *oldest[:tools - per_trajectory]))
        await self._trim("fail", trajectories - self._failure_bounds.trajectories)

    async def status(self) -> str:
        try:
            await self._check_epoch(await self._run(self._redis.get(self._epoch_key)))
        except StateUnavailable:
            return "unavailable"
        return "up"

    async def aclose(self) -> None:
        await self._redis.aclose()


def make_store(url: str | None, capacity: int, ttl_seconds: float, timeout_seconds: float,
               observe: Callable[[bool], None], lost: Callable[[], None] = lambda: None) -> StateStore:
    """The store `state_url` names: None, memory; redis:// (rediss://, unix://), Redis. Failure
    records keep `FailureRecords`' default bounds either way."""
    if url is None:
        return HeldTurns(capacity, ttl_seconds)
    return RedisState(url, capacity, ttl_seconds, timeout_seconds, observe, lost=lost)
