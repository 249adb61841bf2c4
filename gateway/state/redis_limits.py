"""The counts of the gateway keys' limits (gateway.limits.windows) in the Redis that replicas and
workers share: every check-and-take is one Lua script, so that requests on several replicas at
once can never both take the last of a bound.

Under the state store's prefix, per gateway key (`<owner>`: a digest of its name, as
gateway.state.redis_fair names owners, "-" without keys) and per thing counted (requests, tokens,
tool_calls, spend):
- `limit:<owner>:<counted>:minute`, the sliding minute: a sorted set of what was taken, each member
  "<unique>:<amount>" scored by the time it was taken (in milliseconds), with
  `limit:<owner>:<counted>:minute:total`, the sum of its amounts, kept by the same scripts (a take
  reads one number, not the whole set). Both expire a minute after the last taking.
- `limit:<owner>:<counted>:day:<2026-12-06>` and `...:month:<2026-12>`, a plain counter (INCRBY),
  expiring an hour after its window ends (the hour covers replicas whose clocks lag).
- `limit:<owner>:leases`, the requests under way: a sorted set of leases scored by when each ends.
  A lease lives LEASE_SECONDS; the process holding it renews all of its leases every third of
  that, so a long request keeps its place, and the leases of a replica that died end by
  themselves within LEASE_SECONDS.

The minute and the leases are timed by Redis's own clock (TIME, inside the scripts): replicas whose
clocks disagree still agree on when a taking leaves the window. The day and the month are the
caller's `now` (which day a replica thinks it is), their counters' lives counted by Redis from it.
What the scripts find that the gateway did not write (another Redis type, a counter that is no
number) is replaced, counted and logged (gateway.state.redis_values); a Redis that cannot answer
is `StateUnavailable`, and the Limiter follows `limits_when_state_down`."""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import secrets
from typing import Any

from redis.commands.core import AsyncScript

from gateway.limits.windows import MINUTE, Period, Taken, period_end, period_id
from gateway.state.base import StateUnavailable
from gateway.state.redis_connection import RedisConnection
from gateway.state.redis_fair import owner_name
from gateway.state.redis_values import REPLACED, WRONG_TYPE

log = logging.getLogger("toolspan.limits")

LEASE_SECONDS = 60.0  # how long a request's place lasts unless the process holding it renews it
CALENDAR_MARGIN_SECONDS = 3600.0  # a day's or month's counter outlives its window by this
NO_BOUND = -1  # what the scripts read as "take whatever the bound" (an `add`, a read)

# What every script starts with: the reports of garbage found, and the clock. `clock` reads a time
# given by the caller (a test's), in milliseconds, or Redis's own when none is given.
_LIBRARY = """
local reports = {}

local function garbage(key, word)
  redis.call('del', key)
  reports[#reports + 1] = key
  reports[#reports + 1] = word
end

-- The key holds `wanted` or nothing; anything else is garbage, deleted (and reported).
local function usable(key, wanted)
  local kind = redis.call('type', key)['ok']
  if kind ~= wanted and kind ~= 'none' then garbage(key, 'type') end
end

local function clock(given)
  if given ~= '' then return tonumber(given) end
  local now = redis.call('time')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end
"""

