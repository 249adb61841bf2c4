"""Upstreams cooling down (gateway.provider.cooldowns, issue 55), kept in memory and in a real Redis
(gateway.state.redis_cooldowns) alike, on an injected clock: enough failures within the window
take an upstream out for a time; back, it is on probation, where one failure puts it out again at
once and a success clears it. In Redis, replicas agree on it, failures counted at once on two of
them are all counted, every key expires, and a Redis that cannot answer takes no upstream out."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
from redis.asyncio import Redis

from gateway.provider.cooldowns import CooldownRule, Cooldowns, MemoryCooldowns
from gateway.state import MemoryState, RedisState, StateKind
from gateway.state.redis_connection import RedisConnection
from gateway.state.redis_cooldowns import RedisCooldowns
from tests.conftest import Clock, free_port
from tests.e2e.redis_server import RedisServer

RULE = CooldownRule(failures=3, window_seconds=30.0, seconds=60.0)
START = 1_700_000_000.0



@dataclass
class Kept:
    """Cooldowns made where a test keeps them (this process's memory, or a real Redis under keys of
    the test's own), on one clock."""

    clock: Clock
    make: Callable[[CooldownRule], Cooldowns]


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.slow)])
async def kept(request: pytest.FixtureRequest) -> AsyncIterator[Kept]:
    clock = Clock(START)
    if request.param == "memory":
        yield Kept(clock, lambda rule: MemoryCooldowns(rule, clock))
        return
    redis: RedisServer = request.getfixturevalue("redis_server")
    if redis.process is None:  # an outage test that failed half-way
        redis.start()
    prefix, opened = f"test-{secrets.token_hex(4)}:", []

    def make(rule: CooldownRule) -> Cooldowns:
        connection = RedisConnection(redis.url, 5.0, prefix)
        opened.append(connection)
        return RedisCooldowns(connection, rule, clock)

    yield Kept(clock, make)
    for connection in opened:
        await connection.aclose()


async def fail(cooldowns: Cooldowns, name: str, times: int) -> list[bool]:
    return [await cooldowns.failed(name) for _ in range(times)]


async def test_enough_failures_within_the_window_take_an_upstream_out(kept: Kept) -> None:
    cooldowns = kept.make(RULE)
    assert await fail(cooldowns, "east", 2) == [False, False]
    assert await cooldowns.cooling(["east", "west"]) == {}
    kept.clock.now += 10
    assert await cooldowns.failed("east") is True  # the third within 30 s
    assert await cooldowns.cooling(["east", "west"]) == {"east": 60.0}
    kept.clock.now += 45
    assert await cooldowns.cooling(["east", "west"]) == {"east": 15.0}
    assert await cooldowns.cooling(["west"]) == {}  # only the names asked about


async def test_failures_further_apart_than_the_window_do_not_add_up(kept: Kept) -> None:
    cooldowns = kept.make(RULE)
    for step in (0, 20, 11):  # at 0, 20 and 31: the first has left the window
        kept.clock.now += step
        assert await cooldowns.failed("east") is False
    assert await cooldowns.cooling(["east"]) == {}
    kept.clock.now += 1  # at 32: 20, 31 and 32 are within 30 s
    assert await cooldowns.failed("east") is True


async def test_failures_while_out_change_nothing_and_it_comes_back_on_time(kept: Kept) -> None:
    cooldowns = kept.make(RULE)
    await fail(cooldowns, "east", 3)
    kept.clock.now += 30
    assert await fail(cooldowns, "east", 5) == [False] * 5  # already out: not out again, nor for longer
    assert await cooldowns.cooling(["east"]) == {"east": 30.0}
    kept.clock.now += 30
    assert await cooldowns.cooling(["east"]) == {"east": 0.0}  # back, on probation: its calls are probes
    await cooldowns.succeeded("east")
    assert await cooldowns.cooling(["east"]) == {}


async def test_probation_ends_by_itself_a_window_after_the_cooldown(kept: Kept) -> None:
    cooldowns = kept.make(RULE)
    await fail(cooldowns, "east", 3)
    kept.clock.now += RULE.seconds + RULE.window_seconds
    assert await cooldowns.cooling(["east"]) == {}


