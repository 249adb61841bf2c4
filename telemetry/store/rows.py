"""Rows of the trajectory database as the report's questions (`telemetry.store.report`,
`telemetry.store.timeline`) hand them out: plain dicts, their JSON columns decoded, and how a
trajectory is named."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from telemetry.store.records import split_stored_id

FAILED = ("error", "rejected", "timeout", "cancelled")  # outcomes that are a failed call ("interrupted" waits)

CALL_COLUMNS = ("span_id", "trace_id", "request_span_id", "trajectory_id", "round", "tool", "call_id", "outcome",
                "rejection_reason", "error_type", "missing", "unrecognized", "suggestions", "retry_kind",
                "retries_trace_id", "retries_span_id", "diagnostic", "arguments", "mcp_server", "mcp_method",
                "started", "duration_ms", "side", "client_ms", "result_bytes", "result_outcome", "decision",
                "decided_by", "approval_wait_ms")
TURN_COLUMNS = ("span_id", "trace_id", "request_span_id", "round", "model", "response_model", "provider",
                "response_id", "finish_reasons", "stream", "input_tokens", "output_tokens", "error_type",
                "error_message", "input_messages", "output_messages", "started", "duration_ms")
_JSON_COLUMNS = frozenset({"missing", "unrecognized", "suggestions", "finish_reasons", "input_messages",
                           "output_messages"})


def rows(db: sqlite3.Connection, sql: str, columns: Sequence[str], params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """Rows as dicts, the JSON columns decoded."""
    found = []
    for row in db.execute(sql, params):
        item = dict(zip(columns, row, strict=True))
        for key in _JSON_COLUMNS.intersection(item):
            item[key] = _decoded(item[key])
        if "side" in item:
            item["side"] = item["side"] or "gateway"  # stored for the client's calls only
        found.append(item)
    return found


def _decoded(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:  # content an importer wrote as plain text
        return text


def selected(db: sqlite3.Connection, table: str, columns: Sequence[str], where: str = "",
             params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    sql = f"SELECT {', '.join(columns)} FROM {table} {where} ORDER BY started"
    return rows(db, sql, columns, params)


def suggestions(pairs: Iterable[str] | None) -> dict[str, str]:
    """`toolspan.args.suggestions` ("sent->accepted") as a mapping."""
    return dict(pair.rsplit("->", 1) for pair in pairs or () if "->" in pair)


def named(stored: str) -> dict[str, Any]:
    """How a trajectory is named: its id in the store, the gateway key that made it (None without
    keys) and the id its caller knows it by."""
    key, local_id = split_stored_id(stored)
    return {"id": stored, "key": key, "local_id": local_id}
