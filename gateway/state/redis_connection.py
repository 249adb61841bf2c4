"""The one connection to Redis that the Redis-backed parts of the state share (the owned maps,
the failure records, the approvals): every command bounded in time, a failure of Redis made the
state store's (`StateUnavailable`), whether Redis lost its data checked by a marker key, and what
Redis holds that the gateway did not write counted and logged (gateway.state.redis_values)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.client import Pipeline
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from gateway.state.base import StateKind, StateUnavailable
from gateway.state.redis_fair import owner_name
from gateway.state.redis_values import REPLACED, WRONG_TYPE, Unreadable, UnreadableValues, wrong_type

log = logging.getLogger("toolspan.state")
T = TypeVar("T")
REDIS_CONNECTIONS = 100  # connections to Redis a process opens at most (redis-py's default)
# What a script of gateway.state.redis_fair reports, by its word: (what was found, what became of it).
_REPORTS = {b"type": (WRONG_TYPE, REPLACED),
            b"member": ("a member that names no entry of its kind", "dropped from the set"),
            b"owner": ("an owner that names no gateway key", "dropped from the counts")}


async def pipeline_answers(pipe: Pipeline) -> list[Any]:
    """A pipeline's answers, with the WRONGTYPE error of a command that met garbage in its place;
    any other error is raised, as from a single command."""
    answers: list[Any] = await pipe.execute(raise_on_error=False)
    for answer in answers:
        if isinstance(answer, RedisError) and not wrong_type(answer):
            raise answer
    return answers


class RedisConnection:
    """Every command is bounded by `timeout_seconds`; one that fails or times out is a
    `StateUnavailable` (and `observe` hears whether Redis answered), and the client reconnects on
    the next. A value that is not what the gateway wrote is counted on `unreadable` and logged,
    and treated as missing. `lost` hears that Redis lost its data (`check_epoch`)."""

    def __init__(self, url: str, timeout_seconds: float, prefix: str = "toolspan:",
                 observe: Callable[[bool], None] = lambda up: None, lost: Callable[[], None] = lambda: None,
                 unreadable: Callable[[StateKind], None] = lambda kind: None) -> None:
        # A connection found broken (Redis restarted) is replaced at once, for one more try. Past
        # REDIS_CONNECTIONS commands at once a command waits for a free connection, within its time
        # bound: redis-py's default pool refuses it at once, which made a burst a store unavailable.
        pool = BlockingConnectionPool.from_url(url, max_connections=REDIS_CONNECTIONS, timeout=timeout_seconds,
                                               socket_timeout=timeout_seconds, socket_connect_timeout=timeout_seconds,
                                               retry=Retry(NoBackoff(), 1))
        self.redis: Redis = Redis.from_pool(pool)
        self.prefix = prefix
        self.unreadable = UnreadableValues(unreadable)
        self.epoch_key = f"{prefix}epoch"
        self._timeout = timeout_seconds
        self._observe = observe
        self._lost = lost
        self._up: bool | None = None
        self._epoch: bytes | None = None  # the marker this gateway last found in Redis

    def key(self, kind: str, principal: str | None, key: str) -> str:
        """The key of the principal's entry of this kind: its owner's name (redis_fair) and a digest
        of (principal, id), so another gateway key's lookup never finds it."""
        digest = hashlib.sha256(json.dumps([principal, key]).encode("utf-8", "surrogatepass")).hexdigest()[:40]
        return f"{self.prefix}{kind}:{owner_name(principal)}:{digest}"

    def report(self, reports: object) -> None:
        """What a script found that the gateway did not write, counted and logged as the sets'
        garbage; an answer that is no list of reports is a script stopped by garbage it did not
        foresee (a WRONGTYPE error), counted alike."""
        if not isinstance(reports, list):
            self.unreadable("lru", f"{self.prefix}lru", WRONG_TYPE, "the step left undone")
            return
        for key, word in zip(reports[::2], reports[1::2], strict=True):
            reason, outcome = _REPORTS.get(word, (word.decode("utf-8", "replace"), "dropped"))
            self.unreadable("lru", key.decode("utf-8", "replace"), reason, outcome)

    def read(self, kind: StateKind, key: str, raw: object, decode: Callable[[bytes], T]) -> T | None:
        """What `decode` makes of the value at `key`: None when there is none, and for garbage
        (counted and logged), which is treated as missing."""
        if raw is None:
            return None
        if not isinstance(raw, bytes):
            self.unreadable(kind, key, WRONG_TYPE)
            return None
        try:
            return decode(raw)
        except Unreadable as exc:
            self.unreadable(kind, key, exc.reason)
            return None

    async def run(self, command: Awaitable[Any]) -> Any:
        """The command's answer (a pipeline's: `pipeline_answers`); a WRONGTYPE error is an answer
        too, a value for the caller to read as garbage: Redis answered. A cancellation of the
        caller that redis-py answered the command through anyway (8.x does, at some points of a
        command) is raised here: the caller was told to stop, and a request's tool call that went
        on waiting would hold its approval for its whole time limit."""
        task = asyncio.current_task()
        cancels = task.cancelling() if task is not None else 0
        try:
            async with asyncio.timeout(self._timeout):
                answer = await command
        except (TimeoutError, OSError, RedisError) as exc:
            if not wrong_type(exc):
                if self._up is not False:
                    log.warning("the state store (Redis) is unavailable: %s", type(exc).__name__)
                self._up = False
                self._observe(False)
                raise StateUnavailable() from exc
            answer = exc
        if task is not None and task.cancelling() > cancels:
            raise asyncio.CancelledError
        if self._up is not True:
            if self._up is False:
                log.info("the state store (Redis) answers again")
            self._up = True
            self._observe(True)
        return answer

    async def check_epoch(self, found: object) -> None:
        """Redis holds a marker key without expiry. Found gone or changed since this gateway last
        saw it, Redis lost what it held (restarted without persistence, flushed, failed over to an
        empty replica): the held turns and retry state written before are gone, and `lost` (a
        metric) and the log say so; clients learn it as a 409 naming the turn no longer held."""
        if found is not None and found == self._epoch:
            return
        if found is None:  # a new marker, unless another replica set one just now
            mine = secrets.token_hex(8).encode()
            found = await self.run(self.redis.set(self.epoch_key, mine, nx=True, get=True)) or mine
        if not isinstance(found, bytes):  # WRONGTYPE: no marker to compare with
            self.unreadable("epoch", self.epoch_key, WRONG_TYPE,
                            "whether Redis lost its data goes unchecked until the key is deleted")
            return
        if self._epoch is not None and found != self._epoch:
            log.warning("the state store (Redis) lost its data since this gateway last looked: turns held "
                        "and retry state from before are gone")
            self._lost()
        self._epoch = found

    async def status(self) -> str:
        try:
            await self.check_epoch(await self.run(self.redis.get(self.epoch_key)))
        except StateUnavailable:
            return "unavailable"
        return "up"

    async def aclose(self) -> None:
        await self.redis.aclose()
