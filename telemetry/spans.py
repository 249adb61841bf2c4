"""toolspan's own spans: what the OpenTelemetry SDK's span processors and exporters take (a
`ReadableSpan`), made by a tracer that does only the work the gateway's spans need.

The SDK's tracer, at every span, takes a lock, checks and copies each attribute into a
`BoundedAttributes`, keeps bounded lists for events and links, updates its own internal metrics,
and at the end copies the whole span into a second, read-only object for the processors. The
gateway's spans are made, filled and ended by one task, their attributes are bounded where they
are made (`telemetry.bounds`), and they carry no events unless an exception is recorded. So
`GatewaySpan` is itself the `ReadableSpan` the processors get: its attributes a plain dict, taken
as they are (a list becomes a tuple, as the SDK makes it), frozen once it ends.

A plain request's spans cost a fraction of what they cost through the SDK's tracer
(docs/benchmarks.md). The sampler, id generator, resource and processors are the
SDK tracer's own, so OTEL_TRACES_SAMPLER, exporters and the trajectory store see no difference;
the SDK's default sampler (parent-based, always on) is decided here without the calls through it.
"""

from __future__ import annotations

import logging
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from random import getrandbits
from time import time_ns
from types import TracebackType
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import DEFAULT_ON, Decision
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    DEFAULT_TRACE_STATE,
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)
from opentelemetry.util.types import Attributes, AttributeValue

log = logging.getLogger("toolspan.telemetry")

UNSET_STATUS = Status(StatusCode.UNSET)  # every span's, until one is set
_TRACE_ID_MAX, _SPAN_ID_MAX = 2**128 - 1, 2**64 - 1  # the largest ids a SpanContext takes as valid
_PLAIN = frozenset({str, bool, int, float, tuple, bytes, type(None)})  # attribute values kept as they are


def _flags(sampled: bool, random_trace_id: bool) -> TraceFlags:
    """The span's trace flags as the SDK's tracer sets them."""
    flags = TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT
    return TraceFlags(flags | TraceFlags.RANDOM_TRACE_ID if random_trace_id else flags)


_FLAGS = {(sampled, random): _flags(sampled, random) for sampled in (False, True) for random in (False, True)}
_NO_FLAGS = _flags(False, False)  # a root span's parent's


def _settled_value(value: Any) -> Any:
    """An attribute value that is not plain, as a span keeps it: a sequence as a tuple, a mapping as
    it is, anything else as its text. (The SDK's spans copy mappings and drop values they cannot
    export; the gateway's own spans carry neither.)"""
    if isinstance(value, Sequence) and not isinstance(value, str):
        return tuple(value)
    return value if isinstance(value, Mapping) else str(value)


