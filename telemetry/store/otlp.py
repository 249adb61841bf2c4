"""OTLP JSON trace files in and out of the trajectory store: what the OpenTelemetry collector's
file exporter writes, one ExportTraceServiceRequest (JSON encoding) per line. Imported spans go
through the same rows as the gateway's own (`telemetry.store.records`); an export gives back, per trace,
the spans the store holds, with the attributes and links they were recorded from (each column that
holds an attribute gives it back: `telemetry.store.columns`)."""

from __future__ import annotations

import json
import re
import sqlite3
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import IO, Any

from opentelemetry.trace import SpanKind

from telemetry import names
from telemetry.store.columns import MODEL_TURNS, REQUESTS, TOOL_CALLS, Column, Table, attribute_problem
from telemetry.store.records import split_stored_id, write
from telemetry.store.sources import GUARDRAIL_FIELDS
from telemetry.store.span_records import Link, SpanEvent, SpanRecord

_KINDS = {1: SpanKind.INTERNAL, 2: SpanKind.SERVER, 3: SpanKind.CLIENT, 4: SpanKind.PRODUCER, 5: SpanKind.CONSUMER}
_KIND_NUMBERS = {kind: number for number, kind in _KINDS.items()}
_STATUS_ERROR = 2


# --- reading ----------------------------------------------------------------------------------------

_INT64 = re.compile(r"-?[0-9]{1,19}")
_UINT64_MAX = 2**64 - 1


def _int64(raw: Any, what: str) -> int:
    """An OTLP integer: a JSON number or, as 64-bit integers are written, a string of digits."""
    if isinstance(raw, bool) or not isinstance(raw, int | str) or (isinstance(raw, str) and not _INT64.fullmatch(raw)):
        raise ValueError(f"{what} is not a 64-bit integer")
    return int(raw)


def _value(value: dict[str, Any]) -> Any:
    """An OTLP AnyValue as Python (64-bit integers come as JSON strings); arrays are of scalars."""
    if "arrayValue" in value:
        items = [_value(v) for v in value["arrayValue"].get("values", [])]
        if any(isinstance(item, list) for item in items):
            raise ValueError("an array value holds an array")
        return items
    if "stringValue" in value:
        if not isinstance(value["stringValue"], str):
            raise ValueError("a stringValue is not a string")
        return value["stringValue"]
    if "boolValue" in value:
        if not isinstance(value["boolValue"], bool):
            raise ValueError("a boolValue is not a boolean")
        return value["boolValue"]
    if "intValue" in value:
        return _int64(value["intValue"], "an intValue")
    if "doubleValue" in value:
        if isinstance(value["doubleValue"], bool):
            raise ValueError("a doubleValue is not a number")
        return float(value["doubleValue"])  # a number, or "NaN", "Infinity" as JSON spells them
    return None


def _attributes(items: Iterable[dict[str, Any]] | None) -> dict[str, Any]:
    return {item["key"]: _value(item.get("value", {})) for item in items or ()}


def _kind(raw: Any) -> SpanKind:
    if isinstance(raw, str):  # some writers spell the enum: "SPAN_KIND_SERVER"
        return SpanKind[raw.removeprefix("SPAN_KIND_")] if raw.removeprefix("SPAN_KIND_") in SpanKind.__members__ \
            else SpanKind.INTERNAL
    return _KINDS.get(int(raw or 1), SpanKind.INTERNAL)


def _span(raw: dict[str, Any]) -> SpanRecord:
    status = raw.get("status") or {}
    links = [Link(link["traceId"].lower(), link["spanId"].lower(), _attributes(link.get("attributes")))
             for link in raw.get("links") or ()]
    code = status.get("code", 0)
    if not isinstance(raw["name"], str):
        raise ValueError("a span's name is not a string")
    start, end = (_int64(raw.get(key, 0), key) for key in ("startTimeUnixNano", "endTimeUnixNano"))
    if not (0 <= start <= _UINT64_MAX and 0 <= end <= _UINT64_MAX):
        raise ValueError("a span's time is out of range")
    attributes = _attributes(raw.get("attributes"))
    if (problem := attribute_problem(attributes)) is not None:
        raise ValueError(f"span {raw['spanId']}: {problem}")
    return SpanRecord(raw["name"], _kind(raw.get("kind")), raw["traceId"].lower(), raw["spanId"].lower(),
                      raw.get("parentSpanId", "").lower() or None, start, end, attributes,
                      code in (_STATUS_ERROR, "STATUS_CODE_ERROR"), status.get("message") or None, links,
                      [_event(event) for event in raw.get("events") or ()])


