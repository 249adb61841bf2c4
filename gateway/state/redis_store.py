"""The state in a Redis that replicas share (`state_url`)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from gateway.state.base import (
    DEFAULT_FAILURE_BOUNDS,
    OWNED_RESPONSES,
    Bounds,
    FailureBounds,
    Found,
    HeldTurn,
    StateUnavailable,
)

log = logging.getLogger("toolspan.state")
_KEYLESS = "-"  # the owner part of an entry's name without gateway keys


def _turn_json(turn: HeldTurn) -> str:
    return json.dumps({"api": turn.api, "calls": turn.calls, "results": turn.results, "shown": turn.shown},
                      separators=(",", ":"))


def _turn_of(raw: bytes) -> HeldTurn:
    data = json.loads(raw)
    return HeldTurn(data["api"], tuple(data["calls"]), tuple(data["results"]), tuple(data["shown"]))


@dataclass(frozen=True)
class _Kind:
    """One kind of entry (held turns, shown items, response aliases, response owners): its name
    in the keys and its bounds."""

    name: str
    ttl_ms: int
    capacity: int
    per_key: int | None


def _kind(name: str, bounds: Bounds) -> _Kind:
    return _Kind(name, max(1, int(bounds.ttl_seconds * 1000)), bounds.capacity, bounds.per_key)


class RedisState:
    """The state in a Redis that replicas share. Each entry is a key of its own with a TTL (the
    expiry, refreshed on use by GETEX), named by its kind, a digest of its gateway key and a digest
    of (gateway key, id): another key's lookup never finds it. Each kind keeps a sorted set of its
    entries by last use, trimmed to the capacity, and a set for each gateway key, trimmed to that
    key's share (least recently used dropped first). Every command is bounded by `timeout_seconds`;
    one that fails or times out is a `StateUnavailable`, and the client reconnects on the next."""

    def __init__(self, url: str, capacity: int, ttl_seconds: float, timeout_seconds: float,
                 observe: Callable[[bool], None] = lambda up: None, prefix: str = "toolspan:",
                 failure_bounds: FailureBounds = DEFAULT_FAILURE_BOUNDS, lost: Callable[[], None] = lambda: None,
                 per_key: int | None = None, owned: Bounds = OWNED_RESPONSES) -> None:
        # A connection found broken (Redis restarted) is replaced at once, for one more try.
        self._redis: Redis = Redis.from_url(url, socket_timeout=timeout_seconds, socket_connect_timeout=timeout_seconds,
                                            retry=Retry(NoBackoff(), 1))
        turns = Bounds(capacity, ttl_seconds, per_key)
        self._kinds = {name: _kind(name, bounds) for name, bounds in
                       (("turn", turns), ("item", turns), ("resp", turns), ("own", owned))}
        self._timeout = timeout_seconds
        self._observe = observe
        self._prefix = prefix
        self._up: bool | None = None
        self._failure_bounds = failure_bounds
        self._failure_ttl_ms = max(1, int(failure_bounds.ttl_seconds * 1000))
        self._lost = lost
        self._epoch_key = f"{prefix}epoch"
        self._epoch: bytes | None = None  # the marker this gateway last found in Redis

    @staticmethod
    def _owner(principal: str | None) -> str:
        if principal is None:
            return _KEYLESS
        return hashlib.sha256(principal.encode("utf-8", "surrogatepass")).hexdigest()[:16]

    def _key(self, kind: str, principal: str | None, key: str) -> str:
        digest = hashlib.sha256(json.dumps([principal, key]).encode("utf-8", "surrogatepass")).hexdigest()[:40]
        return f"{self._prefix}{kind}:{self._owner(principal)}:{digest}"

    def _recency(self, kind: str, owner: str | None = None) -> str:
        """The sorted set of a kind's entries by last use: all of them, or one gateway key's."""
        return f"{self._prefix}lru:{kind}" if owner is None else f"{self._prefix}lru:{kind}:{owner}"

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

    async def _put(self, principal: str | None, entries: list[tuple[str, str, str]]) -> None:
        """The principal's (kind, key, value) entries, each with its kind's TTL, in its kind's
        recency sets; then each set trimmed to its bound."""
        now, owner = time.time(), self._owner(principal)
        keyed = principal is not None
        pipe = self._redis.pipeline(transaction=True)
        pipe.get(self._epoch_key)
        for name, key, value in entries:
            pipe.set(key, value, px=self._kinds[name].ttl_ms)
            pipe.zadd(self._recency(name), {key: now})
            if keyed:
                pipe.zadd(self._recency(name, owner), {key: now})
        counted: list[tuple[_Kind, int, int | None]] = []  # each kind's ZCARD answers: of all, of the key's
        for kind in sorted({self._kinds[name] for name, _, _ in entries}, key=lambda k: k.name):
            pipe.zremrangebyscore(self._recency(kind.name), "-inf", now - kind.ttl_ms / 1000)
            everyone = len(pipe)
            pipe.zcard(self._recency(kind.name))
            mine = None
            if keyed:
                pipe.zremrangebyscore(self._recency(kind.name, owner), "-inf", now - kind.ttl_ms / 1000)
                mine = len(pipe)
                pipe.zcard(self._recency(kind.name, owner))
                pipe.pexpire(self._recency(kind.name, owner), kind.ttl_ms)  # a key's set goes with its last entry
            counted.append((kind, everyone, mine))
        answers = await self._run(pipe.execute())
        await self._check_epoch(answers[0])
        for counted_kind, everyone, mine in counted:
            dropped = 0
            if mine is not None:
                dropped = await self._trim(counted_kind.name, answers[mine] - (counted_kind.per_key or
                                                                               counted_kind.capacity), owner)
            await self._trim(counted_kind.name, answers[everyone] - dropped - counted_kind.capacity, None)

    async def _trim(self, kind: str, excess: int, owner: str | None) -> int:
        """Drop the `excess` least recently used entries of a kind: of all, or of one key's; how
        many went."""
        if excess <= 0:
            return 0
        dropped = [key.decode() for key, _ in await self._run(self._redis.zpopmin(self._recency(kind, owner),
                                                                                  excess))]
        if not dropped:
            return 0
        by_owner: dict[str, list[str]] = defaultdict(list)
        for key in dropped:
            by_owner[key.rsplit(":", 2)[1]].append(key)
        pipe = self._redis.pipeline(transaction=False)
        pipe.delete(*dropped)
        # Out of the other set too: the kind's (from a key's), or each key's (from the kind's).
        if owner is not None:
            pipe.zrem(self._recency(kind), *dropped)
        elif kind in self._kinds:  # the retry state keeps no set per key
            for other, keys in by_owner.items():
                if other != _KEYLESS:
                    pipe.zrem(self._recency(kind, other), *keys)
        await self._run(pipe.execute())
        return len(dropped)

    async def _get(self, principal: str | None, keys: list[str], kinds: list[str]) -> list[bytes | None]:
        """Values of the principal's keys, their TTLs and recency refreshed; whether Redis lost its
        data is checked on the way (`_check_epoch`), so a loss is reported when it bites."""
        if not keys:
            return []
        now, owner = time.time(), self._owner(principal)
        pipe: Pipeline = self._redis.pipeline(transaction=False)
        pipe.get(self._epoch_key)
        for key, kind in zip(keys, kinds, strict=True):
            pipe.getex(key, px=self._kinds[kind].ttl_ms)
            pipe.zadd(self._recency(kind), {key: now}, xx=True)
            if principal is not None:
                pipe.zadd(self._recency(kind, owner), {key: now}, xx=True)
        epoch, *answers = await self._run(pipe.execute())
        await self._check_epoch(epoch)
        return list(answers[::3 if principal is not None else 2])

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
        await self._put(principal, [("turn", self._key("turn", principal, token), _turn_json(turn)),
                                    *(("item", self._key("item", principal, i), token) for i in turn.shown)])
        return token

    async def alias(self, client_id: str, provider_id: str, principal: str | None) -> None:
        await self._put(principal, [("resp", self._key("resp", principal, client_id), provider_id)])

    async def claim(self, response_ids: Collection[str], principal: str) -> None:
        if response_ids:
            await self._put(principal, [("own", self._key("own", principal, i), "1") for i in response_ids])

    async def lookup(self, principal: str | None, tokens: Collection[str], item_ids: Collection[str] = (),
                     response_id: str | None = None) -> Found:
        items = list(dict.fromkeys(item_ids))
        keys = [self._key("item", principal, i) for i in items]
        kinds = ["item"] * len(items)
        if response_id is not None:
            keys += [self._key("resp", principal, response_id), self._key("own", principal, response_id)]
            kinds += ["resp", "own"]
        first = await self._get(principal, keys, kinds)
        owners = {i: raw.decode() for i, raw in zip(items, first[:len(items)], strict=True) if raw is not None}
        wanted = list(dict.fromkeys([*tokens, *owners.values()]))
        raws = await self._get(principal, [self._key("turn", principal, t) for t in wanted], ["turn"] * len(wanted))
        turns = {t: _turn_of(raw) for t, raw in zip(wanted, raws, strict=True) if raw is not None}
        if response_id is None:
            return Found(turns, owners)
        alias, claimed = first[-2:]
        response = alias.decode() if alias is not None else None
        return Found(turns, owners, response, response is not None or claimed is not None)

    async def failure(self, principal: str | None, trajectory_id: str, tool: str) -> str | None:
        raw = await self._run(self._redis.hget(self._key("fail", principal, trajectory_id), tool))
        return raw.decode().partition(" ")[2] if raw is not None else None

    async def remember_failure(self, principal: str | None, trajectory_id: str, tool: str,
                               record: str | None) -> None:
        """One hash per trajectory, a field per tool whose value starts with the time it was
        written (the oldest go past `tools_per_trajectory`); trajectories trimmed like the rest."""
        key, lru, now = self._key("fail", principal, trajectory_id), self._recency("fail"), time.time()
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
        await self._trim("fail", trajectories - self._failure_bounds.trajectories, None)

    async def status(self) -> str:
        try:
            await self._check_epoch(await self._run(self._redis.get(self._epoch_key)))
        except StateUnavailable:
            return "unavailable"
        return "up"

    async def aclose(self) -> None:
        await self._redis.aclose()
