"""The propagators OTEL_PROPAGATORS names: what reads a caller's trace context (and baggage) and
writes the gateway's into the requests it sends the provider. Built once, at start-up."""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import entry_points

from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.propagators.textmap import TextMapPropagator
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


class Propagation:
    """One propagator, used both ways: the caller's context out of a request's headers, and a span's
    context into the headers of a provider request."""

    __slots__ = ("_fields", "_propagator")

    def __init__(self, propagator: TextMapPropagator) -> None:
        self._propagator = propagator
        self._fields = frozenset(field.lower() for field in propagator.fields)

    def extract(self, headers: Mapping[str, str]) -> Context | None:
        """The caller's context; None (without the work) when the headers carry none of its fields.
        `headers` should be case-insensitive, as aiohttp's are."""
        if not any(field in headers for field in self._fields):
            return None
        return self._propagator.extract(headers)

    def inject(self, headers: dict[str, str], context: Context) -> None:
        """`context` written into `headers`, over whatever the caller sent in the same fields (in any
        letter case): the provider sees one trace context, the gateway's."""
        if not self._fields:
            return
        for stale in [name for name in headers if name.lower() in self._fields]:
            del headers[stale]
        self._propagator.inject(headers, context)
