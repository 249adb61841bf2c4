"""The trajectory database: its schema, and spans written into it as rows.

One span in, at most one row out: a `tool.call` span is a row of `tool_calls`, a `chat {model}`
span a row of `model_turns`, a request's SERVER span a row of `requests` (only when some tool call
or model turn belongs to it: health checks and metric scrapes are no trajectory). A span ends
after its children, so a request's rows are written before the request itself, whether the spans
come from this process or from an OTLP file (`telemetry.store.otlp` orders them by their end).

Times are seconds since the epoch (REAL), durations milliseconds, ids lower-case hex; lists of
names are JSON arrays. `telemetry.store.report` reads this schema; nothing else writes it.
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from itertools import chain
from types import MappingProxyType
from typing import Any, NamedTuple

import orjson
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from telemetry import names
from telemetry.spans import UNSET_STATUS, GatewaySpan

SCHEMA_VERSION = 4
# Every row is found through its trajectory: each table's key is (trajectory_id, span_id). The
# gateway mints trajectory ids that begin with the time (`gateway.caller.request_ids`), so a busy
# store's inserts land at the ends of these indexes instead of on random pages. Keyed by span ids
# (version 1: five random-key indexes for a plain request), a plain request's rows cost 22 us of CPU
# to write into an empty store and 84 us at 100,000 requests; keyed this way, 14 to 15 us at any
# size (`python bench/store_growth.py`; with random caller-named ids, 25 us growing to 67 us).
# A model turn names no trajectory (nor may a span from elsewhere): it takes its request's. Since a
# request span ends after its children, maybe in a later batch, a child is kept under '' until
# then (`write`); few are, and the key's '' prefix finds them. (A partial index of them would make
# SQLite prepare every statement that binds trajectory_id anew, for each row: 26 us a turn, not 4.)
# A request's turns and calls are found through a second index of each table, (trajectory_id,
# request_span_id): through the key alone, showing a trajectory read all its rows once per request
# (`telemetry.store.timeline`). A store written before them gets them when it is next opened (`_schema`).
SCHEMA = """
CREATE TABLE IF NOT EXISTS trajectories (
    id TEXT PRIMARY KEY, started REAL NOT NULL, ended REAL NOT NULL);
CREATE INDEX IF NOT EXISTS trajectories_ended ON trajectories (ended);
CREATE TABLE IF NOT EXISTS requests (
    span_id TEXT NOT NULL, trace_id TEXT NOT NULL, trajectory_id TEXT NOT NULL, name TEXT, route TEXT,
    status INTEGER, rounds INTEGER, limit_reached INTEGER, error_type TEXT, started REAL NOT NULL,
    duration_ms REAL NOT NULL);
CREATE UNIQUE INDEX IF NOT EXISTS requests_key ON requests (trajectory_id, span_id);
CREATE TABLE IF NOT EXISTS model_turns (
    span_id TEXT NOT NULL, trace_id TEXT NOT NULL, trajectory_id TEXT NOT NULL, request_span_id TEXT,
    round INTEGER NOT NULL, model TEXT, response_model TEXT, provider TEXT, response_id TEXT, finish_reasons TEXT,
    stream INTEGER, input_tokens INTEGER, output_tokens INTEGER, error_type TEXT, error_message TEXT,
    input_messages TEXT, output_messages TEXT, started REAL NOT NULL, duration_ms REAL NOT NULL);
CREATE UNIQUE INDEX IF NOT EXISTS model_turns_key ON model_turns (trajectory_id, span_id);
CREATE INDEX IF NOT EXISTS model_turns_of_request ON model_turns (trajectory_id, request_span_id);
CREATE TABLE IF NOT EXISTS tool_calls (
    span_id TEXT NOT NULL, trace_id TEXT NOT NULL, request_span_id TEXT, trajectory_id TEXT NOT NULL, round INTEGER,
    tool TEXT NOT NULL, call_id TEXT, outcome TEXT, rejection_reason TEXT, error_type TEXT, missing TEXT,
    unrecognized TEXT, suggestions TEXT, retry_kind TEXT, retries_trace_id TEXT, retries_span_id TEXT,
    diagnostic TEXT, arguments TEXT, mcp_server TEXT, mcp_method TEXT, started REAL NOT NULL,
    duration_ms REAL NOT NULL, side TEXT, client_ms REAL, result_bytes INTEGER, result_outcome TEXT,
    decision TEXT, decided_by TEXT, approval_wait_ms REAL);
