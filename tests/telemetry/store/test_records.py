"""The store's keys: children written before their request learn its trajectory whatever the
batches, a version 1 store is migrated whole, a version 2, 3 or 5 store gains its new columns, a newer
one is refused, and the gateway's own
trajectory ids grow with time (so that the store's inserts append)."""

from __future__ import annotations

import contextlib
import gc
import json
import sqlite3
import threading
import time
import weakref
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.trace import SpanKind

from gateway.caller import request_ids
from telemetry import names
from telemetry.store import writer as store_module
from telemetry.store.columns import MODEL_TURNS, TABLES, TOOL_CALLS
from telemetry.store.records import write
from telemetry.store.schema import SCHEMA, SCHEMA_VERSION, connect
from telemetry.store.span_records import SpanRecord, record_of
from telemetry.store.writer import TrajectoryStore
from tests.telemetry.conftest import Session
from tests.telemetry.store.test_report import _everything

V1_SCHEMA = (Path(__file__).parent / "schema_v1.sql").read_text()
V2_SCHEMA = (Path(__file__).parent / "schema_v2.sql").read_text()  # before a tool call had a side
V3_SCHEMA = (Path(__file__).parent / "schema_v3.sql").read_text()  # before a call kept its approval's decision
# A model turn's columns before version 5 named its upstream.
V4_TURN_COLUMNS = ("span_id, trace_id, trajectory_id, request_span_id, round, model, response_model, provider, "
                   "response_id, finish_reasons, stream, input_tokens, output_tokens, error_type, error_message, "
                   "input_messages, output_messages, started, duration_ms")


def _stored(db: sqlite3.Connection) -> dict[str, Any]:
    return {table: sorted(db.execute(f"SELECT * FROM {table}").fetchall())
            for table in ("trajectories", "requests", "model_turns", "tool_calls")}


def _before(version: int, db: sqlite3.Connection) -> sqlite3.Connection:
    """A copy of `db` as a store of `version` holds it once migrated: before version 5 no model
    turn names its upstream; before version 6 no guardrail decided on a tool call; before version 7
    no call used an alias or was repaired, and no model turn kept the tools it offered."""
    copy = sqlite3.connect(":memory:", isolation_level=None)
    db.backup(copy)
    if version < 5:
        copy.execute("UPDATE model_turns SET upstream = NULL, fallback_from = NULL")
    if version < 6:
        copy.execute("UPDATE tool_calls SET guardrail = NULL, guardrail_decision = NULL, guardrail_reason = NULL, "
                     "guardrail_moment = NULL, guardrails = NULL")
    copy.execute("UPDATE tool_calls SET aliases = NULL, repair_mode = NULL, repair_changes = NULL, "
                 "repair_before = NULL, repair_after = NULL")
    copy.execute("UPDATE model_turns SET tool_definitions = NULL")
    return copy


def _session_records(session: Session) -> list[SpanRecord]:
    """The session's spans as the store's writer gets them: in the order they ended."""
    return sorted((record_of(span) for span in session.spans()), key=lambda r: r.end_ns)


def test_any_split_into_batches_stores_the_same_rows(session: Session, tmp_path: Path) -> None:
    """A request span ends after its turns and calls; where a batch ends decides which of them
    arrive before it. Every split gives the rows one batch gives (rounds and trajectories)."""
    records = _session_records(session)
    whole = connect(str(tmp_path / "whole.sqlite3"))
    write(whole, records)
    expected = _stored(whole)
    assert expected == _stored(session.db)
    for split in range(1, len(records)):
        db = sqlite3.connect(":memory:", isolation_level=None)
        db.executescript(SCHEMA)
        write(db, records[:split])
        write(db, records[split:])
        assert _stored(db) == expected, f"split after {split} of {len(records)} spans"


def _older_store(path: Path, schema: str, session: Session, copy: str, version: int) -> None:
    """A store of an older `schema` version at `path`, holding the session's rows as `copy` (SQL
    reading the session's store as `new`) puts them in."""
    old = sqlite3.connect(path, isolation_level=None)
    old.executescript(schema)
    old.execute("ATTACH DATABASE ? AS new", (session.stack.store.path.as_posix(),))
    old.executescript(f"{copy}\nDETACH DATABASE new;\nPRAGMA user_version = {version};")
    old.close()


