"""The recorded tool calls as a replay reads them (gateway.improve.replay): each call's tool, side,
recorded outcome and reason, and its arguments as the span kept them, with what the recording did
to them (cut to a length, values masked), newest first. Plain dicts, as the report's questions
hand out (`telemetry.store.report`), one at a time: a replay of a whole store holds none of them
longer than it takes to parse it."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

from telemetry import names
from telemetry.arguments import was_cut, was_masked
from telemetry.store.records import key_range
from telemetry.store.rows import named

_COLUMNS = ("trajectory_id", "span_id", "trace_id", "call_id", "tool", "side", "outcome", "rejection_reason",
            "arguments", "started")


def recorded_calls(db: sqlite3.Connection, *, since: float | None = None, tool: str | None = None,
                   key: str | None = None, gateway_only: bool = False,
                   limit: int | None = None) -> Iterator[dict[str, Any]]:
    """Tool calls started at or after `since`, of `tool`, of the gateway key named `key`, of the
    gateway's own tools only (`gateway_only`), each filter when given; the newest `limit` of them
    (every one without a limit), newest first.

    Each: {"id", "key", "local_id" (its trajectory, as `named` names it), "span_id", "trace_id",
    "call_id", "tool", "side" ("gateway" or "client"), "outcome", "rejection_reason", "arguments"
    (the text recorded, None when none was), "started", "cut" (the arguments are the start of
    longer ones), "masked" (a value in them may be the mask)}."""
    where: list[str] = ["started >= ?"]
    params: list[Any] = [since if since is not None else float("-inf")]
    if tool is not None:
        where.append("tool = ?")
        params.append(tool)
    if key is not None:
        where.append("trajectory_id >= ? AND trajectory_id < ?")
        params += key_range(key)
    if gateway_only:
        where.append("side IS NULL")
    sql = (f"SELECT {', '.join(_COLUMNS)} FROM tool_calls WHERE {' AND '.join(where)} "
           "ORDER BY started DESC, span_id LIMIT ?")
    for row in db.execute(sql, (*params, -1 if limit is None else limit)):
        call = dict(zip(_COLUMNS, row, strict=True))
        arguments = call["arguments"]
        call.update(named(call.pop("trajectory_id")), side=call["side"] or names.SIDE_GATEWAY,
                    cut=arguments is not None and was_cut(arguments),
                    masked=arguments is not None and was_masked(arguments))
        yield call
