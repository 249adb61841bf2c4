"""Requests under way: at most so many at once, and a way to wait until none is left."""

from __future__ import annotations

import asyncio
from contextlib import AbstractContextManager, nullcontext

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
        self._uncounted: AbstractContextManager[None] = nullcontext()  # holds nothing: made once

    @property
    def count(self) -> int:
        return self._count

    def admit(self, path: str) -> AbstractContextManager[None]:
        """The scope of one request to `path`: counted (a 503 on entering it when `limit` are under
        way already), unless it is an operations request. Plain objects, not a generator-based
        context manager, which costs several times as much on every request (see
        NoInstrumentation)."""
        return self._uncounted if path in OPERATIONS else self

    def __enter__(self) -> None:
        """One more counted request; a 503 when `limit` are under way already."""
        if self._count >= self._limit:
            raise Unavailable(f"the gateway is handling {self._limit} requests already; send it again shortly",
                              code="overloaded")
        self._count += 1
        self._idle.clear()

    def __exit__(self, *exc_info: object) -> None:
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
