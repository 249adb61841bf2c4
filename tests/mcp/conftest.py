"""MCP servers for the tests: tests/mcp/servers/files.py over stdio, or served over streamable HTTP
by a process of its own, and what such a server recorded of the calls it received."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from gateway.http.keys import MCP_SOURCES
from gateway.mcp import McpConnection
from telemetry import names
from tests.conftest import Gateway, Stack

FILES_SERVER = Path(__file__).parent / "servers" / "files.py"


@dataclass
class Recorded:
    """The JSON lines a test server wrote: its process ids, and each call it received."""

    path: Path

    def entries(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines()]

    def calls(self) -> list[dict[str, Any]]:
        return [entry for entry in self.entries() if "tool" in entry]

    def pids(self) -> list[int]:
        return [entry["pid"] for entry in self.entries() if "pid" in entry]


@pytest.fixture
def recorded(tmp_path: Path) -> Recorded:
    return Recorded(tmp_path / "calls.jsonl")


def stdio_server(recorded: Recorded, **settings: Any) -> dict[str, Any]:
    """The settings of the test server run over stdio."""
    return {"command": sys.executable, "args": [str(FILES_SERVER)], "env": {"RECORD": str(recorded.path)},
            **settings}


@dataclass
class HttpServer:
    url: str
    process: asyncio.subprocess.Process

    @property
    def port(self) -> int:
        port = urlsplit(self.url).port
        assert port is not None
        return port

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()


@contextlib.asynccontextmanager
async def served_over_http(script: Path, *args: str, env: Mapping[str, str] | None = None) -> AsyncIterator[str]:
    """An MCP server script of the tests' own over streamable HTTP, in a process of its own (it
    prints its port on its first line): its URL."""
    process = await asyncio.create_subprocess_exec(sys.executable, str(script), *args, "http",
                                                   stdout=asyncio.subprocess.PIPE, env={**os.environ, **(env or {})})
    assert process.stdout is not None
    try:
        port = int(await asyncio.wait_for(process.stdout.readline(), 30))
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.kill()
        await process.wait()


async def start_http_server(recorded: Recorded, port: int = 0, transport: str = "http") -> HttpServer:
    """The test server over streamable HTTP (`transport="http"`) or the legacy SSE transport
    (`"sse"`); it listens once its first line (its port) is out."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(FILES_SERVER), transport, str(port), stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "RECORD": str(recorded.path)})
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), 30)
    return HttpServer(f"http://127.0.0.1:{int(line)}/{'sse' if transport == 'sse' else 'mcp'}", process)


@pytest.fixture
async def http_server(recorded: Recorded) -> AsyncIterator[HttpServer]:
    server = await start_http_server(recorded)
    yield server
    await server.stop()


@pytest.fixture
def files(http_server: HttpServer, recorded: Recorded) -> tuple[HttpServer, Recorded]:
    """The files server over streamable HTTP and what it records: a server a test lists by URL."""
    return http_server, recorded


@pytest.fixture
async def sse_server(recorded: Recorded) -> AsyncIterator[HttpServer]:
    server = await start_http_server(recorded, transport="sse")
    yield server
    await server.stop()


@pytest.fixture(params=["stdio", "http", "sse"])
def files_server(request: pytest.FixtureRequest, recorded: Recorded) -> dict[str, Any]:
    """The settings of the test server, over stdio, streamable HTTP and the legacy SSE transport."""
    if request.param == "stdio":
        return stdio_server(recorded)
    if request.param == "sse":
        sse: HttpServer = request.getfixturevalue("sse_server")
        return {"url": sse.url, "transport": "sse"}
    server: HttpServer = request.getfixturevalue("http_server")
    return {"url": server.url}


def connection(gateway: Stack | Gateway, name: str = "files") -> McpConnection:
    return gateway.http.server.app[MCP_SOURCES].connections[name]


async def lose_once(gateway: Stack | Gateway, recorded: Recorded, name: str = "files") -> None:
    """Kill the stdio server `name` and wait until the gateway has reconnected to a new one."""
    source = connection(gateway, name)
    lost = source.disconnects
    os.kill(recorded.pids()[-1], signal.SIGKILL)
    await source.wait_until(lambda c: c.disconnects > lost and c.state == "up")


# --- tests/mcp/servers/flood.py: answers as large as asked, and what each call came to ---------------

FLOOD_SERVER = Path(__file__).parent / "servers" / "flood.py"


async def invoke(stack: Stack, tool: str, **arguments: Any) -> dict[str, Any]:
    async with stack.http.post(f"/v1/tools/flood__{tool}/invoke", json={"arguments": arguments}) as response:
        assert response.status == 200
        outcome: dict[str, Any] = await response.json()
        return outcome


def assert_counted(stack: Stack, expected: dict[tuple[str, str], int]) -> None:
    """Each call has its tool.call span and its count, with its outcome."""
    spans = [s for s in stack.spans() if s.name == names.SPAN_TOOL_CALL]
    seen: dict[tuple[str, str], int] = {}
    for span in spans:
        attributes = span.attributes or {}
        key = (str(attributes[names.ATTR_TOOL_NAME]), str(attributes[names.ATTR_OUTCOME]))
        seen[key] = seen.get(key, 0) + 1
    assert seen == expected
    for (tool, outcome), count in expected.items():
        assert stack.metric(names.METRIC_TOOL_CALLS, tool=tool, outcome=outcome) == count
