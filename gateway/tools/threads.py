"""The threads sync tool bodies run on: a pool of their own, bounded, that refuses when stuck.

A sync body cannot be stopped: when its call times out, the executor stops waiting but the thread
runs on. On the loop's default executor such threads would starve every other sync tool (and
whatever else uses that executor); here they only take threads of this pool. A call waits for a
free thread within its own time limit, as on any executor; but once every thread is held by a body
whose call gave up, no thread will come free in time, and a new call is refused at once
(ToolsBusy), which the tool's outcome reports to the model.

The threads are daemon threads: a body that never returns must not keep the process from exiting
(ThreadPoolExecutor's workers are joined at exit, whatever `shutdown(wait=False)` says).
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any


class ToolsBusy(Exception):
    """Every thread of the pool is held by a body that outlived its call."""

    def __init__(self, size: int) -> None:
        super().__init__(f"all {size} tool threads are busy")
        self.size = size


@dataclass
class _Job:
    call: Callable[[], Any]
    future: Future[Any] = field(default_factory=Future)
    abandoned: bool = False  # its call stopped waiting while it ran


class ToolThreads:
    """At most `size` sync bodies at a time, each on a thread of this pool; `close()` ends it."""

    def __init__(self, size: int = 16) -> None:
        if size < 1:
            raise ValueError("a tool thread pool needs at least one thread")
        self.size = size
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._running = 0  # bodies running now
        self._idle = 0  # threads free for a call not yet handed to one (negative: calls queued)
        self._abandoned = 0  # of those, bodies whose call gave up on them
        self._closed = False

    @property
    def busy(self) -> int:
        """Threads running a body now (a body that timed out counts until it returns)."""
        return self._running

    async def run(self, call: Callable[[], Any]) -> Any:
        """`call()` on a thread of the pool, in the caller's context (its span, say). Waits for a
        free thread; raises ToolsBusy at once when every thread is held by an abandoned body.
        Cancelling the wait leaves a running body running, and its thread taken, until it returns."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the tool thread pool is closed")
            if self._abandoned >= self.size:
                raise ToolsBusy(self.size)
            if self._idle == 0 and len(self._threads) < self.size:
                self._start_one()  # threads start as calls need them, as ThreadPoolExecutor's do
            self._idle -= 1  # this call's thread: taken from now on, as far as the next call can tell
        job = _Job(_in_context(call))
        self._jobs.put(job)
        try:
            return await asyncio.wrap_future(job.future)
        except asyncio.CancelledError:  # the call's time ran out, or its request ended
            with self._lock:
                if job.future.running():
                    job.abandoned = True
                    self._abandoned += 1
            raise

    def _start_one(self) -> None:
        thread = threading.Thread(target=self._work, name=f"toolspan-tool-{len(self._threads)}", daemon=True)
        thread.start()
        self._threads.append(thread)
        self._idle += 1

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            if job.future.set_running_or_notify_cancel():
                with self._lock:
                    self._running += 1
                try:
                    job.future.set_result(job.call())
                except BaseException as exc:  # the body's own failure, delivered to its call
                    job.future.set_exception(exc)
                with self._lock:
                    self._running -= 1
                    self._abandoned -= job.abandoned
            # else its call gave up before a thread was free
            with self._lock:
                self._idle += 1

    def close(self) -> None:
        """Take no more calls; bodies still running are not waited for (they cannot be stopped)."""
        with self._lock:
            self._closed = True
            for _ in self._threads:
                self._jobs.put(None)


def _in_context(call: Callable[[], Any]) -> Callable[[], Any]:
    context = contextvars.copy_context()
    return lambda: context.run(call)