CREATE UNIQUE INDEX IF NOT EXISTS tool_calls_key ON tool_calls (trajectory_id, span_id);
CREATE INDEX IF NOT EXISTS tool_calls_of_request ON tool_calls (trajectory_id, request_span_id);
"""
# Version 1 to 2: the same columns, model turns gain their trajectory (their request's), and the
# tables are rebuilt under the new keys. One transaction: a store is migrated whole or not at all.
_MIGRATE_FROM_1 = """
ALTER TABLE requests RENAME TO requests_v1;
ALTER TABLE model_turns RENAME TO model_turns_v1;
ALTER TABLE tool_calls RENAME TO tool_calls_v1;
DROP INDEX IF EXISTS requests_trajectory;
DROP INDEX IF EXISTS model_turns_request;
DROP INDEX IF EXISTS tool_calls_trajectory;
DROP INDEX IF EXISTS tool_calls_request;
""" + SCHEMA + """
INSERT INTO requests SELECT * FROM requests_v1;
INSERT INTO model_turns SELECT m.span_id, m.trace_id, COALESCE(r.trajectory_id, ''), m.request_span_id, m.round,
    m.model, m.response_model, m.provider, m.response_id, m.finish_reasons, m.stream, m.input_tokens, m.output_tokens,
    m.error_type, m.error_message, m.input_messages, m.output_messages, m.started, m.duration_ms
    FROM model_turns_v1 m LEFT JOIN requests_v1 r ON r.span_id = m.request_span_id;
INSERT INTO tool_calls SELECT span_id, trace_id, request_span_id, COALESCE(trajectory_id, ''), round, tool, call_id,
    outcome, rejection_reason, error_type, missing, unrecognized, suggestions, retry_kind, retries_trace_id,
    retries_span_id, diagnostic, arguments, mcp_server, mcp_method, started, duration_ms, NULL, NULL, NULL, NULL,
    NULL, NULL, NULL
    FROM tool_calls_v1;
DROP TABLE requests_v1;
DROP TABLE model_turns_v1;
DROP TABLE tool_calls_v1;
"""

# Version 3 to 4: of a call that waited for a reviewer (gateway.tools.approval_gate), what became of its
# approval (toolspan.tool.decision: approve, deny, timeout, cancelled, shutdown, unavailable), the
# gateway key that decided and how long the call waited; NULL for every call stored before, and for
# any call that asked no one.
_ADD_DECISIONS = """
ALTER TABLE tool_calls ADD COLUMN decision TEXT;
ALTER TABLE tool_calls ADD COLUMN decided_by TEXT;
ALTER TABLE tool_calls ADD COLUMN approval_wait_ms REAL;
"""
_MIGRATE_FROM_3 = _ADD_DECISIONS + SCHEMA

# Version 2 to 3: a tool call's side, NULL for the gateway's own (every call stored before), "client"
# for a call of the client's tool that the gateway checked (gateway.client_tools.check); and of such a call,
# what its result said when a later request brought it (gateway.client_tools.results): the time from the
# answer that handed it over, the result's size and outcome. Then on to 4.
_MIGRATE_FROM_2 = """
ALTER TABLE tool_calls ADD COLUMN side TEXT;
ALTER TABLE tool_calls ADD COLUMN client_ms REAL;
ALTER TABLE tool_calls ADD COLUMN result_bytes INTEGER;
ALTER TABLE tool_calls ADD COLUMN result_outcome TEXT;
""" + _MIGRATE_FROM_3


class Link(NamedTuple):
    trace_id: str
    span_id: str
    attributes: Mapping[str, Any] = MappingProxyType({})


class SpanRecord(NamedTuple):
    """A finished span, whichever way it came: from this process's SDK or from an OTLP file.

    A named tuple rather than a frozen dataclass: the store's writer makes one per span, and a
    frozen dataclass's __init__ cost 1.5 us of the 7.5 us a span took to convert (bench/store.py)."""

    name: str
    kind: SpanKind
    trace_id: str
    span_id: str
    parent_span_id: str | None
    start_ns: int
    end_ns: int
    attributes: Mapping[str, Any]
    error: bool = False
    status_description: str | None = None
    links: Sequence[Link] = ()


def attributes_of(span: ReadableSpan) -> Mapping[str, Any]:
    """An ended span's attributes as a plain dict (a lookup through the SDK's read-only mapping
    costs ten times a dict's). A GatewaySpan's own dict, which no one changes once the span has
    ended, is taken as it is.

    Of the SDK's spans, the copy is taken from the SDK's own dict when the span has one
    (`BoundedAttributes._dict`): copying through the public mapping calls Python code per key, 1.6 us
    a tool call against 0.1, which took the store from 1.27 to 1.24 times the telemetry cost
    (bench/store.py). Any other shape of span falls back to the public mapping."""
    if type(span) is GatewaySpan:
        return span.recorded_attributes
    raw = getattr(getattr(span, "_attributes", None), "_dict", None)
    return dict(raw) if isinstance(raw, dict) else dict(span.attributes or {})


