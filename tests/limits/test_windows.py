"""The counts behind the gateway keys' limits (gateway.limits.windows), in memory and in a real Redis
(gateway.state.redis_limits) alike, on a `now` the test moves: a take fits up to the bound and not
past it, a check that keeps nothing takes nothing, an add goes past the bound, the sliding minute
forgets each taking 60 s after it, a day and a month end at midnight UTC, a key's leases are
bounded, and 200 concurrent takes against a bound of 50 take exactly 50.

In Redis besides: the minute and the leases follow Redis's own clock, two replicas' takes are
counted exactly together, a dead replica's leases end by themselves while a live one's are renewed,
every key expires, garbage under the keys is counted and replaced, and a Redis that cannot answer
is `StateUnavailable`."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis

from gateway.limits.windows import LimitBook, MemoryLimitBook, Taken, period_end
from gateway.state import MemoryState, RedisState, StateKind, StateUnavailable
from gateway.state.redis_connection import RedisConnection
from gateway.state.redis_limits import CALENDAR_MARGIN_SECONDS, LEASE_SECONDS, RedisLimitBook
from tests.conftest import free_port
from tests.e2e.redis_server import RedisServer

END_OF_YEAR = datetime(2026, 12, 31, 23, 59, tzinfo=UTC).timestamp()  # a minute before a day, a month end
START = END_OF_YEAR - 3600.0


def redis_prefix() -> str:
    return f"test-{secrets.token_hex(4)}:"


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.slow)])
async def book(request: pytest.FixtureRequest) -> AsyncIterator[LimitBook]:
    """A book in this process's memory, or in a real Redis under keys of the test's own, timed by
    the `now` the test gives it."""
    if request.param == "memory":
        yield MemoryLimitBook()
        return
    redis: RedisServer = request.getfixturevalue("redis_server")
    if redis.process is None:  # an outage test that failed half-way
        redis.start()
    connection = RedisConnection(redis.url, 5.0, redis_prefix())
    yield RedisLimitBook(connection, server_clock=False)
    await connection.aclose()


def seen(taken: Taken) -> tuple[bool, int, int, float]:
    return taken.allowed, taken.used, taken.remaining, round(taken.retry_after, 2)


async def test_a_take_fits_up_to_the_bound_and_not_past_it(book: LimitBook) -> None:
    takes = [await book.take("alice", "requests", 1, 3, "minute", START + second) for second in range(4)]
    assert [seen(taken) for taken in takes] == [(True, 1, 2, 60.0), (True, 2, 1, 60.0), (True, 3, 0, 60.0),
                                                (False, 3, 0, 57.0)]  # until the first leaves the window
    assert await book.used("alice", "requests", "minute", START + 4) == 3
    # A larger amount: refused while it does not fit, though a smaller one would.
    assert seen(await book.take("bob", "tokens", 7, 10, "minute", START)) == (True, 7, 3, 60.0)
    assert seen(await book.take("bob", "tokens", 4, 10, "minute", START + 1)) == (False, 7, 3, 59.0)
    assert seen(await book.take("bob", "tokens", 3, 10, "minute", START + 2)) == (True, 10, 0, 60.0)


async def test_an_amount_past_the_bound_itself_waits_a_whole_window(book: LimitBook) -> None:
    assert seen(await book.take("alice", "tokens", 11, 10, "minute", START)) == (False, 0, 10, 60.0)
    assert await book.used("alice", "tokens", "minute", START) == 0


async def test_a_check_that_keeps_nothing_takes_nothing(book: LimitBook) -> None:
    for _ in range(3):
        assert seen(await book.take("alice", "tokens", 5, 5, "minute", START, keep=False)) == (True, 0, 5, 60.0)
        assert seen(await book.take("alice", "spend", 5, 5, "day", START, keep=False)) == (True, 0, 5, 3660.0)
    await book.add("alice", "tokens", 3, "minute", START)
    assert seen(await book.take("alice", "tokens", 3, 5, "minute", START + 1, keep=False)) == (False, 3, 2, 59.0)
    assert await book.used("alice", "tokens", "minute", START + 1) == 3


async def test_an_add_counts_past_the_bound(book: LimitBook) -> None:
    await book.add("alice", "tokens", 40, "minute", START)
    await book.add("alice", "tokens", 0, "minute", START)  # nothing to count
    await book.add("alice", "tokens", 30, "day", START)
    await book.add("alice", "tokens", 30, "day", START + 1)
    assert seen(await book.take("alice", "tokens", 1, 25, "minute", START + 5)) == (False, 40, 0, 55.0)
    assert seen(await book.take("alice", "tokens", 1, 50, "day", START + 5)) == (False, 60, 0, 3655.0)
    assert await book.used("alice", "tokens", "month", START) == 0  # windows of one thing counted apart


async def test_the_minute_forgets_each_taking_60_s_after_it(book: LimitBook) -> None:
    await book.take("alice", "tokens", 4, 10, "minute", START)
    await book.take("alice", "tokens", 5, 10, "minute", START + 30)
    # 6 more must wait until both left: the second leaves at START + 90.
    assert seen(await book.take("alice", "tokens", 6, 10, "minute", START + 40)) == (False, 9, 1, 50.0)
    assert await book.used("alice", "tokens", "minute", START + 59.999) == 9
    assert await book.used("alice", "tokens", "minute", START + 60) == 5  # 60 s after it: gone
    assert seen(await book.take("alice", "tokens", 5, 10, "minute", START + 60)) == (True, 10, 0, 60.0)
    assert await book.used("alice", "tokens", "minute", START + 90) == 5
    assert await book.used("alice", "tokens", "minute", START + 120) == 0
    assert seen(await book.take("alice", "tokens", 10, 10, "minute", START + 500)) == (True, 10, 0, 60.0)


async def test_a_day_and_a_month_end_at_midnight_utc(book: LimitBook) -> None:
    before = END_OF_YEAR + 59.5  # half a second before 2027 begins
    assert seen(await book.take("alice", "spend", 8, 10, "day", before)) == (True, 8, 2, 0.5)
    assert seen(await book.take("alice", "spend", 8, 10, "month", before)) == (True, 8, 2, 0.5)
    assert seen(await book.take("alice", "spend", 8, 10, "day", before)) == (False, 8, 2, 0.5)
    assert seen(await book.take("alice", "spend", 8, 10, "month", before)) == (False, 8, 2, 0.5)
    after = END_OF_YEAR + 60  # 2027-01-01 00:00:00
    assert seen(await book.take("alice", "spend", 8, 10, "day", after)) == (True, 8, 2, 86400.0)
    assert seen(await book.take("alice", "spend", 8, 10, "month", after)) == (True, 8, 2, 31 * 86400.0)
    assert await book.used("alice", "spend", "day", after + 86400) == 0
    assert await book.used("alice", "spend", "month", after + 86400) == 8  # still January


async def test_two_keys_never_share_a_count(book: LimitBook) -> None:
    assert (await book.take("alice", "requests", 1, 1, "minute", START)).allowed
    assert not (await book.take("alice", "requests", 1, 1, "minute", START)).allowed
    assert (await book.take("bob", "requests", 1, 1, "minute", START)).allowed
    assert (await book.take("", "requests", 1, 1, "minute", START)).allowed  # no keys: a count of its own
    assert (await book.enter("alice", "a1", 1, START)).allowed
    assert (await book.enter("bob", "b1", 1, START)).allowed
    await book.leave("alice", "a1")
    await book.leave("bob", "b1")


async def test_leases_are_bounded_and_given_back(book: LimitBook) -> None:
    assert seen(await book.enter("alice", "one", 2, START)) == (True, 1, 1, 0.0)
    assert seen(await book.enter("alice", "two", 2, START)) == (True, 2, 0, 0.0)
    assert seen(await book.enter("alice", "three", 2, START)) == (False, 2, 0, 1.0)
    await book.leave("alice", "one")
    await book.leave("alice", "one")  # given back twice: nothing more
    assert seen(await book.enter("alice", "three", 2, START)) == (True, 2, 0, 0.0)
    for lease in ("two", "three"):
        await book.leave("alice", lease)
    assert seen(await book.enter("alice", "four", 2, START)) == (True, 1, 1, 0.0)
    await book.leave("alice", "four")


async def test_200_concurrent_takes_against_a_bound_of_50_take_exactly_50(book: LimitBook) -> None:
    takes = await asyncio.gather(*(book.take("alice", "requests", 1, 50, "minute", START) for _ in range(200)))
    assert sum(taken.allowed for taken in takes) == 50
    assert sorted(taken.used for taken in takes if taken.allowed) == list(range(1, 51))
    assert await book.used("alice", "requests", "minute", START) == 50
    entered = await asyncio.gather(*(book.enter("alice", f"lease-{n}", 50, START) for n in range(200)))
    assert sum(taken.allowed for taken in entered) == 50
    for n, taken in enumerate(entered):
        if taken.allowed:
            await book.leave("alice", f"lease-{n}")


# --- in Redis --------------------------------------------------------------------------------------

@pytest.fixture
async def connections(redis_up: RedisServer) -> AsyncIterator[tuple[RedisConnection, RedisConnection, Redis]]:
    """Two replicas' connections to one Redis, under one prefix of the test's own, and a client of
    the test's to look at the keys."""
    prefix = redis_prefix()
    one, two = RedisConnection(redis_up.url, 5.0, prefix), RedisConnection(redis_up.url, 5.0, prefix)
    client = Redis.from_url(redis_up.url)
    yield one, two, client
    for connection in (one, two):
        await connection.aclose()
    await client.aclose()


