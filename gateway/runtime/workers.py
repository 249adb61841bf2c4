"""`toolspan serve --workers N`: the supervisor, and what each worker process is handed.

The supervisor starts N worker processes (multiprocessing's spawn: a fresh interpreter each, none
of the parent's threads or sockets), each running the gateway as `toolspan serve` does, on the
same port (SO_REUSEPORT: the kernel spreads the connections), with its own event loop. The
supervisor never listens itself. It waits until every worker listens, then logs the start-up
lines once.

On SIGTERM or SIGINT it sends SIGTERM to every worker, which stops taking connections, gives its
requests their grace period and flushes its spans (gateway.cli.main._serve, gateway.app._wind_down),
and waits for them: up to the grace period, the wrap-up and STOP_MARGIN_SECONDS; a worker still
running then is killed. The exit code is 0 when every worker stopped cleanly.

On SIGHUP, once every worker listens, it passes the signal on to each of them: each reads its
settings again and puts their limits in place (gateway.runtime.reload). A SIGHUP before then is
only logged (a worker may not handle it yet, and it would end it).

A worker that ends on its own (a crash, the OOM killer) is not restarted: the supervisor stops the
others and exits 1, for the orchestrator (systemd, Kubernetes, compose) to restart the whole. A
worker whose supervisor is gone (SIGKILL) stops by itself.

The run directory (made here, removed at exit) holds each worker's metrics socket
(gateway.http.metrics_page)."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from gateway.app import SHUTDOWN_WRAP_UP_SECONDS

log = logging.getLogger("toolspan")

STOP_MARGIN_SECONDS = 10.0  # past the grace and the wrap-up: the runner's last second, the spans' export


class WorkerFailed(Exception):
    """A worker could not start (its tools, its port ...): the operator's message, said once."""


@dataclass(frozen=True)
class WorkerSlot:
    """Which worker this is, of how many, and where their metrics sockets are."""

    index: int
    count: int
    run_dir: Path

    def socket(self, index: int) -> Path:
        return self.run_dir / f"worker-{index}.sock"

    def own_socket(self) -> Path:
        return self.socket(self.index)

    def peer_sockets(self) -> list[Path]:
        return [self.socket(i) for i in range(self.count) if i != self.index]


@dataclass
class Worker:
    """What a worker process is handed: its slot, and its line to the supervisor (a pipe the
    supervisor only reads; its end closing means the supervisor is gone)."""

    slot: WorkerSlot
    line: Connection

    def listening(self, lines: list[str]) -> None:
        """Tells the supervisor this worker listens; `lines` are its start-up lines."""
        self.line.send(("listening", lines))

    def failed(self, message: str) -> None:
        self.line.send(("failed", message))

    def on_supervisor_gone(self, stop: Callable[[], None]) -> None:
        """Calls `stop` (once) when the supervisor's end of the line closes."""
        loop = asyncio.get_running_loop()

        def gone() -> None:
            loop.remove_reader(self.line.fileno())
            log.warning("worker %d: its supervisor is gone; stopping", self.slot.index)
            stop()

        loop.add_reader(self.line.fileno(), gone)


