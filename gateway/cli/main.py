"""The composition root: read settings, load tools, set up telemetry, run the app.

    toolspan serve [--host H] [--port P] [--upstream URL] [--tools module:attr ...] [--config FILE]
                   [--log-level debug|info|warning|error] [--log-format text|json] [--[no-]access-log]
                   [--mcp-examples] [--workers N]
    toolspan demo [--api chat|responses] [--mcp]
    toolspan mcp-examples
    toolspan trajectories list|show|report|replay|import|export   (see gateway.cli.trajectories)
    toolspan approvals list|approve ID|deny ID [--url URL] [--key KEY]   (see gateway.cli.approvals)
    toolspan keys usage [--url URL] [--key KEY] [--json]   (see gateway.cli.keys)
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import signal
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path

from gateway.cli.approvals import add_parser as add_approvals_parser
from gateway.cli.approvals import run_approvals
from gateway.cli.keys import add_parser as add_keys_parser
from gateway.cli.keys import run_keys
from gateway.cli.loading import StartupError, import_path, served_registry
from gateway.cli.trajectories import add_parser as add_trajectories_parser
from gateway.cli.trajectories import run_trajectories
from gateway.demo.mcp_server import with_mcp_examples
from gateway.guardrails.catalog import named_in
from gateway.http.browsers import LOOPBACK
from gateway.runtime.logs import configure_logging
from gateway.runtime.process import CannotListen, gateway, run, settle_garbage_collector
from gateway.runtime.reload import LimitsReload
from gateway.runtime.workers import Worker, WorkerFailed, supervise
from gateway.settings.load import load_settings
from gateway.settings.model import Settings
from gateway.settings.text import option_help as setting_help
from gateway.settings.text import version
from gateway.tools import ToolRegistry
from gateway.wire.escaping import without_credentials
from telemetry.tracing import export_plan

log = logging.getLogger("toolspan")


MAX_TOOLS_NAMED = 10  # more than this, and the start-up line gives their number


def describe_tools(registry: ToolRegistry) -> str:
    names = registry.names()
    if not names:
        return "none (every tool call goes back to the client)"
    if len(names) > MAX_TOOLS_NAMED:
        return f"{len(names)} loaded (GET /v1/tools lists them)"
    return ", ".join(names)


def describe_traces(settings: Settings) -> str:
    """Where spans are exported (telemetry.tracing decides; unknown names were refused already)."""
    if not settings.telemetry:
        return "off (telemetry = false)"
    if settings.otel_sdk_disabled:
        return "off (OTEL_SDK_DISABLED=true)"
    plan = export_plan(settings.otel_traces_exporter, settings.otel_exporter_otlp_endpoint,
                       settings.otel_exporter_otlp_traces_endpoint)
    places = [f"OTLP to {plan.otlp_url}"] if "otlp" in plan.chosen else []
    if "console" in plan.chosen:
        places.append("the console (stdout)")
    if places:
        return " and ".join(places)
    if settings.otel_traces_exporter:
        return f"not exported (OTEL_TRACES_EXPORTER={settings.otel_traces_exporter})"
    return "not exported (set OTEL_EXPORTER_OTLP_ENDPOINT to send them to a collector)"


def capture_line() -> str:
    """Said at start-up when messages are not captured: a trajectory then shows its tool calls but
    not what was said, unlike the demo's (which captures)."""
    return ("messages: not captured (spans and the page show tool calls, not the conversation); "
            "capture_message_content = true, or TOOLSPAN_CAPTURE_MESSAGE_CONTENT=true, keeps them")


def upstream_lines(settings: Settings, builtin_model: bool) -> list[str]:
    """Where requests go: the one upstream, or the routing table."""
    if builtin_model:
        return ["upstream: the built-in scripted model (set --upstream for a provider)"]
    if not settings.upstreams:
        return [f"upstream: {settings.upstream_kind} at {settings.upstream}"]
    table = settings.routing_table()
    default = f"; other models go to {table.default}" if table.default is not None else (
        "; other models: 404 model_not_found (no default_upstream)")
    return [f"upstreams: {len(table.upstreams)}, a request's model picks one{default}", *table.describe()]


def guardrail_lines(settings: Settings) -> list[str]:
    """The guardrails every call passes, and what the client's results get; nothing when no list
    names any (gateway.guardrails)."""
    others = bool(settings.tool_guardrails or any(k.guardrails for k in settings.keys.values())
                  or any(s.guardrails for s in settings.mcp_servers.values()))
    if not settings.guardrails and not others:
        return []
    every = ", ".join(settings.guardrails) if settings.guardrails else "none for every call"
    more = "; more on some tools, keys or MCP servers" if others else ""
    return [f"guardrails: {every}{more} (client results: {settings.client_result_guardrails}, "
            f"failure: {settings.guardrail_failure})"]


