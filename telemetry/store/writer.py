"""The embedded trajectory store: a span processor that writes the `tool.call`, `chat` and request
spans into SQLite (`telemetry.store.records`), so the store says exactly what the traces say.

The request path only turns the ended span into its record and puts that on a queue (`on_end`;
and, while a whole batch waits, gives the writer the GIL now and then: `_make_way`). One thread of
the store's own takes the records off in batches (what arrives within `linger_seconds`, see
`_batch`), turns them into rows and writes each batch in one transaction, then keeps the file
within its bounds: trajectories older than the age limit go, and the oldest go first when the rows
near the size limit (which SQLite also enforces as a page cap, so the file never outgrows it; its
write-ahead log adds about 32 MiB at most, see `schema.connect`). A batch that does not fit makes
its room from the oldest trajectories, as many as it takes (`_fit`): at the limit the store keeps
the new and loses the old, never the other way round.

A store that cannot write (disk full or broken, file read-only or its directory gone, or any other
error writing a batch) never fails a request, nor stops the writer: the batch's spans are dropped,
counted (`dropped(reason, n)`) and logged once per run of failures.
A file deleted under it is created anew. A file whose write permission was taken away (chmod) is
treated as read-only even by root, who could still write it: that is what the operator asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from queue import Empty, SimpleQueue

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import SpanKind

from telemetry import names
from telemetry.store.records import prune, prune_orphans, used_bytes, write
from telemetry.store.schema import connect
from telemetry.store.span_records import SpanRecord, kind_of, record_of

log = logging.getLogger("toolspan.store")

_HIGH, _LOW = 0.9, 0.7  # past _HIGH of the size limit, the oldest trajectories go until under _LOW
_ORPHAN_CHECK_SECONDS = 60.0
_MAKE_WAY_SECONDS = 0.005  # CPython's default switch interval
_Item = SpanRecord | threading.Event | None  # a span's record; a flush marker; None: stop


class _ReadOnly(OSError):
    pass


def _ended_from(records: list[SpanRecord]) -> float | None:
    """When the first of the requests among `records` ended (seconds since the epoch): every
    trajectory they wrote ended then or later. None: they wrote no trajectory."""
    ends = [r.end_ns for r in records if kind_of(r) == "request"]
    return min(ends) / 1e9 if ends else None


def _wanted(span: ReadableSpan) -> bool:
    """A cheap first cut on the request path; the writer decides exactly (records.kind_of)."""
    return (span.name == names.SPAN_TOOL_CALL or span.kind is SpanKind.SERVER
            or (span.kind is SpanKind.CLIENT and span.name.startswith(names.SPAN_CHAT_PREFIX))
            or (span.name == names.SPAN_TOOL_EXECUTE  # a client call's execute step (the gateway's own: no side)
                and (span.attributes or {}).get(names.ATTR_TOOL_SIDE) == names.SIDE_CLIENT))


class TrajectoryStore(SpanProcessor):
    def __init__(self, path: Path, *, max_bytes: int = 256 * 2**20, max_age_days: float = 30.0,
                 dropped: Callable[[str, int], None] | None = None, max_pending: int = 100_000,
                 batch_size: int = 1024, linger_seconds: float = 0.2, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self._max_bytes = max_bytes
        self._max_age = max_age_days * 86400.0
        self._dropped = dropped or (lambda reason, count: None)
        self._max_pending = max_pending
        self._batch_size = batch_size
        self._linger = linger_seconds
        self._clock = clock
        self._queue: SimpleQueue[_Item] = SimpleQueue()
        self._hurry = threading.Event()  # a flush, a stop or a whole batch is waiting: end the batch now
        self._db: sqlite3.Connection | None = None  # the writer thread's alone
        self._inode: int | None = None
        self._failing = False
        self._overflowing = False  # the last batch was larger than the whole store
        self._orphans_at = float("-inf")
        self._stopped = False
        self._next_way = float("-inf")  # when the request path may next give the writer the GIL
        self._thread = threading.Thread(target=self._run, name="toolspan-trajectory-store", daemon=True)
        self._thread.start()

    # --- the request path ------------------------------------------------------------------------

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        """The span's record queued for the writer. Its record rather than the span: a queued SDK span
        holds many more objects the garbage collector tracks than a record, and the hundreds a busy
        gateway has queued at any time made the collector run often, each run a pause on the request
        path; with records it hardly runs, and the record's cost moved here from the writer without
        changing the CPU per request (docs/benchmarks.md)."""
        if not _wanted(span) or self._stopped:
            return
        waiting = self._queue.qsize()
        if waiting >= self._max_pending:  # the writer cannot keep up: memory stays bounded
            self._dropped(names.STORE_DROP_BACKLOG, 1)
            return
        try:
            record = record_of(span)
        except Exception:  # not one of the SDK's spans, which always convert: it must not fail their end
            log.exception("trajectory store %s: a span could not be read, and is dropped", self.path)
            self._dropped(names.STORE_DROP_WRITE, 1)
            return
        self._queue.put(record)
        if waiting + 1 >= self._batch_size:  # a whole batch is waiting: no reason to linger
            self._hurry.set()
            self._make_way()

    def _make_way(self) -> None:
        """Lets the writer have the GIL while a whole batch or more waits for it, at most once every
        _MAKE_WAY_SECONDS. sqlite3 gives the GIL up at every statement, and an event loop that is
        never idle takes it back before the writer can, until the switch interval forces a
        hand-over: the writer fell behind, and the spans waiting for it were what the gateway's
        memory grew by (bench/soak.py, over its bound).
        `time.sleep(0)` here is a real sleep on Linux, of about the timer slack (CPython gh-125997):
        long enough for the writer to take the GIL. Once every switch interval, the soak stays
        within its bound; and a writer that cannot use the GIL (waiting for another worker's lock on
        the file, or for the disk) costs the event loop at most one such short sleep every switch
        interval, a small share of its time (docs/benchmarks.md)."""
        now = time.monotonic()
        if now >= self._next_way:
            self._next_way = now + _MAKE_WAY_SECONDS
            time.sleep(0)

    # --- flushing and stopping -------------------------------------------------------------------

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Waits until every span ended before the call is written (or dropped)."""
        if self._stopped:
            return True
        done = threading.Event()
        self._queue.put(done)
        self._hurry.set()
        return done.wait(timeout)

    async def flushed(self) -> bool:
        """`flush`, awaited without blocking the event loop."""
        return await asyncio.to_thread(self.flush)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.flush(timeout_millis / 1000)

    def shutdown(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._queue.put(None)
        self._hurry.set()
        self._thread.join(30.0)

    # --- the writer thread -----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            items = self._batch()
            records = [item for item in items if isinstance(item, SpanRecord)]
            if records:
                self._write(records)
            for item in items:
                if isinstance(item, threading.Event):
                    item.set()
            if any(item is None for item in items):
                self._close()
                return

    def _batch(self) -> list[_Item]:
        """The next batch: once a span comes, what arrives within `linger_seconds`, up to
        `batch_size`; a flush, a stop or a whole batch waiting ends the wait at once (a writer that
        lingered behind a full queue fell behind a busy gateway for good). Lingering makes the
        batches of a busy gateway large, and much of a transaction's cost is per transaction, not
        per row: a request's rows cost several times more to write in batches of one request than
        in batches of a hundred, and lingering lowered the gateway's CPU per plain request.
        The writer sleeps through the lingering instead of taking each span as it comes: woken for
        every span, it showed in a busy gateway's profile, in `on_end` (the wake-up, on the request
        path) and in this loop; sleeping, neither shows.
        Batches of up to 1024 spans: in a tool round (four or five spans a request) the writer took
        less CPU per request than with 512, and a plain request's cost did not change. What a batch
        holds while it is written (its records; their rows, SQLite's copies) is much of what the
        store adds to the gateway's memory at full load, and `bench/soak.py` stays within its bound
        with batches of 1024 records. The figures are in docs/benchmarks.md."""
        items = [self._queue.get()]
        if isinstance(items[0], SpanRecord) and self._queue.qsize() < self._batch_size:
            self._hurry.wait(self._linger)
        self._hurry.clear()  # a later flush: taken by this batch, or at worst it waits out the next lingering
        while len(items) < self._batch_size and isinstance(items[-1], SpanRecord):
            try:
                items.append(self._queue.get_nowait())
            except Empty:
                break
        return items

    def _write(self, records: list[SpanRecord]) -> None:
        try:
            db = self._open()
            written = self._fit(db, records)
        except Exception as exc:  # the disk or the file; or a span no row can hold: the batch only is lost
            self._lost(records, exc)
            self._close()  # the next batch opens afresh: the file may be back, or writable again
            return
        if written < len(records):
            self._too_large(records[:len(records) - written])
        else:
            self._overflowing = False
        if self._failing:
            log.warning("trajectory store %s: writing again", self.path)
        self._failing = False
        try:
            self._maintain(db, _ended_from(records[len(records) - written:]))
        except Exception as exc:  # the batch is written: only the pruning failed, and the next batch tries again
            log.warning("trajectory store %s: cannot prune (%s)", self.path, exc)
            self._close()

    def _fit(self, db: sqlite3.Connection, records: list[SpanRecord]) -> int:
        """Writes the batch, the oldest trajectories going while it does not fit: a quarter of them,
        then twice as many each time (a few tries, however large the batch). New data is never the
        first to go: only a batch that does not fit in an empty store loses its oldest part
        (`_newest_that_fit`). Returns how many of `records` (the newest) were written.
        "Fits" is SQLite's to judge: its page cap (`records.connect`) counts the pages freed by
        deleted rows (the freelist) as room, and every try but the last deletes at least one
        trajectory (or, none being left, the rows of none), so the loop ends."""
        doomed = 0
        while not self._tried(db, records):
            total, _ = self._count(db)
            if total == 0 and not self._prune_orphans(db):
                return self._newest_that_fit(db, records)
            if total > 0:
                doomed = max(1, total // 4) if doomed == 0 else 2 * doomed
                self._prune(db, oldest=doomed)
        return len(records)

    def _prune_orphans(self, db: sqlite3.Connection) -> int:
        """With no trajectory left to make room, the rows of none go, however new: turns and calls
        still waiting for a request that a batch too large lost (they would hold the room for good).
        Returns how many rows."""
        db.execute("BEGIN IMMEDIATE")
        try:
            deleted = prune_orphans(db, before=float("inf"))
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        return deleted

    def _tried(self, db: sqlite3.Connection, records: list[SpanRecord]) -> bool:
        """Whether the batch was written: False when it did not fit (rolled back whole)."""
        try:
            self._transaction(db, records)
        except sqlite3.OperationalError as exc:
            if "full" not in str(exc):
                raise
            return False
        return True

    def _newest_that_fit(self, db: sqlite3.Connection, records: list[SpanRecord]) -> int:
        """The longest newest part of a batch that fits in the store, written; how many records it
        holds (found by bisection: a dozen tries for the largest batch). A part that fits is
        committed, and a longer one tried after it writes those rows again as they are (every
        insert replaces its row), so it needs room only for what it adds."""
        fits, too_many = 0, len(records)
        while too_many - fits > 1:
            middle = (fits + too_many) // 2
            if self._tried(db, records[-middle:]):
                fits = middle
            else:
                too_many = middle
        return fits

    def _too_large(self, lost: list[SpanRecord]) -> None:
        """The oldest part of a batch larger than the whole store, not written: counted, and logged
        once per run of such batches."""
        self._count_lost(lost)
        if not self._overflowing:
            log.warning("trajectory store %s: a batch of spans is larger than the whole store (max_bytes %d); "
                        "its oldest spans are dropped (and counted in %s)", self.path, self._max_bytes,
                        names.METRIC_TRAJECTORY_STORE_DROPPED)
        self._overflowing = True

    def _transaction(self, db: sqlite3.Connection, records: list[SpanRecord]) -> None:
        """The batch, and the trajectories past the age limit gone (an index lookup: cheap enough
        for every batch, so that nothing older is ever read)."""
        db.execute("BEGIN IMMEDIATE")
        try:
            write(db, records)
            prune(db, before=self._clock() - self._max_age)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def _open(self) -> sqlite3.Connection:
        """The connection, opened anew when the file was deleted or replaced."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            stat = None
        if self._db is not None and (stat is None or stat.st_ino != self._inode):
            self._close()
        if stat is not None and not stat.st_mode & 0o222:
            raise _ReadOnly(f"{self.path} is read-only")
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = connect(str(self.path), self._max_bytes)
            self._inode = os.stat(self.path).st_ino
        return self._db

    def _maintain(self, db: sqlite3.Connection, spare_from: float | None) -> None:
        """Past _HIGH of the size limit, the oldest trajectories go until under _LOW, so that not
        every batch must make room; never those the batch just written touched (they ended at or
        after `spare_from`): a batch that fits is kept whole, and the next batch makes room from the
        oldest if it needs to (`_fit`). Each round deletes at least one trajectory, so the loop ends."""
        now = self._clock()
        if now - self._orphans_at >= _ORPHAN_CHECK_SECONDS:  # a scan of the turns: not every batch
            self._orphans_at = now
            prune_orphans(db, before=now - self._max_age)
        while (used := used_bytes(db)) > _HIGH * self._max_bytes:
            total, older = self._count(db, spare_from)
            if older == 0:
                return
            target = _LOW * self._max_bytes / used  # the share of trajectories to keep, roughly
            self._prune(db, oldest=max(1, int(total * (1 - target))), spare_from=spare_from)

    def _prune(self, db: sqlite3.Connection, *, oldest: int, spare_from: float | None = None) -> None:
        """The `oldest` trajectories (of those that ended before `spare_from`) and those past the age
        limit deleted, in a transaction of their own."""
        db.execute("BEGIN IMMEDIATE")
        try:
            prune(db, before=self._clock() - self._max_age, oldest=oldest, spare_from=spare_from)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    @staticmethod
    def _count(db: sqlite3.Connection, spare_from: float | None = None) -> tuple[int, int]:
        """How many trajectories the store holds, and how many of them ended before `spare_from`."""
        total, older = db.execute("SELECT COUNT(*), COALESCE(SUM(ended < ?), 0) FROM trajectories",
                                  (float("inf") if spare_from is None else spare_from,)).fetchone()
        return int(total), int(older)

    def _lost(self, records: list[SpanRecord], exc: BaseException) -> None:
        self._count_lost(records)
        if not self._failing:
            log.warning("trajectory store %s: cannot write (%s); trajectories are dropped (and counted in %s) "
                        "until it can", self.path, exc, names.METRIC_TRAJECTORY_STORE_DROPPED)
        self._failing = True

    def _count_lost(self, records: list[SpanRecord]) -> None:
        """Counts the spans of `records` that would have been rows: the tool calls, the model turns,
        and the requests of those."""
        kinds = [kind_of(r) for r in records]
        parents = {r.parent_span_id for r, k in zip(records, kinds, strict=True) if k in ("tool_call", "model_turn")}
        lost = sum(k in ("tool_call", "model_turn") or (k == "request" and r.span_id in parents)
                   for r, k in zip(records, kinds, strict=True))
        if lost:
            self._dropped(names.STORE_DROP_WRITE, lost)

    def _close(self) -> None:
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
            self._db = None