def record_of(span: ReadableSpan) -> SpanRecord:
    """The record of an ended span; a link's attributes are kept as they are (read-only)."""
    if type(span) is GatewaySpan:
        return _gateway_record(span)
    context, parent, status = span.context, span.parent, span.status
    # Most spans have none: asking the SDK's own list first spares the copy `links` makes under its
    # lock (3.9 -> 3.0 to 3.3 us a span).
    links = [Link(format(link.context.trace_id, "032x"), format(link.context.span_id, "016x"), link.attributes or {})
             for link in span.links] if getattr(span, "_links", True) else []
    return SpanRecord(span.name, span.kind, format(context.trace_id, "032x"), format(context.span_id, "016x"),
                      format(parent.span_id, "016x") if parent is not None else None, span.start_time or 0,
                      span.end_time or 0, attributes_of(span), status.status_code is StatusCode.ERROR,
                      status.description, links)


def _gateway_record(span: GatewaySpan) -> SpanRecord:
    """A GatewaySpan's record, its fields read as ReadableSpan keeps them rather than through its
    properties (a call each): per span 1.89 -> 1.24 us (timeit, a chat span)."""
    trace_id, span_id, *_ = span._context  # type: ignore[misc]  # a SpanContext, set when it started
    parent, status = span._parent, span._status
    links = [Link(format(link.context.trace_id, "032x"), format(link.context.span_id, "016x"), link.attributes or {})
             for link in span._links] if span._links else []
    error, description = (False, None) if status is UNSET_STATUS else (status.status_code is StatusCode.ERROR,
                                                                       status.description)
    # tuple.__new__: a named tuple's own __new__ is Python code, a call more.
    return tuple.__new__(SpanRecord, (span._name, span._kind, "%032x" % trace_id, "%016x" % span_id,  # noqa: UP031
                                      "%016x" % parent.span_id if parent is not None else None,  # noqa: UP031
                                      span._start_time or 0, span._end_time or 0, span.recorded_attributes, error,
                                      description, links))


def kind_of(record: SpanRecord) -> str | None:
    """Which table a span goes to, if any."""
    if record.name == names.SPAN_TOOL_CALL:
        return "tool_call"
    if record.name == names.SPAN_TOOL_EXECUTE and record.attributes.get(names.ATTR_TOOL_SIDE) == names.SIDE_CLIENT:
        return "client_result"  # a client call's execute step: it completes the call's row
    if record.kind is SpanKind.CLIENT and record.name.startswith(names.SPAN_CHAT_PREFIX + " "):
        return "model_turn"
    if record.kind is SpanKind.SERVER and names.ATTR_CONVERSATION_ID in record.attributes:
        return "request"
    return None


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
    # pages are rewritten by every batch, and copying them back less often took the store from 1.26
    # to 1.23 times the telemetry cost (bench/store.py). The log may grow to 32 MiB between checkpoints;
    # without a journal_size_limit it would stay that size after them.
    db.execute("PRAGMA wal_autocheckpoint=8000")
    db.execute(f"PRAGMA journal_size_limit={wal_kept_bytes(max_bytes)}")
    _schema(db)
    if max_bytes is not None:
        page = int(db.execute("PRAGMA page_size").fetchone()[0])
        db.execute(f"PRAGMA max_page_count={max(max_bytes // page, 16)}")
    return db


def _schema(db: sqlite3.Connection) -> None:
    """Creates the schema in a new file, or brings an older store (version 1, 2 or 3) to this version. A store of
    a later version (a newer toolspan wrote it) is refused rather than written wrongly. An index
    added within a version is created in a file of that version written before it (CREATE INDEX IF
    NOT EXISTS, in this transaction): the tables are the same, and an older toolspan of the version
    keeps the index up to date as it writes."""
    db.execute("BEGIN IMMEDIATE")  # two processes opening one new file: one creates, the other waits
    try:
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise sqlite3.DatabaseError(f"the store's schema is version {version}, newer than this "
                                        f"toolspan's ({SCHEMA_VERSION}); a newer toolspan wrote it")
        migration = {1: _MIGRATE_FROM_1, 2: _MIGRATE_FROM_2, 3: _MIGRATE_FROM_3}.get(version, SCHEMA)
        for statement in _statements(migration):
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


def _seconds(ns: int) -> float:
    return ns / 1e9


def _ms(record: SpanRecord) -> float:
    return (record.end_ns - record.start_ns) / 1e6


