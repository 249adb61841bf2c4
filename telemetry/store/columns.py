"""The trajectory database's tables, each column declared once: its name, its SQL declaration and
where its value comes from (`telemetry.store.sources`: a span attribute named in `telemetry.names`,
a field of the span, or a derivation). Everything else is derived from these tables: the CREATE
TABLE statements and the migrations' added columns (`telemetry.store.schema`), the rows and their
inserts (`telemetry.store.records`), the reading of rows (`telemetry.store.rows`), the check of an
imported span's attributes (`attribute_problem`) and the attributes an export gives back
(`telemetry.store.otlp`).

A table's columns are listed in their order on disk. A column added after the base layout
(version 2, which the migration from version 1 rebuilds) names the version that added it (`since`)
and comes after every older one: ALTER TABLE appends, so a migrated store and a new one keep the
same order. A new column, then, is one Column at the end of its table with `since` one past
SCHEMA_VERSION, and SCHEMA_VERSION raised to it.

Times are seconds since the epoch (REAL), durations milliseconds, ids lower-case hex; lists of
names are JSON arrays."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from telemetry import names
from telemetry.store.sources import (
    BLANK,
    DIAGNOSTIC,
    DURATION_MS,
    ENDED,
    GUARDRAILS,
    MISSING,
    PARENT,
    RETRIED_SPAN_ID,
    RETRIED_TRACE_ID,
    SIDE,
    STARTED,
    STATUS_MESSAGE,
    TRAJECTORY,
    Kind,
    RowOf,
    Source,
    compiled,
    count,
    duration,
    duration_of,
    field,
    flag,
    json_text,
    names_list,
    required_text,
    text,
)

BASE_VERSION = 2  # the oldest layout a store is migrated through (version 1 is rebuilt into it)
SCHEMA_VERSION = 7  # the version of the tables below: a column `since` a later one raises it
MAX_COUNT = 2**31 - 1  # rounds, tokens, a status code: more is no real span's


class Column(NamedTuple):
    name: str
    sql: str  # its declaration: type and constraints
    source: Source  # its value in the span's own row
    since: int = BASE_VERSION  # the schema version that added it
    when_null: str | None = None  # what a NULL reads as (`telemetry.store.rows`, an export)
    # What a client call's result says, from the span of its execute step, set on the call's row
    # when a later request brings it (gateway.client_tools.results).
    of_result: Source | None = None


class Table:
    """A table of the store: its name and its columns, in their order on disk; `row` makes the row
    of a span (its values as they are bound)."""

    def __init__(self, name: str, *columns: Column) -> None:
        self.name = name
        self.columns = columns
        self.names = tuple(column.name for column in columns)
        self.row: RowOf = compiled([column.source for column in columns])

    def position(self, name: str) -> int:
        return self.names.index(name)

    def create(self, version: int = SCHEMA_VERSION) -> str:
        """The CREATE TABLE statement of the table as it was at schema `version`."""
        declared = ", ".join(f"{c.name} {c.sql}" for c in self.columns if c.since <= version)
        return f"CREATE TABLE IF NOT EXISTS {self.name} ({declared});"

    def added_after(self, version: int) -> list[str]:
        """The statements that add the columns of the versions after `version`, in their order."""
        return [f"ALTER TABLE {self.name} ADD COLUMN {c.name} {c.sql};" for c in self.columns if c.since > version]


def parameters(columns: Iterable[Column]) -> str:
    """An insert's parameters for `columns`: a value bound as it is, or "" stored as NULL."""
    return ", ".join("NULLIF(?, '')" if column.source.blank_is_null else "?" for column in columns)


TRAJECTORIES = Table(
    "trajectories",
    Column("id", "TEXT PRIMARY KEY", TRAJECTORY),
    Column("started", "REAL NOT NULL", STARTED),
    Column("ended", "REAL NOT NULL", ENDED))

REQUESTS = Table(
    "requests",
    Column("span_id", "TEXT NOT NULL", field("span_id")),
    Column("trace_id", "TEXT NOT NULL", field("trace_id")),
    Column("trajectory_id", "TEXT NOT NULL", TRAJECTORY),
    Column("name", "TEXT", field("name", blank_is_null=True)),
    Column("route", "TEXT", text(names.ATTR_HTTP_ROUTE)),
    Column("status", "INTEGER", count(names.ATTR_HTTP_STATUS)),
    Column("rounds", "INTEGER", count(names.ATTR_ROUNDS)),
    Column("limit_reached", "INTEGER", flag(names.ATTR_ROUND_LIMIT_REACHED)),
    Column("error_type", "TEXT", text(names.ATTR_ERROR_TYPE)),
    Column("started", "REAL NOT NULL", STARTED),
    Column("duration_ms", "REAL NOT NULL", DURATION_MS))

