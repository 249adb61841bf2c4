"""The counts behind the limits: how much of one limit a gateway key has used in its window, and
the one step that checks and takes at once, so that concurrent requests (and, in Redis, other
replicas) can never both take the last of a bound.

Three windows: a minute is sliding (what was taken in the last 60 s, each taking forgotten 60 s
after it), a day and a month are the calendar's, in UTC (a budget's day starts at midnight). And
the requests under way at once, as leases: taken when a request starts, given back when it ends
(in Redis a lease also ends by itself, should the replica holding it die).

`MemoryLimitBook` keeps them in this process; gateway.state.redis_limits in Redis, shared.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Literal, Protocol

Period = Literal["minute", "day", "month"]
MINUTE = 60.0


@dataclass(frozen=True, slots=True)
class Taken:
    """What a check found: whether it was allowed (and, when asked to, taken), the amount used
    in the window after it, the bound, and the seconds until enough of the window frees for it
    (refused) or until the window starts again (allowed)."""

    allowed: bool
    used: int
    bound: int
    retry_after: float

    @property
    def remaining(self) -> int:
        return max(self.bound - self.used, 0)


_DAY = 86400  # seconds in a UTC day: Unix time counts none of the leap seconds


@lru_cache(maxsize=4)
def _calendar(day: int) -> tuple[str, float, str, float]:
    """The UTC day numbered `day` since the epoch: its id and end, and its month's id and end.
    Made once a day rather than at every check (datetime's formatting is most of a check's cost)."""
    start = datetime.fromtimestamp(day * _DAY, UTC)
    year, month = (start.year + 1, 1) if start.month == 12 else (start.year, start.month + 1)
    return (start.strftime("%Y-%m-%d"), (day + 1) * _DAY, start.strftime("%Y-%m"),
            datetime(year, month, 1, tzinfo=UTC).timestamp())


def period_end(period: Period, now: float) -> float:
    """When the calendar window holding `now` ends (a minute: 60 s from now, as it slides)."""
    if period == "minute":
        return now + MINUTE
    _, day_end, _, month_end = _calendar(int(now // _DAY))
    return day_end if period == "day" else month_end


def period_id(period: Period, now: float) -> str:
    """The calendar window holding `now`: 2026-12-06 for a day, 2026-12 for a month."""
    day_id, _, month_id, _ = _calendar(int(now // _DAY))
    return day_id if period == "day" else month_id


class LimitBook(Protocol):
    """Where the counts live. `key` is a gateway key's name ("" without keys), `name` the limit's."""

    async def take(self, key: str, name: str, amount: int, bound: int, period: Period, now: float,
                   keep: bool = True) -> Taken:
        """Whether `amount` more fits under `bound` in the window; if so and `keep`, taken."""

    async def add(self, key: str, name: str, amount: int, period: Period, now: float) -> None:
        """`amount` taken whatever the bound (what a provider call used, known once it answered)."""

    async def used(self, key: str, name: str, period: Period, now: float) -> int:
        """What the window holds now."""

    async def enter(self, key: str, lease: str, bound: int, now: float) -> Taken:
        """One more request under way, under `lease`, if fewer than `bound` are."""

    async def leave(self, key: str, lease: str) -> None:
        """The request of `lease` ended."""


class _Sliding:
    """One key's takings of one limit in the last minute, oldest first, and their sum."""

    __slots__ = ("entries", "total")

    def __init__(self) -> None:
        self.entries: deque[tuple[float, int]] = deque()
        self.total = 0

    def at(self, now: float) -> int:
        entries = self.entries
        while entries and entries[0][0] <= now - MINUTE:
            self.total -= entries.popleft()[1]
        return self.total

    def freed_in(self, excess: int, now: float) -> float:
        """Seconds until `excess` of what is held has left the window."""
        freed = 0
        for when, amount in self.entries:
            freed += amount
            if freed >= excess:
                return max(when + MINUTE - now, 0.0)
        return MINUTE


class MemoryLimitBook:
    """The counts in this process: exact for one process (the event loop runs one check at a time)."""

    def __init__(self) -> None:
        self._sliding: dict[tuple[str, str], _Sliding] = {}
        self._calendar: dict[tuple[str, str, Period], tuple[str, int]] = {}  # the window's id, its count
        self._leases: dict[str, set[str]] = {}

    def _count(self, key: str, name: str, period: Period, now: float) -> int:
        if period == "minute":
            window = self._sliding.get((key, name))
            return window.at(now) if window is not None else 0
        found = self._calendar.get((key, name, period))
        return found[1] if found is not None and found[0] == period_id(period, now) else 0

    def _put(self, key: str, name: str, amount: int, period: Period, now: float) -> None:
        if period == "minute":
            window = self._sliding.setdefault((key, name), _Sliding())
            window.entries.append((now, amount))
            window.total += amount
        else:
            self._calendar[key, name, period] = (period_id(period, now), self._count(key, name, period, now) + amount)

    async def take(self, key: str, name: str, amount: int, bound: int, period: Period, now: float,
                   keep: bool = True) -> Taken:
        used = self._count(key, name, period, now)
        if used + amount > bound:
            wait = (self._sliding[key, name].freed_in(used + amount - bound, now)
                    if period == "minute" and (key, name) in self._sliding and amount <= bound
                    else period_end(period, now) - now)
            return Taken(False, used, bound, wait)
        if keep and amount:
            self._put(key, name, amount, period, now)
            used += amount
        return Taken(True, used, bound, period_end(period, now) - now)

    async def add(self, key: str, name: str, amount: int, period: Period, now: float) -> None:
        if amount:
            self._put(key, name, amount, period, now)

    async def used(self, key: str, name: str, period: Period, now: float) -> int:
        return self._count(key, name, period, now)

    async def enter(self, key: str, lease: str, bound: int, now: float) -> Taken:
        held = self._leases.setdefault(key, set())
        if len(held) >= bound:
            return Taken(False, len(held), bound, 1.0)
        held.add(lease)
        return Taken(True, len(held), bound, 0.0)

    async def leave(self, key: str, lease: str) -> None:
        self._leases.get(key, set()).discard(lease)