# Text that may be missing is bound as "" and stored as NULL by `NULLIF(?, '')`: Python's sqlite3
# binds None through its adapter lookup, ten times the cost of a str, and a tool call row has a
# dozen such columns. This took an insert from 9.4 to 6.9 us per tool call (bench/store.py).
_NONE = ""


def _names(value: Any) -> str:
    """A list of names as a JSON array of strings; anything that is not a list: none. (orjson:
    0.26 us a list of one, json.dumps 1.5; a model turn's row took 4.4 us, now 2.2 to 2.4 with _int's
    first line.) A lone surrogate, which an imported file's JSON may carry and orjson refuses,
    is written as JSON escapes it."""
    if not isinstance(value, list | tuple) or not value:
        return _NONE
    listed = [str(v) for v in value]
    try:
        return orjson.dumps(listed).decode()
    except orjson.JSONEncodeError:
        return json.dumps(listed)


_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1  # SQLite's INTEGER

# The attributes rows are built from, by the type each must have. The gateway's own spans have
# them; a span from elsewhere (an OTLP file) is checked first (`attribute_problem`).
_TEXT_ATTRIBUTES = frozenset({
    names.ATTR_CONVERSATION_ID, names.ATTR_TOOL_NAME, names.ATTR_TOOL_CALL_ID, names.ATTR_OUTCOME,
    names.ATTR_REJECTION_REASON, names.ATTR_ERROR_TYPE, names.ATTR_RETRY_KIND, names.ATTR_TOOL_CALL_ARGUMENTS,
    names.ATTR_MCP_SERVER, names.ATTR_MCP_METHOD_NAME, names.ATTR_REQUEST_MODEL, names.ATTR_RESPONSE_MODEL,
    names.ATTR_PROVIDER_NAME, names.ATTR_RESPONSE_ID, names.ATTR_INPUT_MESSAGES, names.ATTR_OUTPUT_MESSAGES,
    names.ATTR_HTTP_ROUTE, names.ATTR_KEY_NAME, names.ATTR_TOOL_DECISION, names.ATTR_DECIDED_BY})
_NAMES_ATTRIBUTES = frozenset({names.ATTR_ARGS_MISSING, names.ATTR_ARGS_UNRECOGNIZED, names.ATTR_ARGS_SUGGESTIONS,
                               names.ATTR_FINISH_REASONS})
_COUNT_ATTRIBUTES = frozenset({names.ATTR_ROUND, names.ATTR_ROUNDS, names.ATTR_INPUT_TOKENS,
                               names.ATTR_OUTPUT_TOKENS, names.ATTR_HTTP_STATUS})
_FLAG_ATTRIBUTES = frozenset({names.ATTR_REQUEST_STREAM, names.ATTR_ROUND_LIMIT_REACHED})
_DURATION_ATTRIBUTES = frozenset({names.ATTR_APPROVAL_WAIT_MS})
MAX_COUNT = 2**31 - 1  # rounds, tokens, a status code: more is no real span's


def attribute_problem(attributes: Mapping[str, Any]) -> str | None:
    """What is wrong with a span's attributes for its row, if anything: text that is not a string,
    names that are not a list of strings, a count that is not an integer from 0 to MAX_COUNT, a
    flag that is not a boolean, a duration that is not a number from 0."""
    for key, value in attributes.items():
        if key in _TEXT_ATTRIBUTES and not isinstance(value, str):
            return f"attribute {key} is not a string"
        if key in _NAMES_ATTRIBUTES and not (isinstance(value, list | tuple)
                                             and all(isinstance(v, str) for v in value)):
            return f"attribute {key} is not a list of strings"
        if key in _COUNT_ATTRIBUTES and not (isinstance(value, int) and not isinstance(value, bool)
                                             and 0 <= value <= MAX_COUNT):
            return f"attribute {key} is not an integer from 0 to {MAX_COUNT}"
        if key in _FLAG_ATTRIBUTES and not isinstance(value, bool):
            return f"attribute {key} is not a boolean"
        if key in _DURATION_ATTRIBUTES and _duration(value) is None:
            return f"attribute {key} is not a number from 0"
    return None


def _int(value: Any) -> int | None:
    """A number as SQLite's 64-bit INTEGER can hold it (clamped to its range); None for anything else."""
    if type(value) is int and _INT_MIN <= value <= _INT_MAX:  # what the gateway's own spans hold
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or (isinstance(value, float)
                                                                         and math.isnan(value)):
        return None
    return int(min(max(value, _INT_MIN), _INT_MAX))