# The sliding minute: forget what left it, then check `amount` against the bound (-1: none) and,
# when it fits and `keep`, take it. The total follows the set in the same step (recounted from the
# set when missing or unreadable). A refusal's wait is until enough of the oldest takings leave.
# KEYS: the set, its total. ARGV: now (ms, or '' for Redis's clock), amount, bound, keep (1/0),
# the new member's unique part, the window (ms). Answers {allowed 1/0, used, wait (ms), reports}.
_SLIDING = _LIBRARY + """
local window, totals = KEYS[1], KEYS[2]
local now, amount, bound, keep = clock(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4] == '1'
local member, span = ARGV[5], tonumber(ARGV[6])
local cutoff = now - span
usable(window, 'zset')
usable(totals, 'string')

local odd = false
local function amount_of(entry)
  local found = tonumber(string.match(entry, ':(%d+)$'))
  if found == nil and not odd then
    odd = true
    reports[#reports + 1] = window
    reports[#reports + 1] = 'member'
  end
  return found or 0
end

local function recount()
  local sum = 0
  for _, entry in ipairs(redis.call('zrangebyscore', window, '(' .. cutoff, '+inf')) do
    sum = sum + amount_of(entry)
  end
  return sum
end

-- Seconds (in ms) until `excess` of what the window holds has left it, oldest first.
local function freed_in(excess)
  local freed, start = 0, 0
  while true do
    local page = redis.call('zrange', window, start, start + 99, 'withscores')
    if #page == 0 then return span end
    for i = 1, #page, 2 do
      freed = freed + amount_of(page[i])
      if freed >= excess then return math.max(tonumber(page[i + 1]) + span - now, 0) end
    end
    start = start + 100
  end
end

local total, changed = redis.call('get', totals), false
if total ~= false and string.match(total, '^%d+$') == nil then
  garbage(totals, 'value')
  total = false
end
local forgotten = redis.call('zrangebyscore', window, '-inf', cutoff)
if total == false then
  total, changed = recount(), true
else
  total = tonumber(total)
  for _, entry in ipairs(forgotten) do total = total - amount_of(entry) end
  if total < 0 then total = recount() end
end
if #forgotten > 0 then
  redis.call('zremrangebyscore', window, '-inf', cutoff)
  changed = true
end

local allowed, wait = 1, span
if bound >= 0 and total + amount > bound then
  allowed = 0
  if amount <= bound then wait = freed_in(total + amount - bound) end
elseif keep and amount > 0 then
  redis.call('zadd', window, now, member .. ':' .. amount)
  redis.call('pexpire', window, span)
  total, changed = total + amount, true
end
if changed then
  local left = redis.call('pttl', window)
  if left == -2 then
    redis.call('del', totals)
  else
    if left < 0 then
      left = span
      redis.call('pexpire', window, left)
    end
    redis.call('set', totals, total, 'PX', left)
  end
end
return {allowed, total, wait, reports}
"""

# A calendar window's counter: check `amount` against the bound (-1: none) and, when it fits and
# `keep`, add it. KEYS: the counter. ARGV: amount, bound, keep (1/0), its life (ms) from now.
# Answers {allowed 1/0, used, reports}.
_CALENDAR = _LIBRARY + """
local counter = KEYS[1]
local amount, bound, keep, life = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3] == '1', ARGV[4]
usable(counter, 'string')
local used = redis.call('get', counter)
if used == false then
  used = 0
elseif string.match(used, '^%d+$') then
  used = tonumber(used)
else
  garbage(counter, 'value')
  used = 0
end
if bound >= 0 and used + amount > bound then return {0, used, reports} end
if keep and amount > 0 then
  used = redis.call('incrby', counter, amount)
  redis.call('pexpire', counter, life)
end
return {1, used, reports}
"""

# One more request under way, if fewer than the bound are: leases past their end are dropped first.
# KEYS: the leases. ARGV: now (ms, or ''), the lease, the bound, a lease's life (ms).
# Answers {allowed 1/0, leases held, reports}.
_ENTER = _LIBRARY + """
local leases = KEYS[1]
local now, lease, bound, life = clock(ARGV[1]), ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
usable(leases, 'zset')
redis.call('zremrangebyscore', leases, '-inf', now)
local held = redis.call('zcard', leases)
if held >= bound then return {0, held, reports} end
redis.call('zadd', leases, now + life, lease)
redis.call('pexpire', leases, life)
return {1, held + 1, reports}
"""

# The leases named (ARGV[3..]) live another life from now, those still there. KEYS: the leases.
# ARGV: now (ms, or ''), a lease's life (ms), the leases. Answers {reports}.
_RENEW = _LIBRARY + """
local leases = KEYS[1]
local now, life = clock(ARGV[1]), tonumber(ARGV[2])
usable(leases, 'zset')
for i = 3, #ARGV do redis.call('zadd', leases, 'XX', now + life, ARGV[i]) end
if redis.call('exists', leases) == 1 then redis.call('pexpire', leases, life) end
return {reports}
"""

_REASONS = {b"type": WRONG_TYPE, b"value": "not a count", b"member": "a taking without its amount"}


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


