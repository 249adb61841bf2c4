"""`toolspan keys usage`: what gateway keys have used of their limits, from a running gateway over
its HTTP API (GET /v1/limits, gateway.routes.limits): the key's own, every key's with the
operator's key (and, without keys, the one caller's).

    toolspan keys usage [--url URL] [--key KEY] [--json]

One line a limit: the key, the limit, what its window holds, its bound, what is left and when the
window holds none of that any more (a minute's in seconds, a day's and a month's as a UTC time);
`max_rounds` is per request. --url and --key as for `toolspan approvals` (gateway.cli.remote). A
failure exits 1 with the gateway's own message.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from gateway.cli.remote import CommandFailed, call, gateway_options
from gateway.limits.usage import figure
from gateway.wire.escaping import visible, visible_lines

HEADER = ["key", "limit", "used", "bound", "left", "resets"]
SECONDS_SHOWN = 3600  # a reset sooner than this is said in seconds, a later one as a time


def add_parser(commands: Any) -> None:
    """The `keys` command and its subcommand, on the top-level parser's subparsers."""
    parser = commands.add_parser("keys", help="gateway keys' limits and what they have used of them (a running "
                                              "gateway's)")
    sub = parser.add_subparsers(dest="action", required=True)
    usage = sub.add_parser("usage", parents=[gateway_options("; the operator's key sees every key's")],
                           help="each limit of the key (every key, for the operator's) against its bound")
    usage.add_argument("--json", action="store_true", help="JSON instead of a table")


def _resets(limit: Mapping[str, Any]) -> str:
    seconds, at = limit.get("resets_in_seconds"), limit.get("resets_at")
    if not isinstance(seconds, int | float) or not isinstance(at, int | float) or seconds <= 0:
        return "-"  # requests at once, or a window that holds nothing
    if seconds < SECONDS_SHOWN:
        return f"in {math.ceil(seconds)} s"
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _rows(entry: Mapping[str, Any]) -> list[list[str]]:
    key = visible(str(entry.get("key") or "-"))
    rows = [[key, visible(str(limit.get("limit"))), figure(limit.get("used")), figure(limit.get("bound")),
             figure(limit.get("remaining")), _resets(limit)] for limit in entry["limits"]]
    if (rounds := entry.get("max_rounds")) is not None:
        rows.append([key, "max_rounds", "-", figure(rounds), "-", "per request"])
    return rows or [[key, "(no limits)", "", "", "", ""]]


def table(listed: list[dict[str, Any]]) -> list[str]:
    """Each key's limits, one line a limit, in columns; every cell terminal-safe."""
    if not listed:
        return ["no key's limits to show"]
    rows = [HEADER, *(row for entry in listed for row in _rows(entry))]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    numeric = {2, 3, 4}  # used, bound, left: right-aligned
    return ["  ".join(cell.rjust(width) if i in numeric else cell.ljust(width)
                      for i, (cell, width) in enumerate(zip(row, widths, strict=True))).rstrip() for row in rows]


def _listed(answer: Any, url: str) -> list[dict[str, Any]]:
    listed = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(listed, list) or not all(isinstance(entry, dict) and isinstance(entry.get("limits"), list)
                                               and all(isinstance(limit, dict) for limit in entry["limits"])
                                               for entry in listed):
        raise CommandFailed(f"{url} did not answer with the keys' limits: is it a toolspan gateway?")
    return listed


def run_keys(options: argparse.Namespace) -> int:
    """Runs `toolspan keys usage`; the exit status."""
    try:
        listed = _listed(call(options, "GET", "/v1/limits"), options.url)
    except CommandFailed as exc:
        print(f"toolspan: {visible(str(exc))}", file=sys.stderr)
        return 1
    print(visible_lines(json.dumps(listed, indent=2, ensure_ascii=False)) if options.json else "\n".join(table(listed)))
    return 0
