"""The propagators OTEL_PROPAGATORS names: what reads a caller's trace context (and baggage) and
writes the gateway's into the requests it sends the provider. Built once, at start-up."""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import entry_points

from opentelemetry import trace
from opentelemetry.baggage import get_all
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.trace import DEFAULT_TRACE_STATE, INVALID_SPAN_CONTEXT, Span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

DEFAULT_PROPAGATORS = "tracecontext,baggage"  # the specification's default: W3C trace context and baggage
_BUILT_IN = {"tracecontext": TraceContextTextMapPropagator, "baggage": W3CBaggagePropagator}
_ENTRY_POINTS = "opentelemetry_propagator"  # where packages such as opentelemetry-propagator-b3 register theirs


def build_propagator(configured: str | None = DEFAULT_PROPAGATORS) -> TextMapPropagator:
    """The propagators named as in OTEL_PROPAGATORS (comma-separated; empty means the default),
    in order. `none` anywhere means none, as in the OpenTelemetry SDK. A name that is neither
    built in nor installed fails here, at start-up."""
    configured = configured if configured and configured.strip() else DEFAULT_PROPAGATORS
    chosen = list(dict.fromkeys(n.strip().lower() for n in configured.split(",") if n.strip()))
    if "none" in chosen:
        return CompositePropagator([])
    if chosen == ["tracecontext", "baggage"]:
        return W3CPropagator()
    return CompositePropagator([_propagator(name, configured) for name in chosen])


def _propagator(name: str, configured: str) -> TextMapPropagator:
    built_in = _BUILT_IN.get(name)
    if built_in is not None:
        return built_in()
    installed = entry_points(group=_ENTRY_POINTS, name=name)
    if not installed:
        raise ValueError(f"OTEL_PROPAGATORS={configured}: {name} is not supported (use tracecontext, baggage or "
                         "none; b3 and b3multi need the opentelemetry-propagator-b3 package installed)")
    propagator: TextMapPropagator = next(iter(installed)).load()()
    return propagator


class W3CPropagator(CompositePropagator):
    """W3C trace context, then W3C baggage: the default propagators, as CompositePropagator runs
    them. Named, so that Propagation can write their headers without going through them."""

    def __init__(self) -> None:
        super().__init__([TraceContextTextMapPropagator(), W3CBaggagePropagator()])


class Propagation:
    """One propagator, used both ways: the caller's context out of a request's headers, and a span's
    context into the headers of a provider request."""

    __slots__ = ("_fields", "_propagator", "_w3c_baggage")

    def __init__(self, propagator: TextMapPropagator) -> None:
        self._propagator = propagator
        self._fields = frozenset(field.lower() for field in propagator.fields)
        # Only for the default propagators: inject_span writes their trace context itself.
        self._w3c_baggage = W3CBaggagePropagator() if type(propagator) is W3CPropagator else None

    def extract(self, headers: Mapping[str, str]) -> Context | None:
        """The caller's context; None (without the work) when the headers carry none of its fields.
        `headers` should be case-insensitive, as aiohttp's are."""
        for field in self._fields:
            if field in headers:
                return self._propagator.extract(headers)
        return None

    def inject(self, headers: dict[str, str], context: Context) -> None:
        """`context` written into `headers`, over whatever the caller sent in the same fields (in any
        letter case): the provider sees one trace context, the gateway's."""
        if not self._fields:
            return
        self._drop_stale(headers)
        self._propagator.inject(headers, context)

    def inject_span(self, headers: dict[str, str], span: Span, parent: Context) -> None:
        """What inject(headers, set_span_in_context(span, parent)) writes: `span`'s trace context and
        the baggage of `parent`, the context it runs in. For the default propagators, without
        building that context or going through them: the traceparent formatted here as W3C's
        propagator formats it, the baggage by its propagator, in less time per provider call
        (docs/benchmarks.md)."""
        baggage = self._w3c_baggage
        if baggage is None:
            self.inject(headers, trace.set_span_in_context(span, parent))
            return
        self._drop_stale(headers)
        context = span.get_span_context()
        if context != INVALID_SPAN_CONTEXT:
            trace_id, span_id, _, flags, state, _ = context  # its fields at once (SpanContext is a tuple)
            # %-formatting: faster here than an f-string's format specs.
            headers["traceparent"] = "00-%032x-%016x-%02x" % (trace_id, span_id, flags)  # noqa: UP031
            if state is not DEFAULT_TRACE_STATE and state:  # the shared empty one, most often
                headers["tracestate"] = state.to_header()
        if get_all(parent):  # most requests carry none, and then its propagator writes nothing
            baggage.inject(headers, parent)

    def _drop_stale(self, headers: dict[str, str]) -> None:
        if self._fields.isdisjoint(map(str.lower, headers)):
            return
        for stale in [name for name in headers if name.lower() in self._fields]:
            del headers[stale]