def test_a_version_1_store_is_migrated_whole(session: Session, tmp_path: Path) -> None:
    path = tmp_path / "v1.sqlite3"
    _older_store(path, V1_SCHEMA, session, """
        INSERT INTO trajectories SELECT * FROM new.trajectories;
        INSERT INTO requests SELECT * FROM new.requests;
        INSERT INTO model_turns SELECT span_id, trace_id, request_span_id, round, model, response_model, provider,
            response_id, finish_reasons, stream, input_tokens, output_tokens, error_type, error_message,
            input_messages, output_messages, started, duration_ms FROM new.model_turns;
        INSERT INTO tool_calls SELECT span_id, trace_id, request_span_id, NULLIF(trajectory_id, ''), round, tool,
            call_id, outcome, rejection_reason, error_type, missing, unrecognized, suggestions, retry_kind,
            retries_trace_id, retries_span_id, diagnostic, arguments, mcp_server, mcp_method, started, duration_ms
            FROM new.tool_calls;""", 1)
    migrated = connect(str(path))
    assert migrated.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    assert _stored(migrated) == _stored(_before(4, session.db))
    assert _everything(migrated) == _everything(_before(4, session.db))
    indexes = {row[0] for row in migrated.execute("SELECT name FROM sqlite_master WHERE type = 'index' "
                                                  "AND name NOT LIKE 'sqlite_%'")}
    assert indexes == {"trajectories_ended", "requests_key", "model_turns_key", "tool_calls_key",
                       "model_turns_of_request", "tool_calls_of_request"}
    assert {row[0] for row in migrated.execute("SELECT name FROM sqlite_master WHERE type = 'table'")} == {
        "trajectories", "requests", "model_turns", "tool_calls"}


def test_a_version_2_store_gains_the_side_of_its_calls(session: Session, tmp_path: Path) -> None:
    path = tmp_path / "v2.sqlite3"
    _older_store(path, V2_SCHEMA, session, """
        INSERT INTO trajectories SELECT * FROM new.trajectories;
        INSERT INTO requests SELECT * FROM new.requests;
        INSERT INTO model_turns SELECT {V4_TURN_COLUMNS} FROM new.model_turns;
        INSERT INTO tool_calls SELECT span_id, trace_id, request_span_id, trajectory_id, round, tool, call_id, outcome,
            rejection_reason, error_type, missing, unrecognized, suggestions, retry_kind, retries_trace_id,
            retries_span_id, diagnostic, arguments, mcp_server, mcp_method, started, duration_ms
            FROM new.tool_calls;""".replace("{V4_TURN_COLUMNS}", V4_TURN_COLUMNS), 2)
    migrated = connect(str(path))
    assert migrated.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,) == (7,)
    # every call stored before is the gateway's (side NULL)
    assert _stored(migrated) == _stored(_before(4, session.db))
    assert _everything(migrated) == _everything(_before(4, session.db))
    assert {row[0] for row in migrated.execute("SELECT side FROM tool_calls")} == {None}


def test_a_version_3_store_gains_the_decisions_of_its_calls(session: Session, tmp_path: Path) -> None:
    path = tmp_path / "v3.sqlite3"
    _older_store(path, V3_SCHEMA, session, """
        INSERT INTO trajectories SELECT * FROM new.trajectories;
        INSERT INTO requests SELECT * FROM new.requests;
        INSERT INTO model_turns SELECT {V4_TURN_COLUMNS} FROM new.model_turns;
        INSERT INTO tool_calls SELECT span_id, trace_id, request_span_id, trajectory_id, round, tool, call_id, outcome,
            rejection_reason, error_type, missing, unrecognized, suggestions, retry_kind, retries_trace_id,
            retries_span_id, diagnostic, arguments, mcp_server, mcp_method, started, duration_ms, side, client_ms,
            result_bytes, result_outcome FROM new.tool_calls;""".replace("{V4_TURN_COLUMNS}", V4_TURN_COLUMNS), 3)
    migrated = connect(str(path))
    assert migrated.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,) == (7,)
    # no call stored before waited for a reviewer (NULLs)
    assert _stored(migrated) == _stored(_before(4, session.db))
    assert _everything(migrated) == _everything(_before(4, session.db))
    assert set(migrated.execute("SELECT decision, decided_by, approval_wait_ms FROM tool_calls")) == {
        (None, None, None)}
    columns = [row[1] for row in migrated.execute("PRAGMA table_info(tool_calls)")]
    assert columns == [row[1] for row in session.db.execute("PRAGMA table_info(tool_calls)")]
    assert columns[-13:-10] == ["decision", "decided_by", "approval_wait_ms"]


