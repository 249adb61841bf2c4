"""Upstreams cooling down (issue 55): `failures` retryable failures within `window_seconds` take an
upstream out of its routes for `seconds`. Back from that, it is on probation for a window: a
failure then puts it back out at once, a success (or a window without failure) ends the probation.
Kept in this process's memory (`MemoryCooldowns`), or in Redis so that replicas agree
(gateway.state.redis_cooldowns, under the state store's keys; `StateStore.cooldowns` makes either)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class CooldownRule:
    failures: int = 3
    window_seconds: float = 30.0
    seconds: float = 30.0

    def probation_ends(self, cooled_at: float) -> float:
        """When the probation of an upstream cooled down at `cooled_at` ends. It lasts a window so that
        an upstream whose probe's success went unreported (its cooldown ran out, and its next call
        was an ordinary one) is not put out by one failure for ever after."""
        return cooled_at + self.seconds + self.window_seconds


class Cooldowns(Protocol):
    """Which upstreams are cooling down, and what their calls did."""

    async def cooling(self, names: Collection[str]) -> dict[str, float]:
        """Of `names`, those cooling down, with the seconds until each comes back, and those on
        probation (0 or less: back, and a call to one is its probe, whose success ends it)."""

    async def failed(self, name: str) -> bool:
        """A retryable failure of `name`; whether it now cools down."""

    async def succeeded(self, name: str) -> None:
        """`name` answered: its failures are forgotten."""


@dataclass
class _Record:
    failures: deque[float] = field(default_factory=deque)
    until: float = 0.0
    probation: float = 0.0  # until then, back from its cooldown, one failure puts it out again


class MemoryCooldowns:
    """Cooldowns in this process's memory (one record per upstream that failed: as many as the
    configuration names, at most)."""

    def __init__(self, rule: CooldownRule, clock: Callable[[], float] = time.monotonic) -> None:
        self.rule = rule
        self._clock = clock
        self._records: dict[str, _Record] = {}

    async def cooling(self, names: Collection[str]) -> dict[str, float]:
        now = self._clock()
        return {name: record.until - now for name in names
                if (record := self._records.get(name)) is not None and record.probation > now}

    async def failed(self, name: str) -> bool:
        now = self._clock()
        record = self._records.setdefault(name, _Record())
        if record.until > now:
            return False  # already cooling
        failures = record.failures
        failures.append(now)
        while failures and failures[0] <= now - self.rule.window_seconds:
            failures.popleft()
        if now < record.probation or len(failures) >= self.rule.failures:
            record.until, record.probation = now + self.rule.seconds, self.rule.probation_ends(now)
            failures.clear()
            return True
        return False

    async def succeeded(self, name: str) -> None:
        self._records.pop(name, None)
