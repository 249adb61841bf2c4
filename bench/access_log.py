"""What one access log line costs in CPU, this checkout's gateway.runtime.logs against an earlier one's,
side by side in one process and one run.

The earlier gateway/logs.py (now gateway/runtime/logs.py) is read from git (`--before`, default c1e04d9, the last commit
before the access line was made cheaper) and imported beside the current one. For each format
(text, json) and each version, the root logger is set up by that version's `configure_logging`,
as `toolspan serve` does, writing to /dev/null; then its AccessLogger logs --lines lines of a
typical request (a POST of /v1/chat/completions, no query, a 200 with the trajectory and trace
ids). Measured: the process's CPU time (`time.process_time`) per line, and apart, per formatting
of such a record by the version's formatter. The versions take turns within each repeat; the
ratio now/before is taken per repeat, then the median. The machine may be shared: the ratio is
the figure, the microseconds only show the scale.

    python bench/access_log.py [--lines 20000] [--repeats 9] [--before REVISION]
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from aiohttp import web
from aiohttp.test_utils import make_mocked_request

import gateway.runtime.logs as current

ROOT = Path(__file__).resolve().parent.parent


def earlier_logs(revision: str, folder: Path) -> ModuleType:
    """gateway/logs.py (gateway/runtime/logs.py since) as it was at `revision`, imported as a module of its own."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{revision}:gateway/logs.py"], check=True,
                            capture_output=True, text=True).stdout
    path = folder / "logs_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("logs_before", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cpu_per_line(logs: ModuleType, log_format: str, lines: int) -> float:
    """Microseconds of CPU per access line, with `logs` configuring the process's logging (from
    the logging module's own defaults: a version may change its switches, see configure_logging)."""
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = True
    logs.configure_logging("info", log_format)  # its handler takes sys.stderr: /dev/null here
    request = make_mocked_request("POST", "/v1/chat/completions")
    response = web.Response(text="ok", headers={"X-Trajectory-Id": "traj_0123456789abcdef",
                                                "X-Trace-Id": "4bf92f3577b34da6a3ce929d0e0e4736"})
    access = logs.AccessLogger(logging.getLogger(logs.ACCESS_LOGGER), "")
    started = time.process_time()
    for _ in range(lines):
        access.log(request, response, 0.0123)
    return (time.process_time() - started) / lines * 1e6


def format_cost(logs: ModuleType, log_format: str, lines: int) -> float:
    """Microseconds of CPU to format one access record with `logs`'s formatter for `log_format`
    (the formatting alone: no record made, nothing written)."""
    fields = {"remote": "127.0.0.1", "method": "POST", "path": "/v1/chat/completions", "protocol": "HTTP/1.1",
              "status": 200, "bytes": 731, "duration_ms": 12.3, "trajectory_id": "traj_0123456789abcdef",
              "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"}
    record = logging.LogRecord(logs.ACCESS_LOGGER, logging.INFO, __file__, 1, current.ACCESS_LINE, (fields,),
                               None, "log")
    record.fields = fields
    formatter = logs.JsonFormatter() if log_format == "json" else logs.TextFormatter(logs.TEXT_FORMAT)
    started = time.process_time()
    for _ in range(lines):
        formatter.format(record)
    return (time.process_time() - started) / lines * 1e6


def report(title: str, figures: dict[str, list[tuple[float, float]]]) -> None:
    print(title)
    for fmt, runs in figures.items():
        ratio = statistics.median(now / then for then, now in runs)
        print(f"  {fmt:5s} before {statistics.median(t for t, _ in runs):5.1f} us   "
              f"now {statistics.median(n for _, n in runs):5.1f} us   now/before {ratio:.2f} "
              f"(per repeat {min(n / t for t, n in runs):.2f}..{max(n / t for t, n in runs):.2f})")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--before", default="c1e04d9", help="the git revision to compare with")
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder, open("/dev/null", "w") as sink:
        before = earlier_logs(options.before, Path(folder))
        stderr, sys.stderr = sys.stderr, sink
        try:
            lines = {fmt: [(cpu_per_line(before, fmt, options.lines), cpu_per_line(current, fmt, options.lines))
                           for _ in range(options.repeats)] for fmt in ("text", "json")}
            formats = {fmt: [(format_cost(before, fmt, options.lines), format_cost(current, fmt, options.lines))
                             for _ in range(options.repeats)] for fmt in ("text", "json")}
        finally:
            sys.stderr = stderr
    report(f"CPU per access line, {options.lines:,} lines x {options.repeats} repeats, before: {options.before}",
           lines)
    report("of which formatting the record (the formatter alone)", formats)


if __name__ == "__main__":
    main()
