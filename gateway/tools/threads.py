"""The threads sync tool bodies run on: a pool of their own, bounded, that refuses when full.

A sync body cannot be stopped: when its call times out, the executor stops waiting but the thread
runs on. On the loop's default executor such threads would starve every other sync tool (and
whatever else uses that executor); here they only fill this pool, and once every thread is taken
a new call is refused at once (ToolsBusy), which the tool's outcome reports to the model.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


class ToolsBusy(Exception):
    """Every thread of the pool is taken (by bodies still running, timed out or not)."""

    def __init__(self, size: int) -> None:
        super().__init__(f"all {size} tool threads are busy")
        self.size = size


class ToolThreads:
    """At most `size` sync bodies at a time, each on a thread of this pool; `close()` ends it."""

    def __init__(self, size: int = 16) -> None:
        if size < 1:
            raise ValueError("a tool thread pool needs at least one thread")
        self.size = size
        self._lock = threading.Lock()
        self._running = 0  # bodies running now; a worker thread counts its own down when its body returns
        self._pool = ThreadPoolExecutor(max_workers=size, thread_name_prefix="toolspan-tool")

    @property
    def busy(self) -> int:
        """Threads running a body now (a body that timed out counts until it returns)."""
        return self._running

    async def run(self, call: Callable[[], Any]) -> Any:
        """`call()` on a thread of the pool, in the caller's context (its span, say); raises
        ToolsBusy at once when no thread is free. Cancelling the wait leaves the thread running,
        and taken, until the body returns."""
        with self._lock:
            if self._running >= self.size:
                raise ToolsBusy(self.size)
            self._running += 1
        try:
            future = self._pool.submit(contextvars.copy_context().run, call)
        except BaseException:  # the pool is shut down
            self._release()
            raise
        future.add_done_callback(self._release)
        return await asyncio.wrap_future(future)

    def _release(self, future: Future[Any] | None = None) -> None:
        with self._lock:
            self._running -= 1

    def close(self) -> None:
        """Stop taking calls; bodies still running are not waited for (they cannot be stopped)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
