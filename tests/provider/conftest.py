"""A real forward proxy on loopback (Debian's tinyproxy), what it saw, and stacks whose provider is
reached through it."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pytest_aiohttp import AiohttpServer

from gateway.demo.model import Reply, ScriptedModel
from gateway.settings.model import Settings
from tests.conftest import GatewayFactory, Script, Stack, free_port

_REQUEST = re.compile(r"Request \(file descriptor \d+\): (.+)$")


@dataclass
class Tinyproxy:
    url: str  # http://127.0.0.1:port, with credentials when it wants them
    log: Path

    def requests(self) -> list[str]:
        """The request lines it took, in order: `GET http://host:port/path HTTP/1.1`, `CONNECT host:port HTTP/1.1`."""
        if not self.log.exists():
            return []
        return [match.group(1) for line in self.log.read_text().splitlines() if (match := _REQUEST.search(line))]


ProxyFactory = Callable[..., Awaitable[Tinyproxy]]


async def _listening(port: int, process: asyncio.subprocess.Process) -> None:
    """Until tinyproxy takes connections (it says so only in its log: polled, with a deadline)."""
    async with asyncio.timeout(10):
        while True:
            assert process.returncode is None, "tinyproxy exited at start-up"
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                await asyncio.sleep(0.02)
                continue
            writer.close()
            return


@pytest.fixture
async def make_tinyproxy(tmp_path: Path) -> AsyncIterator[ProxyFactory]:
    """Starts tinyproxy on a free loopback port; `auth=("user", "password")` makes it ask for them (407),
    `connect_ports` limits CONNECT to those ports (others get 403; without it, any port)."""
    binary = shutil.which("tinyproxy") or "/usr/bin/tinyproxy"
    started: list[asyncio.subprocess.Process] = []

    async def start(auth: tuple[str, str] | None = None, connect_ports: tuple[int, ...] = ()) -> Tinyproxy:
        port = free_port()
        folder = tmp_path / f"tinyproxy-{port}"
        folder.mkdir()
        log = folder / "tinyproxy.log"
        config = [f"Port {port}", "Listen 127.0.0.1", "Timeout 30", f'LogFile "{log}"', "LogLevel Info",
                  "MaxClients 100", "DisableViaHeader Yes"]
        if auth is not None:
            config.append(f"BasicAuth {auth[0]} {auth[1]}")
        config.extend(f"ConnectPort {port}" for port in connect_ports)
        (folder / "tinyproxy.conf").write_text("\n".join(config) + "\n")
        process = await asyncio.create_subprocess_exec(binary, "-d", "-c", str(folder / "tinyproxy.conf"),
                                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started.append(process)
        await _listening(port, process)
        return Tinyproxy(f"http://127.0.0.1:{port}", log)

    yield start
    for process in started:
        process.terminate()
        async with asyncio.timeout(5):
            await process.wait()


@pytest.fixture
async def tinyproxy(make_tinyproxy: ProxyFactory) -> Tinyproxy:
    return await make_tinyproxy()


# --- a stack whose provider is reached through such a proxy, or not ----------------------------------

def _origin(stack: Stack) -> str:
    assert stack.upstream_server is not None
    return str(stack.upstream_server.make_url("")).rstrip("/")


def _script_a_tool_round(stack: Stack) -> None:
    stack.script.then(Reply(tool_calls=[("read_file", {"path": "notes.txt"})]), Reply(content="It says hi."))


async def _one_of_each(stack: Stack) -> dict[str, Any]:
    _script_a_tool_round(stack)
    answer = await stack.ask(False, messages=[{"role": "user", "content": "read notes.txt"}])
    models = await stack.client.models.list()
    ready = await stack.http.get("/readyz")
    return {"answer": answer.content, "models": bool(models.data), "ready": ready.status}


async def _stack_on_localhost(make_gateway: GatewayFactory, aiohttp_server: AiohttpServer,
                              **overrides: Any) -> Stack:
    """A stack whose gateway names its provider `localhost` (the scripted model listens on 127.0.0.1)."""
    script = Script()
    model = ScriptedModel(script)
    server = await aiohttp_server(model.app())
    settings = Settings(port=0, upstream=str(server.make_url("/v1").with_host("localhost")), trajectory_store=False,
                        **overrides)
    gateway = await make_gateway(settings, provider_name="toolspan.scripted")
    return Stack(gateway.url, gateway.http, gateway.client, model, script, gateway.exporter, gateway.metrics,
                 gateway.observability, server)