Connections = tuple[RedisConnection, RedisConnection, Redis]


@pytest.mark.slow
async def test_the_stores_give_their_own_books(redis_up: RedisServer) -> None:
    assert isinstance(MemoryState(10, 60.0).limit_book(), MemoryLimitBook)
    store = RedisState(redis_up.url, 10, 60.0, 5.0, prefix=redis_prefix())
    try:
        assert isinstance(store.limit_book(), RedisLimitBook)
    finally:
        await store.aclose()


@pytest.mark.slow
async def test_two_replicas_take_exactly_the_bound_together_on_redis_clock(connections: Connections) -> None:
    one, two, _ = connections
    books = [RedisLimitBook(one), RedisLimitBook(two)]
    # The replicas' clocks disagree wildly: Redis's clock times the minute, theirs are not read.
    assert seen(await books[0].take("alice", "requests", 1, 50, "minute", 0)) == (True, 1, 49, 60.0)
    assert seen(await books[1].take("alice", "requests", 1, 50, "minute", 1e10)) == (True, 2, 48, 60.0)
    takes = await asyncio.gather(*(books[n % 2].take("alice", "requests", 1, 50, "minute", n * 1e6)
                                   for n in range(198)))
    assert sum(taken.allowed for taken in takes) == 48
    refused = [taken for taken in takes if not taken.allowed]
    assert all(0 < taken.retry_after <= 60 for taken in refused)
    entered = await asyncio.gather(*(books[n % 2].enter("alice", f"lease-{n}", 10, -n) for n in range(40)))
    assert sum(taken.allowed for taken in entered) == 10
    for n, taken in enumerate(entered):
        if taken.allowed:
            await books[n % 2].leave("alice", f"lease-{n}")