async def test_a_failure_on_probation_puts_it_out_again_at_once(kept: Kept) -> None:
    cooldowns = kept.make(RULE)
    await fail(cooldowns, "east", 3)
    kept.clock.now += 60 + 5  # back, and its next call fails
    assert await cooldowns.failed("east") is True
    assert await cooldowns.cooling(["east"]) == {"east": 60.0}


async def test_a_success_on_probation_clears_it(kept: Kept) -> None:
    cooldowns = kept.make(RULE)
    await fail(cooldowns, "east", 3)
    kept.clock.now += 60
    await cooldowns.succeeded("east")
    assert await fail(cooldowns, "east", 3) == [False, False, True]  # counted from nothing again


async def test_a_probe_answering_while_out_brings_it_back_at_once(kept: Kept) -> None:
    """A call to an upstream cooling down (tried when no other answered) that answers."""
    cooldowns = kept.make(RULE)
    await fail(cooldowns, "east", 3)
    kept.clock.now += 1
    await cooldowns.succeeded("east")
    assert await cooldowns.cooling(["east"]) == {}
    assert await cooldowns.failed("east") is False


async def test_probation_ends_a_window_after_the_cooldown(kept: Kept) -> None:
    """A probe whose success went unreported (its cooldown ran out and its next call was an ordinary
    one) does not leave the upstream one failure from going out for ever."""
    cooldowns = kept.make(RULE)
    await fail(cooldowns, "east", 3)
    kept.clock.now += 60 + 30
    assert await cooldowns.failed("east") is False
    assert await cooldowns.cooling(["east"]) == {}


async def test_each_upstream_has_its_own_record(kept: Kept) -> None:
    cooldowns = kept.make(RULE)
    await fail(cooldowns, "east", 2)
    await fail(cooldowns, "west", 2)
    assert await cooldowns.failed("east") is True
    assert await cooldowns.cooling(["east", "west", "local"]) == {"east": 60.0}
    assert await cooldowns.cooling([]) == {}


async def test_the_rule_is_the_one_given(kept: Kept) -> None:
    cooldowns = kept.make(CooldownRule(failures=1, window_seconds=5.0, seconds=2.5))
    assert await cooldowns.failed("east") is True
    assert await cooldowns.cooling(["east"]) == {"east": 2.5}


# --- replicas on one Redis --------------------------------------------------------------------------

@pytest.mark.slow
async def test_replicas_agree_on_an_upstream_cooling_down(redis_up: RedisServer) -> None:
    """Each replica's state store makes its cooldowns (on wall-clock time) over the Redis they share."""
    prefix = f"test-{secrets.token_hex(4)}:"
    one = RedisState(redis_up.url, 10, 60.0, 5.0, prefix=prefix)
    two = RedisState(redis_up.url, 10, 60.0, 5.0, prefix=prefix)
    try:
        first, second = one.cooldowns(RULE), two.cooldowns(RULE)
        await first.failed("east")
        await second.failed("east")
        assert await first.failed("east") is True  # the third of the two replicas' failures
        left = await second.cooling(["east", "west"])
        assert list(left) == ["east"]
        assert 59.0 < left["east"] <= 60.0
        await second.succeeded("east")  # its probe answered on the other replica
        assert await first.cooling(["east"]) == {}
    finally:
        await one.aclose()
        await two.aclose()


@pytest.mark.slow
@pytest.mark.parametrize("failures", [2, 3, 40])
async def test_failures_counted_at_once_on_two_replicas_are_all_counted(redis_up: RedisServer,
                                                                       failures: int) -> None:
    prefix, clock = f"test-{secrets.token_hex(4)}:", Clock(START)
    rule = CooldownRule(failures=failures, window_seconds=30.0, seconds=60.0)
    connections = [RedisConnection(redis_up.url, 5.0, prefix) for _ in range(2)]
    try:
        one, two = (RedisCooldowns(connection, rule, clock) for connection in connections)
        # all but one, at the same moment, each replica counting every other one
        early = await asyncio.gather(*((one, two)[n % 2].failed("east") for n in range(failures - 1)))
        assert early == [False] * (failures - 1)  # none counted twice
        assert await one.cooling(["east"]) == {}
        assert await two.failed("east") is True  # none lost
        assert await one.cooling(["east"]) == {"east": 60.0}
        await one.succeeded("east")
        every = await asyncio.gather(*((one, two)[n % 2].failed("east") for n in range(failures)))
        assert every.count(True) == 1  # one of them put it out, whichever came last
    finally:
        for connection in connections:
            await connection.aclose()