def _duration(value: Any) -> float | None:
    """A duration as REAL: a finite number from 0; None for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        return None
    return float(value)


def _text(value: Any) -> str:
    return _NONE if value is None else str(value)


def _values(columns: str) -> str:
    """The parameters of an insert, one letter a column: `v` a value bound as it is, `t` text that
    may be missing (NULL when bound as "")."""
    return ", ".join("?" if column == "v" else "NULLIF(?, '')" for column in columns)


# Each table's parameters as `_values` spells them, a letter a column in the table's order.
_CALL_PARAMS = "vvtvvvttttttttttttttvvtvvtttv"
_TURN_PARAMS = "vvvtvtttttvvvttttvv"  # the fifth, the round, counted in the batch or by the database
_REQUEST_PARAMS = "vvvttvvvtvv"


def _insert_many(table: str, columns: str) -> tuple[str, str, str]:
    """An insert of many rows into `table` (its columns as in `_values`) for `_insert_all`: the
    rows' plain parameters in a VALUES list, each column's NULLIF once in the SELECT over it. A
    NULLIF for every parameter made SQLite's prepared statements about three times larger: for a
    19-column table, one statement of each size in `_CHUNKS` took 3.0 MiB by SQLite's own count
    (sqlite3_memory_used, SQLite 3.40), these 1.1 MiB; the process grew by 6.7 and 0.8 MiB."""
    select = ", ".join(f"column{n}" if column == "v" else f"NULLIF(column{n}, '')"
                       for n, column in enumerate(columns, 1))
    return (f"INSERT OR REPLACE INTO {table} SELECT {select} FROM (VALUES ",
            "(" + ", ".join("?" * len(columns)) + ")", ")")


def _tool_call_row(r: SpanRecord, trajectory: str) -> tuple[Any, ...]:
    a = r.attributes
    retried = next((link for link in r.links if names.ATTR_RETRY_KIND in link.attributes), None) \
        if r.links else None
    return (r.span_id, r.trace_id, r.parent_span_id or _NONE, trajectory,
            _int(a.get(names.ATTR_ROUND)), str(a.get(names.ATTR_TOOL_NAME, "")), _text(a.get(names.ATTR_TOOL_CALL_ID)),
            _text(a.get(names.ATTR_OUTCOME)), _text(a.get(names.ATTR_REJECTION_REASON)),
            _text(a.get(names.ATTR_ERROR_TYPE)), _names(a.get(names.ATTR_ARGS_MISSING)),
            _names(a.get(names.ATTR_ARGS_UNRECOGNIZED)), _names(a.get(names.ATTR_ARGS_SUGGESTIONS)),
            _text(a.get(names.ATTR_RETRY_KIND)), retried.trace_id if retried else _NONE,
            retried.span_id if retried else _NONE, _text(r.status_description if r.error else None),
            _text(a.get(names.ATTR_TOOL_CALL_ARGUMENTS)), _text(a.get(names.ATTR_MCP_SERVER)),
            _text(a.get(names.ATTR_MCP_METHOD_NAME)), _seconds(r.start_ns), _ms(r),
            _NONE if (side := a.get(names.ATTR_TOOL_SIDE)) == names.SIDE_GATEWAY else _text(side),
            None, None, _NONE,  # what the client's result said: set when it comes (_CLIENT_RESULT)
            _text(a.get(names.ATTR_TOOL_DECISION)), _text(a.get(names.ATTR_DECIDED_BY)),
            _duration(a.get(names.ATTR_APPROVAL_WAIT_MS)))


class _TurnRow(NamedTuple):
    """A `model_turns` row, its columns in the table's order."""

    span_id: str
    trace_id: str
    trajectory_id: str
    request_span_id: str
    round: int | None  # counted in the batch (`_turn_rounds`) or by the database (_INSERT_MODEL_TURN)
    model: str
    response_model: str
    provider: str
    response_id: str
    finish_reasons: str
    stream: int | None
    input_tokens: int | None
    output_tokens: int | None
    error_type: str
    error_message: str
    input_messages: str
    output_messages: str
    started: float
    duration_ms: float

    def counted_by_database(self) -> tuple[Any, ...]:
        """The parameters of _INSERT_MODEL_TURN, which counts the round itself."""
        return (*self[:4], self.trajectory_id, self.request_span_id, self.span_id, self.started, *self[5:])