def _event(raw: dict[str, Any]) -> SpanEvent:
    if not isinstance(raw.get("name"), str):
        raise ValueError("an event's name is not a string")
    return SpanEvent(raw["name"], _attributes(raw.get("attributes")),
                     _int64(raw.get("timeUnixNano", 0), "an event's time"))


def read_spans(lines: Iterable[str]) -> Iterator[SpanRecord]:
    """The spans of an OTLP JSON file's lines (blank lines skipped). Raises ValueError, naming the
    line, on one that is not an ExportTraceServiceRequest."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            for resource in request.get("resourceSpans", []):
                for scope in resource.get("scopeSpans", []):
                    yield from (_span(raw) for raw in scope.get("spans", []))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"line {number}: not an OTLP JSON trace export ({exc})") from exc


def import_file(db: sqlite3.Connection, lines: Iterable[str]) -> int:
    """Writes the spans of an OTLP JSON file into the store, in one transaction; returns the rows
    written. Spans are taken in the order they ended, as the gateway's own processor sees them."""
    records = sorted(read_spans(lines), key=lambda r: r.end_ns)
    db.execute("BEGIN IMMEDIATE")
    try:
        written = write(db, records)
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return written


# --- writing ----------------------------------------------------------------------------------------

def _any(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, list):
        return {"arrayValue": {"values": [_any(v) for v in value]}}
    return {"stringValue": str(value)}


def _otlp_span(record: SpanRecord) -> dict[str, Any]:
    span: dict[str, Any] = {
        "traceId": record.trace_id, "spanId": record.span_id, "name": record.name,
        "kind": _KIND_NUMBERS[record.kind], "startTimeUnixNano": str(record.start_ns),
        "endTimeUnixNano": str(record.end_ns),
        "attributes": [{"key": k, "value": _any(v)} for k, v in record.attributes.items() if v is not None],
        "status": {"code": _STATUS_ERROR, "message": record.status_description or ""} if record.error else {}}
    if record.parent_span_id:
        span["parentSpanId"] = record.parent_span_id
    if record.links:
        span["links"] = [{"traceId": link.trace_id, "spanId": link.span_id,
                          "attributes": [{"key": k, "value": _any(v)} for k, v in link.attributes.items()]}
                         for link in record.links]
    if record.events:
        span["events"] = [{"timeUnixNano": str(event.time_ns), "name": event.name,
                           "attributes": [{"key": k, "value": _any(v)} for k, v in event.attributes.items()]}
                          for event in record.events]
    return span


def _ns(seconds: float, ms: float = 0.0) -> int:
    return round(seconds * 1e9 + ms * 1e6)


def _listed(text: str | None) -> list[Any] | None:
    return json.loads(text) if text else None


def _trajectory_attributes(stored: str) -> dict[str, Any]:
    """A row's trajectory as the spans said it: the id, and the gateway key's name when there was one."""
    if not stored:
        return {}
    key, trajectory_id = split_stored_id(stored)
    return {names.ATTR_CONVERSATION_ID: trajectory_id, names.ATTR_KEY_NAME: key}


def _row_attributes(table: Table, row: sqlite3.Row) -> dict[str, Any]:
    """The span attributes the row's columns hold, as the span had them (None: it had none). A
    column a store of an older schema lacks (read as it is, read-only) holds none."""
    present = set(row.keys())
    return {column.source.attribute: _attribute(column, row[column.name]) for column in table.columns
            if column.source.attribute is not None and column.name in present}