def _readable(fd: int) -> asyncio.Future[None]:
    """Done when `fd` can be read: a message or the end of a pipe, a process's end (its sentinel)."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, readable)
    ready.add_done_callback(lambda _: loop.remove_reader(fd))  # done or cancelled: no longer watched
    return ready


class _Running:
    """One worker process, as the supervisor sees it."""

    def __init__(self, process: BaseProcess, line: Connection, slot: WorkerSlot) -> None:
        self.process = process
        self.line = line
        self.slot = slot
        self.ended = asyncio.ensure_future(self._end())
        self.killed = False

    async def _end(self) -> None:
        await _readable(self.process.sentinel)
        self.process.join()  # its sentinel closed as it exited: reaped at once, its exit code known

    @property
    def name(self) -> str:
        return f"worker {self.slot.index} (pid {self.process.pid})"

    async def word(self) -> tuple[str, Any]:
        """What the worker says once it listens or cannot; ("ended", None) if it ends without a word."""
        await _readable(self.line.fileno())
        try:
            said: tuple[str, Any] = self.line.recv()
        except EOFError:
            return ("ended", None)
        return said

    def how_it_ended(self) -> str:
        code = self.process.exitcode
        if code is not None and code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return f"exit code {code}"


def _start(work: Callable[[Worker], None], slot: WorkerSlot) -> _Running:
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    process = context.Process(target=work, args=(Worker(slot, theirs),), name=f"toolspan-worker-{slot.index}")
    process.start()
    theirs.close()  # the worker has its own copy: its end closes when it ends
    return _Running(process, ours, slot)


async def _started(workers: list[_Running], stop: asyncio.Event) -> list[str] | None:
    """The first worker's start-up lines once every worker listens; None when told to stop first.
    Raises WorkerFailed when a worker cannot start or ends before it listens."""
    words = [asyncio.ensure_future(worker.word()) for worker in workers]
    stopped = asyncio.ensure_future(stop.wait())
    try:
        while not all(word.done() for word in words):
            await asyncio.wait([stopped, *words], return_when=asyncio.FIRST_COMPLETED)
            for worker, word in zip(workers, words, strict=True):
                kind, said = word.result() if word.done() else ("", None)
                if kind == "failed":
                    raise WorkerFailed(said)
                if kind == "ended":
                    await worker.ended
                    raise WorkerFailed(f"{worker.name} ended before it listened ({worker.how_it_ended()})")
            if stopped.done():
                return None
    finally:
        stopped.cancel()
        for word in words:
            word.cancel()
    lines: list[str] = words[0].result()[1]
    return lines


def _hang_up(workers: list[_Running], listening: asyncio.Event) -> None:
    """SIGHUP, passed on to every worker still running, once they all listen."""
    if not listening.is_set():
        log.warning("SIGHUP while the workers start: nothing reloaded (they read the settings as they start)")
        return
    running = [worker.process.pid for worker in workers if not worker.ended.done()]
    log.info("SIGHUP: passed on to %d workers, each to read the settings again", len(running))
    for pid in running:
        if pid is not None:
            os.kill(pid, signal.SIGHUP)


async def _serve(workers: list[_Running], stop: asyncio.Event, grace_seconds: float,
                 listening: asyncio.Event) -> bool:
    """Every worker started and running until SIGTERM or SIGINT (True), or until one ends (False);
    `listening` is set once every worker listens."""
    lines = await _started(workers, stop)
    if lines is None:
        return True
    listening.set()
    for line in lines:
        log.info("%s", line)
    log.info("workers: %d processes on the port (pids %s)", len(workers),
             ", ".join(str(worker.process.pid) for worker in workers))
    stopped = asyncio.ensure_future(stop.wait())
    waits: list[asyncio.Future[Any]] = [stopped, *(worker.ended for worker in workers)]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    gone = next((worker for worker in workers if worker.ended.done()), None)
    if gone is not None:
        log.error("%s ended on its own (%s): stopping the other workers, then exiting with code 1 for the "
                  "orchestrator to start toolspan again", gone.name, gone.how_it_ended())
        return False
    log.info("stopping %d workers: no new connections; requests under way have %g s to finish",
             len(workers), grace_seconds)
    return True


async def _stop(workers: list[_Running], within: float) -> bool:
    """SIGTERM to every worker, and a wait for them all, `within` seconds at most; then SIGKILL to
    those still running. Whether every one stopped cleanly."""
    for worker in workers:
        if not worker.ended.done():
            worker.process.terminate()
    running = [worker.ended for worker in workers if not worker.ended.done()]
    if running:
        await asyncio.wait(running, timeout=within)
    for worker in workers:
        if not worker.ended.done():
            log.warning("%s did not stop within %g s: killing it", worker.name, within)
            worker.killed = True
            worker.process.kill()
            await worker.ended
        worker.line.close()
    # A worker ended by SIGTERM itself was still starting (no handler yet): it had no request.
    return all(not w.killed and w.process.exitcode in (0, -signal.SIGTERM) for w in workers)


async def supervise(work: Callable[[Worker], None], count: int, grace_seconds: float) -> int:
    """Runs `count` workers (`work` is each one's main, given its Worker; it must be picklable: a
    module-level function or a partial of one) until SIGTERM or SIGINT, or until one ends. Returns
    the exit code: 0 when stopped by a signal and every worker stopped cleanly, else 1. Raises
    WorkerFailed when a worker cannot start (after stopping the others)."""
    loop = asyncio.get_running_loop()
    stop, listening = asyncio.Event(), asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    workers: list[_Running] = []
    loop.add_signal_handler(signal.SIGHUP, _hang_up, workers, listening)
    within = grace_seconds + SHUTDOWN_WRAP_UP_SECONDS + STOP_MARGIN_SECONDS
    with tempfile.TemporaryDirectory(prefix="toolspan-workers-") as run_dir:
        try:
            for index in range(count):
                workers.append(_start(work, WorkerSlot(index, count, Path(run_dir))))
            signalled = await _serve(workers, stop, grace_seconds, listening)
        finally:
            clean = await _stop(workers, within)
    return 0 if signalled and clean else 1