def _settled(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """`attributes` as a span keeps them (the gateway's own values are plain already: this is
    cheap for them)."""
    return {key: value if type(value) in _PLAIN else _settled_value(value) for key, value in attributes.items()}


def _kept_link(context: SpanContext | None, attributes: Attributes) -> bool:
    """Whether a span keeps a link, by the SDK's rule: to a valid context, or to an invalid one
    that carries attributes or a trace state."""
    return bool(context and (context.is_valid or attributes or context.trace_state))


class GatewaySpan(trace.Span, ReadableSpan):
    """A span the gateway records, readable by the SDK's processors once it ends. Not locked: one
    task makes, fills and ends it."""

    def __init__(self, name: str, context: SpanContext, parent: SpanContext | None, kind: SpanKind,
                 attributes: Attributes, links: Sequence[Link], start_time: int,
                 scope: InstrumentationScope, resource: Resource, processor: SpanProcessor,
                 record_exception: bool = True, set_status_on_exception: bool = True) -> None:
        self._name = name
        self._context = context
        self._parent = parent
        self._kind = kind
        self._attributes: dict[str, Any] = _settled(attributes) if attributes else {}
        self._events: list[Event] = []
        self._links = tuple(link for link in links if _kept_link(link.context, link.attributes)) if links else ()
        self._status = UNSET_STATUS
        self._start_time = start_time
        self._end_time: int | None = None
        self._resource = resource
        self._instrumentation_scope = scope
        self._instrumentation_info = None
        self._processor = processor
        self._record_exception = record_exception  # what leaving it as a context manager does
        self._set_status_on_exception = set_status_on_exception

    def get_span_context(self) -> SpanContext:
        return self._context  # type: ignore[return-value]  # set once, in __init__

    @property
    def recorded_attributes(self) -> Mapping[str, Any]:
        """The attributes themselves, not a read-only view of them: once the span has ended, no one
        changes them."""
        return self._attributes

    def is_recording(self) -> bool:
        return self._end_time is None

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None:
        if self._end_time is not None:
            log.warning("setting attributes on the ended span %s", self._name)
            return
        kept = self._attributes
        kept.update(attributes)
        for key, value in attributes.items():
            if type(value) not in _PLAIN:
                kept[key] = _settled_value(value)

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        self.set_attributes({key: value})

    def add_event(self, name: str, attributes: Attributes = None, timestamp: int | None = None) -> None:
        if self._end_time is None:
            self._events.append(Event(name, _settled(attributes) if attributes else {}, timestamp))

    def add_link(self, context: SpanContext, attributes: Attributes = None) -> None:
        if self._end_time is None and _kept_link(context, attributes):
            self._links = (*self._links, Link(context, attributes))

    def update_name(self, name: str) -> None:
        if self._end_time is None:
            self._name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        """As the SDK's spans: OK is final, UNSET changes nothing."""
        if self._end_time is not None or self._status.status_code is StatusCode.OK:
            return
        new = status if isinstance(status, Status) else Status(status, description)
        if new.status_code is not StatusCode.UNSET:
            self._status = new

    def record_exception(self, exception: BaseException, attributes: Attributes = None,
                         timestamp: int | None = None, escaped: bool = False) -> None:
        """An `exception` event, with the attributes the SDK's spans give it."""
        kind, module = type(exception), type(exception).__module__
        qualified = kind.__qualname__ if module in ("builtins", "") else f"{module}.{kind.__qualname__}"
        recorded: dict[str, Any] = {"exception.type": qualified, "exception.message": str(exception),
                                    "exception.stacktrace": "".join(traceback.format_exception(exception)),
                                    "exception.escaped": str(escaped)}
        recorded.update(attributes or {})
        self.add_event("exception", recorded, timestamp)

    def end(self, end_time: int | None = None) -> None:
        if self._end_time is not None:
            log.warning("ending the ended span %s", self._name)
            return
        self._end_time = end_time if end_time is not None else time_ns()
        # As the SDK's spans tell the provider's processor (`shortcuts_missing` checked it has _on_ending).
        self._processor._on_ending(self)  # type: ignore[arg-type]
        self._processor.on_end(self)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None and self._end_time is None:
            if self._record_exception:
                self.record_exception(exc, escaped=True)
            if self._set_status_on_exception:
                self.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        super().__exit__(exc_type, exc, tb)


def shortcuts_missing(sdk_tracer: SdkTracer) -> str | None:
    """What GatewayTracer takes from this SDK beyond its public API and finds missing or different,
    or None. Checked once, when a tracer is made, so that no span has anything to check."""
    for check in (_processor_missing, _context_missing, _readable_missing):
        missing = check(sdk_tracer)
        if missing is not None:
            return missing
    return None


def _processor_missing(sdk_tracer: SdkTracer) -> str | None:
    """The SDK's spans tell their processor a span is ending through its private `_on_ending`; the
    gateway's spans do the same, so the SDK's span must still call it and the processor have it."""
    processor = sdk_tracer.span_processor
    if not callable(getattr(processor, "_on_ending", None)):
        return f"no {type(processor).__name__}._on_ending"
    if "_on_ending" not in getattr(getattr(SdkSpan.end, "__code__", None), "co_names", ()):
        return "Span.end does not call _on_ending"
    return None


_CONTEXT_FIELDS = ("trace_id", "span_id", "is_remote", "trace_flags", "trace_state", "is_valid")


def _context_missing(_: SdkTracer) -> str | None:
    """GatewayTracer reads a parent's fields by unpacking it and makes a SpanContext with
    tuple.__new__: its fields must be the tuple the public constructor makes, in that order."""
    state = TraceState([("k", "v")])
    public = SpanContext(1, 2, is_remote=False, trace_flags=TraceFlags(1), trace_state=state)
    ours = tuple.__new__(SpanContext, (1, 2, False, TraceFlags(1), state, True))
    if (tuple(public) != (1, 2, False, 1, state, True)
            or any(getattr(public, field) != getattr(ours, field) for field in _CONTEXT_FIELDS)):
        return f"SpanContext is not the tuple ({', '.join(_CONTEXT_FIELDS)})"
    return None


def _readable_missing(sdk_tracer: SdkTracer) -> str | None:
    """GatewaySpan fills ReadableSpan's private fields itself: each of ReadableSpan's properties
    must read the same of it as of a ReadableSpan made through its public constructor."""
    try:
        with warnings.catch_warnings():  # instrumentation_info is deprecated, and read here too
            warnings.simplefilter("ignore")
            ours, theirs = _probes(sdk_tracer.resource)
            differing = [name for name, member in vars(ReadableSpan).items() if isinstance(member, property)
                         and _plain(getattr(ours, name)) != _plain(getattr(theirs, name))]
            if ours.to_json() != theirs.to_json():
                differing.append("to_json()")
    except Exception as exc:  # a span that cannot be made or read is as missing as a field
        return f"toolspan's span is not a ReadableSpan ({type(exc).__name__}: {exc})"
    return f"ReadableSpan reads {', '.join(differing)} differently" if differing else None


def _probes(resource: Resource) -> tuple[GatewaySpan, ReadableSpan]:
    """The same ended span twice: a GatewaySpan, and a ReadableSpan made through its constructor."""
    context, parent = SpanContext(3, 4, False, TraceFlags(1)), SpanContext(3, 5, False, TraceFlags(1))
    link, scope = Link(SpanContext(6, 7, False), {"kind": "x"}), InstrumentationScope("toolspan.probe", "")
    ours = GatewaySpan("probe", context, parent, SpanKind.CLIENT, {"a": 1, "b": ["x"]}, [link], 10, scope,
                       resource, SpanProcessor())
    ours.add_event("e", {"n": 1}, 11)
    ours.set_status(Status(StatusCode.ERROR, "why"))
    ours.end(12)
    theirs = ReadableSpan("probe", context, parent, resource, {"a": 1, "b": ("x",)}, (Event("e", {"n": 1}, 11),),
                          (link,), SpanKind.CLIENT, None, Status(StatusCode.ERROR, "why"), 10, 12, scope)
    return ours, theirs


def _plain(value: Any) -> Any:
    """A property's value in a form to compare: events, links and statuses by their fields."""
    if isinstance(value, Event):
        return value.name, _plain(value.attributes), value.timestamp
    if isinstance(value, Link):
        return value.context, _plain(value.attributes)
    if isinstance(value, Status):
        return value.status_code, value.description
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str):
        return tuple(_plain(item) for item in value)
    return value


