"""Upstreams cooling down (gateway.provider.cooldowns) in the Redis that replicas share, so that a
provider one replica found failing is passed over by all of them.

Each upstream that failed has two keys under the state store's prefix: `cool:<name>`, the times
its cooldown and its probation end (a string, "<until> <probation ends>", as the clock reads them),
and `cool:<name>:failures`, its failures of the last window (a sorted set by time). A failure is
counted, and the upstream put out, by one script: failures counted on several replicas at once are
all counted. Both keys expire: the failures a window after the last, the cooldown when its
probation ends. A Redis that cannot answer puts no upstream out: requests go on as without
cooldowns, and the state store's metric and log say Redis is unavailable."""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable, Collection

from gateway.provider.cooldowns import CooldownRule
from gateway.state.base import StateUnavailable
from gateway.state.redis_connection import RedisConnection
from gateway.state.redis_values import REPLACED, WRONG_TYPE, Unreadable

# Count one failure of an upstream, and put it out when that makes enough within the window, or
# when it is on probation; nothing is counted while it is out. What is found under its keys that
# the gateway did not write is deleted, and reported ("type": another Redis type, "value": a
# cooldown whose times do not read). Answers {1 when it was put out now, else 0; reports}.
_FAILED = """
local cooldown, failures = KEYS[1], KEYS[2]
local now, window, needed = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local until_, probation_ends, member, lifetime_ms, window_ms = ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local reports = {}

local function garbage(key, word)
  redis.call('del', key)
  reports[#reports + 1] = key
  reports[#reports + 1] = word
end

local out, probation = 0, 0
local kind = redis.call('type', cooldown)['ok']
if kind == 'string' then
  local first, second = string.match(redis.call('get', cooldown), '^(%S+) (%S+)$')
  out, probation = tonumber(first), tonumber(second)
  if out == nil or probation == nil then
    out, probation = 0, 0
    garbage(cooldown, 'value')
  end
elseif kind ~= 'none' then
  garbage(cooldown, 'type')
end
if out > now then return {0, reports} end

kind = redis.call('type', failures)['ok']
if kind ~= 'zset' and kind ~= 'none' then garbage(failures, 'type') end
redis.call('zadd', failures, now, member)
redis.call('zremrangebyscore', failures, '-inf', now - window)
if now < probation or redis.call('zcard', failures) >= needed then
  redis.call('set', cooldown, until_ .. ' ' .. probation_ends, 'PX', lifetime_ms)
  redis.call('del', failures)
  return {1, reports}
end
redis.call('pexpire', failures, window_ms)
return {0, reports}
"""
_REASONS = {b"type": WRONG_TYPE, b"value": "not a cooldown's times"}


def cooldown_of(raw: bytes) -> tuple[float, float]:
    """The times a cooldown and its probation end, as `RedisCooldowns` writes them."""
    try:
        until, probation = (float(part) for part in raw.decode("ascii").split(" "))
    except (UnicodeDecodeError, ValueError):
        raise Unreadable("not a cooldown's times") from None
    if not (math.isfinite(until) and math.isfinite(probation)):
        raise Unreadable("not a cooldown's times")
    return until, probation


def _milliseconds(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


class RedisCooldowns:
    """`Cooldowns` in Redis, by `rule`, on the state store's connection (its time bound, its prefix,
    its count of what Redis holds that the gateway did not write). `clock` gives the times written
    and compared: wall-clock time by default, which replicas on several hosts share."""

    def __init__(self, connection: RedisConnection, rule: CooldownRule,
                 clock: Callable[[], float] = time.time) -> None:
        self.rule = rule
        self._connection = connection
        self._clock = clock
        self._prefix = f"{connection.prefix}cool:"
        self._failed = connection.redis.register_script(_FAILED)
        self._lifetime_ms = _milliseconds(rule.seconds + rule.window_seconds)
        self._window_ms = _milliseconds(rule.window_seconds)

    def keys(self, name: str) -> tuple[str, str]:
        """The keys of an upstream's cooldown and of its failures."""
        return f"{self._prefix}{name}", f"{self._prefix}{name}:failures"

    async def cooling(self, names: Collection[str]) -> dict[str, float]:
        ordered = list(names)
        if not ordered:
            return {}
        keys = [self.keys(name)[0] for name in ordered]
        try:
            found = await self._connection.run(self._connection.redis.mget(keys))
        except StateUnavailable:
            return {}  # none is passed over: a call to one that is down fails over as it would anyway
        now, cooling = self._clock(), {}
        for name, key, raw in zip(ordered, keys, found, strict=True):
            times = self._connection.read("cool", key, raw, cooldown_of)
            if times is not None and times[1] > now:  # cooling down, or on probation
                cooling[name] = times[0] - now
        return cooling

    async def failed(self, name: str) -> bool:
        now, rule = self._clock(), self.rule
        member = f"{now!r} {secrets.token_hex(8)}"  # failures at the same moment on two replicas are two
        try:
            answer = await self._connection.run(self._failed(
                keys=list(self.keys(name)),
                args=[repr(now), repr(rule.window_seconds), rule.failures, repr(now + rule.seconds),
                      repr(rule.probation_ends(now)), member, self._lifetime_ms, self._window_ms]))
        except StateUnavailable:
            return False  # not counted: Redis is the record, and it cannot take one
        if not isinstance(answer, list):  # WRONGTYPE, which the script's checks leave no room for
            return False
        cooled, reports = answer
        for key, word in zip(reports[::2], reports[1::2], strict=True):
            self._connection.unreadable("cool", key.decode("utf-8", "replace"), _REASONS.get(word, "unknown"),
                                        REPLACED)
        return bool(cooled == 1)

    async def succeeded(self, name: str) -> None:
        try:
            await self._connection.run(self._connection.redis.delete(*self.keys(name)))
        except StateUnavailable:
            return  # its record expires by itself
