"""Where a column of the trajectory database takes its value from (`telemetry.store.columns`): a
span attribute (as text, a list of names, a count, a flag or a duration), a field of the span, or a
derivation; and the values as SQLite is given them.

Each source is a Python expression of the span's record (`record`), its attributes (`attributes`)
and its trajectory as the store keys it (`trajectory`). A table's expressions are compiled into
one function that builds its rows (`compiled`): a function called per column instead made every
row cost a call per column more, enough to show in the store's cost per tool call
(docs/benchmarks.md). The expressions are this module's and `telemetry.store.columns`' own text;
the attribute names in them are `telemetry.names`' constants, written as literals.

Text that may be missing is bound as "" and stored as NULL by `NULLIF(?, '')` (a source that is
`blank_is_null`): sqlite3 binds None through its adapter lookup, at many times the cost of a str,
and a tool call has a dozen such columns."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, NamedTuple, cast

import orjson

from telemetry import names
from telemetry.store.span_records import Link, SpanRecord

# What an imported span's attribute must be (`telemetry.store.columns.attribute_problem`).
Kind = Literal["text", "names", "count", "flag", "duration"]
# A table's rows: (a span's record, its trajectory as the store keys it) -> its row, as bound.
RowOf = Callable[[SpanRecord, str], list[Any]]

_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1  # SQLite's INTEGER


class Source(NamedTuple):
    """Where a column's value comes from."""

    expression: str  # of `record`, `attributes` and `trajectory`, calling builtins and `functions` only
    blank_is_null: bool = False  # missing is bound as "" and stored as NULL
    attribute: str | None = None  # the span attribute the column holds: an export writes it back
    kind: Kind | None = None  # what an imported span's `attribute` must be (None: not checked)
    json: bool = False  # JSON text: decoded when read
    functions: tuple[Callable[..., Any], ...] = ()  # what `expression` calls, by their names


# --- values as they are bound ---------------------------------------------------------------------

def text_of(value: Any) -> str:
    return "" if value is None else str(value)


def names_of(value: Any) -> str:
    """A list of names as a JSON array of strings; anything that is not a list: none. (orjson: far
    cheaper than json.dumps.) A lone surrogate, which an imported file's JSON may carry and orjson
    refuses, is written as JSON escapes it."""
    if not isinstance(value, list | tuple) or not value:
        return ""
    return json_array([str(v) for v in value])


def integer_of(value: Any) -> int | None:
    """A number as SQLite's 64-bit INTEGER can hold it (clamped to its range); None for anything else."""
    if type(value) is int and _INT_MIN <= value <= _INT_MAX:  # what the gateway's own spans hold
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or (isinstance(value, float)
                                                                         and math.isnan(value)):
        return None
    return int(min(max(value, _INT_MIN), _INT_MAX))


def flag_of(value: Any) -> int | None:
    return None if value is None else int(bool(value))


def duration_of(value: Any) -> float | None:
    """A duration as REAL: a finite number from 0; None for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        return None
    return float(value)


# --- sources --------------------------------------------------------------------------------------

def text(attribute: str) -> Source:
    """Text of an attribute that may be missing."""
    return Source(f"text_of(attributes.get({attribute!r}))", True, attribute, "text", functions=(text_of,))


def json_text(attribute: str) -> Source:
    """Text of an attribute that holds JSON (the GenAI messages), decoded when read."""
    return text(attribute)._replace(json=True)


def required_text(attribute: str) -> Source:
    """Text of an attribute the span always has ("" if it has not)."""
    return Source(f"str(attributes.get({attribute!r}, ''))", False, attribute, "text")


def names_list(attribute: str) -> Source:
    """A list of names, stored as a JSON array."""
    return Source(f"names_of(attributes.get({attribute!r}))", True, attribute, "names", True, (names_of,))


def count(attribute: str) -> Source:
    """A whole number: rounds, tokens, a status code, bytes."""
    return Source(f"integer_of(attributes.get({attribute!r}))", False, attribute, "count", functions=(integer_of,))


def flag(attribute: str) -> Source:
    """A boolean, stored as 0 or 1."""
    return Source(f"flag_of(attributes.get({attribute!r}))", False, attribute, "flag", functions=(flag_of,))


def duration(attribute: str) -> Source:
    """Milliseconds, a finite number from 0."""
    return Source(f"duration_of(attributes.get({attribute!r}))", False, attribute, "duration",
                  functions=(duration_of,))


def field(name: str, *, blank_is_null: bool = False) -> Source:
    """A field of the span's record (`SpanRecord`)."""
    if name not in SpanRecord._fields:
        raise ValueError(f"a span record has no field {name}")
    return Source(f"record.{name}", blank_is_null)