def _model_turn_row(r: SpanRecord, trajectory: str) -> _TurnRow:
    a = r.attributes
    stream = a.get(names.ATTR_REQUEST_STREAM)
    parent = r.parent_span_id or _NONE
    # tuple.__new__: a named tuple's own __new__ is Python code, a call more a row.
    return tuple.__new__(_TurnRow, (
        r.span_id, r.trace_id, trajectory, parent, None, _text(a.get(names.ATTR_REQUEST_MODEL)),
        _text(a.get(names.ATTR_RESPONSE_MODEL)), _text(a.get(names.ATTR_PROVIDER_NAME)),
        _text(a.get(names.ATTR_RESPONSE_ID)), _names(a.get(names.ATTR_FINISH_REASONS)),
        None if stream is None else int(bool(stream)), _int(a.get(names.ATTR_INPUT_TOKENS)),
        _int(a.get(names.ATTR_OUTPUT_TOKENS)), _text(a.get(names.ATTR_ERROR_TYPE)),
        _text(r.status_description if r.error else None), _text(a.get(names.ATTR_INPUT_MESSAGES)),
        _text(a.get(names.ATTR_OUTPUT_MESSAGES)), _seconds(r.start_ns), _ms(r)))


def _request_row(r: SpanRecord, trajectory: str) -> tuple[Any, ...]:
    a = r.attributes
    limit = a.get(names.ATTR_ROUND_LIMIT_REACHED)
    return (r.span_id, r.trace_id, trajectory, r.name, _text(a.get(names.ATTR_HTTP_ROUTE)),
            _int(a.get(names.ATTR_HTTP_STATUS)), _int(a.get(names.ATTR_ROUNDS)),
            None if limit is None else int(bool(limit)), _text(a.get(names.ATTR_ERROR_TYPE)),
            _seconds(r.start_ns), _ms(r))


def _trajectory_row(r: SpanRecord, trajectory: str) -> tuple[Any, ...]:
    return trajectory, _seconds(r.start_ns), _seconds(r.end_ns)


_INSERT_TOOL_CALLS = _insert_many("tool_calls", _CALL_PARAMS)
# A model turn's round is its place among the turns of its request (they run one after another),
# counted from 1 as `toolspan.round` counts them: a tool call's round is the turn that asked for it.
# The turns counted are the others that started before it, so a turn written again (the same OTLP
# file imported twice) keeps its round.
_INSERT_MODEL_TURN = (f"INSERT OR REPLACE INTO model_turns VALUES ({_values(_TURN_PARAMS[:4])}, "
                      "(SELECT COUNT(*) + 1 FROM model_turns WHERE trajectory_id = ? AND request_span_id = ? "
                      "AND span_id != ? AND started <= ?), "
                      f"{_values(_TURN_PARAMS[5:])})")
_INSERT_MODEL_TURNS = _insert_many("model_turns", _TURN_PARAMS)
_INSERT_REQUESTS = _insert_many("requests", _REQUEST_PARAMS)
_INSERT_REQUEST_IF_ANY_ROW = (f"INSERT OR REPLACE INTO requests SELECT {_values(_REQUEST_PARAMS)} "
                              "WHERE EXISTS (SELECT 1 FROM tool_calls WHERE trajectory_id = ? AND request_span_id = ?) "
                              "OR EXISTS (SELECT 1 FROM model_turns WHERE trajectory_id = ? AND request_span_id = ?)")
_ADOPT_TURNS = "UPDATE OR REPLACE model_turns SET trajectory_id = ? WHERE trajectory_id = '' AND request_span_id = ?"
_ADOPT_CALLS = "UPDATE OR REPLACE tool_calls SET trajectory_id = ? WHERE trajectory_id = '' AND request_span_id = ?"
# One row (a JSON array), not a row each: sqlite3 lets other threads take the GIL at every row.
_PENDING = ("SELECT json_group_array(request_span_id) FROM (SELECT request_span_id FROM model_turns "
            "WHERE trajectory_id = '' UNION SELECT request_span_id FROM tool_calls WHERE trajectory_id = '')")
_TRAJECTORY_SPAN = ("ON CONFLICT (id) DO UPDATE SET started = min(started, excluded.started), "
                    "ended = max(ended, excluded.ended)")
_UPSERT_TRAJECTORIES = ("INSERT INTO trajectories VALUES ", "(?, ?, ?)", f" {_TRAJECTORY_SPAN}")


KEY_SEPARATOR = "~"  # in no gateway key's name nor any trajectory id the gateway takes from a caller


def stored_id(key: str | None, trajectory_id: str) -> str:
    """A trajectory's id in the store: the id a caller sent, after the name of the gateway key that
    sent it (with keys), so that the same id from two keys is two trajectories."""
    return trajectory_id if key is None else f"{key}{KEY_SEPARATOR}{trajectory_id}"


def split_stored_id(stored: str) -> tuple[str | None, str]:
    """(gateway key name or None, the trajectory id its caller knows) of a stored id."""
    key, separator, trajectory_id = stored.partition(KEY_SEPARATOR)
    return (key, trajectory_id) if separator else (None, stored)


