"""The composition root: read settings, load tools, set up telemetry, run the app.

    toolspan serve [--host H] [--port P] [--upstream URL] [--tools module:attr ...] [--config FILE]
    toolspan demo [--api chat|responses]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import signal
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gateway.runtime import gateway, run
from gateway.settings import Settings, load_settings
from gateway.tools import Tool, ToolRegistry

log = logging.getLogger("toolspan")


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
    demo = commands.add_parser("demo", help="run a scripted agent session end to end and print its trajectory")
    demo.add_argument("--api", choices=("chat", "responses"), default="chat",
                      help="the API the session uses: Chat Completions (default) or Responses")
    return parser


def main(argv: list[str] | None = None) -> int:
    options = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if options.command == "demo" else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if options.command == "demo":
            from gateway.demo_session import run_demo  # the demo pulls in the openai client

            run(run_demo(api=options.api))
            return 0
        flags = {"host": options.host, "port": options.port, "upstream": options.upstream, "tools": options.tools}
        settings = load_settings(flags, options.config)
        run(_serve(settings))
    except (StartupError, FileNotFoundError, ValueError) as exc:
        print(f"toolspan: {exc}", file=sys.stderr)
        return 2
    return 0
