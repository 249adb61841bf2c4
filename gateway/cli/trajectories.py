"""`toolspan trajectories list|show|report|import|export`: the embedded trajectory store, read in
the terminal (telemetry.store.report answers, telemetry.store.report_text prints).

    toolspan trajectories list [--tool T] [--outcome O] [--since 2h|2024-05-01] [--model M] [--limit N] [--key K]
    toolspan trajectories show [--key K] [--page N] [--limit N] ID   (a page of N requests; default 200)
    toolspan trajectories report [--since ...] [--key K] [--by model|upstream|key|tool]
    toolspan trajectories replay [--since ...] [--tool T] [--key K] [--against module:attr | FILE.json]
                                 [--examples N] [--fail-on-regression]   (see gateway.cli.replay)
    toolspan trajectories import FILE...      (OTLP JSON, one ExportTraceServiceRequest a line)
    toolspan trajectories export [FILE]       (the same format; default: stdout)
    toolspan trajectories export --format chat-jsonl [--pairs] [the filters of list] [FILE]
                                              (a dataset of the tool calls: telemetry.store.dataset)
Each takes --db PATH (default: the settings' store path) and --json (list, show, report, replay). With
gateway keys, a trajectory is the key's and the id's together: --key names the key (list and report:
only its trajectories; show: the id is the one its caller sent), or show takes the stored id, KEY~ID.
What is printed has the control characters of stored strings made visible (gateway.wire.escaping).
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from gateway.cli.replay import add_options as add_replay_options
from gateway.cli.replay import regression_status, replayed
from gateway.improve import replay_text
from gateway.settings.load import load_settings
from gateway.wire.escaping import visible_lines
from telemetry.names import OUTCOMES
from telemetry.store import compare, dataset, otlp, report, report_text
from telemetry.store.schema import connect

_AGO = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_WHOLE = re.compile(r"[0-9]{1,9}")
SHOW_REQUESTS = 200  # requests `show` prints unless --limit says otherwise
EXPORT_FORMATS = ("otlp", "chat-jsonl")
_DATASET_OPTIONS = ("tool", "outcome", "model", "since", "key", "limit", "pairs")  # chat-jsonl's alone


def since_seconds(text: str, now: float | None = None) -> float:
    """`--since`: an age (`90s`, `30m`, `2h`, `7d`) or an ISO date or time, as epoch seconds."""
    if (match := _AGO.match(text.strip())) is not None:
        return (time.time() if now is None else now) - float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(f"--since {text!r}: give an age such as 2h or 7d, or a date such as "
                                         "2024-05-01") from None


def positive(text: str) -> int:
    """`--page` and `--limit`: a whole number from 1."""
    if not _WHOLE.fullmatch(text.strip()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number from 1")
    return int(text)


def add_parser(commands: Any) -> None:
    """The `trajectories` command and its subcommands, on the top-level parser's subparsers."""
    parser = commands.add_parser("trajectories", help="list, show and report the recorded trajectories")
    sub = parser.add_subparsers(dest="action", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", type=Path, help="the store's file (default: the settings' trajectory_store_path)")
    shown = argparse.ArgumentParser(add_help=False, parents=[common])
    shown.add_argument("--json", action="store_true", help="JSON instead of text")
    filters = argparse.ArgumentParser(add_help=False)
    filters.add_argument("--tool", help="trajectories with a call of this tool")
    filters.add_argument("--outcome", choices=OUTCOMES, help="trajectories with a tool call of this outcome")
    filters.add_argument("--model", help="trajectories with a turn of this model")
    filters.add_argument("--since", type=since_seconds, help="an age (2h, 7d) or a date")
    listing = sub.add_parser("list", parents=[shown, filters], help="trajectories, newest first")
    listing.add_argument("--limit", type=int, default=50)
    show = sub.add_parser("show", parents=[shown], help="one trajectory's timeline")
    show.add_argument("id")
    show.add_argument("--page", type=positive, default=1, help="which page of the requests (default: the first)")
    show.add_argument("--limit", type=positive, default=SHOW_REQUESTS,
                      help=f"requests a page (default {SHOW_REQUESTS})")
    summary = sub.add_parser("report", parents=[shown], help="per tool and per model: rejections, renames, "
                                                               "retries, recoveries")
    summary.add_argument("--since", type=since_seconds, help="an age (2h, 7d) or a date")
    summary.add_argument("--by", choices=compare.GROUPINGS, help="compare models, upstreams, gateway keys or tools: "
                                                                 "each rate with its counts")
    replay = sub.add_parser("replay", parents=[shown], help="recorded calls parsed again against tools as they "
                                                             "are now: which rejections would pass, which passes break")
    replay.add_argument("--since", type=since_seconds, help="calls made since: an age (2h, 7d) or a date")
    add_replay_options(replay)
    for keyed in (listing, show, summary, replay):
        keyed.add_argument("--key", help="the gateway key (its name) whose trajectories to read")
    imports = sub.add_parser("import", parents=[common], help="add OTLP JSON trace files to the store")
    imports.add_argument("files", nargs="+", type=Path)
    exports = sub.add_parser("export", parents=[common, filters], help="write the store as OTLP JSON, or a "
                             "dataset of its tool calls (the filters and --pairs: chat-jsonl only)")
    exports.add_argument("file", nargs="?", type=Path, help="default: stdout")
    exports.add_argument("--format", choices=EXPORT_FORMATS, default="otlp",
                         help="otlp: the spans; chat-jsonl: one example a line in OpenAI's chat format")
    exports.add_argument("--pairs", action="store_true",
                         help="one example per failed call a later call corrected, instead of one per call")
    exports.add_argument("--limit", type=positive, help="the newest N trajectories (default: all)")
    exports.add_argument("--key", help="the gateway key (its name) whose trajectories to read")


