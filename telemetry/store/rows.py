"""Rows of the trajectory database as the report's questions (`telemetry.store.report`,
`telemetry.store.timeline`) hand them out: plain dicts, their JSON columns decoded, and how a
trajectory is named."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from gateway.wire.json_depth import nests_deeper
from telemetry.store.columns import MODEL_TURNS, REQUESTS, TABLES, TOOL_CALLS
from telemetry.store.records import split_stored_id

# Levels of nesting a JSON column is read with, as the gateway writes them (orjson refuses to write
# more); a deeper value, written by another hand, is read as its text.
STORED_DEPTH = 255
FAILED = ("error", "rejected", "timeout", "cancelled")  # outcomes that are a failed call ("interrupted" waits)

# What the report's questions read of each table: every column, but a model turn's trajectory (it
# is its request's) and a request's (the trajectory is asked for), and the tools a turn offered
# (a dataset's, telemetry.store.dataset: nothing the report or the timeline shows; not read, a
# store of schema 6 still reads).
CALL_COLUMNS = TOOL_CALLS.names
TURN_COLUMNS = tuple(name for name in MODEL_TURNS.names if name not in ("trajectory_id", "tool_definitions"))
REQUEST_COLUMNS = tuple(name for name in REQUESTS.names if name != "trajectory_id")
# By name: a name means one thing in every table.
_JSON_COLUMNS = frozenset(column.name for table in TABLES for column in table.columns if column.source.json)
# What a NULL of a column reads as, where it reads as something.
_WHEN_NULL = {column.name: column.when_null for table in TABLES for column in table.columns
              if column.when_null is not None}


def rows(db: sqlite3.Connection, sql: str, columns: Sequence[str], params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """Rows as dicts, the JSON columns decoded."""
    found = []
    for row in db.execute(sql, params):
        item = dict(zip(columns, row, strict=True))
        for key in _JSON_COLUMNS.intersection(item):
            item[key] = _decoded(item[key])
        for key, when_null in _WHEN_NULL.items():
            if key in item:
                item[key] = item[key] or when_null
        found.append(item)
    return found


def _decoded(text: str | None) -> Any:
    """A JSON column's value; its text when it is not JSON (an importer's plain text) or nests deeper
    than STORED_DEPTH, which the report's recursive walks (escaping for a terminal, writing JSON
    again) could not take."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return text
    if text.count("[") + text.count("{") > STORED_DEPTH and nests_deeper(value, STORED_DEPTH):  # counted in C first
        return text
    return value


def selected(db: sqlite3.Connection, table: str, columns: Sequence[str], where: str = "",
             params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    sql = f"SELECT {', '.join(columns)} FROM {table} {where} ORDER BY started"
    return rows(db, sql, columns, params)


def suggestions(pairs: Iterable[str] | None) -> dict[str, str]:
    """`toolspan.args.suggestions` ("sent->accepted"), or `toolspan.args.aliases` ("alias->parameter"),
    as a mapping."""
    return dict(pair.rsplit("->", 1) for pair in pairs or () if "->" in pair)


_DONE = {("allow", "before"): "allowed the call", ("allow", "after"): "allowed the result",
         ("flag", "before"): "flagged the call", ("flag", "after"): "flagged the result",
         ("deny", "before"): "denied the call", ("rewrite", "before"): "rewrote the arguments",
         ("ask", "before"): "asked for a reviewer's approval", ("block", "after"): "withheld the result",
         ("mask", "after"): "masked the result"}


def guardrail_words(decision: dict[str, Any]) -> str:
    """One stored guardrail decision (an element of a call's `guardrails`) in words: "guardrail
    secrets masked the result: credentials masked (a GitHub token)"."""
    said, moment = str(decision.get("decision")), str(decision.get("moment"))
    done = _DONE.get((said, moment), f"decided {said}")
    failed = f" (it failed: {decision['failed']})" if decision.get("failed") else ""
    reason = f": {decision['reason']}" if decision.get("reason") else ""
    return f"guardrail {decision.get('guardrail')} {done}{failed}{reason}"


def guardrail_decisions(call: dict[str, Any]) -> list[dict[str, Any]]:
    """A call's guardrail decisions as the store holds them (none where no guardrail decided)."""
    found = call.get("guardrails")
    return [item for item in found if isinstance(item, dict)] if isinstance(found, list) else []


_REPAIRED = {"apply": "repair applied", "observe": "repair observed, not applied"}


def repair_words(call: dict[str, Any]) -> str | None:
    """What argument repair found for a call, in words (None where it found nothing): "repair applied:
    rename A -> a; type a: string -> integer", or "repair observed, not applied: ..." (mode observe:
    the call stayed rejected)."""
    mode = call.get("repair_mode")
    if not mode:
        return None
    changes = call.get("repair_changes")
    said = "; ".join(str(change) for change in changes) if isinstance(changes, list) and changes else "no change named"
    done = _REPAIRED.get(str(mode), f"repair ({mode})")  # an imported file may name any mode
    return f"{done}: {said}"


def alias_words(aliases: dict[str, str]) -> str | None:
    """The parameter aliases a call used, in words (None where it used none): "aliases used:
    file_path -> path"."""
    return f"aliases used: {', '.join(f'{alias} -> {name}' for alias, name in aliases.items())}" if aliases else None


def named(stored: str) -> dict[str, Any]:
    """How a trajectory is named: its id in the store, the gateway key that made it (None without
    keys) and the id its caller knows it by."""
    key, local_id = split_stored_id(stored)
    return {"id": stored, "key": key, "local_id": local_id}
