"""The trajectory database's schema (its tables are `telemetry.store.columns`'), the migrations
of a store an older toolspan wrote, and the connection the store's writer keeps."""

from __future__ import annotations

import sqlite3
import time

from telemetry.store.columns import BASE_VERSION, SCHEMA_VERSION, TABLES

__all__ = ["BUSY_TIMEOUT_SECONDS", "SCHEMA", "SCHEMA_VERSION", "WAL_MAX_BYTES", "connect", "migration",
           "read_as_current", "wal_kept_bytes"]

# Every row is found through its trajectory: each table's key is (trajectory_id, span_id). The
# gateway mints trajectory ids that begin with the time (`gateway.caller.request_ids`), so a busy
# store's inserts land at the ends of these indexes instead of on random pages: keyed by span ids
# (version 1), the cost of writing a request's rows grew with the store; keyed this way, it stays
# flat (docs/benchmarks.md).
# A model turn names no trajectory (nor may a span from elsewhere): it takes its request's. Since a
# request span ends after its children, maybe in a later batch, a child is kept under '' until
# then (`telemetry.store.records.write`); few are, and the key's '' prefix finds them. (A partial
# index of them would make SQLite prepare every statement that binds trajectory_id anew, for each row.)
# A request's turns and calls are found through a second index of each table, (trajectory_id,
# request_span_id): through the key alone, showing a trajectory read all its rows once per request
# (`telemetry.store.timeline`). A store written before them gets them when it is next opened (`_schema`).
_INDEXES = """
CREATE INDEX IF NOT EXISTS trajectories_ended ON trajectories (ended);
CREATE UNIQUE INDEX IF NOT EXISTS requests_key ON requests (trajectory_id, span_id);
CREATE UNIQUE INDEX IF NOT EXISTS model_turns_key ON model_turns (trajectory_id, span_id);
CREATE INDEX IF NOT EXISTS model_turns_of_request ON model_turns (trajectory_id, request_span_id);
CREATE UNIQUE INDEX IF NOT EXISTS tool_calls_key ON tool_calls (trajectory_id, span_id);
CREATE INDEX IF NOT EXISTS tool_calls_of_request ON tool_calls (trajectory_id, request_span_id);
"""
SCHEMA = "\n".join(table.create() for table in TABLES) + _INDEXES

# Version 1 to 2: the same columns, model turns gain their trajectory (their request's), and the
# tables are rebuilt under the new keys, as version 2 had them; the later versions' columns are
# added after (`migration`).
_REBUILD_FROM_1 = """
ALTER TABLE requests RENAME TO requests_v1;
ALTER TABLE model_turns RENAME TO model_turns_v1;
ALTER TABLE tool_calls RENAME TO tool_calls_v1;
DROP INDEX IF EXISTS requests_trajectory;
DROP INDEX IF EXISTS model_turns_request;
DROP INDEX IF EXISTS tool_calls_trajectory;
DROP INDEX IF EXISTS tool_calls_request;
""" + "\n".join(table.create(BASE_VERSION) for table in TABLES) + """
INSERT INTO requests SELECT * FROM requests_v1;
INSERT INTO model_turns SELECT m.span_id, m.trace_id, COALESCE(r.trajectory_id, ''), m.request_span_id, m.round,
    m.model, m.response_model, m.provider, m.response_id, m.finish_reasons, m.stream, m.input_tokens, m.output_tokens,
    m.error_type, m.error_message, m.input_messages, m.output_messages, m.started, m.duration_ms
    FROM model_turns_v1 m LEFT JOIN requests_v1 r ON r.span_id = m.request_span_id;
INSERT INTO tool_calls SELECT span_id, trace_id, request_span_id, COALESCE(trajectory_id, ''), round, tool, call_id,
    outcome, rejection_reason, error_type, missing, unrecognized, suggestions, retry_kind, retries_trace_id,
    retries_span_id, diagnostic, arguments, mcp_server, mcp_method, started, duration_ms
    FROM tool_calls_v1;
DROP TABLE requests_v1;
DROP TABLE model_turns_v1;
DROP TABLE tool_calls_v1;
"""


def migration(version: int) -> str:
    """The script that brings a store of schema `version` to SCHEMA_VERSION, in one transaction
    (`_schema`: a store is migrated whole or not at all). A new file (0) gets the schema; a store of
    version 1 is first rebuilt as version 2; then the columns of every later version are added, in
    their order (ALTER TABLE appends: the tables end as a new store's), and the indexes created."""
    if version == 0:
        return SCHEMA
    rebuilt = _REBUILD_FROM_1 if version == 1 else ""
    added = [statement for table in TABLES for statement in table.added_after(max(version, BASE_VERSION))]
    return rebuilt + "\n".join(added) + "\n" + SCHEMA