def test_a_version_5_store_gains_the_guardrail_decisions_of_its_calls(session: Session, tmp_path: Path) -> None:
    path = tmp_path / "v5.sqlite3"
    v5 = [column.name for column in TOOL_CALLS.columns if column.since <= 5]
    v5_turns = [column.name for column in MODEL_TURNS.columns if column.since <= 5]
    _older_store(path, "\n".join(table.create(5) for table in TABLES), session, f"""
        INSERT INTO trajectories SELECT * FROM new.trajectories;
        INSERT INTO requests SELECT * FROM new.requests;
        INSERT INTO model_turns SELECT {', '.join(v5_turns)} FROM new.model_turns;
        INSERT INTO tool_calls SELECT {', '.join(v5)} FROM new.tool_calls;""", 5)
    migrated = connect(str(path))
    assert migrated.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,) == (7,)
    # no guardrail decided on a call stored before (NULLs)
    assert _stored(migrated) == _stored(_before(5, session.db))
    assert _everything(migrated) == _everything(_before(5, session.db))
    assert set(migrated.execute("SELECT guardrail, guardrail_decision, guardrails FROM tool_calls")) == {
        (None, None, None)}
    columns = [row[1] for row in migrated.execute("PRAGMA table_info(tool_calls)")]
    assert columns == [row[1] for row in session.db.execute("PRAGMA table_info(tool_calls)")]
    assert columns[-10:-5] == ["guardrail", "guardrail_decision", "guardrail_reason", "guardrail_moment",
                               "guardrails"]


def test_a_version_6_store_gains_the_aliases_and_repairs_of_its_calls(session: Session, tmp_path: Path) -> None:
    path = tmp_path / "v6.sqlite3"
    v6 = {table.name: [column.name for column in table.columns if column.since <= 6] for table in TABLES}
    _older_store(path, "\n".join(table.create(6) for table in TABLES), session, "\n".join(
        f"INSERT INTO {name} SELECT {', '.join(columns)} FROM new.{name};" for name, columns in v6.items()), 6)
    migrated = connect(str(path))
    assert migrated.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,) == (7,)
    # no call stored before used an alias or was repaired (NULLs); the rest is as it was
    assert _stored(migrated) == _stored(_before(6, session.db))
    assert _everything(migrated) == _everything(_before(6, session.db))
    assert set(migrated.execute("SELECT aliases, repair_mode, repair_changes, repair_before, repair_after "
                                "FROM tool_calls")) == {(None, None, None, None, None)}
    assert set(migrated.execute("SELECT tool_definitions FROM model_turns")) == {(None,)}
    columns = [row[1] for row in migrated.execute("PRAGMA table_info(tool_calls)")]
    assert columns == [row[1] for row in session.db.execute("PRAGMA table_info(tool_calls)")]
    assert columns[-5:] == ["aliases", "repair_mode", "repair_changes", "repair_before", "repair_after"]


def test_a_store_of_a_newer_schema_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "newer.sqlite3"
    newer = sqlite3.connect(path, isolation_level=None)
    newer.executescript(f"CREATE TABLE future (x); PRAGMA user_version = {SCHEMA_VERSION + 1};")
    newer.close()
    with pytest.raises(sqlite3.DatabaseError, match="newer than this toolspan"):
        connect(str(path))
    untouched = sqlite3.connect(path)
    assert untouched.execute("SELECT name FROM sqlite_master").fetchall() == [("future",)]
    assert untouched.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION + 1,)


def test_the_gateways_trajectory_ids_grow_with_time() -> None:
    before = time.time_ns() // 1_000_000
    minted = [request_ids({}) for _ in range(200)]
    after = time.time_ns() // 1_000_000
    trajectories = [trajectory for trajectory, _, named in minted if not named]
    assert len(set(trajectories)) == 200
    assert all(len(t) == 32 and int(t, 16) >= 0 and before <= int(t[:12], 16) <= after for t in trajectories)
    assert [t[:12] for t in trajectories] == sorted(t[:12] for t in trajectories)
    assert len({request for _, request, _ in minted}) == 200
    assert all(len(request) == 16 for _, request, _ in minted)