def startup_lines(url: str, settings: Settings, registry: ToolRegistry, builtin_model: bool) -> list[str]:
    """What an operator wants to see once the gateway listens: where, in front of what, with which
    tools, and where its traces and metrics go."""
    recorded = settings.telemetry and settings.trajectory_store
    return [f"listening on {url}/v1",
            *upstream_lines(settings, builtin_model),
            f"tools: {describe_tools(registry)}",
            *guardrail_lines(settings),
            f"traces: {describe_traces(settings)}",
            f"metrics: {url}/metrics" if settings.telemetry else "metrics: off (telemetry = false)",
            f"trajectories: {settings.store_path()} (toolspan trajectories"
            f"{f'; the page: {url}/ui' if settings.ui else ''})" if recorded else "trajectories: not recorded",
            *([capture_line()] if settings.telemetry and not settings.capture_message_content else []),
            f"mcp: {url}/mcp" if settings.mcp_endpoint else "mcp: off (mcp_endpoint = false)",
            *([] if settings.keys or settings.allowed_hosts is not None or settings.host in LOOPBACK else [
                f"browsers: no gateway keys and any Host taken on {settings.host}: a web page that re-points its "
                "name at this gateway (DNS rebinding) can use its tools; set allowed_hosts, or keys"])]


async def _serve(settings: Settings, mcp_examples: bool = False, worker: Worker | None = None,
                 load: Callable[[], Settings] | None = None) -> None:
    """`toolspan serve` until SIGTERM or SIGINT; as one `worker` of several, it tells the
    supervisor its start-up lines rather than logging them, and stops if the supervisor is gone.
    On SIGHUP, the settings are read again through `load` and their limits replace the ones in
    use (gateway.runtime.reload)."""
    if mcp_examples and not settings.tools:  # the example tools, through MCP
        registry = ToolRegistry()
        settings = with_mcp_examples(settings)
    else:
        registry = served_registry(settings)
    if any(":" in name for name in named_in(settings)):  # module:attr guardrails come from where tools do
        import_path(settings.app_dir)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):  # from here on: a clean shutdown, even mid start-up
        loop.add_signal_handler(sig, stop.set)
    reload = LimitsReload(load if load is not None else lambda: settings)
    loop.add_signal_handler(signal.SIGHUP, reload)  # not the default, which would end the process
    if worker is not None:
        worker.on_supervisor_gone(stop.set)
    async with gateway(settings, registry, worker=worker.slot if worker else None, reload=reload) as (url, _, model):
        settle_garbage_collector()  # the process is the gateway's own: tune its collector
        lines = startup_lines(url, settings, registry, builtin_model=model is not None)
        if worker is None:
            for line in lines:
                log.info("%s", line)
        else:
            worker.listening(lines)  # the supervisor logs them, once for all workers
        await stop.wait()
        # Leaving the block is the graceful shutdown (gateway.runtime.process.serving, gateway.app._wind_down).
        if worker is None:  # the supervisor says it for all workers
            log.info("stopping: no new connections; requests under way have %g s to finish",
                     settings.shutdown_grace_seconds)


READER_GONE = 128 + signal.SIGPIPE  # the exit status when stdout's reader left before the output ended

# What an operator can get wrong: said in one line on stderr, exit code 2.
OPERATOR_ERRORS = (StartupError, CannotListen, FileNotFoundError, ValueError, sqlite3.Error)


def check_workers(settings: Settings) -> None:
    """Workers share what the gateway remembers only through Redis, and one port only when it is
    given: refused before any worker starts."""
    if settings.workers > 1 and settings.state_url is None:
        raise StartupError(f"--workers {settings.workers} needs shared state: set TOOLSPAN_STATE_URL (state_url) "
                           "to a Redis, e.g. redis://localhost:6379/0; in each worker's memory, a follow-up "
                           "landing on another worker would not find its held turn")
    if settings.workers > 1 and settings.port == 0:
        raise StartupError(f"--workers {settings.workers} needs a port: with port 0 each worker would get its own")


def serve_worker(settings: Settings, mcp_examples: bool, load: Callable[[], Settings], worker: Worker) -> None:
    """The main of one worker process of `toolspan serve --workers N` (gateway.runtime.workers
    starts it); `load` reads the settings again on SIGHUP."""
    configure_logging(settings.log_level, settings.log_format)
    try:
        run(_serve(settings, mcp_examples, worker, load))
    except OPERATOR_ERRORS as exc:
        worker.failed(without_credentials(str(exc)))
        sys.exit(2)


def option_help(name: str, text: str | None = None, default: str | None = None) -> str:
    return setting_help(Settings, name, text, default)