def derived(function: Callable[[SpanRecord, Mapping[str, Any]], Any], *, blank_is_null: bool = False) -> Source:
    """What `function` makes of the span's record and its attributes."""
    return Source(f"{function.__name__}(record, attributes)", blank_is_null, functions=(function,))


def _retried(record: SpanRecord) -> Link | None:
    """The link to the failed call a tool call retries, if any."""
    return next((link for link in record.links if names.ATTR_RETRY_KIND in link.attributes), None)


def retried_trace_id(record: SpanRecord) -> str:
    retried = _retried(record)
    return retried.trace_id if retried else ""


def retried_span_id(record: SpanRecord) -> str:
    retried = _retried(record)
    return retried.span_id if retried else ""


def side_of(record: SpanRecord, attributes: Mapping[str, Any]) -> str:
    """Stored for the client's calls only: NULL is the gateway's own."""
    side = attributes.get(names.ATTR_TOOL_SIDE)
    return "" if side == names.SIDE_GATEWAY else text_of(side)


# A tool call's side: written back by an export, taken as any text on import (no kind).
SIDE = derived(side_of, blank_is_null=True)._replace(attribute=names.ATTR_TOOL_SIDE)
# The failed call a tool call retries: its span's link that names a retry kind (most spans have no link).
RETRIED_TRACE_ID = Source("retried_trace_id(record) if record.links else ''", True, functions=(retried_trace_id,))
RETRIED_SPAN_ID = Source("retried_span_id(record) if record.links else ''", True, functions=(retried_span_id,))
TRAJECTORY = Source("trajectory")
PARENT = Source("record.parent_span_id or ''", blank_is_null=True)
STARTED = Source("record.start_ns / 1e9")
ENDED = Source("record.end_ns / 1e9")
DURATION_MS = Source("(record.end_ns - record.start_ns) / 1e6")
# What the span's error status says (a call's diagnostic, a turn's error message).
STATUS_MESSAGE = Source("text_of(record.status_description if record.error else None)", True, functions=(text_of,))


def diagnostic_of(record: SpanRecord, attributes: Mapping[str, Any]) -> str:
    """What a failed call's model was told: its result as the span names it, else (a span recorded
    before calls had one, or imported) its error status, which once said only that."""
    if not record.error:
        return ""
    return text_of(attributes.get(names.ATTR_TOOL_CALL_RESULT) or record.status_description)


DIAGNOSTIC = derived(diagnostic_of, blank_is_null=True)

# A guardrail decision as the store keeps it (an element of a call's `guardrails`), by the attribute
# of the span's event that holds each field.
GUARDRAIL_FIELDS = {"guardrail": names.ATTR_GUARDRAIL_NAME, "moment": names.ATTR_GUARDRAIL_MOMENT,
                    "decision": names.ATTR_GUARDRAIL_DECISION, "reason": names.ATTR_GUARDRAIL_REASON,
                    "failed": names.ATTR_GUARDRAIL_FAILED}


def guardrails_of(record: SpanRecord) -> str:
    """Every guardrail decision on a call, from its span's events in their order, as a JSON array
    of {"guardrail", "moment", "decision", "reason", "failed"} (None where the event has none)."""
    found = [{field: None if event.attributes.get(key) is None else text_of(event.attributes[key])
              for field, key in GUARDRAIL_FIELDS.items()}
             for event in record.events if event.name == names.EVENT_GUARDRAIL]
    return json_array(found) if found else ""


def json_array(items: list[Any]) -> str:
    """`items` as JSON text (orjson: far cheaper than json.dumps), as JSON escapes a lone
    surrogate an imported file carried, which orjson refuses."""
    try:
        return orjson.dumps(items).decode()
    except orjson.JSONEncodeError:
        return json.dumps(items)


# Most spans have no event: their rows pay no call.
GUARDRAILS = Source("guardrails_of(record) if record.events else ''", True, json=True, functions=(guardrails_of,))
MISSING = Source("None")  # no value (yet)
BLANK = Source("''", blank_is_null=True)  # no text (yet)


def compiled(sources: Sequence[Source]) -> RowOf:
    """One function that makes a row of `sources`' values, in their order."""
    namespace: dict[str, Any] = {}
    for source in sources:
        for function in source.functions:
            if namespace.setdefault(function.__name__, function) is not function:
                raise ValueError(f"two functions named {function.__name__} in one table's sources")
    code = ("def row(record, trajectory):\n    attributes = record.attributes\n"
            f"    return [{', '.join(source.expression for source in sources)}]\n")
    exec(code, namespace)  # the sources' own expressions, never data
    return cast(RowOf, namespace["row"])
