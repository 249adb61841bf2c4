"""Upstreams cooling down (issue 55): `failures` retryable failures within `window_seconds` take an
upstream out of its routes for `seconds`; the first call after that is its probe (a failure puts it
back at once, a success clears its record). Kept in this process's memory, or in Redis so that
replicas agree (gateway.state's Redis, under keys of its own)."""

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


class Cooldowns(Protocol):
    """Which upstreams are cooling down, and what their calls did."""

    async def cooling(self, names: Collection[str]) -> dict[str, float]:
        """Of `names`, those cooling down, with the seconds until each comes back; 0 or less: its
        time is up and its probe has not answered yet."""

    async def failed(self, name: str) -> bool:
        """A retryable failure of `name`; whether it now cools down."""

    async def succeeded(self, name: str) -> None:
        """`name` answered: its failures are forgotten."""


@dataclass
class _Record:
    failures: deque[float] = field(default_factory=deque)
    until: float = 0.0
    probing: bool = False  # it was taken out, and no call to it has answered since


class MemoryCooldowns:
    """Cooldowns in this process's memory."""

    def __init__(self, rule: CooldownRule, clock: Callable[[], float] = time.monotonic) -> None:
        self.rule = rule
        self._clock = clock
        self._records: dict[str, _Record] = {}

    async def cooling(self, names: Collection[str]) -> dict[str, float]:
        now = self._clock()
        return {name: record.until - now for name in names
                if (record := self._records.get(name)) is not None and record.probing}

    async def failed(self, name: str) -> bool:
        now = self._clock()
        record = self._records.setdefault(name, _Record())
        if record.until > now:
            return False  # already cooling
        failures = record.failures
        failures.append(now)
        while failures and failures[0] <= now - self.rule.window_seconds:
            failures.popleft()
        if record.probing or len(failures) >= self.rule.failures:
            record.until, record.probing = now + self.rule.seconds, True
            failures.clear()
            return True
        return False

    async def succeeded(self, name: str) -> None:
        self._records.pop(name, None)