def test_a_full_batch_is_written_without_lingering(tmp_path: Path) -> None:
    """A writer that lingered whenever a span came fell behind a busy gateway for good: it slept
    its whole linger even with a batch's worth waiting. With a whole batch queued, it writes at once."""
    store = TrajectoryStore(tmp_path / "store.sqlite3", batch_size=4, linger_seconds=120.0)
    provider = TracerProvider()
    provider.add_span_processor(store)
    tracer = provider.get_tracer("test")
    for number in range(2):  # two requests of two spans each: one batch
        with tracer.start_as_current_span("POST /v1/chat/completions", kind=SpanKind.SERVER,
                                          attributes={names.ATTR_CONVERSATION_ID: f"full-batch-{number}"}), \
                tracer.start_as_current_span(names.SPAN_TOOL_CALL, attributes={names.ATTR_TOOL_NAME: "add"}):
            pass
    deadline = time.monotonic() + 10.0  # far less than the linger: only a write without it gets here
    written = 0
    while written < 2 and time.monotonic() < deadline:
        with contextlib.closing(sqlite3.connect(store.path)) as db:
            written = db.execute("SELECT COUNT(*) FROM requests").fetchone()[0] if _has_schema(db) else 0
        time.sleep(0.01)
    try:
        assert written == 2
    finally:
        provider.shutdown()


class _Watch(SpanProcessor):
    """Keeps a weak reference to every span that ends."""

    def __init__(self, ended: list[weakref.ref[ReadableSpan]]) -> None:
        self._ended = ended

    def on_end(self, span: ReadableSpan) -> None:
        self._ended.append(weakref.ref(span))


def test_the_store_keeps_a_queued_spans_record_and_lets_the_span_go(tmp_path: Path) -> None:
    """A queued SDK span holds 13 objects the garbage collector tracks, and the hundreds a busy
    gateway has queued at any time made it collect several times a second. The store queues the
    span's record: the span itself goes once nothing else holds it, and its rows are still written."""
    store = TrajectoryStore(tmp_path / "store.sqlite3", linger_seconds=120.0)
    ended: list[weakref.ref[ReadableSpan]] = []  # what the store is handed: the SDK's ended span
    provider = TracerProvider()
    provider.add_span_processor(_Watch(ended))
    provider.add_span_processor(store)
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("POST /v1/chat/completions", kind=SpanKind.SERVER,
                                      attributes={names.ATTR_CONVERSATION_ID: "queued"}), \
            tracer.start_as_current_span(names.SPAN_TOOL_CALL, attributes={names.ATTR_TOOL_NAME: "add"}):
        pass
    gc.collect()
    try:
        assert len(ended) == 2
        assert [ref() for ref in ended] == [None, None]  # while the writer lingers with them
        assert store.flush(10.0)
        with contextlib.closing(sqlite3.connect(store.path)) as db:
            assert db.execute("SELECT id FROM trajectories").fetchall() == [("queued",)]
            assert db.execute("SELECT tool FROM tool_calls").fetchall() == [("add",)]
    finally:
        provider.shutdown()


def test_a_writer_a_whole_batch_behind_gets_the_gil_from_the_request_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An event loop that is never idle keeps the GIL from the writer, which needs it after every
    statement, until the switch interval forces a hand-over: the writer fell behind, and memory grew
    by the spans waiting. While a whole batch waits, a span's end gives the GIL up (`time.sleep(0)`),
    at most once every 5 ms: a writer stuck on a lock or a disk cannot take more of the loop's time."""
    store = TrajectoryStore(tmp_path / "store.sqlite3", batch_size=4, linger_seconds=0.05)
    writing, release = threading.Event(), threading.Event()

    def stuck(records: list[SpanRecord]) -> None:  # a writer busy with a batch while more arrive
        writing.set()
        release.wait(30.0)

    given_up: list[float] = []
    now = [1000.0]
    monkeypatch.setattr(store, "_write", stuck)
    monkeypatch.setattr(store_module, "time", SimpleNamespace(sleep=given_up.append, monotonic=lambda: now[0]))
    provider = TracerProvider()
    provider.add_span_processor(store)
    tracer = provider.get_tracer("test")

    def end_a_span() -> int:
        tracer.start_span(names.SPAN_TOOL_CALL, attributes={names.ATTR_TOOL_NAME: "add"}).end()
        return len(given_up)

    try:
        assert end_a_span() == 0  # the writer takes it, lingers, and is held writing it
        assert writing.wait(10.0)
        assert [end_a_span() for _ in range(6)] == [0, 0, 0, 1, 1, 1]  # a whole batch waits from the 4th
        now[0] += 0.004
        assert end_a_span() == 1
        now[0] += 0.001
        assert [end_a_span() for _ in range(2)] == [2, 2]
        assert given_up == [0, 0]
    finally:
        release.set()
        monkeypatch.undo()
        provider.shutdown()