def _serve_options(serve: argparse.ArgumentParser) -> None:
    """`toolspan serve`'s options; each one's help names its default and its variable (the
    settings' own, gateway.settings.text)."""
    serve.add_argument("--host", help=option_help("host"))
    serve.add_argument("--port", type=int, help=option_help("port"))
    serve.add_argument("--upstream", metavar="URL", help=option_help("upstream"))
    serve.add_argument("--tools", nargs="+", metavar="MODULE:ATTR",
                       help=option_help("tools", "Tools to offer: a ToolRegistry, a Tool or a list of tools, "
                                                 "imported from the current directory (or --app-dir) first",
                                        default="the example tools get_weather, to_fahrenheit and echo without "
                                                "--upstream, none with it"))
    serve.add_argument("--app-dir", type=Path, metavar="DIR", help=option_help("app_dir"))
    serve.add_argument("--config", type=Path, metavar="FILE",
                       help="TOML or JSON settings file (its keys: the settings' names, e.g. port = 8080)")
    serve.add_argument("--log-level", choices=("debug", "info", "warning", "error"), help=option_help("log_level"))
    serve.add_argument("--log-format", choices=("text", "json"), help=option_help("log_format"))
    serve.add_argument("--access-log", action=argparse.BooleanOptionalAction, help=option_help("access_log"))
    serve.add_argument("--mcp-examples", action="store_true",
                       help="offer the example tools through an MCP server over stdio (toolspan mcp-examples)")
    serve.add_argument("--workers", type=int, metavar="N", help=option_help("workers"))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="toolspan", description="OpenAI-compatible gateway that runs tools")
    parser.add_argument("--version", action="version", version=f"toolspan {version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    _serve_options(commands.add_parser(
        "serve", help="run the gateway", description="Run the gateway. Settings come from these options, then "
        "TOOLSPAN_* environment variables, then the --config file."))
    demo = commands.add_parser("demo", help="run a scripted agent session end to end and print its trajectory")
    demo.add_argument("--api", choices=("chat", "responses", "messages"), default="chat",
                      help="the API the session uses: Chat Completions (default), Responses, or Anthropic's Messages")
    demo.add_argument("--mcp", action="store_true", help="the example tools come through MCP (toolspan mcp-examples)")
    commands.add_parser("mcp-examples", help="serve the example tools as an MCP server over stdio")
    add_trajectories_parser(commands)
    add_approvals_parser(commands)
    add_keys_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        return _command(argv)
    except BrokenPipeError:
        return _reader_gone()


def _reader_gone() -> int:
    """What stdout was written to stopped reading (`toolspan trajectories export | head`): nothing
    more to say, and no traceback. Its descriptor then points at /dev/null, so that the
    interpreter's own flush at exit finds nothing to fail on; the status is a shell's for a
    program SIGPIPE ended."""
    try:
        descriptor = sys.stdout.fileno()
    except (OSError, ValueError):  # not a file (a test's capture): nothing is flushed at exit
        return READER_GONE
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, descriptor)
    os.close(devnull)
    return READER_GONE


def _command(argv: list[str] | None) -> int:
    options = _parser().parse_args(argv)
    try:
        if options.command == "demo":
            from gateway.cli.demo import run_demo  # the demo pulls in the openai client

            configure_logging("warning")  # its output is the trajectory
            run(run_demo(api=options.api, mcp=options.mcp))
            return 0
        if options.command == "trajectories":
            return run_trajectories(options)
        if options.command == "approvals":
            return run_approvals(options)
        if options.command == "keys":
            return run_keys(options)
        if options.command == "mcp-examples":
            from gateway.demo.mcp_server import serve_examples

            configure_logging("warning")  # stdout is the MCP wire; logs go to stderr
            run(serve_examples())
            return 0
        flags = {"host": options.host, "port": options.port, "upstream": options.upstream, "tools": options.tools,
                 "app_dir": options.app_dir, "log_level": options.log_level,
                 "log_format": options.log_format, "access_log": options.access_log,
                 "workers": options.workers}
        load = functools.partial(load_settings, flags, options.config)  # again on SIGHUP, for the limits
        settings = load()
        configure_logging(settings.log_level, settings.log_format)
        if settings.workers > 1:
            check_workers(settings)
            work = functools.partial(serve_worker, settings, options.mcp_examples, load)
            return run(supervise(work, settings.workers, settings.shutdown_grace_seconds))
        run(_serve(settings, mcp_examples=options.mcp_examples, load=load))
    except (*OPERATOR_ERRORS, WorkerFailed) as exc:
        # A settings error may be several, one a line; a URL in one is said without its credentials.
        for line in without_credentials(str(exc)).splitlines():
            print(line if line.startswith(" ") else f"toolspan: {line}", file=sys.stderr)
        return 2
    return 0
