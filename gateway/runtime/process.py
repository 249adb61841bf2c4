"""Running the gateway: telemetry from settings, the app on a port, the built-in model when no
provider is configured, and the event loop it all runs on. `toolspan serve`, `toolspan demo`,
the tests and the bench all start the gateway through `gateway()`."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
from collections.abc import AsyncIterator, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from aiohttp import web
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.trace import NoOpTracerProvider
from opentelemetry.trace import TracerProvider as AnyTracerProvider
from prometheus_client import CollectorRegistry

from gateway.app import create_app
from gateway.demo.agent import DemoPolicy
from gateway.demo.model import Policy, ScriptedModel
from gateway.demo.tools import demo_registry
from gateway.http.metrics_page import MetricsPage, OwnMetrics, WorkersMetrics, serving_own_metrics
from gateway.http.server import GatewayRunner
from gateway.instrumentation import Instrumentation, NoInstrumentation
from gateway.runtime.logs import ACCESS_LOGGER, access_logger
from gateway.runtime.reload import LimitsReload
from gateway.runtime.workers import WorkerSlot
from gateway.settings.model import REDACT_KEYS, Settings
from gateway.state import ApprovalBounds, Bounds, StateStore, make_store
from gateway.tools import ToolRegistry
from telemetry.decisions import DecisionLog, build_decision_log, log_exporter_names, logs_url
from telemetry.instrument import ArgumentCapture, Telemetry
from telemetry.merge import merged_page
from telemetry.messages import MessageCapture
from telemetry.metrics import Metrics
from telemetry.propagation import build_propagator
from telemetry.store.reader import StoreReader
from telemetry.store.writer import TrajectoryStore
from telemetry.tracing import build_provider, build_resource, exporters_for, tracer_of
from telemetry.trajectory import Trajectories

T = TypeVar("T")
LISTEN_BACKLOG = 128  # aiohttp's own, for the servers that expect no bursts (tests, benches)


@dataclass
class Observability:
    """The instrumentation handed to the app, the tracer provider this process made (None when
    telemetry is off or the host application brought its own), the state store (held turns and
    retry state, shared by the app and the retry classification), and the trajectory store its
    spans feed (None when off)."""

    instrumentation: Instrumentation
    provider: TracerProvider | None
    state: StateStore
    store: TrajectoryStore | None = None
    log_provider: LoggerProvider | None = None  # of the decision log records, when a logs exporter is named

    def trajectory_reader(self) -> StoreReader | None:
        """The store as the page at /ui reads it (None when there is no store)."""
        return StoreReader(self.store.path) if self.store is not None else None


def build_store(settings: Settings, metrics: Metrics) -> TrajectoryStore | None:
    """The trajectory store the settings ask for; its losses counted in `metrics`."""
    if not settings.trajectory_store:
        return None
    counter = metrics.trajectory_store_dropped
    return TrajectoryStore(settings.store_path(), max_bytes=settings.trajectory_store_max_bytes,
                           max_age_days=settings.trajectory_store_max_age_days,
                           dropped=lambda reason, count: counter.labels(reason).inc(count))


def build_state(settings: Settings, metrics: Metrics | None) -> StateStore:
    """The state store the settings name; `metrics` hear whether each command to Redis worked,
    whether Redis lost its data, and of each value read from it that was garbage (and export
    whether Redis is up only when there is a Redis)."""
    turns = Bounds(settings.pending_turn_capacity, settings.pending_turn_ttl_seconds,
                   settings.pending_turn_capacity_per_key)
    owned = Bounds(settings.owned_response_capacity, settings.owned_response_ttl_seconds,
                   settings.owned_response_capacity_per_key)
    approvals = ApprovalBounds(settings.approvals_max_pending, settings.approvals_max_pending_per_key)
    if metrics is not None and settings.state_url is not None:
        metrics.state_store_shared()
    return make_store(settings.state_url, turns, owned, settings.state_timeout_seconds,
                      metrics.state_store_answered if metrics else lambda up: None,
                      metrics.state_store_lost if metrics else lambda: None,
                      metrics.state_store_unreadable_value if metrics else lambda kind: None, approvals)


def build_telemetry(settings: Settings, processors: Iterable[SpanProcessor] = (),
                    tracer_provider: AnyTracerProvider | None = None) -> Observability:
    """Spans and metrics as the settings ask. A host application may hand in its own tracer
    provider: toolspan's spans then go wherever that provider sends them, and it stays the
    host's to shut down (no trajectory store then: it is fed by a provider of toolspan's own).
    OTEL_SDK_DISABLED turns spans off, not metrics."""
    if not settings.telemetry:
        return Observability(NoInstrumentation(), None, build_state(settings, None))
    propagator = build_propagator(settings.otel_propagators)  # an unknown name fails here, at start-up
    metrics = Metrics(CollectorRegistry())
    state = build_state(settings, metrics)
    owned: TracerProvider | None = None
    store: TrajectoryStore | None = None
    if tracer_provider is None and settings.otel_sdk_disabled:
        tracer_provider = NoOpTracerProvider()  # no spans; a caller's trace context still goes on
    elif tracer_provider is None:
        exporters = exporters_for(settings.otel_traces_exporter, settings.otel_exporter_otlp_endpoint,
                                  settings.otel_exporter_otlp_traces_endpoint, settings.otel_exporter_otlp_protocol)
        resource = build_resource(settings.otel_service_name, settings.otel_resource_attributes)
        store = build_store(settings, metrics)
        processors = [*processors, store] if store is not None else processors
        tracer_provider = owned = build_provider(resource, exporters, processors)
    log_provider, decisions = build_decisions(settings, tracer_provider)
    capture = ArgumentCapture(settings.record_tool_arguments, settings.argument_max_chars, settings.redact_keys)
    telemetry = Telemetry(tracer_of(tracer_provider), metrics, capture, settings.metrics_max_models,
                          propagator=propagator,
                          max_label_chars=settings.metrics_max_label_chars,
                          own_sampling=settings.trace_sampling == "own", trajectories=Trajectories(state.failures),
                          count_probes=settings.telemetry_count_probes,
                          messages=MessageCapture(settings.message_content_max_chars, settings.redact_keys)
                          if settings.capture_message_content else None, decisions=decisions)
    return Observability(telemetry, owned, state, store, log_provider)


def build_decisions(settings: Settings, tracer_provider: AnyTracerProvider) -> tuple[LoggerProvider | None,
                                                                                     DecisionLog | None]:
    """The decision log records' provider and writer, when OTEL_LOGS_EXPORTER names an exporter
    (an unknown name, or a logs URL ending in /v1/traces, fails here, at start-up). Their resource
    is the spans' (a host's provider's own, when it brought one)."""
    chosen = log_exporter_names(settings.otel_logs_exporter)
    url = logs_url(settings.otel_exporter_otlp_endpoint, settings.otel_exporter_otlp_logs_endpoint)
    if not chosen or settings.otel_sdk_disabled:
        return None, None
    resource = getattr(tracer_provider, "resource", None)
    if not isinstance(resource, Resource):
        resource = build_resource(settings.otel_service_name, settings.otel_resource_attributes)
    return build_decision_log(chosen, url, resource)