@pytest.mark.slow
async def test_a_dead_replicas_leases_end_by_themselves_a_live_ones_are_renewed(connections: Connections) -> None:
    one, two, _ = connections
    dead, live, other = (RedisLimitBook(one, server_clock=False), RedisLimitBook(two, server_clock=False),
                         RedisLimitBook(two, server_clock=False))
    assert (await dead.enter("alice", "dead", 2, START)).allowed
    assert (await live.enter("alice", "live", 2, START)).allowed
    assert not (await other.enter("alice", "new", 2, START + LEASE_SECONDS - 1)).allowed
    await live.renew(START + LEASE_SECONDS - 1)  # the dead replica renews nothing
    assert seen(await other.enter("alice", "new", 2, START + LEASE_SECONDS)) == (True, 2, 0, 0.0)
    assert not (await other.enter("alice", "newer", 2, START + 2 * LEASE_SECONDS - 2)).allowed
    assert (await other.enter("alice", "newer", 2, START + 2 * LEASE_SECONDS)).allowed  # `live` lapsed too
    for book, lease in ((dead, "dead"), (live, "live"), (other, "new"), (other, "newer")):
        await book.leave("alice", lease)


class CountedRenewals(RedisLimitBook):
    """A book that says when it renewed its leases (in the background, as a request runs)."""

    def __init__(self, connection: RedisConnection, lease_seconds: float) -> None:
        super().__init__(connection, lease_seconds=lease_seconds)
        self.renewals = 0
        self.renewed = asyncio.Condition()

    async def renew(self, now: float | None = None) -> None:
        await super().renew(now)
        async with self.renewed:
            self.renewals += 1
            self.renewed.notify_all()


