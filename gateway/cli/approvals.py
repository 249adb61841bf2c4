"""`toolspan approvals list|approve|deny`: the pending approvals of tool calls of a running gateway,
over its HTTP API (GET and POST /v1/approvals, gateway.routes.approvals).

    toolspan approvals list [--json]
    toolspan approvals approve ID [--reason TEXT] [--output JSON] [--arguments-sha256 HEX]
    toolspan approvals deny ID [--reason TEXT] [--arguments-sha256 HEX]
A decision given the arguments_sha256 the list showed is taken only while the call still asks
about those arguments (else the gateway answers 409 arguments_changed, and it stays pending).
Each takes --url (default http://127.0.0.1:8080) and --key (default: the TOOLSPAN_API_KEY
environment variable), sent as `Authorization: Bearer`. A failure exits 1 with the gateway's own
message. Whatever a model or a caller chose (arguments, messages, tool names, the gateway's error
text) is printed with its control characters made visible (gateway.wire.escaping).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any

from gateway.cli.remote import CommandFailed, call, gateway_options
from gateway.wire.escaping import visible, visible_lines

SAID_MAX = 400  # characters of a call's arguments, and of its message, in the table (--json: all of them)
_DIGEST = re.compile(r"[0-9a-f]{64}")


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--output {text[:80]!r} is not JSON: give JSON, such as "
                                         "'{\"refunded\": true}' or '\"a text\"'") from None


def _digest(text: str) -> str:
    if not _DIGEST.fullmatch(text):
        raise argparse.ArgumentTypeError(f"--arguments-sha256 {text[:80]!r} is not a SHA-256 in hex: give the "
                                         "64 characters `toolspan approvals list` shows")
    return text


def add_parser(commands: Any) -> None:
    """The `approvals` command and its subcommands, on the top-level parser's subparsers."""
    parser = commands.add_parser("approvals", help="list, approve and deny tool calls waiting for a reviewer "
                                                   "(a running gateway's)")
    sub = parser.add_subparsers(dest="action", required=True)
    common = gateway_options("; deciding needs an approver's or the operator's")
    listing = sub.add_parser("list", parents=[common], help="the pending approvals this key may see, oldest first")
    listing.add_argument("--json", action="store_true", help="JSON instead of a table")
    approve = sub.add_parser("approve", parents=[common], help="approve one: the call goes on")
    deny = sub.add_parser("deny", parents=[common], help="deny one: the model is told so, with the reason")
    for decide in (approve, deny):
        decide.add_argument("id", help="the approval's id (appr_...)")
        decide.add_argument("--reason", help="why (a denial's reason goes to the model)")
        decide.add_argument("--arguments-sha256", type=_digest, metavar="HEX",
                            help="the arguments' digest as listed: decide only if the call still asks about those")
    approve.add_argument("--output", type=_json, metavar="JSON", default=argparse.SUPPRESS,
                         help="for a call whose tool paused (Interrupt): its result, as JSON")


def _cell(value: Any, most: int) -> str:
    text = visible(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str))
    return text if len(text) <= most else text[:most - 1] + "…"


def table(listed: list[dict[str, Any]], now: float | None = None) -> list[str]:
    """The pending approvals, one line each: id, tool, kind, the time left, whose (with keys, for
    the operator), the trajectory, the arguments' digest, the arguments and the message; every cell
    terminal-safe."""
    if not listed:
        return ["no approval is pending"]
    now = time.time() if now is None else now
    keyed = any(item.get("key") for item in listed)
    rows = [["id", "tool", "kind", "expires", *(["key"] if keyed else []), "trajectory", "arguments_sha256",
             "arguments / message"]]
    for item in listed:
        expires = item.get("expires_at")
        left = f"in {max(0.0, expires - now):.0f} s" if isinstance(expires, int | float) else "?"
        said = _cell(item.get("arguments"), SAID_MAX)  # the last column: as wide as it is
        if item.get("message"):
            said += f"  {_cell(item['message'], SAID_MAX)}"
        rows.append([_cell(item.get("id"), 40), _cell(item.get("tool"), 64), _cell(item.get("kind"), 12), left,
                     *([_cell(item.get("key") or "-", 64)] if keyed else []), _cell(item.get("trajectory_id"), 40),
                     _cell(item.get("arguments_sha256") or "-", 64), said])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), row[-1]]).rstrip()
            for row in rows]


def _decided(decided: Mapping[str, Any], reason: str | None) -> str:
    line = f"{_cell(decided.get('status'), 20)} {_cell(decided.get('id'), 40)} ({_cell(decided.get('tool'), 64)})"
    return line + (f": {visible(reason)}" if reason else "")


def run_approvals(options: argparse.Namespace) -> int:
    """Runs one `toolspan approvals` subcommand; the exit status."""
    try:
        if options.action == "list":
            answer = call(options, "GET", "/v1/approvals")
            listed = answer.get("data") if isinstance(answer, dict) else None
            if not isinstance(listed, list) or not all(isinstance(item, dict) for item in listed):
                raise CommandFailed(f"{options.url} did not answer with a list of approvals: is it a toolspan "
                                      "gateway?")
            print(visible_lines(json.dumps(listed, indent=2, ensure_ascii=False)) if options.json
                  else "\n".join(table(listed)))
            return 0
        body: dict[str, Any] = {"decision": options.action}
        if options.reason is not None:
            body["reason"] = options.reason
        if hasattr(options, "output"):  # given, null included
            body["output"] = options.output
        if options.arguments_sha256 is not None:
            body["arguments_sha256"] = options.arguments_sha256
        decided = call(options, "POST", f"/v1/approvals/{urllib.parse.quote(options.id, safe='')}", body)
        print(_decided(decided if isinstance(decided, dict) else {}, options.reason))
        return 0
    except CommandFailed as exc:
        print(f"toolspan: {visible(str(exc))}", file=sys.stderr)
        return 1