def _has_schema(db: sqlite3.Connection) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE name = 'requests'").fetchone() is not None


def _plain_tool_requests(count: int) -> list[SpanRecord]:
    """`count` requests of one tool call and one model turn each, in the order their spans end."""
    records = []
    for number in range(count):
        request, trace = f"{number:016x}", f"{number:032x}"
        records += [
            SpanRecord(names.SPAN_TOOL_CALL, SpanKind.INTERNAL, trace, f"a{number:015x}", request, 1, 2,
                       {names.ATTR_TOOL_NAME: "add", names.ATTR_TOOL_CALL_ARGUMENTS: '{"a": 1}'}),
            SpanRecord(f"{names.SPAN_CHAT_PREFIX} m", SpanKind.CLIENT, trace, f"b{number:015x}", request, 2, 3,
                       {names.ATTR_REQUEST_MODEL: "m"}),
            SpanRecord("POST /v1/chat/completions", SpanKind.SERVER, trace, request, None, 0, 4,
                       {names.ATTR_CONVERSATION_ID: f"t{number:05}"})]
    return records


def test_a_batch_is_written_in_a_few_statements_however_many_its_rows() -> None:
    """sqlite3 lets other threads take the GIL at every statement it runs, and behind a busy event
    loop the writer waits up to 5 ms to get it back: a batch written a tool call a statement took
    its writer 0.1 to 0.5 s and fell behind the gateway. Rows go many to a statement."""
    for count in (300, 700):
        db = sqlite3.connect(":memory:", isolation_level=None)
        db.executescript(SCHEMA)
        statements: list[str] = []
        db.set_trace_callback(statements.append)
        assert write(db, _plain_tool_requests(count)) == 3 * count
        db.set_trace_callback(None)
        assert len(statements) <= 32, f"{len(statements)} statements for {count} requests"
        assert db.execute("SELECT COUNT(*), COUNT(DISTINCT trajectory_id) FROM tool_calls").fetchone() == (count, count)
        assert db.execute("SELECT COUNT(*) FROM trajectories").fetchone() == (count,)


def test_a_sqlite_of_999_variables_a_statement_still_takes_the_batch() -> None:
    """SQLite before 3.32 allows 999 variables a statement: 256 rows of a tool call's 22 columns
    would fail there, and the whole batch with them."""
    db = sqlite3.connect(":memory:", isolation_level=None)
    db.executescript(SCHEMA)
    db.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)
    assert write(db, _plain_tool_requests(300)) == 900
    assert db.execute("SELECT COUNT(*) FROM tool_calls").fetchone() == (300,)


def test_listed_names_read_back_as_they_were_whatever_their_characters() -> None:
    """Names lists are stored as JSON arrays; in them, a lone surrogate, which an imported OTLP
    file's JSON may carry and orjson refuses, is stored as JSON escapes it (as json.dumps always
    did) rather than failing the batch."""
    db = sqlite3.connect(":memory:", isolation_level=None)
    db.executescript(SCHEMA)
    reasons = ["stop", "länge \ud800", "tool_calls"]
    unrecognized = ["file_path", "pfad_ü"]
    write(db, [
        SpanRecord(names.SPAN_TOOL_CALL, SpanKind.INTERNAL, "1" * 32, "a" * 16, "c" * 16, 1, 2,
                   {names.ATTR_TOOL_NAME: "read_file", names.ATTR_ARGS_UNRECOGNIZED: unrecognized}),
        SpanRecord(f"{names.SPAN_CHAT_PREFIX} m", SpanKind.CLIENT, "1" * 32, "b" * 16, "c" * 16, 2, 3,
                   {names.ATTR_FINISH_REASONS: reasons}),
        SpanRecord("POST /v1/chat/completions", SpanKind.SERVER, "1" * 32, "c" * 16, None, 0, 4,
                   {names.ATTR_CONVERSATION_ID: "listed-names"})])
    [(stored_reasons,)] = db.execute("SELECT finish_reasons FROM model_turns").fetchall()
    [(stored_names,)] = db.execute("SELECT unrecognized FROM tool_calls").fetchall()
    assert json.loads(stored_reasons) == reasons
    assert json.loads(stored_names) == unrecognized
