"""`toolspan serve` stops in bounded time whatever its stdio MCP servers do, and leaves none of
their processes behind: here a server that hangs at start-up, ignores SIGTERM and has started a
helper process that ignores it too (tests/mcp/servers/stuck.py)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.cli.test_main_process import Server

STUCK_SERVER = Path(__file__).parent.parent / "mcp" / "servers" / "stuck.py"
# With nothing under way the gateway's own shutdown takes well under a second; its MCP servers'
# stop is bounded by gateway.mcp.sources.STOP_SECONDS (7 s), and a cancelled stop kills them outright.
EXIT_SECONDS = 15.0


def entries(record: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def running(pid: int) -> bool:
    """Whether the process exists and is not a zombie (one that exited, waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def until(check: Callable[[], bool], seconds: float) -> bool:
    """Poll `check` (an effect in other processes: there is no event to await) until it holds."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def test_sigterm_while_a_stuck_server_is_being_stopped_ends_serve_and_its_processes(tmp_path: Path) -> None:
    """SIGTERM comes while the gateway is tearing down a failed connection attempt (the server's
    stdin just closed, its graces running): serve exits 0 in bounded time, and neither the
    server nor its helper is still running."""
    record = tmp_path / "stuck.jsonl"
    servers = {"stuck": {"command": sys.executable, "args": [str(STUCK_SERVER)], "env": {"RECORD": str(record)},
                         "connect_timeout_seconds": 1, "reconnect_min_seconds": 0.1, "reconnect_max_seconds": 0.2,
                         "ping_interval_seconds": 0}}
    server = Server(env={"TOOLSPAN_MCP_SERVERS": json.dumps(servers)})
    try:
        await asyncio.to_thread(server.url)  # start-up waited for the first attempt to end
        closed = sum("stdin" in entry for entry in entries(record))
        assert await until(lambda: sum("stdin" in entry for entry in entries(record)) > closed, 30)
        server.process.send_signal(signal.SIGTERM)
        began = time.monotonic()
        exited = await until(lambda: server.process.poll() is not None, EXIT_SECONDS)
        took = time.monotonic() - began
    finally:
        server.process.kill()
        left = [int(str(entry["pid"])) for entry in entries(record) if "pid" in entry]
        gone = await until(lambda: not any(running(pid) for pid in left), 10)
        for pid in left:
            if running(pid):
                os.kill(pid, signal.SIGKILL)
    assert exited, f"toolspan serve still running {EXIT_SECONDS} s after SIGTERM"
    assert server.process.returncode == 0, "".join(server.output)
    assert took < EXIT_SECONDS
    assert {entry.get("role") for entry in entries(record)} >= {"server", "helper"}
    assert gone, f"MCP server processes still running after the gateway exited: {left}"
    server.reader.join(timeout=10)
    assert "Traceback" not in "".join(server.output)
