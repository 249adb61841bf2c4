"""Spans written into the trajectory database as rows (the tables are `telemetry.store.columns`'),
and the rows pruned.

One span in, at most one row out: a `tool.call` span is a row of `tool_calls`, a `chat {model}`
span a row of `model_turns`, a request's SERVER span a row of `requests` (only when some tool call
or model turn belongs to it: health checks and metric scrapes are no trajectory). A span ends
after its children, so a request's rows are written before the request itself, whether the spans
come from this process or from an OTLP file (`telemetry.store.otlp` orders them by their end).
`telemetry.store.report` reads these rows; nothing else writes them.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from itertools import chain
from typing import Any

from telemetry import names
from telemetry.guardrails import standing_index
from telemetry.store.columns import MODEL_TURNS, REQUESTS, TOOL_CALLS, TRAJECTORIES, Table, parameters
from telemetry.store.sources import compiled, guardrails_of, json_array, text_of
from telemetry.store.span_records import SpanRecord, kind_of

_NONE = ""  # no trajectory (yet): a child kept until its request comes


def _insert_many(table: Table) -> tuple[str, str, str]:
    """An insert of many rows into `table` for `_insert_all`: the rows' plain parameters in a VALUES
    list, each blank-is-NULL column's NULLIF once in the SELECT over it. A NULLIF for every
    parameter made SQLite's prepared statements, one of each size in `_CHUNKS`, about three times
    larger (docs/benchmarks.md)."""
    select = ", ".join(f"NULLIF(column{n}, '')" if column.source.blank_is_null else f"column{n}"
                       for n, column in enumerate(table.columns, 1))
    return (f"INSERT OR REPLACE INTO {table.name} SELECT {select} FROM (VALUES ",
            "(" + ", ".join("?" * len(table.columns)) + ")", ")")


# Where write() finds what it needs in a row.
_CALL_REQUEST = TOOL_CALLS.position("request_span_id")
_TURN_SPAN, _TURN_TRAJECTORY, _TURN_REQUEST, _TURN_ROUND, _TURN_STARTED = (
    MODEL_TURNS.position(name) for name in ("span_id", "trajectory_id", "request_span_id", "round", "started"))

_INSERT_TOOL_CALLS = _insert_many(TOOL_CALLS)
# A model turn's round is its place among the turns of its request (they run one after another),
# counted from 1 as `toolspan.round` counts them: a tool call's round is the turn that asked for it.
# The turns counted are the others that started before it, so a turn written again (the same OTLP
# file imported twice) keeps its round.
_INSERT_MODEL_TURN = (f"INSERT OR REPLACE INTO model_turns VALUES ({parameters(MODEL_TURNS.columns[:_TURN_ROUND])}, "
                      "(SELECT COUNT(*) + 1 FROM model_turns WHERE trajectory_id = ? AND request_span_id = ? "
                      "AND span_id != ? AND started <= ?), "
                      f"{parameters(MODEL_TURNS.columns[_TURN_ROUND + 1:])})")
_INSERT_MODEL_TURNS = _insert_many(MODEL_TURNS)
_INSERT_REQUESTS = _insert_many(REQUESTS)
_INSERT_REQUEST_IF_ANY_ROW = (f"INSERT OR REPLACE INTO requests SELECT {parameters(REQUESTS.columns)} "
                              "WHERE EXISTS (SELECT 1 FROM tool_calls WHERE trajectory_id = ? AND request_span_id = ?) "
                              "OR EXISTS (SELECT 1 FROM model_turns WHERE trajectory_id = ? AND request_span_id = ?)")
_ADOPT_TURNS = "UPDATE OR REPLACE model_turns SET trajectory_id = ? WHERE trajectory_id = '' AND request_span_id = ?"
_ADOPT_CALLS = "UPDATE OR REPLACE tool_calls SET trajectory_id = ? WHERE trajectory_id = '' AND request_span_id = ?"
# One row (a JSON array), not a row each: sqlite3 lets other threads take the GIL at every row.
_PENDING = ("SELECT json_group_array(request_span_id) FROM (SELECT request_span_id FROM model_turns "
            "WHERE trajectory_id = '' UNION SELECT request_span_id FROM tool_calls WHERE trajectory_id = '')")
_TRAJECTORY_SPAN = ("ON CONFLICT (id) DO UPDATE SET started = min(started, excluded.started), "
                    "ended = max(ended, excluded.ended)")
_UPSERT_TRAJECTORIES = ("INSERT INTO trajectories VALUES ", f"({parameters(TRAJECTORIES.columns)})",
                        f" {_TRAJECTORY_SPAN}")
# What a client call's result said, set on the call's row when its execute step's span comes
# (gateway.client_tools.results); bound as read, "" included.
_RESULT_COLUMNS = [column for column in TOOL_CALLS.columns if column.of_result is not None]
_CLIENT_RESULT = (f"UPDATE tool_calls SET {', '.join(f'{column.name} = ?' for column in _RESULT_COLUMNS)} "
                  "WHERE trajectory_id = ? AND call_id = ? AND side = 'client'")
_RESULT_OF = compiled([column.of_result for column in _RESULT_COLUMNS if column.of_result is not None])
# The guardrails' decisions on a client call's result, merged into its row (`_guarded_result`).
_CALL_GUARDRAILS = ("SELECT span_id, guardrails FROM tool_calls WHERE trajectory_id = ? AND call_id = ? "
                    "AND side = 'client'")
_STANDING = ("guardrail", "decision", "reason", "moment")  # a decision's fields, as the columns below hold them
_SET_GUARDRAILS = ("UPDATE tool_calls SET guardrail = NULLIF(?, ''), guardrail_decision = NULLIF(?, ''), "
                   "guardrail_reason = NULLIF(?, ''), guardrail_moment = NULLIF(?, ''), guardrails = ? "
                   "WHERE trajectory_id = ? AND span_id = ?")


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


def _insert_all(db: sqlite3.Connection, statement: tuple[str, str, str], rows: list[list[Any]]) -> None:
    """Inserts `rows` with `statement` (its head, one row's "(?, ...)", its tail), many rows a
    statement, at most one statement of each size in `_CHUNKS` for the rest. Each statement's run
    is where sqlite3 lets other threads take the GIL, and behind a busy event loop the store's
    writer then waits up to the switch interval to get it back: with a row a run, the writer of a
    busy gateway (bench/soak.py) spent most of a batch's wall time waiting, and fell behind. Fewer
    runs also cost less CPU (docs/benchmarks.md)."""
    head, row, tail = statement
    most = db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // row.count("?")  # 999 variables before SQLite 3.32
    done = 0
    for size in (size for size in _CHUNKS if size <= most):
        while len(rows) - done >= size:
            chunk = rows[done:done + size]
            # chain: the rows' values flattened in C, cheaper than a comprehension.
            db.execute(head + ", ".join([row] * size) + tail, list(chain.from_iterable(chunk)))
            done += size


def _call_id(record: SpanRecord) -> str:
    return str(record.attributes.get(names.ATTR_TOOL_CALL_ID, ""))


def _client_result_row(record: SpanRecord) -> list[Any]:
    """_CLIENT_RESULT's parameters for a client call's execute step."""
    trajectory = _trajectory(record)
    return [*_RESULT_OF(record, trajectory), trajectory, _call_id(record)]


def _guarded_result(db: sqlite3.Connection, record: SpanRecord) -> None:
    """The guardrails' decisions on a client call's result, on the call's row: they take the place
    of any decisions on its result the row held (the same result written twice changes nothing),
    after those on the call itself, and the decision that stands is the strongest of them all."""
    found = guardrails_of(record)
    if not found:
        return
    on_result = json.loads(found)
    trajectory = _trajectory(record)
    for span_id, stored in db.execute(_CALL_GUARDRAILS, (trajectory, _call_id(record))).fetchall():
        decisions = [d for d in _decoded_list(stored) if d.get("moment") != "after"] + on_result
        standing = decisions[standing_index([str(d.get("decision")) for d in decisions])]
        db.execute(_SET_GUARDRAILS, (*(text_of(standing.get(field)) for field in _STANDING),
                                     json_array(decisions), trajectory, span_id))


def _decoded_list(text: str | None) -> list[dict[str, Any]]:
    try:
        found = json.loads(text) if text else []
    except ValueError:
        return []
    return [item for item in found if isinstance(item, dict)] if isinstance(found, list) else []


def _turn_rounds(turns: list[list[Any]]) -> list[list[Any]]:
    """`turns` (in the batch's order) with their rounds, counted as _INSERT_MODEL_TURN counts them
    in the database: 1 + the turns of the same request written before it that started no later."""
    earlier: dict[tuple[str, str], list[float]] = {}
    for turn in turns:
        started = earlier.setdefault((turn[_TURN_TRAJECTORY], turn[_TURN_REQUEST]), [])
        turn[_TURN_ROUND] = 1 + sum(1 for other in started if other <= turn[_TURN_STARTED])
        started.append(turn[_TURN_STARTED])
    return turns


def _counted_by_database(turn: list[Any]) -> tuple[Any, ...]:
    """The parameters of _INSERT_MODEL_TURN, which counts the turn's round itself."""
    return (*turn[:_TURN_ROUND], turn[_TURN_TRAJECTORY], turn[_TURN_REQUEST], turn[_TURN_SPAN], turn[_TURN_STARTED],
            *turn[_TURN_ROUND + 1:])


def write(db: sqlite3.Connection, records: Iterable[SpanRecord]) -> int:
    """Writes the rows of `records` in one transaction (the caller's, if one is open); returns how
    many rows were written. Spans of no table are skipped.

    A tool call's trajectory is the one it names, else its request's when that is in this batch,
    else '' until its request comes. A model turn's is always its request's (or '' until it comes),
    though its `chat` span names one too: the rounds of a request's turns are counted in this batch
    only when none was written before, which a turn kept under '' tells. So first the children kept
    under '' by earlier batches are given the trajectory of their request in this one; then the
    tool calls, the model turns (in their order: a turn's round counts the turns of its request
    before it), then the requests, which are kept only when some row of theirs exists (a request
    span ends after its children, so those are in this batch or an earlier one).

    Rows go in many to a statement where they can (`_insert_all`)."""
    classified = [(kind_of(record), record) for record in records]
    requests = [record for kind, record in classified if kind == "request"]
    trajectory_of_request = {record.span_id: _trajectory(record) for record in requests}
    pending = _adopt_children(db, trajectory_of_request)

    def trajectory(child: SpanRecord) -> str:
        return _trajectory(child) or trajectory_of_request.get(child.parent_span_id or _NONE, _NONE)

    calls = [TOOL_CALLS.row(record, trajectory(record)) for kind, record in classified if kind == "tool_call"]
    turns = [MODEL_TURNS.row(record, trajectory_of_request.get(record.parent_span_id or _NONE, _NONE))
             for kind, record in classified if kind == "model_turn"]
    _insert_all(db, _INSERT_TOOL_CALLS, calls)
    _write_turns(db, turns, trajectory_of_request.keys() - pending)
    parents = {row[_CALL_REQUEST] for row in calls} | {turn[_TURN_REQUEST] for turn in turns}
    kept = _write_requests(db, requests, trajectory_of_request, parents)
    # Last: a result the client brought back fast may be in the batch of its call's own row.
    results = [record for kind, record in classified if kind == "client_result"]
    completed = sum(db.execute(_CLIENT_RESULT, _client_result_row(record)).rowcount for record in results)
    for record in results:
        if record.events:  # guardrails decided on the result
            _guarded_result(db, record)
    return len(calls) + len(turns) + kept + completed


def _adopt_children(db: sqlite3.Connection, trajectory_of_request: dict[str, str]) -> set[str]:
    """Gives the children kept under '' by earlier batches the trajectory of their request, when it
    is among these; returns the requests that had any children kept so."""
    pending = set(json.loads(db.execute(_PENDING).fetchone()[0])) if trajectory_of_request else set()
    for span_id in pending & trajectory_of_request.keys():
        db.execute(_ADOPT_TURNS, (trajectory_of_request[span_id], span_id))
        db.execute(_ADOPT_CALLS, (trajectory_of_request[span_id], span_id))
    return pending


def _write_turns(db: sqlite3.Connection, turns: list[list[Any]], alone: set[str]) -> None:
    """A turn of a request in this batch whose turns none before were written (`alone`) has all its
    request's turns here: its round is counted here, and it is written with others in one run.
    Any other turn counts its round in the database, a run a turn."""
    in_batch: list[list[Any]] = []
    by_database: list[tuple[Any, ...]] = []
    for turn in turns:
        if turn[_TURN_REQUEST] in alone and turn[_TURN_TRAJECTORY]:
            in_batch.append(turn)
        else:
            by_database.append(_counted_by_database(turn))
    _insert_all(db, _INSERT_MODEL_TURNS, _turn_rounds(in_batch))
    db.executemany(_INSERT_MODEL_TURN, by_database)


def _write_requests(db: sqlite3.Connection, requests: list[SpanRecord], trajectory_of_request: dict[str, str],
                    parents: set[str]) -> int:
    """Writes the requests that have a row, and their trajectories; returns how many. A request with
    a row in this batch (`parents`) is kept without asking the database (most are: the spans of a
    request end within moments of each other); the others only when an earlier batch wrote one."""
    kept = [record for record in requests if record.span_id in parents]
    _insert_all(db, _INSERT_REQUESTS, [REQUESTS.row(r, trajectory_of_request[r.span_id]) for r in kept])
    for record in requests:
        trajectory_id = trajectory_of_request[record.span_id]
        if record.span_id not in parents and db.execute(
                _INSERT_REQUEST_IF_ANY_ROW, (*REQUESTS.row(record, trajectory_id), trajectory_id, record.span_id,
                                             trajectory_id, record.span_id)).rowcount > 0:
            kept.append(record)
    _insert_all(db, _UPSERT_TRAJECTORIES, [TRAJECTORIES.row(r, trajectory_of_request[r.span_id]) for r in kept])
    return len(kept)


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
