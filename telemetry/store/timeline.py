"""One trajectory's timeline, a page of its requests at a time (`telemetry.store.report.trajectory`).

Any caller can grow a trajectory without bound (every request naming one `X-Trajectory-Id`), so
nothing here reads a request's rows by scanning the trajectory's: a page's model turns and tool
calls are found through the (trajectory, request) indexes, and the figures of the whole trajectory
are counted by SQLite. A page costs its own rows plus a pass over the trajectory's request keys,
whatever its place in the trajectory."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gateway.tools.approval_text import denial_reason
from telemetry.store.records import split_stored_id, stored_id
from telemetry.store.rows import CALL_COLUMNS, FAILED, REQUEST_COLUMNS, TURN_COLUMNS, named, rows, suggestions

# span_id: requests that started together keep one order across pages. Ordering a page's requests
# sorts the trajectory's in SQLite, which is cheap: an index in that order would cost every request
# written, for the page's sake.
_IN_ORDER = "ORDER BY started, span_id"
# The rows of the page's requests, their span ids bound as one JSON array: a page may hold more
# requests than an older SQLite takes variables in a statement (999).
_OF_PAGE = "WHERE trajectory_id = ? AND request_span_id IN (SELECT value FROM json_each(?)) ORDER BY started"
# The whole trajectory's figures, counted as the trajectory list counts them (`report.list_trajectories`):
# the model turns of its recorded requests, every tool call it names.
_TOTALS = ("SELECT (SELECT COUNT(*) FROM requests WHERE trajectory_id = ?), "
           "(SELECT COUNT(*) FROM model_turns m JOIN requests r ON r.trajectory_id = m.trajectory_id "
           "AND r.span_id = m.request_span_id WHERE m.trajectory_id = ?), "
           "(SELECT COUNT(*) FROM tool_calls WHERE trajectory_id = ?), "
           f"(SELECT COUNT(*) FROM tool_calls WHERE trajectory_id = ? AND outcome IN ({', '.join('?' * len(FAILED))}))")


@contextmanager
def _snapshot(db: sqlite3.Connection) -> Iterator[None]:
    """The questions of one page in one read transaction: the writer may commit between them, and
    the page's counts and rows must be of the same moment. In the caller's, if one is open."""
    if db.in_transaction:
        yield
        return
    db.execute("BEGIN")
    try:
        yield
    finally:
        db.execute("COMMIT")  # it only read: nothing to keep or to lose


def trajectory(db: sqlite3.Connection, trajectory_id: str, key: str | None = None, *, offset: int = 0,
               limit: int | None = None) -> dict[str, Any] | None:
    """One trajectory's timeline, None when the store has no such trajectory; given `key`, only one
    of that gateway key's, named by its stored id or by the id its caller knows. Its requests in the
    order they started, `limit` of them (None: all) from the `offset`th (0 for the first):
    {"id", "key", "local_id", "started", "ended", "offset",
    "totals": {"requests", "model_turns", "tool_calls", "failed_calls"} (of the whole trajectory),
    "requests": [{"index" (its place in the trajectory, from 1), "span_id", "trace_id", "name",
    "route", "status", "rounds", "limit_reached", "error_type", "started", "duration_ms",
    "events": [event, ...]}]}.

    Events, in the order they started: {"type": "model_turn", "span_id", "round", "model",
    "response_model", "provider", "response_id", "finish_reasons", "stream", "input_tokens",
    "output_tokens", "error_type", "error_message", "input_messages", "output_messages" (the GenAI
    messages where content was captured, else None), "started", "duration_ms", "upstream" (the
    configured upstream it went to), "fallback_from" (the one it moved on from, if any), ...} and
    {"type": "tool_call", "span_id", "round", "tool", "call_id", "outcome", "rejection_reason",
    "error_type", "missing", "unrecognized", "suggestions": {sent: accepted}, "retry_kind",
    "retries_span_id" (the failed call it retries), "retries_request" (the index of that call's
    request, None when it is not stored), "retried_by": {"span_id", "request"} or None (the first
    call that retried this one, and its request's index), "diagnostic" (what the model was told),
    "arguments" (masked; failed calls, or all when recorded), "mcp_server", "mcp_method", "started",
    "duration_ms", "side" ("gateway", or "client": a call of the client's own tool the gateway
    checked), and of a client call whose result came back: "client_ms" (from the answer that handed
    it over to the request that brought the result), "result_bytes", "result_outcome" (None
    before), and of a call that waited for a reviewer's approval: "decision" (approve, deny, timeout,
    cancelled, shutdown, unavailable), "decided_by" (the gateway key that decided, None without
    keys), "approval_wait_ms", "decision_reason" (a denial's reason; None for every other call),
    "aliases": {alias sent: parameter} (the parameter aliases its arguments used; {} for none), and of
    a call argument repair found a fix for: "repair_mode" (apply: it ran on the fixed arguments,
    outcome repaired; observe: it stayed rejected), "repair_changes" (each change in words),
    "repair_before" and "repair_after" (the arguments as sent and as fixed: JSON text, masked as
    "arguments" is; None where no fix was found), ...}."""
    if offset < 0 or (limit is not None and limit < 1):
        raise ValueError(f"offset {offset}, limit {limit}: a page starts at 0 or later and holds a request or more")
    if key is not None and split_stored_id(trajectory_id)[0] != key:
        trajectory_id = stored_id(key, trajectory_id)  # the id the key's caller knows it by, or none of its own
    with _snapshot(db):
        found = db.execute("SELECT id, started, ended FROM trajectories WHERE id = ?", (trajectory_id,)).fetchone()
        if found is None:
            return None
        requests = rows(db, f"SELECT {', '.join(REQUEST_COLUMNS)} FROM requests WHERE trajectory_id = ? "
                            f"{_IN_ORDER} LIMIT ? OFFSET ?", REQUEST_COLUMNS,
                        (trajectory_id, -1 if limit is None else limit, offset))
        for index, request in enumerate(requests, offset + 1):
            request["index"] = index
        _add_events(db, trajectory_id, requests)
        totals = db.execute(_TOTALS, (trajectory_id,) * 4 + FAILED).fetchone()
    return {**named(found[0]), "started": found[1], "ended": found[2], "offset": offset,
            "totals": dict(zip(("requests", "model_turns", "tool_calls", "failed_calls"), totals, strict=True)),
            "requests": requests}


def _add_events(db: sqlite3.Connection, trajectory_id: str, requests: list[dict[str, Any]]) -> None:
    """Each request's "events": its model turns and tool calls, in the order they started."""
    ids = json.dumps([request["span_id"] for request in requests])
    turns = rows(db, f"SELECT {', '.join(TURN_COLUMNS)} FROM model_turns {_OF_PAGE}", TURN_COLUMNS,
                 (trajectory_id, ids))
    calls = rows(db, f"SELECT {', '.join(CALL_COLUMNS)} FROM tool_calls {_OF_PAGE}", CALL_COLUMNS,
                 (trajectory_id, ids))
    for call in calls:
        call["suggestions"] = suggestions(call["suggestions"])
        call["aliases"] = suggestions(call["aliases"])
        # A denial's reason, read back from what the model was told.
        call["decision_reason"] = denial_reason(call["diagnostic"]) if call["decision"] == "deny" else None
    _link_retries(db, trajectory_id, requests, calls)
    events: dict[str, list[dict[str, Any]]] = {request["span_id"]: [] for request in requests}
    for event in sorted([{"type": "model_turn", **t} for t in turns] + [{"type": "tool_call", **c} for c in calls],
                        key=lambda e: e["started"]):
        events[event["request_span_id"]].append(event)
    for request in requests:
        request["events"] = events[request["span_id"]]


def _link_retries(db: sqlite3.Connection, trajectory_id: str, requests: list[dict[str, Any]],
                  calls: list[dict[str, Any]]) -> None:
    """Each call's retry links both ways, with the index of the request at the other end: that
    call may be on another page."""
    retried = {c["retries_span_id"] for c in calls if c["retries_span_id"]}
    request_of = dict(db.execute(
        "SELECT span_id, request_span_id FROM tool_calls WHERE trajectory_id = ? AND span_id IN "
        "(SELECT value FROM json_each(?))", (trajectory_id, json.dumps(sorted(retried)))).fetchall())
    retried_by: dict[str, tuple[str, str]] = {}
    for target, retry, request in db.execute(
            "SELECT retries_span_id, span_id, request_span_id FROM tool_calls WHERE trajectory_id = ? AND "
            "retries_span_id IN (SELECT value FROM json_each(?)) ORDER BY started",
            (trajectory_id, json.dumps([c["span_id"] for c in calls]))):
        retried_by.setdefault(target, (retry, request))
    index = _Indexes(db, trajectory_id, requests)
    for call in calls:
        target_request = request_of.get(call["retries_span_id"])
        call["retries_request"] = index.of(target_request) if target_request else None
        by = retried_by.get(call["span_id"])
        call["retried_by"] = {"span_id": by[0], "request": index.of(by[1])} if by else None


class _Indexes:
    """Where a request is in its trajectory (from 1; None when it is not recorded): the page's
    requests are known; the others' are read, all at once, the first time one is asked for."""

    def __init__(self, db: sqlite3.Connection, trajectory_id: str, requests: list[dict[str, Any]]) -> None:
        self._db, self._trajectory_id = db, trajectory_id
        self._known: dict[str, int] = {request["span_id"]: request["index"] for request in requests}
        self._all: dict[str, int] | None = None

    def of(self, request_span_id: str) -> int | None:
        if request_span_id in self._known:
            return self._known[request_span_id]
        if self._all is None:
            ordered = self._db.execute(f"SELECT span_id FROM requests WHERE trajectory_id = ? {_IN_ORDER}",
                                       (self._trajectory_id,))
            self._all = {span_id: index for index, (span_id,) in enumerate(ordered, 1)}
        return self._all.get(request_span_id)