@pytest.mark.slow
async def test_every_key_of_the_cooldowns_expires(redis_up: RedisServer) -> None:
    prefix = f"test-{secrets.token_hex(4)}:"
    connection = RedisConnection(redis_up.url, 5.0, prefix)
    client = Redis.from_url(redis_up.url)
    try:
        cooldowns = RedisCooldowns(connection, RULE)  # on wall-clock time, as Redis expires keys
        cooldown, failures = cooldowns.keys("east")
        assert (cooldown, failures) == (f"{prefix}cool:east", f"{prefix}cool:east:failures")
        await cooldowns.failed("east")
        assert 29_000 < await client.pttl(failures) <= 30_000  # a window after the last failure
        assert await client.exists(cooldown) == 0
        await fail(cooldowns, "east", 2)
        assert await client.exists(failures) == 0  # counted into the cooldown
        assert 89_000 < await client.pttl(cooldown) <= 90_000  # when its probation ends
        assert all([await client.pttl(key) > 0 async for key in client.scan_iter(f"{prefix}*")])
        await cooldowns.succeeded("east")
        assert [key async for key in client.scan_iter(f"{prefix}*")] == []
    finally:
        await client.aclose()
        await connection.aclose()


@pytest.mark.slow
async def test_garbage_under_the_keys_is_counted_and_taken_for_no_cooldown(redis_up: RedisServer) -> None:
    prefix = f"test-{secrets.token_hex(4)}:"
    unreadable: list[StateKind] = []
    connection = RedisConnection(redis_up.url, 5.0, prefix, unreadable=unreadable.append)
    client = Redis.from_url(redis_up.url)
    try:
        cooldowns = RedisCooldowns(connection, CooldownRule(failures=2), Clock(START))
        await client.set(f"{prefix}cool:east", "soon")
        await client.set(f"{prefix}cool:west", f"{START + 99} nan")
        await client.rpush(f"{prefix}cool:local", "x")
        assert await cooldowns.cooling(["east", "west", "local"]) == {}  # a list, to MGET, is no value
        assert unreadable == ["cool", "cool"]
        await client.rpush(f"{prefix}cool:east:failures", "x")
        assert await cooldowns.failed("east") is False  # both replaced: this is its first failure
        assert await cooldowns.failed("local") is False
        assert unreadable == ["cool"] * 5
        assert await cooldowns.failed("east") is True
        assert await cooldowns.cooling(["east", "local"]) == {"east": 30.0}
    finally:
        await client.aclose()
        await connection.aclose()


async def test_a_redis_that_cannot_answer_takes_no_upstream_out() -> None:
    heard: list[bool] = []
    connection = RedisConnection(f"redis://127.0.0.1:{free_port()}/0", 2.0, "test:", observe=heard.append)
    try:
        cooldowns = RedisCooldowns(connection, CooldownRule(failures=1), Clock(START))
        assert await cooldowns.failed("east") is False
        assert await cooldowns.cooling(["east", "west"]) == {}
        await cooldowns.succeeded("east")
        assert heard == [False] * 3  # the state store's metric hears that Redis is down
    finally:
        await connection.aclose()


def test_the_memory_store_keeps_cooldowns_in_memory_on_its_clock() -> None:
    clock = Clock(START)
    cooldowns = MemoryState(10, 60.0, clock=clock).cooldowns(CooldownRule(failures=1))

    async def scenario() -> dict[str, float]:
        await cooldowns.failed("east")
        clock.now += 10
        return await cooldowns.cooling(["east"])

    assert isinstance(cooldowns, MemoryCooldowns)
    assert asyncio.run(scenario()) == {"east": 20.0}