def _attribute(column: Column, value: Any) -> Any:
    if value is None:
        return column.when_null
    if column.source.kind == "names":
        return _listed(value)
    return bool(value) if column.source.kind == "flag" else value


def _call_record(row: sqlite3.Row) -> SpanRecord:
    attributes = {names.ATTR_OPERATION_NAME: names.OPERATION_EXECUTE_TOOL,
                  names.ATTR_TOOL_TYPE: names.TOOL_TYPE_FUNCTION, **_trajectory_attributes(row["trajectory_id"]),
                  **_row_attributes(TOOL_CALLS, row)}
    links = [Link(row["retries_trace_id"], row["retries_span_id"], {names.ATTR_RETRY_KIND: row["retry_kind"]})] \
        if row["retries_span_id"] else []
    return SpanRecord(names.SPAN_TOOL_CALL, SpanKind.INTERNAL, row["trace_id"], row["span_id"],
                      row["request_span_id"], _ns(row["started"]), _ns(row["started"], row["duration_ms"]),
                      {k: v for k, v in attributes.items() if v is not None}, row["diagnostic"] is not None,
                      row["diagnostic"], links, _guardrail_events(row["guardrails"], _ns(row["started"])))


def _guardrail_events(stored: str | None, at: int) -> list[SpanEvent]:
    """A call's guardrail decisions as the span events they were read from (the store keeps no
    time of its own for them: the call's start)."""
    decisions = _listed(stored) or []
    return [SpanEvent(names.EVENT_GUARDRAIL, {key: decision[field] for field, key in GUARDRAIL_FIELDS.items()
                                              if decision.get(field) is not None}, at)
            for decision in decisions if isinstance(decision, dict)]


def _turn_record(row: sqlite3.Row) -> SpanRecord:
    attributes = {names.ATTR_OPERATION_NAME: names.OPERATION_CHAT, **_row_attributes(MODEL_TURNS, row),
                  **_trajectory_attributes(row["trajectory_id"])}
    return SpanRecord(f"{names.SPAN_CHAT_PREFIX} {row['model']}", SpanKind.CLIENT, row["trace_id"], row["span_id"],
                      row["request_span_id"], _ns(row["started"]), _ns(row["started"], row["duration_ms"]),
                      {k: v for k, v in attributes.items() if v is not None}, row["error_message"] is not None,
                      row["error_message"])


def _request_record(row: sqlite3.Row) -> SpanRecord:
    attributes = {**_trajectory_attributes(row["trajectory_id"]), **_row_attributes(REQUESTS, row)}
    return SpanRecord(row["name"], SpanKind.SERVER, row["trace_id"], row["span_id"], None, _ns(row["started"]),
                      _ns(row["started"], row["duration_ms"]), {k: v for k, v in attributes.items() if v is not None},
                      (row["status"] or 0) >= 500)


def stored_spans(db: sqlite3.Connection) -> list[SpanRecord]:
    """Every span the store holds, rebuilt from its rows."""
    db.row_factory = sqlite3.Row
    try:
        spans = [_request_record(row) for row in db.execute("SELECT * FROM requests")]
        spans += [_turn_record(row) for row in db.execute("SELECT * FROM model_turns")]
        spans += [_call_record(row) for row in db.execute("SELECT * FROM tool_calls")]
    finally:
        db.row_factory = None
    return spans


def export(db: sqlite3.Connection, out: IO[str], service_name: str = "toolspan") -> int:
    """Writes the store as OTLP JSON, one ExportTraceServiceRequest per trace and line; returns the
    number of spans written."""
    traces: dict[str, list[SpanRecord]] = defaultdict(list)
    for span in stored_spans(db):
        traces[span.trace_id].append(span)
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": service_name}}]}
    for spans in traces.values():
        ordered = [_otlp_span(s) for s in sorted(spans, key=lambda s: s.start_ns)]
        request = {"resourceSpans": [{"resource": resource, "scopeSpans": [
            {"scope": {"name": "toolspan"}, "spans": ordered}]}]}
        out.write(json.dumps(request, separators=(",", ":")) + "\n")
    return sum(len(spans) for spans in traces.values())