MODEL_TURNS = Table(
    "model_turns",
    Column("span_id", "TEXT NOT NULL", field("span_id")),
    Column("trace_id", "TEXT NOT NULL", field("trace_id")),
    Column("trajectory_id", "TEXT NOT NULL", TRAJECTORY),  # its request's (`telemetry.store.records.write`)
    Column("request_span_id", "TEXT", PARENT),
    # Its place among its request's turns: counted in the batch or by the database (`telemetry.store.records`).
    Column("round", "INTEGER NOT NULL", MISSING),
    Column("model", "TEXT", text(names.ATTR_REQUEST_MODEL)),
    Column("response_model", "TEXT", text(names.ATTR_RESPONSE_MODEL)),
    Column("provider", "TEXT", text(names.ATTR_PROVIDER_NAME)),
    Column("response_id", "TEXT", text(names.ATTR_RESPONSE_ID)),
    Column("finish_reasons", "TEXT", names_list(names.ATTR_FINISH_REASONS)),
    Column("stream", "INTEGER", flag(names.ATTR_REQUEST_STREAM)),
    Column("input_tokens", "INTEGER", count(names.ATTR_INPUT_TOKENS)),
    Column("output_tokens", "INTEGER", count(names.ATTR_OUTPUT_TOKENS)),
    Column("error_type", "TEXT", text(names.ATTR_ERROR_TYPE)),
    Column("error_message", "TEXT", STATUS_MESSAGE),
    Column("input_messages", "TEXT", json_text(names.ATTR_INPUT_MESSAGES)),
    Column("output_messages", "TEXT", json_text(names.ATTR_OUTPUT_MESSAGES)),
    Column("started", "REAL NOT NULL", STARTED),
    Column("duration_ms", "REAL NOT NULL", DURATION_MS),
    Column("upstream", "TEXT", text(names.ATTR_UPSTREAM), since=5),  # the configured upstream it went to
    Column("fallback_from", "TEXT", text(names.ATTR_UPSTREAM_FALLBACK_FROM), since=5),
    # Version 7: the tools the call offered the model, as the GenAI conventions' tool definitions (a
    # JSON array, captured with the messages: telemetry.messages), for a dataset of the calls
    # (telemetry.store.dataset); NULL for every turn stored before, and without content capture.
    Column("tool_definitions", "TEXT", json_text(names.ATTR_TOOL_DEFINITIONS), since=7))