def key_range(key: str) -> tuple[str, str]:
    """The stored ids of one key's trajectories lie in [low, high): an index range, not a scan."""
    return f"{key}{KEY_SEPARATOR}", f"{key}{chr(ord(KEY_SEPARATOR) + 1)}"


def _trajectory(record: SpanRecord) -> str:
    """The trajectory a span names ("" when it names none), as the store keys it."""
    attributes = record.attributes
    value = attributes.get(names.ATTR_CONVERSATION_ID)
    if value is None:
        return _NONE
    key = attributes.get(names.ATTR_KEY_NAME)
    return stored_id(None if key is None else str(key), str(value))


_CHUNKS = (256, 128, 64, 32, 16, 8, 4, 2, 1)  # rows an insert takes: few distinct statements (sqlite3 caches 128)


def _insert_all(db: sqlite3.Connection, statement: tuple[str, str, str], rows: list[tuple[Any, ...]]) -> None:
    """Inserts `rows` with `statement` (its head, one row's "(?, ...)", its tail), many rows a
    statement, at most one statement of each size in `_CHUNKS` for the rest. Each statement's run
    is where sqlite3 lets other threads take the GIL, and behind a busy event loop the store's
    writer then waits up to the switch interval (5 ms) to get it back: with tool calls written a row
    a run and the rest 64 rows a run, a batch of a busy gateway (bench/soak.py) took 0.1 to 0.5 s
    of wall time for 0.02 to 0.04 s of CPU, and the writer fell behind. Fewer runs also cost less
    CPU: 13 against 15.5 us per plain request a row a run (`bench/store_growth.py`)."""
    head, row, tail = statement
    most = db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // row.count("?")  # 999 variables before SQLite 3.32
    done = 0
    for size in (size for size in _CHUNKS if size <= most):
        while len(rows) - done >= size:
            chunk = rows[done:done + size]
            # chain: the rows' values flattened in C (16 rows of 22 columns: 2.6 us, against 3.6 us
            # for a list comprehension; timeit).
            db.execute(head + ", ".join([row] * size) + tail, list(chain.from_iterable(chunk)))
            done += size


_CLIENT_RESULT = ("UPDATE tool_calls SET client_ms = ?, result_bytes = ?, result_outcome = ? "
                  "WHERE trajectory_id = ? AND call_id = ? AND side = 'client'")


def _client_result_row(r: SpanRecord) -> tuple[Any, ...]:
    """_CLIENT_RESULT's parameters for a client call's execute step (gateway.client_tools.results)."""
    a = r.attributes
    return (_ms(r), _int(a.get(names.ATTR_RESULT_BYTES)), _text(a.get(names.ATTR_OUTCOME)), _trajectory(r),
            str(a.get(names.ATTR_TOOL_CALL_ID, "")))


def _turn_rounds(turns: list[_TurnRow]) -> list[tuple[Any, ...]]:
    """`turns` (in the batch's order) with their rounds, counted as _INSERT_MODEL_TURN counts them
    in the database: 1 + the turns of the same request written before it that started no later."""
    earlier: dict[tuple[str, str], list[float]] = {}
    counted: list[tuple[Any, ...]] = []
    for turn in turns:
        started = earlier.setdefault((turn.trajectory_id, turn.request_span_id), [])
        round_ = 1 + sum(1 for other in started if other <= turn.started)
        counted.append((*turn[:4], round_, *turn[5:]))  # the round is the fifth column (_replace: 1 us more)
        started.append(turn.started)
    return counted