@pytest.mark.slow
async def test_a_lease_is_renewed_in_the_background_while_its_request_runs(connections: Connections) -> None:
    one, _, client = connections
    book = CountedRenewals(one, lease_seconds=0.6)  # renewed every 0.2 s
    assert (await book.enter("alice", "long", 1, 0)).allowed
    async with asyncio.timeout(5), book.renewed:  # four renewals: more than a lease's life later
        await book.renewed.wait_for(lambda: book.renewals >= 4)
    assert not (await book.enter("alice", "other", 1, 0)).allowed  # still held
    await book.leave("alice", "long")
    assert await client.exists(book.leases_key("alice")) == 0
    assert (await book.enter("alice", "other", 1, 0)).allowed
    await book.leave("alice", "other")


@pytest.mark.slow
async def test_every_key_expires(connections: Connections) -> None:
    one, _, client = connections
    book = RedisLimitBook(one)
    now = time.time()
    await book.take("alice", "tokens", 5, 10, "minute", now)
    await book.add("alice", "tokens", 5, "day", now)
    await book.add("alice", "spend", 5, "month", now)
    assert (await book.enter("alice", "one", 3, now)).allowed
    window, total = book.keys("alice", "tokens", "minute", now)
    [day] = book.keys("alice", "tokens", "day", now)
    [month] = book.keys("alice", "spend", "month", now)
    found = {key.decode(): await client.pttl(key) async for key in client.scan_iter(f"{one.prefix}*")}
    assert found.keys() == {window, total, day, month, book.leases_key("alice")}
    assert all(55_000 < found[key] <= 60_000 for key in (window, total, book.leases_key("alice")))
    day_lasts = 1000 * (period_end("day", now) - now + CALENDAR_MARGIN_SECONDS)  # a margin past its end
    assert day_lasts - 5_000 < found[day] <= day_lasts + 1
    assert found[month] >= found[day] - 1_000
    await book.leave("alice", "one")
    assert await client.exists(book.leases_key("alice")) == 0


@pytest.mark.slow
async def test_garbage_under_the_keys_is_counted_and_replaced(redis_up: RedisServer) -> None:
    unreadable: list[StateKind] = []
    connection = RedisConnection(redis_up.url, 5.0, redis_prefix(), unreadable=unreadable.append)
    client = Redis.from_url(redis_up.url)
    try:
        book = RedisLimitBook(connection, server_clock=False)
        window, total = book.keys("alice", "tokens", "minute", START)
        [day] = book.keys("alice", "tokens", "day", START)
        await client.rpush(window, "x")
        await client.set(day, "lots")
        await client.set(book.leases_key("alice"), "x")
        assert seen(await book.take("alice", "tokens", 5, 10, "minute", START)) == (True, 5, 5, 60.0)
        assert seen(await book.take("alice", "tokens", 5, 10, "day", START)) == (True, 5, 5, 3660.0)
        assert (await book.enter("alice", "one", 1, START)).allowed
        assert unreadable == ["limit"] * 3
        await client.set(total, "many")  # the total recounted from the set
        await client.zadd(window, {"no amount": START * 1000})
        assert await book.used("alice", "tokens", "minute", START + 1) == 5
        assert unreadable == ["limit"] * 5
        await book.leave("alice", "one")
    finally:
        await client.aclose()
        await connection.aclose()


async def test_a_redis_that_cannot_answer_is_state_unavailable() -> None:
    heard: list[bool] = []
    connection = RedisConnection(f"redis://127.0.0.1:{free_port()}/0", 2.0, "test:", observe=heard.append)
    book = RedisLimitBook(connection)
    try:
        for step in (book.take("alice", "requests", 1, 5, "minute", START), book.add("a", "spend", 1, "day", START),
                     book.used("alice", "tokens", "month", START), book.enter("alice", "one", 1, START),
                     book.leave("alice", "one")):
            with pytest.raises(StateUnavailable):
                await step
        assert heard == [False] * 5
    finally:
        await connection.aclose()
