"""`toolspan trajectories replay`: the recorded calls parsed again against tools as they are now
(gateway.improve.replay), for a team to run before it changes a tool, in CI with
--fail-on-regression.

    toolspan trajectories replay [--since 2h|2024-05-01] [--tool T] [--key K]
                                 [--against module:attr | schemas.json] [--examples N] [--fail-on-regression]

Without --against, the tools `toolspan serve` would serve from the settings (the example tools
when none are named). `--against module:attr` names tools as `toolspan serve --tools` does; either
way they are parsed as a gateway with these settings would parse them: with its tool_aliases, and
repaired where its argument_repair applies. `--against FILE.json` names the JSON schemas of tools
(gateway.improve.targets), the only way to replay the calls of a client's own tools, whose
schemas the store does not keep. No tool body runs."""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import sys
from pathlib import Path
from typing import Any

from gateway.cli.loading import StartupError, load_tools, served_registry
from gateway.improve.replay import EXAMPLES, RecordedCall, Target, replay
from gateway.improve.targets import as_served, schema_file
from gateway.settings.load import load_settings
from gateway.tools import ToolDeclarationError
from telemetry.store.recorded import recorded_calls

_FORMS = "give module:attr (tools, as toolspan serve --tools takes them) or a JSON file of tool schemas"


def replayed(db: sqlite3.Connection, options: argparse.Namespace) -> dict[str, Any]:
    """The replay `options` ask for, of the calls in `db`."""
    target = target_of(options.against)
    calls = (RecordedCall.of(row) for row in recorded_calls(db, since=options.since, tool=options.tool,
                                                             key=options.key))
    return asyncio.run(replay(calls, target, options.examples))


def target_of(against: str | None) -> Target:
    """What `--against` names: a JSON file of schemas, tools by module:attr, or (None) the tools
    `toolspan serve` would serve. A ValueError says what is wrong with it, in one line."""
    if against is not None and (against.endswith(".json") or Path(against).is_file()):
        return schema_file(Path(against))
    if against is not None and ":" not in against:
        raise ValueError(f"--against {against!r}: {_FORMS}")
    settings = load_settings()  # the aliases and the repair a gateway would use, whatever the tools
    try:
        registry = served_registry(settings) if against is None else load_tools([against])
    except StartupError as exc:  # said as for --tools; here the option is --against
        said = str(exc)
        raise ValueError(f"--against{said.removeprefix('--tools')}" if said.startswith("--tools") else said) from None
    described = (f"the tools toolspan serve would serve ({_named(registry.names())}; an MCP server's are not "
                 "loaded)" if against is None else f"the tools of {against} ({_named(registry.names())})")
    try:
        return as_served(registry, described, settings)
    except ToolDeclarationError as exc:
        raise ValueError(f"tool_aliases does not fit the tools replayed against: {exc}") from None


def _named(names: list[str]) -> str:
    return f"{len(names)} tools: {', '.join(names)}" if names else "no tools"


def regression_status(answer: dict[str, Any], fail_on_regression: bool) -> int:
    """1 when a recorded pass would now be rejected and --fail-on-regression asks to fail then; else 0."""
    if fail_on_regression and answer["broken"]:
        print(f"toolspan: {answer['broken']:,} recorded passes would now be rejected (--fail-on-regression)",
              file=sys.stderr)
        return 1
    return 0


def _whole(text: str) -> int:
    """`--examples`: a whole number from 0."""
    if not text.strip().isascii() or not text.strip().isdigit() or len(text.strip()) > 9:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number from 0")
    return int(text)


def add_options(parser: argparse.ArgumentParser) -> None:
    """The replay's own options (--since and --key come with the other subcommands')."""
    parser.add_argument("--tool", help="only the calls of this tool")
    parser.add_argument("--against", metavar="MODULE:ATTR|FILE.json",
                        help="tools to replay against: module:attr as toolspan serve --tools takes it, or a JSON "
                             "file of tool schemas (a list of Chat, Responses or Anthropic tools, or an object of "
                             "names to schemas); default: the tools toolspan serve would serve")
    parser.add_argument("--examples", type=_whole, default=EXAMPLES, metavar="N",
                        help=f"broken and fixed calls shown of each tool (default {EXAMPLES})")
    parser.add_argument("--fail-on-regression", action="store_true",
                        help="exit 1 when any recorded pass would now be rejected")