def write(db: sqlite3.Connection, records: Iterable[SpanRecord]) -> int:
    """Writes the rows of `records` in one transaction (the caller's, if one is open); returns how
    many rows were written. Spans of no table are skipped.

    A child's trajectory is the one it names, else its request's when that is in this batch (the
    gateway's `chat` spans name none), else '' until its request comes. So first the children kept
    under '' by earlier batches are given the trajectory of their request in this one; then the
    tool calls, the model turns (in their order: a turn's round counts the turns of its request
    before it), then the requests, which are kept only when some row of theirs exists (a request
    span ends after its children, so those are in this batch or an earlier one).

    Rows go in many to a statement where they can (`_insert_all`)."""
    classified = [(kind_of(record), record) for record in records]
    requests = [record for kind, record in classified if kind == "request"]
    trajectory_of_request = {record.span_id: _trajectory(record) for record in requests}
    pending = set(json.loads(db.execute(_PENDING).fetchone()[0])) if trajectory_of_request else set()
    for span_id in pending & trajectory_of_request.keys():
        db.execute(_ADOPT_TURNS, (trajectory_of_request[span_id], span_id))
        db.execute(_ADOPT_CALLS, (trajectory_of_request[span_id], span_id))

    def trajectory(child: SpanRecord) -> str:
        return _trajectory(child) or trajectory_of_request.get(child.parent_span_id or _NONE, _NONE)

    calls = [_tool_call_row(record, trajectory(record)) for kind, record in classified if kind == "tool_call"]
    turns = [_model_turn_row(record, trajectory(record)) for kind, record in classified if kind == "model_turn"]
    _insert_all(db, _INSERT_TOOL_CALLS, calls)
    # A turn of a request in this batch whose turns none before were written (pending) has all its
    # request's turns here: its round is counted here, and it is written with others in one run.
    # Any other turn counts its round in the database, a run a turn.
    alone = trajectory_of_request.keys() - pending
    in_batch: list[_TurnRow] = []
    by_database: list[tuple[Any, ...]] = []
    for turn in turns:
        if turn.request_span_id in alone and turn.trajectory_id:
            in_batch.append(turn)
        else:
            by_database.append(turn.counted_by_database())
    _insert_all(db, _INSERT_MODEL_TURNS, _turn_rounds(in_batch))
    db.executemany(_INSERT_MODEL_TURN, by_database)
    # A request with a row in this batch is kept without asking the database (most are: the spans of
    # a request end within moments of each other); the others only when an earlier batch wrote one.
    parents = {row[2] for row in calls} | {turn.request_span_id for turn in turns}  # a call's row: its third
    kept = [record for record in requests if record.span_id in parents]
    _insert_all(db, _INSERT_REQUESTS, [_request_row(r, trajectory_of_request[r.span_id]) for r in kept])
    for record in requests:
        trajectory_id = trajectory_of_request[record.span_id]
        if record.span_id not in parents and db.execute(
                _INSERT_REQUEST_IF_ANY_ROW, (*_request_row(record, trajectory_id), trajectory_id, record.span_id,
                                             trajectory_id, record.span_id)).rowcount > 0:
            kept.append(record)
    _insert_all(db, _UPSERT_TRAJECTORIES, [_trajectory_row(r, trajectory_of_request[r.span_id]) for r in kept])
    # Last: a result the client brought back fast may be in the batch of its call's own row.
    results = [_client_result_row(record) for kind, record in classified if kind == "client_result"]
    completed = sum(db.execute(_CLIENT_RESULT, row).rowcount for row in results)
    return len(calls) + len(turns) + len(kept) + completed


def prune(db: sqlite3.Connection, *, before: float | None = None, oldest: int = 0,
          spare_from: float | None = None) -> int:
    """Deletes the trajectories that ended before `before` (seconds since the epoch), and then the
    `oldest` ones left among those that ended before `spare_from` (the store spares what it has
    just written); with their requests, model turns and tool calls. Returns how many."""
    doomed: list[str] = []
    if before is not None:
        doomed += [row[0] for row in db.execute("SELECT id FROM trajectories WHERE ended < ?", (before,))]
    if oldest > 0:
        doomed += [row[0] for row in db.execute(
            "SELECT id FROM trajectories WHERE ended >= ? AND ended < ? ORDER BY ended LIMIT ?",
            (before if before is not None else float("-inf"),
             spare_from if spare_from is not None else float("inf"), oldest))]
    for trajectory in doomed:
        for table in ("model_turns", "tool_calls", "requests"):
            db.execute(f"DELETE FROM {table} WHERE trajectory_id = ?", (trajectory,))
        db.execute("DELETE FROM trajectories WHERE id = ?", (trajectory,))
    return len(doomed)


def prune_orphans(db: sqlite3.Connection, *, before: float) -> int:
    """Deletes the model turns older than `before` whose request was never recorded (a request cut
    short, a trace imported in part), and the tool calls as old that never learnt their trajectory:
    no trajectory shows them. Returns how many rows."""
    turns = db.execute("DELETE FROM model_turns WHERE started < ? AND NOT EXISTS (SELECT 1 FROM requests r "
                       "WHERE r.trajectory_id = model_turns.trajectory_id AND r.span_id = model_turns.request_span_id)",
                       (before,)).rowcount
    return turns + db.execute("DELETE FROM tool_calls WHERE trajectory_id = '' AND started < ?", (before,)).rowcount


def used_bytes(db: sqlite3.Connection) -> int:
    """Bytes the rows take (pages in use; freed pages are reused before the file grows)."""
    pages, size = db.execute("SELECT (SELECT page_count FROM pragma_page_count()) - (SELECT freelist_count FROM "
                             "pragma_freelist_count()), (SELECT page_size FROM pragma_page_size())").fetchone()
    return int(pages) * int(size)
