"""The state in a Redis that replicas share (`state_url`)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import re
import secrets
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.client import Pipeline
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from gateway.state.approvals import PENDING_APPROVALS, ApprovalBounds, ApprovalStore, RedisApprovals
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
    StateKind,
    StateUnavailable,
)
from gateway.state.redis_fair import PUT, TAKE, owner_name
from gateway.state.redis_values import (
    REPLACED,
    WRONG_TYPE,
    Unreadable,
    UnreadableValues,
    answer_of,
    failure_record,
    owned_of,
    response_of,
    rounds_of,
    sent_of,
    thread_of,
    token_of,
    trajectory_of,
    turn_of,
    written_at,
    wrong_type,
)

log = logging.getLogger("toolspan.state")
T = TypeVar("T")
# What a script of gateway.state.redis_fair reports, by its word: (what was found, what became of it).
_REPORTS = {b"type": (WRONG_TYPE, REPLACED),
            b"member": ("a member that names no entry of its kind", "dropped from the set"),
            b"owner": ("an owner that names no gateway key", "dropped from the counts")}
REDIS_CONNECTIONS = 100  # connections to Redis a process opens at most (redis-py's default)


def turn_json(turn: HeldTurn) -> str:
    """A held turn as `hold` writes it (redis_values.turn_of reads it)."""
    return json.dumps({"api": turn.api, "calls": turn.calls, "results": turn.results, "shown": turn.shown},
                      separators=(",", ":"))


async def _answers(pipe: Pipeline) -> list[Any]:
    """A pipeline's answers, with the WRONGTYPE error of a command that met garbage in its place;
    any other error is raised, as from a single command."""
    answers: list[Any] = await pipe.execute(raise_on_error=False)
    for answer in answers:
        if isinstance(answer, RedisError) and not wrong_type(answer):
            raise answer
    return answers


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
    entries by last use, a set for each owner (gateway key) and the owners' counts: a write keeps
    the writer within its share (its least recently used go) and the kind within its capacity (the
    least recently used of the key holding the most go, gateway.state.redis_fair), in one step
    inside Redis. Every command is bounded by `timeout_seconds`;
    one that fails or times out is a `StateUnavailable`, and the client reconnects on the next.
    A value that is not what the gateway wrote (redis_values) is counted on `unreadable` and
    logged, and treated as missing."""

    def __init__(self, url: str, capacity: int, ttl_seconds: float, timeout_seconds: float,
                 observe: Callable[[bool], None] = lambda up: None, prefix: str = "toolspan:",
                 failure_bounds: FailureBounds = DEFAULT_FAILURE_BOUNDS, lost: Callable[[], None] = lambda: None,
                 per_key: int | None = None, owned: Bounds = OWNED_RESPONSES,
                 unreadable: Callable[[StateKind], None] = lambda kind: None,
                 approvals: ApprovalBounds = PENDING_APPROVALS) -> None:
        # A connection found broken (Redis restarted) is replaced at once, for one more try. Past
        # REDIS_CONNECTIONS commands at once a command waits for a free connection, within its time
        # bound: redis-py's default pool refuses it at once, which made a burst a store unavailable.
        pool = BlockingConnectionPool.from_url(url, max_connections=REDIS_CONNECTIONS, timeout=timeout_seconds,
                                               socket_timeout=timeout_seconds, socket_connect_timeout=timeout_seconds,
                                               retry=Retry(NoBackoff(), 1))
        self._redis: Redis = Redis.from_pool(pool)
        turns = Bounds(capacity, ttl_seconds, per_key)
        self._kinds = {name: _kind(name, bounds) for name, bounds in
                       (("turn", turns), ("item", turns), ("resp", turns), ("own", owned),
                                                              ("link", TRAJECTORY_LINKS), ("answer", turns),
                                                              ("rounds", REPLAYS), ("sent", SENT_CALLS),
                                                              ("thread", turns))}
        self._timeout = timeout_seconds
        self._observe = observe
        self._prefix = prefix
        self._up: bool | None = None
        self._failure_bounds = failure_bounds
        self._failure_ttl_ms = max(1, int(failure_bounds.ttl_seconds * 1000))
        self._lost = lost
        self._epoch_key = f"{prefix}epoch"
        self._epoch: bytes | None = None  # the marker this gateway last found in Redis
        self._unreadable = UnreadableValues(unreadable)
        # The entries the failure records' recency set may name: anything else in it is never deleted by a trim.
        self._entry = re.compile(re.escape(prefix.encode()) + rb"fail:(-|[0-9a-f]{16}):[0-9a-f]{40}")
        self._put_script = self._redis.register_script(PUT)
        self._take_script = self._redis.register_script(TAKE)
        self.approvals: ApprovalStore = RedisApprovals(self._redis, self._run, prefix, approvals, self._report)

    def _key(self, kind: str, principal: str | None, key: str) -> str:
        digest = hashlib.sha256(json.dumps([principal, key]).encode("utf-8", "surrogatepass")).hexdigest()[:40]
        return f"{self._prefix}{kind}:{owner_name(principal)}:{digest}"

    def _recency(self, kind: str, owner: str | None = None) -> str:
        """The sorted set of a kind's entries by last use: all of them, or one owner's."""
        return f"{self._prefix}lru:{kind}" if owner is None else f"{self._prefix}lru:{kind}:{owner}"

    def _bookkeeping(self, kind: str) -> tuple[list[str], list[str]]:
        """The keys and arguments every script of gateway.state.redis_fair takes first for a kind:
        its set of all entries and its owners' counts; its owners' sets' prefix and its entries'."""
        return ([self._recency(kind), f"{self._prefix}owners:{kind}"],
                [f"{self._prefix}lru:{kind}:", f"{self._prefix}{kind}:"])

    def _report(self, reports: object) -> None:
        """What a script found that the gateway did not write, counted and logged as the sets'
        garbage; an answer that is no list of reports is a script stopped by garbage it did not
        foresee (a WRONGTYPE error), counted alike."""
        if not isinstance(reports, list):
            self._unreadable("lru", f"{self._prefix}lru", WRONG_TYPE, "the step left undone")
            return
        for key, word in zip(reports[::2], reports[1::2], strict=True):
            reason, outcome = _REPORTS.get(word, (word.decode("utf-8", "replace"), "dropped"))
            self._unreadable("lru", key.decode("utf-8", "replace"), reason, outcome)

    async def _run(self, command: Awaitable[Any]) -> Any:
        """The command's answer (a pipeline's: `_answers`); a WRONGTYPE error is an answer too, a
        value for the caller to read as garbage: Redis answered. A cancellation of the caller
        that redis-py answered the command through anyway (8.x does, at some points of a command) is
        raised here: the caller was told to stop, and a request's tool call that went on waiting
        would hold its approval for its whole time limit."""
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

    async def _put(self, principal: str | None, entries: list[tuple[str, str, str]]) -> None:
        """The principal's (kind, key, value) entries, each with its kind's TTL, and each kind kept
        within its bounds (gateway.state.redis_fair's PUT), with the check of the epoch, as one
        transaction."""
        now, owner = time.time(), owner_name(principal)
        by_kind: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for name, key, value in entries:
            by_kind[name].append((key, value))
        pipe = self._redis.pipeline(transaction=True)
        pipe.get(self._epoch_key)
        for name, written in sorted(by_kind.items()):
            kind = self._kinds[name]
            keys, args = self._bookkeeping(name)
            share = (kind.per_key or kind.capacity) if principal is not None else 0
            await self._put_script(keys=[*keys, *(key for key, _ in written)],
                             args=[*args, now, kind.ttl_ms, kind.capacity, share, owner,
                                   *(value for _, value in written)], client=pipe)
        epoch, *reports = await self._run(_answers(pipe))
        await self._check_epoch(epoch)
        for found in reports:
            self._report(found)

    async def _take(self, principal: str | None, kind: str, keys: list[str], pipe: Pipeline) -> None:
        """Queue on `pipe` the reading and forgetting of the principal's entries of a kind
        (gateway.state.redis_fair's TAKE): its answer is [values, reports]."""
        bookkeeping, args = self._bookkeeping(kind)
        await self._take_script(keys=[*bookkeeping, *keys], args=[*args, owner_name(principal)], client=pipe)

    def _taken(self, answer: Any) -> list[object]:
        """The values of a TAKE's answer (0, no text, for a key of another Redis type: garbage,
        which `_read` counts), its reports counted."""
        if not isinstance(answer, list):  # stopped by garbage: nothing read
            self._report(answer)
            return []
        values, reports = answer
        self._report(reports)
        return list(values)

    async def _trim(self, kind: str, counted: object, bound: int) -> None:
        """Trim the failure records' recency set, of `counted` entries by its ZCARD, to `bound`,
        least recently used first. A set that is another Redis type is garbage, deleted: the next
        write makes it anew (the entries written meanwhile are in no set, and still expire)."""
        recency = self._recency(kind)
        if not isinstance(counted, int):
            self._unreadable("lru", recency, WRONG_TYPE, REPLACED)
            await self._run(self._redis.delete(recency))
            return
        if counted <= bound:
            return
        popped = await self._run(self._redis.zpopmin(recency, counted - bound))
        if wrong_type(popped):  # became garbage since it was counted: the next write replaces it
            return
        dropped = self._entries(recency, [member for member, _ in popped])
        if dropped:
            await self._run(self._redis.delete(*dropped))

    def _entries(self, recency: str, members: list[bytes]) -> list[str]:
        """The members of the failure records' recency set that name failure records. Any other is
        garbage, and never a key to delete: it could name anything in Redis."""
        entries = []
        for member in members:
            if self._entry.fullmatch(member) is not None:
                entries.append(member.decode("ascii"))
            else:
                self._unreadable("lru", recency, "a member that names no entry of its kind", "dropped from the set")
        return entries

    async def _get(self, principal: str | None, keys: list[str], kinds: list[StateKind]) -> list[object]:
        """Values of the principal's keys (for a key of another Redis type, its WRONGTYPE error),
        their TTLs and recency refreshed; whether Redis lost its data is checked on the way
        (`_check_epoch`), so a loss is reported when it bites. A recency set that is garbage
        fails its refresh here unseen: the next write counts it and replaces it."""
        if not keys:
            return []
        now, owner = time.time(), owner_name(principal)
        pipe: Pipeline = self._redis.pipeline(transaction=False)
        pipe.get(self._epoch_key)
        for key, kind in zip(keys, kinds, strict=True):
            pipe.getex(key, px=self._kinds[kind].ttl_ms)
            pipe.zadd(self._recency(kind), {key: now}, xx=True)
            pipe.zadd(self._recency(kind, owner), {key: now}, xx=True)
        epoch, *answers = await self._run(_answers(pipe))
        await self._check_epoch(epoch)
        return list(answers[::3])

    def _read(self, kind: StateKind, key: str, raw: object, read: Callable[[bytes], T]) -> T | None:
        """What `read` makes of the value at `key`: None when there is none, and for garbage
        (counted and logged), which is treated as missing."""
        if raw is None:
            return None
        if not isinstance(raw, bytes):
            self._unreadable(kind, key, WRONG_TYPE)
            return None
        try:
            return read(raw)
        except Unreadable as exc:
            self._unreadable(kind, key, exc.reason)
            return None

    async def _check_epoch(self, found: object) -> None:
        """Redis holds a marker key without expiry. Found gone or changed since this gateway last
        saw it, Redis lost what it held (restarted without persistence, flushed, failed over to an
        empty replica): the held turns and retry state written before are gone, and `lost` (a
        metric) and the log say so; clients learn it as a 409 naming the turn no longer held."""
        if found is not None and found == self._epoch:
            return
        if found is None:  # a new marker, unless another replica set one just now
            mine = secrets.token_hex(8).encode()
            found = await self._run(self._redis.set(self._epoch_key, mine, nx=True, get=True)) or mine
        if not isinstance(found, bytes):  # WRONGTYPE: no marker to compare with
            self._unreadable("epoch", self._epoch_key, WRONG_TYPE,
                             "whether Redis lost its data goes unchecked until the key is deleted")
            return
        if self._epoch is not None and found != self._epoch:
            log.warning("the state store (Redis) lost its data since this gateway last looked: turns held "
                        "and retry state from before are gone")
            self._lost()
        self._epoch = found

    async def hold(self, turn: HeldTurn, principal: str | None) -> str:
        token = secrets.token_hex(6)
        await self._put(principal, [("turn", self._key("turn", principal, token), turn_json(turn)),
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
        kinds: list[StateKind] = ["item"] * len(items)
        if response_id is not None:
            keys += [self._key("resp", principal, response_id), self._key("own", principal, response_id)]
            kinds += ["resp", "own"]
        first = await self._get(principal, keys, kinds)
        owners = {i: token for i, key, raw in zip(items, keys, first, strict=False)
                  if (token := self._read("item", key, raw, token_of)) is not None}
        wanted = list(dict.fromkeys([*tokens, *owners.values()]))
        turn_keys = [self._key("turn", principal, t) for t in wanted]
        raws = await self._get(principal, turn_keys, ["turn"] * len(wanted))
        turns = {t: turn for t, key, raw in zip(wanted, turn_keys, raws, strict=True)
                 if (turn := self._read("turn", key, raw, turn_of)) is not None}
        if response_id is None:
            return Found(turns, owners)
        response = self._read("resp", keys[-2], first[-2], response_of)
        claimed = self._read("own", keys[-1], first[-1], owned_of)
        return Found(turns, owners, response, response is not None or claimed is not None)

    async def link(self, principal: str | None, ids: Collection[str], trajectory_id: str) -> None:
        if ids:
            await self._put(principal, [("link", self._key("link", principal, i), trajectory_id)
                                        for i in dict.fromkeys(ids)])

    async def linked(self, principal: str | None, ids: Collection[str]) -> str | None:
        wanted = list(dict.fromkeys(ids))
        keys = [self._key("link", principal, i) for i in wanted]
        for key, raw in zip(keys, await self._get(principal, keys, ["link"] * len(keys)), strict=True):
            if (trajectory_id := self._read("link", key, raw, trajectory_of)) is not None:
                return trajectory_id
        return None

    async def keep_answer(self, principal: str | None, response_id: str, record: str) -> None:
        await self._put(principal, [("answer", self._key("answer", principal, response_id), record)])

    async def kept_answer(self, principal: str | None, response_id: str) -> str | None:
        key = self._key("answer", principal, response_id)
        [raw] = await self._get(principal, [key], ["answer"])
        return self._read("answer", key, raw, answer_of)

    async def forget_answer(self, principal: str | None, response_id: str) -> None:
        """The record and the alias, and their places in the recency sets."""
        pipe = self._redis.pipeline(transaction=True)
        for kind in ("answer", "resp"):
            await self._take(principal, kind, [self._key(kind, principal, response_id)], pipe)
        for answer in await self._run(_answers(pipe)):
            self._taken(answer)

    async def keep_thread(self, principal: str | None, message_id: str, record: str) -> None:
        await self._put(principal, [("thread", self._key("thread", principal, message_id), record)])

    async def kept_thread(self, principal: str | None, message_id: str) -> str | None:
        key = self._key("thread", principal, message_id)
        [raw] = await self._get(principal, [key], ["thread"])
        return self._read("thread", key, raw, thread_of)

    async def keep_sent(self, principal: str | None, records: Mapping[str, str]) -> None:
        if records:
            await self._put(principal, [("sent", self._key("sent", principal, call_id), record)
                                        for call_id, record in records.items()])

    async def taken_sent(self, principal: str | None, call_ids: Collection[str]) -> dict[str, str]:
        """Read and forgotten in one step: of two replicas given the same result, one records it."""
        wanted = list(dict.fromkeys(call_ids))
        if not wanted:
            return {}
        keys = [self._key("sent", principal, call_id) for call_id in wanted]
        pipe = self._redis.pipeline(transaction=False)
        await self._take(principal, "sent", keys, pipe)
        [answer] = await self._run(_answers(pipe))
        taken = {}
        for call_id, key, raw in zip(wanted, keys, self._taken(answer), strict=False):
            if (record := self._read("sent", key, raw, sent_of)) is not None:
                taken[call_id] = record
        return taken

    async def keep_rounds(self, principal: str | None, request_key: str, record: str) -> None:
        await self._put(principal, [("rounds", self._key("rounds", principal, request_key), record)])

    def may_hold_rounds(self) -> bool:
        return True  # another replica may have kept one

    async def kept_rounds(self, principal: str | None, request_key: str) -> str | None:
        """Read and forgotten in one step: of two replicas handed the same replay, one resumes
        (the other runs the request afresh)."""
        key = self._key("rounds", principal, request_key)
        pipe = self._redis.pipeline(transaction=False)
        await self._take(principal, "rounds", [key], pipe)
        [answer] = await self._run(_answers(pipe))
        [raw] = self._taken(answer) or [None]
        return self._read("rounds", key, raw, rounds_of)

    async def failure(self, principal: str | None, trajectory_id: str, tool: str) -> str | None:
        key = self._key("fail", principal, trajectory_id)
        return self._read("fail", key, await self._run(self._redis.hget(key, tool)), failure_record)

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
        written, *_, trajectories, tools = await self._run(_answers(pipe))
        if wrong_type(written):  # not a hash: garbage, which this write replaces
            self._unreadable("fail", key, WRONG_TYPE, REPLACED)
            tools = await self._replace_failures(key, tool, None if record is None else f"{now:.6f} {record}")
        per_trajectory = self._failure_bounds.tools_per_trajectory
        if tools > per_trajectory:
            await self._drop_oldest(key, tools - per_trajectory)
        await self._trim("fail", trajectories, self._failure_bounds.trajectories)

    async def _replace_failures(self, key: str, tool: str, value: str | None) -> int:
        """The trajectory's hash, of another Redis type, replaced by one holding only `value` (if
        any); how many records it holds."""
        pipe = self._redis.pipeline(transaction=True)
        pipe.delete(key)
        if value is not None:
            pipe.hset(key, tool, value)
            pipe.pexpire(key, self._failure_ttl_ms)
        await self._run(_answers(pipe))
        return 0 if value is None else 1

    async def _drop_oldest(self, key: str, excess: int) -> None:
        """Drop the `excess` oldest records of a trajectory: first those whose time is unreadable."""
        fields = await self._run(self._redis.hgetall(key))
        if not isinstance(fields, dict):  # became garbage meanwhile: the next write replaces it
            return

        def age(field: bytes) -> float:
            try:
                return written_at(fields[field])
            except Unreadable as exc:
                self._unreadable("fail", key, exc.reason)
                return -math.inf

        await self._run(self._redis.hdel(key, *sorted(fields, key=age)[:excess]))

    async def status(self) -> str:
        try:
            await self._check_epoch(await self._run(self._redis.get(self._epoch_key)))
        except StateUnavailable:
            return "unavailable"
        return "up"

    async def aclose(self) -> None:
        await self._redis.aclose()
