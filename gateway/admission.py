"""Requests under way: at most so many at once, and a way to wait until none is left."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

from gateway.errors import Unavailable

OPERATIONS = frozenset({"/healthz", "/readyz", "/metrics"})  # answered under any load, and never counted


class Admission:
    """Admits requests up to `limit` at once. One more is refused at once (503, retry-after): a
    queue would only make every caller wait longer, and grow without bound. Health and metrics
    requests pass uncounted, so that probes still see the gateway when it is full."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def count(self) -> int:
        return self._count

    @contextmanager
    def admit(self, path: str) -> Iterator[None]:
        if path in OPERATIONS:
            yield
            return
        if self._count >= self._limit:
            raise Unavailable(f"the gateway is handling {self._limit} requests already; send it again shortly",
                              code="overloaded")
        self._count += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._count -= 1
            if self._count == 0:
                self._idle.set()

    async def drained(self, within: float) -> bool:
        """Wait until no request is under way, at most `within` seconds; whether none is."""
        try:
            async with asyncio.timeout(within):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True
