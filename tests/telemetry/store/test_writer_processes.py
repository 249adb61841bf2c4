"""One trajectory store file written by several processes at once, as the workers of
`toolspan serve --workers N` write it: nothing is lost, the file's creation included."""

from __future__ import annotations

import multiprocessing
import sqlite3
import threading
from multiprocessing.synchronize import Barrier
from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind

from telemetry import names
from telemetry.store.schema import connect
from telemetry.store.writer import TrajectoryStore

PROCESSES = 4
TRAJECTORIES = 150  # each process's


def _write(path: Path, index: int, start: Barrier) -> int:
    """A store of its own on the shared file, fed one request span and one tool call span per
    trajectory, flushed every few trajectories (many small transactions); returns the spans it
    dropped."""
    dropped: list[int] = []
    store = TrajectoryStore(path, dropped=lambda reason, count: dropped.append(count))
    provider = TracerProvider()
    provider.add_span_processor(store)
    tracer = provider.get_tracer("test")
    start.wait()  # every process opens the new file at the same moment
    for number in range(TRAJECTORIES):
        trajectory = {names.ATTR_CONVERSATION_ID: f"worker{index}-{number}"}
        with tracer.start_as_current_span("POST /v1/chat/completions", kind=SpanKind.SERVER, attributes=trajectory), \
                tracer.start_as_current_span(names.SPAN_TOOL_CALL, attributes={**trajectory,
                                                                                 names.ATTR_TOOL_NAME: "add"}):
            pass
        if number % 5 == 0:
            store.flush()
    provider.shutdown()
    return sum(dropped)


def _worker(path: Path, index: int, start: Barrier, results: multiprocessing.SimpleQueue[int]) -> None:
    results.put(_write(path, index, start))


def test_several_processes_write_one_store_without_losing_a_span(tmp_path: Path) -> None:
    path = tmp_path / "shared.sqlite3"
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(PROCESSES)
    results: multiprocessing.SimpleQueue[int] = context.SimpleQueue()
    processes = [context.Process(target=_worker, args=(path, index, start, results)) for index in range(PROCESSES)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
    assert [process.exitcode for process in processes] == [0] * PROCESSES
    assert [results.get() for _ in processes] == [0] * PROCESSES  # nothing dropped
    db = sqlite3.connect(path)
    expected = PROCESSES * TRAJECTORIES
    assert db.execute("SELECT COUNT(*) FROM tool_calls").fetchone()[0] == expected
    assert db.execute("SELECT COUNT(*) FROM requests").fetchone()[0] == expected
    assert db.execute("SELECT COUNT(*) FROM trajectories").fetchone()[0] == expected
    db.close()


def test_a_new_file_another_process_is_setting_up_is_waited_for(tmp_path: Path) -> None:
    """While another connection holds the new file's write lock (its schema half made), SQLite
    refuses the switch to WAL at once, without its busy handler: `connect` waits and tries again."""
    path = tmp_path / "new.sqlite3"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("CREATE TABLE setting_up (x)")
    other.execute("BEGIN IMMEDIATE")
    other.execute("INSERT INTO setting_up VALUES (1)")
    release = threading.Timer(0.2, other.execute, ("COMMIT",))  # the lock held a moment, then let go
    release.start()
    db = connect(str(path))
    release.join()
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("SELECT COUNT(*) FROM setting_up").fetchone()[0] == 1
    db.close()
    other.close()