class CannotListen(Exception):
    """The gateway could not take its address: a port in use, an address this host does not have."""

    def __init__(self, host: str, port: int, error: OSError) -> None:
        # asyncio's message repeats the address; the errno says it plainly (a failed name lookup has no errno).
        reason = os.strerror(error.errno) if error.errno and error.errno > 0 else error.strerror or str(error)
        address = f"[{host}]" if ":" in host else host
        super().__init__(f"cannot listen on {address}:{port}: {reason}")


@contextlib.asynccontextmanager
async def serving(app: web.Application, host: str, port: int, access_log: bool = False,
                  shutdown_timeout: float = 60.0, reuse_port: bool = False,
                  redact_keys: Sequence[str] = REDACT_KEYS, backlog: int = LISTEN_BACKLOG) -> AsyncIterator[str]:
    """Run `app` on host:port until the block ends; yields its base URL. With `access_log`, each
    request is logged on the toolspan.access logger (query parameters holding credentials, or
    named by `redact_keys`, masked); with `reuse_port`, other processes may listen
    on the same port (SO_REUSEPORT: the kernel spreads connections over them). Raises CannotListen
    when the bind fails.

    `backlog` is how many new connections the kernel holds until the event loop takes them (the
    kernel caps it, at net.core.somaxconn on Linux). Past it, Linux drops the connection's
    handshake and the client's kernel tries again 1, 3, 7, 15 s later: a burst of connections
    larger than the backlog, arriving while the loop is busy, is served seconds late. A server
    should hold as many as it expects at once.

    The end is aiohttp's graceful shutdown: stop listening, close idle connections, run the app's
    on_shutdown handlers (the gateway's waits for the requests under way, see gateway.app), then
    wait up to `shutdown_timeout` for the handlers still running and cancel them, then clean up."""
    runner = GatewayRunner(app, handler_cancellation=True, shutdown_timeout=shutdown_timeout,
                           access_log_class=access_logger(redact_keys),
                           access_log=logging.getLogger(ACCESS_LOGGER) if access_log else None)
    await runner.setup()
    try:
        try:
            await web.TCPSite(runner, host, port, reuse_port=reuse_port, backlog=backlog).start()
        except OSError as exc:
            raise CannotListen(host, port, exc) from exc
        bound = runner.addresses[0][1] if runner.addresses else port
        yield f"http://{host}:{bound}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def gateway(settings: Settings, registry: ToolRegistry | None = None, processors: Iterable[SpanProcessor] = (),
                  policy: Policy | None = None, tracer_provider: AnyTracerProvider | None = None,
                  worker: WorkerSlot | None = None, reload: LimitsReload | None = None,
                  ) -> AsyncIterator[tuple[str, Observability, ScriptedModel | None]]:
    """The whole gateway, with the built-in model as its upstream when none is configured. As one
    `worker` of several (`toolspan serve --workers N`), it shares its port with the others, and
    its /metrics shows theirs too (gateway.http.metrics_page). `reload` (SIGHUP's, in `toolspan
    serve`) is handed the app once it serves."""
    model: ScriptedModel | None = None
    async with contextlib.AsyncExitStack() as stack:
        if not settings.has_upstream:
            registry = registry if registry is not None else demo_registry()
            # The built-in model tells the client's own tools from the gateway's by the registry.
            model = ScriptedModel(policy or DemoPolicy(gateway_tools=registry))
            # It takes as many connections at once as the gateway opens to a provider.
            model_site = serving(model.app(), "127.0.0.1", 0, backlog=settings.upstream_max_connections)
            model_url = model.base_url = await stack.enter_async_context(model_site)
            # It serves every wire API, as an OpenAI-compatible server may: none is refused before it.
            settings = settings.model_copy(update={"upstream": f"{model_url}/v1", "upstream_kind": "compatible",
                                                   "upstream_provider_name": "toolspan.scripted"})
        telemetry = build_telemetry(settings, processors, tracer_provider)
        if telemetry.provider is not None:
            stack.callback(telemetry.provider.shutdown)  # flushes the last spans
        if telemetry.log_provider is not None:
            stack.callback(telemetry.log_provider.shutdown)  # and the last decision records
        metrics_page: MetricsPage | None = None
        if worker is not None and worker.count > 1 and settings.telemetry:
            own = OwnMetrics(telemetry.instrumentation)
            await stack.enter_async_context(serving_own_metrics(own, worker.own_socket()))
            metrics_page = WorkersMetrics(own, worker.peer_sockets(), merged_page)
        app = create_app(settings, registry if registry is not None else ToolRegistry(), telemetry.instrumentation,
                         telemetry.state, telemetry.trajectory_reader(), metrics_page=metrics_page)
        # The app's own shutdown handler gives requests their grace period; the runner then only
        # cancels what outlived it, after a second.
        # A burst of as many new connections as the requests it takes at once waits to be accepted.
        site = serving(app, settings.host, settings.port, access_log=settings.access_log, shutdown_timeout=1.0,
                       reuse_port=worker is not None, redact_keys=settings.redact_keys,
                       backlog=settings.max_concurrent_requests)
        url = await stack.enter_async_context(site)
        if reload is not None:
            reload.serving(app)
        yield url, telemetry, model


def settle_garbage_collector() -> None:
    """For `toolspan serve`, a process of the gateway's own (never the library's entry point,
    `gateway()`, which a host application calls in its own process). Once the gateway listens:
    what start-up made (modules, the app, the registry, the tools) lives as long as the process,
    so it is moved out of the collector's view (`gc.freeze`), and
    young objects are collected every 10,000 allocations rather than 700. A request allocates
    a few thousand objects (more with spans), so the default collected several times a request
    and walked the long-lived ones at every older collection: the change cut the CPU of a request
    a little and its p99 latency several times over (docs/benchmarks.md)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(10_000, older, oldest)


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` to completion on uvloop's event loop where it is installed (a dependency
    everywhere but Windows): the gateway spends a good part of each request in the event loop and
    its transports, which uvloop implements in C. Elsewhere, on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