class RedisLimitBook:
    """`LimitBook` in Redis, on the state store's connection (its time bound, its prefix, its count
    of what Redis holds that the gateway did not write). With `server_clock` (the default) the
    minute and the leases are timed by Redis's clock and the `now` given them is not used; without
    it, by `now`, as in MemoryLimitBook (tests move it)."""

    def __init__(self, connection: RedisConnection, server_clock: bool = True,
                 lease_seconds: float = LEASE_SECONDS) -> None:
        self._connection = connection
        self._prefix = f"{connection.prefix}limit:"
        redis = connection.redis
        self._sliding = redis.register_script(_SLIDING)
        self._calendar = redis.register_script(_CALENDAR)
        self._enter = redis.register_script(_ENTER)
        self._renew = redis.register_script(_RENEW)
        self._server_clock = server_clock
        self._lease_seconds = lease_seconds
        # A taking's unique part: this book's, then a count (no two replicas' takings are one member).
        self._book_id = secrets.token_hex(6)
        self._takings = itertools.count()
        self._held: dict[str, set[str]] = {}  # the leases this process holds, by the key of their set
        self._renewing: asyncio.Task[None] | None = None

    def keys(self, key: str, counted: str, period: Period, now: float) -> list[str]:
        """The Redis keys of one window of a gateway key's (`key`, "" without keys)."""
        head = f"{self._prefix}{owner_name(key or None)}:{counted}:{period}"
        return [head, f"{head}:total"] if period == "minute" else [f"{head}:{period_id(period, now)}"]

    def leases_key(self, key: str) -> str:
        return f"{self._prefix}{owner_name(key or None)}:leases"

    def _at(self, now: float | None) -> str:
        """`now` as the scripts read it: milliseconds, or '' for Redis's clock."""
        return "" if self._server_clock or now is None else str(round(now * 1000))

    async def _run(self, script: AsyncScript, keys: list[str], args: list[Any]) -> list[Any]:
        """What `script` answered before its reports (which are counted and logged)."""
        answer = await self._connection.run(script(keys=keys, args=args))
        if not isinstance(answer, list):  # WRONGTYPE, which the scripts' checks leave no room for
            self._connection.unreadable("limit", keys[0], WRONG_TYPE, "the step left undone")
            raise StateUnavailable()
        *values, reports = answer
        for found, word in zip(reports[::2], reports[1::2], strict=True):
            self._connection.unreadable("limit", found.decode("utf-8", "replace"), _REASONS.get(word, "unknown"),
                                        REPLACED)
        return values

    async def _count(self, key: str, counted: str, amount: int, bound: int, period: Period, now: float,
                     keep: bool) -> Taken:
        keys = self.keys(key, counted, period, now)
        if period == "minute":
            member = f"{self._book_id}.{next(self._takings)}"
            allowed, used, wait = await self._run(
                self._sliding, keys, [self._at(now), amount, bound, int(keep), member, _ms(MINUTE)])
            return Taken(allowed == 1, used, bound, wait / 1000)
        ends = period_end(period, now) - now
        allowed, used = await self._run(self._calendar, keys,
                                        [amount, bound, int(keep), _ms(ends + CALENDAR_MARGIN_SECONDS)])
        return Taken(allowed == 1, used, bound, ends)

    async def take(self, key: str, name: str, amount: int, bound: int, period: Period, now: float,
                   keep: bool = True) -> Taken:
        return await self._count(key, name, amount, bound, period, now, keep)

    async def add(self, key: str, name: str, amount: int, period: Period, now: float) -> None:
        if amount:
            await self._count(key, name, amount, NO_BOUND, period, now, True)

    async def used(self, key: str, name: str, period: Period, now: float) -> int:
        return (await self._count(key, name, 0, NO_BOUND, period, now, False)).used

    async def enter(self, key: str, lease: str, bound: int, now: float) -> Taken:
        leases = self.leases_key(key)
        allowed, held = await self._run(self._enter, [leases],
                                        [self._at(now), lease, bound, _ms(self._lease_seconds)])
        if allowed != 1:
            return Taken(False, held, bound, 1.0)
        self._held.setdefault(leases, set()).add(lease)
        if self._renewing is None or self._renewing.done():
            self._renewing = asyncio.ensure_future(self._renew_held())
        return Taken(True, held, bound, 0.0)

    async def leave(self, key: str, lease: str) -> None:
        leases = self.leases_key(key)
        mine = self._held.get(leases, set())
        mine.discard(lease)
        if not mine:
            self._held.pop(leases, None)
        if not self._held and self._renewing is not None:
            self._renewing.cancel()
            self._renewing = None
        await self._connection.run(self._connection.redis.zrem(leases, lease))

    async def renew(self, now: float | None = None) -> None:
        """Every lease this process holds lives another LEASE_SECONDS from now (those that ended
        already, while Redis could not be reached, stay ended)."""
        for leases, mine in list(self._held.items()):
            await self._run(self._renew, [leases], [self._at(now), _ms(self._lease_seconds), *sorted(mine)])

    async def _renew_held(self) -> None:
        """While this process holds leases: each renewed three times in its life."""
        while True:
            await asyncio.sleep(self._lease_seconds / 3)
            try:
                await self.renew()
            except StateUnavailable:  # its leases may end: more requests than the bound may then run
                log.warning("requests under way not renewed: the shared state is unreachable")
