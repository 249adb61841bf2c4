"""The composition root: read settings, load tools, set up telemetry, run the app.

    toolspan serve [--host H] [--port P] [--upstream URL] [--tools module:attr ...] [--config FILE]
    toolspan demo
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import logging
import signal
import sys
from collections.abc import AsyncIterator, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from prometheus_client import CollectorRegistry

from gateway.app import create_app
from gateway.demo.agent import DemoPolicy
from gateway.demo.model import Policy, ScriptedModel
from gateway.demo.tools import demo_registry
from gateway.instrumentation import Instrumentation, NoInstrumentation
from gateway.settings import Settings, load_settings
from gateway.tools import Tool, ToolRegistry
from telemetry.instrument import ArgumentCapture
from telemetry.instrument import Instrumentation as Telemetry
from telemetry.metrics import Metrics
from telemetry.tracing import build_provider, exporters_for, tracer_of

log = logging.getLogger("toolspan")
T = TypeVar("T")


class StartupError(Exception):
    """The operator's mistake: reported at start-up, before anything listens."""


def _many(value: Any) -> bool:
    """A registry, list, tuple, set, dict view ...: what the contract calls "an iterable of tools".
    Not a string or a mapping, whose items are characters or keys."""
    return isinstance(value, Iterable) and not isinstance(value, str | bytes | Mapping)


def load_tools(specs: Iterable[str]) -> ToolRegistry:
    """A registry from `module:attr` specs naming a ToolRegistry, a Tool, an iterable of tools, or a
    function taking no arguments that returns one of those (a factory keeps the module stateless)."""
    registry = ToolRegistry()
    for spec in specs:
        module_name, sep, attr = spec.partition(":")
        if not sep or not module_name or not attr:
            raise StartupError(f"--tools {spec!r}: expected module:attribute, e.g. myapp.tools:registry")
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:
            raise StartupError(f"--tools {spec!r}: cannot import {module_name!r} ({exc})") from exc
        try:
            value: Any = getattr(module, attr)
        except AttributeError as exc:
            raise StartupError(f"--tools {spec!r}: module {module_name!r} has no attribute {attr!r}") from exc
        if callable(value) and not isinstance(value, Tool | ToolRegistry | type):
            try:
                value = value()
            except Exception as exc:
                raise StartupError(f"--tools {spec!r}: calling {attr} failed ({exc})") from exc
        found = [value] if isinstance(value, Tool) else list(value) if _many(value) else None
        if found is None or not all(isinstance(t, Tool) for t in found):
            raise StartupError(f"--tools {spec!r}: expected a ToolRegistry, a Tool or an iterable of tools, "
                               f"got {type(value).__name__}")
        for item in found:
            try:
                registry.register(item)
            except ValueError as exc:
                raise StartupError(f"--tools {spec!r}: {exc}") from exc
    return registry


@dataclass
class Observability:
    instrumentation: Instrumentation
    provider: TracerProvider | None


def build_telemetry(settings: Settings, processors: Iterable[SpanProcessor] = (),
                    provider_name: str = "openai") -> Observability:
    if not settings.telemetry:
        return Observability(NoInstrumentation(), None)
    exporters = exporters_for(settings.otel_traces_exporter, settings.otel_exporter_otlp_endpoint,
                              settings.otel_exporter_otlp_traces_endpoint, settings.otel_exporter_otlp_protocol)
    provider = build_provider(settings.otel_service_name, exporters, processors)
    capture = ArgumentCapture(settings.record_tool_arguments, settings.argument_max_chars, settings.redact_keys)
    instrumentation = Telemetry(tracer_of(provider), Metrics(CollectorRegistry()), capture, provider_name,
                                settings.metrics_max_models)
    return Observability(instrumentation, provider)


@contextlib.asynccontextmanager
async def serving(app: web.Application, host: str, port: int) -> AsyncIterator[str]:
    """Run `app` on host:port until the block ends; yields its base URL."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1] if runner.addresses else port
    try:
        yield f"http://{host}:{bound}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def gateway(settings: Settings, registry: ToolRegistry | None = None, processors: Iterable[SpanProcessor] = (),
                  policy: Policy | None = None) -> AsyncIterator[tuple[str, Observability, ScriptedModel | None]]:
    """The whole gateway, with the built-in model as its upstream when none is configured."""
    model: ScriptedModel | None = None
    async with contextlib.AsyncExitStack() as stack:
        if settings.upstream is None:
            model = ScriptedModel(policy or DemoPolicy())
            model_url = model.base_url = await stack.enter_async_context(serving(model.app(), "127.0.0.1", 0))
            settings = settings.model_copy(update={"upstream": f"{model_url}/v1"})
            registry = registry if registry is not None else demo_registry()
        telemetry = build_telemetry(settings, processors, "openai" if model is None else "toolspan.scripted")
        if telemetry.provider is not None:
            stack.callback(telemetry.provider.shutdown)  # flushes the last spans
        app = create_app(settings, registry or ToolRegistry(), telemetry.instrumentation)
        url = await stack.enter_async_context(serving(app, settings.host, settings.port))
        yield url, telemetry, model


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


async def _serve(settings: Settings) -> None:
    registry = load_tools(settings.tools) if settings.tools else None
    async with gateway(settings, registry) as (url, _, model):
        upstream = "the built-in scripted model" if model is not None else settings.upstream
        print(f"toolspan listening on {url}/v1 (upstream: {upstream})", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="toolspan", description="OpenAI-compatible gateway that runs tools")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--upstream", help="provider base URL; default: the built-in scripted model")
    serve.add_argument("--tools", nargs="+", metavar="MODULE:ATTR", help="tools to offer")
    serve.add_argument("--config", type=Path, help="TOML or JSON settings file")
    commands.add_parser("demo", help="run a scripted agent session end to end and print its trajectory")
    return parser


def main(argv: list[str] | None = None) -> int:
    options = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if options.command == "demo" else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if options.command == "demo":
            from gateway.demo.session import run_demo  # the demo pulls in the openai client

            run(run_demo())
            return 0
        flags = {"host": options.host, "port": options.port, "upstream": options.upstream, "tools": options.tools}
        settings = load_settings(flags, options.config)
        run(_serve(settings))
    except (StartupError, FileNotFoundError, ValueError) as exc:
        print(f"toolspan: {exc}", file=sys.stderr)
        return 2
    return 0
