"""TracerProvider construction from the standard OTEL_* settings: the resource, OTLP over HTTP, a
console exporter for local runs, batch processing. The caller shuts the provider down, which flushes."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import unquote

from opentelemetry import trace
from opentelemetry.sdk.resources import (
    SERVICE_NAME,
    TELEMETRY_SDK_LANGUAGE,
    TELEMETRY_SDK_NAME,
    TELEMETRY_SDK_VERSION,
    Resource,
    ServiceInstanceIdResourceDetector,
)
from opentelemetry.sdk.trace import SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.sdk.version import __version__ as sdk_version
from opentelemetry.trace import Tracer

from telemetry.spans import GatewayTracer, shortcuts_missing

log = logging.getLogger("toolspan.telemetry")

INSTRUMENTATION_SCOPE = "toolspan"
DEFAULT_SERVICE_NAME = "toolspan"  # when neither OTEL_SERVICE_NAME nor OTEL_RESOURCE_ATTRIBUTES names one
EXPORTERS = ("otlp", "console", "none")


@dataclass(frozen=True)
class ExportPlan:
    """Where spans go, as the OTEL_* settings choose: the exporters named, and the OTLP URL."""

    chosen: tuple[str, ...]  # of EXPORTERS
    otlp_url: str


def export_plan(names: str | None, endpoint: str | None = None, traces_endpoint: str | None = None) -> ExportPlan:
    """The exporters named as in OTEL_TRACES_EXPORTER. Unset means OTLP when an endpoint is given,
    and nothing otherwise (a gateway should not fill its log with failed exports by default)."""
    if names is None:
        names = "otlp" if endpoint or traces_endpoint else "none"
    chosen = tuple(n.strip().lower() for n in names.split(",") if n.strip())
    unknown = [n for n in chosen if n not in EXPORTERS]
    if unknown:
        raise ValueError(f"OTEL_TRACES_EXPORTER={names}: {', '.join(unknown)} is not supported "
                         f"(use {', '.join(EXPORTERS)})")
    url = checked_signal_url("traces", traces_endpoint) if traces_endpoint else signal_url("traces", endpoint)
    return ExportPlan(chosen, url)


SIGNAL_PATHS = {"traces": "/v1/traces", "logs": "/v1/logs"}
_SIGNAL_VARIABLES = {"traces": "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "logs": "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT"}


def signal_url(signal: str, endpoint: str | None) -> str:
    """Where one signal (traces, logs) goes for OTEL_EXPORTER_OTLP_ENDPOINT: the base URL with the
    signal's path after it (the specification's rule). A URL given that already ends in a signal's
    path (as trace backends advertise their OTLP address: Phoenix's, Langfuse's) is taken as that
    signal's URL, its base the part before, rather than getting the path twice, which the backend
    would refuse (a 405, seconds later, in the log)."""
    base = (endpoint or "http://localhost:4318").rstrip("/")
    for path in SIGNAL_PATHS.values():
        if base.endswith(path):
            base = base[: -len(path)]
    return base + SIGNAL_PATHS[signal]


def checked_signal_url(signal: str, url: str) -> str:
    """A signal's own endpoint variable (used as it is), refused at start-up when it ends in
    another signal's path: spans sent to /v1/logs, or records to /v1/traces, would be refused one
    export at a time, far from the setting that caused it."""
    for other, path in SIGNAL_PATHS.items():
        if other != signal and url.rstrip("/").endswith(path):
            raise ValueError(f"{_SIGNAL_VARIABLES[signal]}={url} ends in {path}, where OTLP {other} go: give "
                             f"{_SIGNAL_VARIABLES[signal]} the {SIGNAL_PATHS[signal]} URL, and "
                             f"{_SIGNAL_VARIABLES[other]} this one")
    return url


def exporters_for(names: str | None, endpoint: str | None = None, traces_endpoint: str | None = None,
                  protocol: str = "http/protobuf") -> list[SpanExporter]:
    """The exporters `export_plan` chooses."""
    plan = export_plan(names, endpoint, traces_endpoint)
    exporters: list[SpanExporter] = []
    if "otlp" in plan.chosen:
        if protocol != "http/protobuf":
            raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol} is not supported; toolspan exports "
                             "OTLP over HTTP (http/protobuf)")
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporters.append(OTLPSpanExporter(endpoint=plan.otlp_url))
    if "console" in plan.chosen:
        exporters.append(ConsoleSpanExporter())
    return exporters


def resource_attributes(configured: str | None) -> dict[str, str]:
    """OTEL_RESOURCE_ATTRIBUTES parsed as the specification says: `key=value` pairs separated by
    commas, values percent-decoded. Raises ValueError on a pair it cannot read."""
    attributes: dict[str, str] = {}
    for pair in (p.strip() for p in (configured or "").split(",")):
        if not pair:
            continue
        key, equals, value = (part.strip() for part in pair.partition("="))
        if not equals or not key:
            raise ValueError(f"OTEL_RESOURCE_ATTRIBUTES: {pair!r} is not a key=value pair")
        try:
            attributes[key] = unquote(value, errors="strict")
        except UnicodeDecodeError as exc:
            raise ValueError(f"OTEL_RESOURCE_ATTRIBUTES: the value of {key!r} is not percent-encoded UTF-8") from exc
    return attributes


def build_resource(service_name: str | None = None, attributes: str | None = None) -> Resource:
    """What Resource.create() makes (the SDK's own attributes, a service.instance.id, then
    OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME), but of the values given here rather than of
    the environment. service.name: `service_name`, else the one in `attributes`, else toolspan.
    Attributes that cannot be read are dropped as a whole, with an error logged (the spec's rule)."""
    try:
        configured = resource_attributes(attributes)
    except ValueError as exc:
        log.error("%s; ignoring OTEL_RESOURCE_ATTRIBUTES", exc)
        configured = {}
    configured[SERVICE_NAME] = service_name or configured.get(SERVICE_NAME) or DEFAULT_SERVICE_NAME
    sdk = Resource({TELEMETRY_SDK_LANGUAGE: "python", TELEMETRY_SDK_NAME: "opentelemetry",
                    TELEMETRY_SDK_VERSION: sdk_version})
    return sdk.merge(ServiceInstanceIdResourceDetector().detect()).merge(Resource(configured))


def build_provider(resource: Resource | None = None, exporters: Iterable[SpanExporter] = (),
                   processors: Iterable[SpanProcessor] = ()) -> TracerProvider:
    """A provider of its own (never the global one), exporting in batches; `resource` defaults to
    build_resource(). The sampler comes from OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG, as the
    SDK reads them."""
    provider = TracerProvider(resource=resource if resource is not None else build_resource())
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    for processor in processors:
        provider.add_span_processor(processor)
    return provider


# A gateway span carries a few dozen attributes at most, a few events and a link: span limits at
# the SDK's defaults (128 of each, values of any length) never cut one.
_LEAST_COUNT_LIMIT = 128


def _limits_cut_nothing(limits: SpanLimits) -> bool:
    counts = (limits.max_span_attributes, limits.max_events, limits.max_links, limits.max_event_attributes,
              limits.max_link_attributes)
    return (all(count is None or count >= _LEAST_COUNT_LIMIT for count in counts)
            and limits.max_span_attribute_length is None and limits.max_attribute_length is None)


def tracer_of(provider: trace.TracerProvider) -> Tracer:
    """The tracer of toolspan's own spans: for an SDK provider, one that makes them at a fraction of
    the SDK's cost, through the provider's own sampler and processors (`telemetry.spans`); the
    provider's own tracer when its span limits could cut a span (OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT,
    OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT and the like, which only the SDK's spans apply), and for any
    other provider (a no-op one, a host's own implementation). The gateway's tracer relies on a
    few of the SDK's private members: where this SDK lacks one, or has it in another shape, the
    SDK's own tracer is used, with one warning that says what is missing."""
    sdk_tracer = provider.get_tracer(INSTRUMENTATION_SCOPE)
    if not isinstance(sdk_tracer, SdkTracer):
        return sdk_tracer
    limits = getattr(sdk_tracer, "_span_limits", None)  # the only way to the limits the provider applies
    missing = "no Tracer._span_limits of type SpanLimits" if not isinstance(limits, SpanLimits) else None
    missing = missing or shortcuts_missing(sdk_tracer)
    if missing is not None:
        log.warning("opentelemetry-sdk %s: %s; toolspan's spans use the SDK's own tracer (slower)",
                    sdk_version, missing)
        return sdk_tracer
    if isinstance(limits, SpanLimits) and _limits_cut_nothing(limits):
        return GatewayTracer(sdk_tracer, InstrumentationScope(INSTRUMENTATION_SCOPE, ""))  # as the SDK names it
    return sdk_tracer
