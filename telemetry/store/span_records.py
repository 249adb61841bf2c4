"""A finished span as the trajectory store takes it (`SpanRecord`), whichever way it came: from
this process's SDK (`record_of`, as the span ends) or from an OTLP file (`telemetry.store.otlp`);
and which table it goes to (`kind_of`). Its rows are `telemetry.store.records`'."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from telemetry import names
from telemetry.spans import UNSET_STATUS, GatewaySpan


class Link(NamedTuple):
    trace_id: str
    span_id: str
    attributes: Mapping[str, Any] = MappingProxyType({})


class SpanEvent(NamedTuple):
    """An event of a span: the store reads the guardrails' decisions of a tool call from them."""

    name: str
    attributes: Mapping[str, Any]
    time_ns: int = 0


class SpanRecord(NamedTuple):
    """A finished span, whichever way it came: from this process's SDK or from an OTLP file.

    A named tuple rather than a frozen dataclass: the store's writer makes one per span, and a
    frozen dataclass's __init__ is a measurable share of a span's conversion (docs/benchmarks.md)."""

    name: str
    kind: SpanKind
    trace_id: str
    span_id: str
    parent_span_id: str | None
    start_ns: int
    end_ns: int
    attributes: Mapping[str, Any]
    error: bool = False
    status_description: str | None = None
    links: Sequence[Link] = ()
    events: Sequence[SpanEvent] = ()


def attributes_of(span: ReadableSpan) -> Mapping[str, Any]:
    """An ended span's attributes as a plain dict (a lookup through the SDK's read-only mapping
    costs many times a dict's). A GatewaySpan's own dict, which no one changes once the span has
    ended, is taken as it is.

    Of the SDK's spans, the copy is taken from the SDK's own dict when the span has one
    (`BoundedAttributes._dict`): copying through the public mapping calls Python code per key, which
    showed in the store's cost per tool call (docs/benchmarks.md). Any other shape of span falls back
    to the public mapping."""
    if type(span) is GatewaySpan:
        return span.recorded_attributes
    raw = getattr(getattr(span, "_attributes", None), "_dict", None)
    return dict(raw) if isinstance(raw, dict) else dict(span.attributes or {})


def record_of(span: ReadableSpan) -> SpanRecord:
    """The record of an ended span; a link's attributes are kept as they are (read-only)."""
    if type(span) is GatewaySpan:
        return _gateway_record(span)
    context, parent, status = span.context, span.parent, span.status
    # Most spans have none: asking the SDK's own list first spares the copy `links` makes under its lock.
    links = [Link(format(link.context.trace_id, "032x"), format(link.context.span_id, "016x"), link.attributes or {})
             for link in span.links] if getattr(span, "_links", True) else []
    events = [SpanEvent(event.name, event.attributes or {}, event.timestamp) for event in span.events] \
        if getattr(span, "_events", True) else []
    return SpanRecord(span.name, span.kind, format(context.trace_id, "032x"), format(context.span_id, "016x"),
                      format(parent.span_id, "016x") if parent is not None else None, span.start_time or 0,
                      span.end_time or 0, attributes_of(span), status.status_code is StatusCode.ERROR,
                      status.description, links, events)


def _gateway_record(span: GatewaySpan) -> SpanRecord:
    """A GatewaySpan's record, its fields read as ReadableSpan keeps them rather than through its
    properties (a call each)."""
    trace_id, span_id, *_ = span._context  # type: ignore[misc]  # a SpanContext, set when it started
    parent, status = span._parent, span._status
    links = [Link(format(link.context.trace_id, "032x"), format(link.context.span_id, "016x"), link.attributes or {})
             for link in span._links] if span._links else []
    error, description = (False, None) if status is UNSET_STATUS else (status.status_code is StatusCode.ERROR,
                                                                       status.description)
    # Most spans have none; a tool call a guardrail saw has one a decision.
    events = [SpanEvent(event.name, event.attributes or {}, event.timestamp) for event in span._events] \
        if span._events else ()
    # tuple.__new__: a named tuple's own __new__ is Python code, a call more.
    return tuple.__new__(SpanRecord, (span._name, span._kind, "%032x" % trace_id, "%016x" % span_id,  # noqa: UP031
                                      "%016x" % parent.span_id if parent is not None else None,  # noqa: UP031
                                      span._start_time or 0, span._end_time or 0, span.recorded_attributes, error,
                                      description, links, events))


def kind_of(record: SpanRecord) -> str | None:
    """Which table a span goes to, if any."""
    if record.name == names.SPAN_TOOL_CALL:
        return "tool_call"
    if record.name == names.SPAN_TOOL_EXECUTE and record.attributes.get(names.ATTR_TOOL_SIDE) == names.SIDE_CLIENT:
        return "client_result"  # a client call's execute step: it completes the call's row
    if record.kind is SpanKind.CLIENT and record.name.startswith(names.SPAN_CHAT_PREFIX + " "):
        return "model_turn"
    if record.kind is SpanKind.SERVER and names.ATTR_CONVERSATION_ID in record.attributes:
        return "request"
    return None
