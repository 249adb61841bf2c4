"""The Limiter's usage (what a key has used of each limit, and when its window frees) and its
limits replaced in place (a reload), over the book in memory and in a real Redis alike
(test_windows' `book`), on a clock the test moves."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import SecretStr

from gateway.instrumentation import NoInstrumentation
from gateway.limits import LimitBook, Limiter, RateLimited
from gateway.settings.parts import GatewayKey, Limits, Price
from tests.conftest import Clock
from tests.limits.test_windows import book

__all__ = ["book"]  # the fixture: each test runs over both books

NOON = datetime(2026, 12, 6, 12, 0, tzinfo=UTC).timestamp()


def limiter(book: LimitBook, clock: Clock, defaults: Limits, **keys: GatewayKey) -> Limiter:
    return Limiter(defaults, keys, {"m": Price(input=1.0, output=2.0)}, book, "open", NoInstrumentation(), clock=clock)


async def request(gate: Limiter, key: str | None = None) -> None:
    async with gate.admitted(key, "lease"):
        pass


async def test_a_sliding_minute_frees_as_each_taking_leaves_it(book: LimitBook) -> None:
    clock = Clock(NOON)
    gate = limiter(book, clock, Limits(requests_per_minute=5))
    await request(gate)
    clock.now += 30
    await request(gate)
    clock.now += 10
    [usage] = await gate.usage(None)
    assert (usage.limit, usage.period, usage.used, usage.bound, usage.remaining) == (
        "requests_per_minute", "minute", 2, 5, 3)
    assert usage.resets_in == pytest.approx(50)  # when the later one leaves the window
    assert usage.resets_at == pytest.approx(NOON + 90)
    clock.now += 30
    [usage] = await gate.usage(None)
    assert (usage.used, usage.resets_in) == (1, pytest.approx(20))
    clock.now += 20
    [usage] = await gate.usage(None)
    assert (usage.used, usage.resets_in, usage.remaining) == (0, 0.0, 5)


async def test_days_and_months_reset_at_their_utc_ends_and_money_counts_in_millionths(book: LimitBook) -> None:
    clock = Clock(NOON)
    gate = limiter(book, clock, Limits(tokens_per_day=100, budget_per_month=1.0))
    await gate.after_call(None, "m", 10, 5)
    tokens, money = await gate.usage(None)
    assert (tokens.limit, tokens.used, tokens.remaining) == ("tokens_per_day", 15, 85)
    assert tokens.resets_at == datetime(2026, 12, 7, tzinfo=UTC).timestamp()
    assert (money.limit, money.counted, money.used, money.bound) == ("budget_per_month", "spend", 20, 1_000_000)
    assert money.resets_at == datetime(2027, 1, 1, tzinfo=UTC).timestamp()


async def test_requests_under_way_are_counted_while_they_run(book: LimitBook) -> None:
    gate = limiter(book, Clock(NOON), Limits(max_concurrent_requests=2))
    async with gate.admitted(None, "one"):
        [usage] = await gate.usage(None)
        assert (usage.limit, usage.period, usage.used, usage.resets_in) == ("max_concurrent_requests", None, 1, None)
    [usage] = await gate.usage(None)
    assert usage.used == 0


async def test_replaced_limits_apply_at_once_and_keep_what_was_used(book: LimitBook) -> None:
    clock = Clock(NOON)
    alice = GatewayKey(key=SecretStr("sk-alice-0001"), requests_per_minute=3)
    gate = limiter(book, clock, Limits(requests_per_minute=10), alice=alice)
    await request(gate, "alice")
    await request(gate, "alice")
    gate.replace(Limits(requests_per_minute=10), {"alice": alice.model_copy(update={"requests_per_minute": 2})},
                 {}, "closed")
    [usage] = await gate.usage("alice")
    assert (usage.used, usage.bound, usage.remaining) == (2, 2, 0)
    with pytest.raises(RateLimited):
        await request(gate, "alice")
    assert gate.resolved()["alice"].requests_per_minute == 2
    assert (gate.prices, gate.when_down) == ({}, "closed")


async def test_a_key_without_limits_has_no_usage(book: LimitBook) -> None:
    gate = limiter(book, Clock(NOON), Limits(), alice=GatewayKey(key=SecretStr("sk-alice-0001"), max_rounds=2))
    assert await gate.usage(None) == []
    assert await gate.usage("alice") == []
    assert gate.of("alice").max_rounds == 2
