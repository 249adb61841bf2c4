"""The tool calls the report's questions count (`telemetry.store.report`, `telemetry.store.compare`):
which trajectories a question reads, each call with the model turn that made it, and the failures
among them (a run of failed calls of one tool in one trajectory) with whether each recovered.

Both the report and the comparison count from these, so that a figure means the same in each."""

from __future__ import annotations

import sqlite3
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from telemetry import names
from telemetry.store.records import key_range
from telemetry.store.rows import CALL_COLUMNS, FAILED, TURN_COLUMNS, rows, selected

# A trajectory's model turns are those of its recorded requests (as `m`), found through its key.
RECORDED_TURNS = ("FROM model_turns m JOIN requests r ON r.trajectory_id = m.trajectory_id "
                  "AND r.span_id = m.request_span_id")


def of_key(column: str, key: str | None) -> tuple[str, tuple[str, ...]]:
    """The condition and its parameters that keep the rows of one gateway key's trajectories,
    `column` holding the stored id; every row without a key."""
    if key is None:
        return "1 = 1", ()
    return f"{column} >= ? AND {column} < ?", key_range(key)


def trajectory_ids(db: sqlite3.Connection, since: float | None, key: str | None) -> list[str]:
    """The trajectories active at or after `since` (any, when None), of the gateway key named `key`
    (every key's, when None)."""
    condition, params = of_key("id", key)
    return [row[0] for row in db.execute(f"SELECT id FROM trajectories WHERE ended >= ? AND {condition}",
                                         (since if since is not None else float("-inf"), *params))]


def turns_of(db: sqlite3.Connection, trajectory_id: str) -> list[dict[str, Any]]:
    """A trajectory's model turns, in the order they started."""
    columns = ", ".join(f"m.{c}" for c in TURN_COLUMNS)
    sql = f"SELECT {columns} {RECORDED_TURNS} WHERE m.trajectory_id = ? ORDER BY m.started"
    return rows(db, sql, TURN_COLUMNS, (trajectory_id,))


def calls_with_models(db: sqlite3.Connection, trajectory_id: str) -> tuple[list[dict[str, Any]],
                                                                           list[dict[str, Any]]]:
    """The trajectory's calls in order, each with "model" and "upstream" (of the turn that made it)
    and "turn" (how many model turns of the trajectory had started before it: rounds across
    requests); and its turns."""
    turns = turns_of(db, trajectory_id)
    turn_of = {(t["request_span_id"], t["round"]): t for t in turns}
    starts = [t["started"] for t in turns]
    calls = selected(db, "tool_calls", CALL_COLUMNS, "WHERE trajectory_id = ?", (trajectory_id,))
    for call in calls:
        made_by = turn_of.get((call["request_span_id"], call["round"])) or {}
        call["model"], call["upstream"] = made_by.get("model"), made_by.get("upstream")
        call["turn"] = bisect_right(starts, call["started"])
    return calls, turns


def by_trajectory_tool(calls: Iterable[dict[str, Any]]) -> dict[tuple[str | None, str], list[dict[str, Any]]]:
    """Calls by (trajectory, tool), each group in the calls' order."""
    groups: dict[tuple[str | None, str], list[dict[str, Any]]] = defaultdict(list)
    for call in calls:
        groups[(call["trajectory_id"], call["tool"])].append(call)
    return groups


# The outcomes of a call that ran and returned: a recovery, after failed calls (a repaired call ran on
# mended arguments, and counts as the metrics count it: gateway.tools.repair).
RETURNED = ("ok", names.OUTCOME_REPAIRED)


class Failure(NamedTuple):
    """A run of failed calls of a tool in a trajectory, and the model turns from its first call to
    the later call of the tool that returned (None: none came, it never recovered)."""

    calls: Sequence[dict[str, Any]]
    rounds_to_recover: int | None


def failure_runs(calls: Iterable[dict[str, Any]]) -> list[Failure]:
    """The failures among some calls (with "turn", in order)."""
    found: list[Failure] = []
    for group in by_trajectory_tool(calls).values():
        run: list[dict[str, Any]] = []
        for call in group:
            if call["outcome"] in FAILED:
                run.append(call)
            elif run and call["outcome"] in RETURNED:
                found.append(Failure(run, call["turn"] - run[0]["turn"]))
                run = []
        if run:
            found.append(Failure(run, None))
    return found


def failures(calls: Iterable[dict[str, Any]]) -> list[int | None]:
    """One entry per failure: the model turns it took to recover, or None when it did not."""
    return [failure.rounds_to_recover for failure in failure_runs(calls)]