def _nonzero_bits(bits: int) -> int:
    """A random id of so many bits, as the SDK's RandomIdGenerator draws it: zero is no id."""
    while not (value := getrandbits(bits)):
        pass
    return value


class GatewayTracer(trace.Tracer):
    """Starts GatewaySpans for the SDK tracer it is made from: its sampler, id generator, resource
    and span processor (the provider's, which tells every processor added to it, later ones too).
    Made only where `shortcuts_missing` finds nothing missing."""

    def __init__(self, sdk_tracer: SdkTracer, scope: InstrumentationScope) -> None:
        self.sampler = sdk_tracer.sampler
        self.resource = sdk_tracer.resource
        self.span_processor = sdk_tracer.span_processor
        self.id_generator = sdk_tracer.id_generator
        self._scope = scope
        self._random_ids = sdk_tracer.id_generator.is_trace_id_random()
        self._span_id: Callable[[], int] = sdk_tracer.id_generator.generate_span_id
        self._trace_id: Callable[[], int] = sdk_tracer.id_generator.generate_trace_id
        self._valid_ids = False  # whether every id drawn is one a SpanContext takes as valid
        if type(sdk_tracer.id_generator) is RandomIdGenerator:  # its ids drawn here, as it draws them
            self._span_id, self._trace_id = partial(_nonzero_bits, 64), partial(_nonzero_bits, 128)
            self._valid_ids = True  # nonzero, and of the ids' widths (a parent's trace id is valid too)

    def start_span(self, name: str, context: otel_context.Context | None = None, kind: SpanKind = SpanKind.INTERNAL,
                   attributes: Attributes = None, links: Sequence[Link] | None = (), start_time: int | None = None,
                   record_exception: bool = True, set_status_on_exception: bool = True) -> trace.Span:
        links = links or ()
        parent: SpanContext | None = trace.get_current_span(context).get_span_context()
        trace_state: TraceState | None = None
        if parent is not None and parent.is_valid:
            trace_id, _, _, flags, trace_state, _ = parent  # its fields at once (SpanContext is a tuple)
            random_ids = bool(flags & TraceFlags.RANDOM_TRACE_ID)
        else:
            parent, flags, random_ids = None, _NO_FLAGS, self._random_ids
            trace_id = self._trace_id()
        if self.sampler is DEFAULT_ON:  # parent-based, always on: what the sampler would decide, decided here
            recording = sampled = parent is None or bool(flags & TraceFlags.SAMPLED)
        else:
            result = self.sampler.should_sample(context, trace_id, name, kind, attributes, links)
            recording, sampled = result.decision is not Decision.DROP, result.decision is Decision.RECORD_AND_SAMPLE
            trace_state, attributes = result.trace_state, result.attributes
        span_id = self._span_id()
        # The tuple SpanContext's own __new__ makes (fields, then whether the ids are valid), without
        # the keyword call into it, which costs instructions on every span.
        valid = self._valid_ids or (0 < trace_id <= _TRACE_ID_MAX and 0 < span_id <= _SPAN_ID_MAX)
        state = trace_state if trace_state is not None else DEFAULT_TRACE_STATE
        span_context = tuple.__new__(SpanContext, (trace_id, span_id, False, _FLAGS[sampled, random_ids], state, valid))
        if not recording:
            return NonRecordingSpan(span_context)
        span = GatewaySpan(name, span_context, parent, kind, attributes, links,
                           start_time if start_time is not None else time_ns(), self._scope, self.resource,
                           self.span_processor, record_exception, set_status_on_exception)
        # The processors are typed for the SDK's own Span; they read a span, and this is one to read.
        self.span_processor.on_start(span, parent_context=context)  # type: ignore[arg-type]
        return span

    # The API's own decorator (its return type) is private; contextmanager does the same.
    @contextmanager
    def start_as_current_span(  # type: ignore[override]
            self, name: str, context: otel_context.Context | None = None, kind: SpanKind = SpanKind.INTERNAL,
            attributes: Attributes = None, links: Sequence[Link] | None = (), start_time: int | None = None,
            record_exception: bool = True, set_status_on_exception: bool = True,
            end_on_exit: bool = True) -> Iterator[trace.Span]:
        span = self.start_span(name, context, kind, attributes, links, start_time)
        with trace.use_span(span, end_on_exit=end_on_exit, record_exception=record_exception,
                            set_status_on_exception=set_status_on_exception) as current:
            yield current