WAL_MAX_BYTES = 32 * 2**20  # the write-ahead log kept after a checkpoint, at most


def wal_kept_bytes(max_bytes: int | None) -> int:
    """What a checkpoint cuts the write-ahead log back to: 32 MiB, or a quarter of a smaller store."""
    return WAL_MAX_BYTES if max_bytes is None else min(WAL_MAX_BYTES, max_bytes // 4)


BUSY_TIMEOUT_SECONDS = 5.0  # how long a writer waits for another process's transaction on the same file


def _write_ahead_log(db: sqlite3.Connection) -> None:
    """WAL mode. While another process is setting up the same new file, SQLite refuses the switch
    at once ("database is locked") rather than calling the busy handler: try again, within the busy
    timeout."""
    deadline = time.monotonic() + BUSY_TIMEOUT_SECONDS
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def connect(path: str, max_bytes: int | None = None) -> sqlite3.Connection:
    """The database at `path` (created with its schema); `max_bytes` caps the file's size, so that
    a store never fills the disk beyond its share (writes past it fail as on a full disk).

    The write-ahead log beside it is not in that cap: it grows to about 32 MiB between checkpoints
    (8000 pages of 4 KiB, plus the transaction that passes them; longer only while a reader keeps a
    checkpoint from finishing), and each checkpoint cuts it back to `wal_kept_bytes(max_bytes)`. So
    the store takes at most `max_bytes` plus about 32 MiB of disk.

    Several processes may write one file (`toolspan serve --workers N`): a writer waits up to
    BUSY_TIMEOUT_SECONDS for another's transaction to end."""
    db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_SECONDS, check_same_thread=False, isolation_level=None)
    # WAL: readers (`toolspan trajectories`, /ui) never wait for the writer, nor it for them.
    _write_ahead_log(db)
    db.execute("PRAGMA synchronous=NORMAL")  # a power cut may lose the last batch; nothing worse
    # Checkpoint the log into the database every 8000 pages (SQLite's default: 1000): the same index
    # pages are rewritten by every batch, and copying them back less often lowered the store's cost
    # (docs/benchmarks.md). The log may grow to 32 MiB between checkpoints; without a
    # journal_size_limit it would stay that size after them.
    db.execute("PRAGMA wal_autocheckpoint=8000")
    db.execute(f"PRAGMA journal_size_limit={wal_kept_bytes(max_bytes)}")
    _schema(db)
    if max_bytes is not None:
        page = int(db.execute("PRAGMA page_size").fetchone()[0])
        db.execute(f"PRAGMA max_page_count={max(max_bytes // page, 16)}")
    return db


def _schema(db: sqlite3.Connection) -> None:
    """Creates the schema in a new file, or brings an older store (version 1 or later) to this version. A
    store of a later version (a newer toolspan wrote it) is refused rather than written wrongly. An
    index added within a version is created in a file of that version written before it (CREATE
    INDEX IF NOT EXISTS, in this transaction): the tables are the same, and an older toolspan of the
    version keeps the index up to date as it writes."""
    db.execute("BEGIN IMMEDIATE")  # two processes opening one new file: one creates, the other waits
    try:
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise sqlite3.DatabaseError(f"the store's schema is version {version}, newer than this "
                                        f"toolspan's ({SCHEMA_VERSION}); a newer toolspan wrote it")
        for statement in _statements(migration(version)):
            db.execute(statement)
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


def _statements(script: str) -> list[str]:
    """A script's statements, to run one by one inside a transaction (`executescript` would
    commit the open one first). None of them holds a semicolon in a literal."""
    return [statement.strip() for statement in script.split(";") if statement.strip()]


def read_as_current(db: sqlite3.Connection) -> sqlite3.Connection:
    """`db`, a store opened to be read, as this version's tables: a store an older toolspan wrote
    (version 2 or later) gets, in this connection's own temporary schema, a view for each table that
    lacks columns, the missing ones NULL, named as the table (SQLite looks in the temporary schema
    first). The file is not changed, so the older gateway writing it goes on. A version 1 store,
    keyed otherwise, is refused: a gateway of this version migrates it when it opens it."""
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version >= SCHEMA_VERSION or version == 0:
        return db
    if version < BASE_VERSION:
        raise sqlite3.DatabaseError(f"the store's schema is version {version}: start the gateway of this "
                                    "toolspan once on it, which brings it to this version")
    for table in TABLES:
        present = {row[1] for row in db.execute(f"PRAGMA main.table_info({table.name})")}
        if set(table.names) <= present:
            continue
        columns = ", ".join(name if name in present else f"NULL AS {name}" for name in table.names)
        db.execute(f"CREATE TEMP VIEW {table.name} AS SELECT {columns} FROM main.{table.name}")
    return db