TOOL_CALLS = Table(
    "tool_calls",
    Column("span_id", "TEXT NOT NULL", field("span_id")),
    Column("trace_id", "TEXT NOT NULL", field("trace_id")),
    Column("request_span_id", "TEXT", PARENT),
    Column("trajectory_id", "TEXT NOT NULL", TRAJECTORY),
    Column("round", "INTEGER", count(names.ATTR_ROUND)),
    Column("tool", "TEXT NOT NULL", required_text(names.ATTR_TOOL_NAME)),
    Column("call_id", "TEXT", text(names.ATTR_TOOL_CALL_ID)),
    Column("outcome", "TEXT", text(names.ATTR_OUTCOME)),
    Column("rejection_reason", "TEXT", text(names.ATTR_REJECTION_REASON)),
    Column("error_type", "TEXT", text(names.ATTR_ERROR_TYPE)),
    Column("missing", "TEXT", names_list(names.ATTR_ARGS_MISSING)),
    Column("unrecognized", "TEXT", names_list(names.ATTR_ARGS_UNRECOGNIZED)),
    Column("suggestions", "TEXT", names_list(names.ATTR_ARGS_SUGGESTIONS)),
    Column("retry_kind", "TEXT", text(names.ATTR_RETRY_KIND)),
    Column("retries_trace_id", "TEXT", RETRIED_TRACE_ID),
    Column("retries_span_id", "TEXT", RETRIED_SPAN_ID),
    Column("diagnostic", "TEXT", DIAGNOSTIC),  # what the model was told
    Column("arguments", "TEXT", text(names.ATTR_TOOL_CALL_ARGUMENTS)),
    Column("mcp_server", "TEXT", text(names.ATTR_MCP_SERVER)),
    Column("mcp_method", "TEXT", text(names.ATTR_MCP_METHOD_NAME)),
    Column("started", "REAL NOT NULL", STARTED),
    Column("duration_ms", "REAL NOT NULL", DURATION_MS),
    # Version 3: a call's side, NULL for the gateway's own (every call stored before), "client" for a
    # call of the client's tool that the gateway checked (gateway.client_tools.check). And of such a
    # call, what its result said when a later request brought it: the time from the answer that
    # handed it over, the result's size and outcome.
    Column("side", "TEXT", SIDE, since=3, when_null=names.SIDE_GATEWAY),
    Column("client_ms", "REAL", MISSING, since=3, of_result=DURATION_MS),
    Column("result_bytes", "INTEGER", MISSING, since=3, of_result=count(names.ATTR_RESULT_BYTES)),
    Column("result_outcome", "TEXT", BLANK, since=3, of_result=text(names.ATTR_OUTCOME)),
    # Version 4: of a call that waited for a reviewer (gateway.tools.approval_gate), what became of its
    # approval (approve, deny, timeout, cancelled, shutdown, unavailable), the gateway key that
    # decided and how long the call waited; NULL for every call stored before, and for any call that
    # asked no one.
    Column("decision", "TEXT", text(names.ATTR_TOOL_DECISION), since=4),
    Column("decided_by", "TEXT", text(names.ATTR_DECIDED_BY), since=4),
    Column("approval_wait_ms", "REAL", duration(names.ATTR_APPROVAL_WAIT_MS), since=4),
    # Version 6: what guardrails decided on the call (gateway.guardrails): the decision that stands
    # (its guardrail, decision, reason and moment, as the span's attributes say) and every decision,
    # allow included, as a JSON array (telemetry.store.sources.guardrails_of); of a client call,
    # those on its result too, when a later request brings it. NULL where no guardrail decided.
    Column("guardrail", "TEXT", text(names.ATTR_GUARDRAIL_NAME), since=6),
    Column("guardrail_decision", "TEXT", text(names.ATTR_GUARDRAIL_DECISION), since=6),
    Column("guardrail_reason", "TEXT", text(names.ATTR_GUARDRAIL_REASON), since=6),
    Column("guardrail_moment", "TEXT", text(names.ATTR_GUARDRAIL_MOMENT), since=6),
    Column("guardrails", "TEXT", GUARDRAILS, since=6),
    # Version 7: the parameter aliases the call's arguments used ("alias->parameter", gateway.tools.aliases),
    # and what argument repair found (gateway.tools.repair): its mode (observe: recorded, the call
    # rejected; apply: the call ran repaired, outcome repaired), its changes and the arguments before
    # and after, redacted as the arguments are. NULL where none was used or found.
    Column("aliases", "TEXT", names_list(names.ATTR_ARGS_ALIASES), since=7),
    Column("repair_mode", "TEXT", text(names.ATTR_REPAIR_MODE), since=7),
    Column("repair_changes", "TEXT", names_list(names.ATTR_REPAIR_CHANGES), since=7),
    Column("repair_before", "TEXT", text(names.ATTR_REPAIR_BEFORE), since=7),
    Column("repair_after", "TEXT", text(names.ATTR_REPAIR_AFTER), since=7))

TABLES = (TRAJECTORIES, REQUESTS, MODEL_TURNS, TOOL_CALLS)


# --- what an imported span's attributes must be ---------------------------------------------------

# The attributes rows are built from, by the kind each must be; and the two a span's trajectory is
# named by. The gateway's own spans have them; a span from elsewhere (an OTLP file) is checked first.
_NAMING_THE_TRAJECTORY: dict[str, Kind] = {names.ATTR_CONVERSATION_ID: "text", names.ATTR_KEY_NAME: "text"}
_KINDS = _NAMING_THE_TRAJECTORY | {
    column.source.attribute: column.source.kind for table in TABLES for column in table.columns
    if column.source.attribute is not None and column.source.kind is not None}


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


_CHECKS: Mapping[Kind, tuple[Callable[[Any], bool], str]] = {
    "text": (lambda value: isinstance(value, str), "is not a string"),
    "names": (lambda value: isinstance(value, list | tuple) and all(isinstance(v, str) for v in value),
              "is not a list of strings"),
    "count": (_is_count, f"is not an integer from 0 to {MAX_COUNT}"),
    "flag": (lambda value: isinstance(value, bool), "is not a boolean"),
    "duration": (lambda value: duration_of(value) is not None, "is not a number from 0")}


def attribute_problem(attributes: Mapping[str, Any]) -> str | None:
    """What is wrong with a span's attributes for its row, if anything: text that is not a string,
    names that are not a list of strings, a count that is not an integer from 0 to MAX_COUNT, a
    flag that is not a boolean, a duration that is not a number from 0."""
    for key, value in attributes.items():
        kind = _KINDS.get(key)
        if kind is not None:
            fits, problem = _CHECKS[kind]
            if not fits(value):
                return f"attribute {key} {problem}"
    return None