def _open(path: Path, writing: bool) -> sqlite3.Connection:
    if writing:
        return connect(str(path))
    if not path.is_file():
        raise FileNotFoundError(f"no trajectory store at {path} (run the gateway, or pass --db)")
    return report.open_readonly(str(path))  # an older toolspan's store reads as this version's


def _print(value: Any, as_json: bool, lines: list[str]) -> None:
    """`lines` are terminal-safe already (report_text); JSON escapes the C0 controls itself, not C1 nor
    the bidirectional ones: those as \\u escapes too."""
    print(visible_lines(json.dumps(value, indent=2, ensure_ascii=False)) if as_json else "\n".join(lines))


def run_trajectories(options: argparse.Namespace) -> int:
    """Runs one `toolspan trajectories` subcommand; the exit status."""
    path = options.db if options.db is not None else load_settings().store_path()
    db = _open(path, writing=options.action == "import")
    try:
        return _run(db, options)
    finally:
        db.close()


def _run(db: sqlite3.Connection, options: argparse.Namespace) -> int:
    action = options.action
    if action == "list":
        found = report.list_trajectories(db, tool=options.tool, outcome=options.outcome, since=options.since,
                                         model=options.model, limit=options.limit, key=options.key)
        _print(found, options.json, report_text.trajectory_list(found))
    elif action == "show":
        return _show(db, options)
    elif action == "report" and options.by is not None:
        figures = compare.compared(db, options.by, since=options.since, key=options.key)
        _print(figures, options.json, report_text.compared(figures))
    elif action == "report":
        figures = report.report(db, since=options.since, key=options.key)
        _print(figures, options.json, report_text.report(figures))
    elif action == "replay":
        answer = replayed(db, options)
        _print(answer, options.json, replay_text.replay(answer))
        return regression_status(answer, options.fail_on_regression)
    elif action == "import":
        _import(db, options.files)
    else:
        _export(db, options)
    return 0


def _export(db: sqlite3.Connection, options: argparse.Namespace) -> None:
    """`export`: the spans as OTLP JSON (the whole store), or a dataset of the calls."""
    if options.format == "chat-jsonl":
        _export_dataset(db, options)
    elif given := [f"--{name}" for name in _DATASET_OPTIONS if getattr(options, name) not in (None, False)]:
        raise ValueError(f"{', '.join(given)}: only with --format chat-jsonl (an OTLP export is the whole store)")
    elif options.file is None:
        otlp.export(db, sys.stdout)
    else:
        with _output(options.file) as out:
            print(f"{options.file}: {otlp.export(db, out)} spans written", file=sys.stderr)


def _output(file: Path) -> IO[str]:
    """The file an export writes, or one line saying why it cannot."""
    try:
        return file.open("w", encoding="utf-8")
    except OSError as exc:  # a directory, a folder that is not there, no permission
        raise ValueError(f"{file}: cannot write it ({exc.strerror or exc})") from None


def _export_dataset(db: sqlite3.Connection, options: argparse.Namespace) -> None:
    """`export --format chat-jsonl`: the dataset, to the file or stdout; what was written on stderr."""
    selection = dataset.Selection(tool=options.tool, outcome=options.outcome, since=options.since,
                                  model=options.model, key=options.key, limit=options.limit)
    pairs, keys = options.pairs, load_settings().redact_keys
    if options.file is None:
        written = dataset.export(db, sys.stdout, selection, pairs=pairs, redact_keys=keys)
    else:
        with _output(options.file) as out:
            written = dataset.export(db, out, selection, pairs=pairs, redact_keys=keys)
    where = options.file if options.file is not None else "stdout"
    left = f" ({written.left_out} calls left out: neither messages nor arguments recorded)" if written.left_out else ""
    print(visible_lines(f"{where}: {written.examples} examples written{left}"), file=sys.stderr)


def _import(db: sqlite3.Connection, files: list[Path]) -> None:
    for file in files:
        try:
            with file.open(encoding="utf-8") as lines:
                written = otlp.import_file(db, lines)
        except OSError as exc:  # a directory, a file it may not read
            raise ValueError(f"{file}: cannot read it ({exc.strerror or exc})") from None
        except ValueError as exc:  # not OTLP JSON, or a span of the wrong shape: nothing of it is stored
            raise ValueError(f"{file}: {exc}") from None
        print(f"{file}: {written} spans recorded")


def _show(db: sqlite3.Connection, options: argparse.Namespace) -> int:
    """One page of a trajectory's requests, and how to see the others."""
    one = report.trajectory(db, options.id, options.key, offset=(options.page - 1) * options.limit,
                            limit=options.limit)
    if one is None:
        print(f"toolspan: no trajectory {options.id!r} in the store", file=sys.stderr)
        return 1
    total = one["totals"]["requests"]
    last = max(1, -(-total // options.limit))
    if options.page > last:
        print(f"toolspan: --page {options.page} is past the last page of trajectory {options.id!r}: {last} "
              f"({total:,} requests, {options.limit:,} a page)", file=sys.stderr)
        return 1
    lines = report_text.timeline(one)
    if last > 1:
        more = f"--page {options.page + 1} shows the next" if options.page < last else "--page 1 shows the first"
        lines += ["", f"{report_text.shown_requests(one)[0]} (page {options.page} of {last}): {more} "
                  f"{options.limit:,}; --limit N shows N a page"]
    _print(one, options.json, lines)
    return 0
