"""SIGHUP to `toolspan serve` (a process of its own, its settings in a file): the file's new limits
apply to the next request, what was used stays counted, a file with a mistake keeps the limits as
they were; with `--workers 2` the supervisor passes the signal on and every worker reloads."""

from __future__ import annotations

import re
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import free_port
from tests.e2e.redis_server import RedisServer
from tests.e2e.test_workers import CHAT, QUESTION, Toolspan, child_env, fresh_connections, run_dir

__all__ = ["run_dir"]  # the workers' run directory, short (it holds unix sockets): test_workers' fixture

LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:\d+)/v1")
LOWERED = re.compile(r"INFO toolspan: SIGHUP: limits read again: default_limits: requests_per_minute 3 -> 1$")
UNREADABLE = re.compile(r"ERROR toolspan: SIGHUP: the settings could not be read again, so the limits stay as "
                        r"they were: .*not valid TOML")
RAISED = re.compile(r"INFO toolspan: SIGHUP: limits read again: default_limits: requests_per_minute 1 -> 5$")


def limits_file(path: Path, requests_per_minute: int) -> Path:
    path.write_text(f"[default_limits]\nrequests_per_minute = {requests_per_minute}\n", encoding="utf-8")
    return path


async def status(http: aiohttp.ClientSession, url: str) -> int:
    async with http.post(f"{url}{CHAT}", json=QUESTION) as response:
        await response.read()
        return response.status


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Any]]:
    """Starts `toolspan serve` with the arguments given; stopped with SIGTERM at the end."""
    started: list[Toolspan] = []

    async def start(*args: str, **settings: str) -> Toolspan:
        toolspan = await Toolspan.start(*args, env=child_env(**settings))
        started.append(toolspan)
        return toolspan

    yield start
    for toolspan in started:
        if toolspan.process.returncode is None:
            toolspan.process.terminate()
        await toolspan.exit_code()


async def test_sighup_applies_the_files_new_limits_and_keeps_the_counts(serve: Callable[..., Any],
                                                                       tmp_path: Path) -> None:
    config = limits_file(tmp_path / "toolspan.toml", 3)
    toolspan = await serve("--port", "0", "--config", str(config))
    url = (await toolspan.line(LISTENING)).group(1)
    async with fresh_connections() as http:
        assert await status(http, url) == 200  # 1 of 3
        limits_file(config, 1)
        toolspan.process.send_signal(signal.SIGHUP)
        await toolspan.line(LOWERED)
        assert await status(http, url) == 429  # 1 of 1: the second, allowed before, is refused now
        config.write_text("[default_limits\nrequests_per_minute = 5\n", encoding="utf-8")
        toolspan.process.send_signal(signal.SIGHUP)
        await toolspan.line(UNREADABLE)
        assert await status(http, url) == 429  # still 1 a minute
        limits_file(config, 5)
        toolspan.process.send_signal(signal.SIGHUP)
        await toolspan.line(RAISED)
        assert await status(http, url) == 200  # 2 of 5: the refused one took nothing
    toolspan.process.terminate()
    assert await toolspan.exit_code() == 0


async def test_the_supervisor_passes_sighup_on_to_every_worker(serve: Callable[..., Any], redis_up: RedisServer,
                                                               run_dir: Path, tmp_path: Path) -> None:
    config = limits_file(tmp_path / "toolspan.toml", 3)
    port = free_port()
    toolspan = await serve("--workers", "2", "--port", str(port), "--config", str(config),
                           TOOLSPAN_STATE_URL=redis_up.url, TMPDIR=str(run_dir))
    await toolspan.pids()
    limits_file(config, 1)
    toolspan.process.send_signal(signal.SIGHUP)
    await toolspan.line(re.compile(r"SIGHUP: passed on to 2 workers"))
    await toolspan.matches(LOWERED, 2)  # each worker read the file itself
    async with fresh_connections() as http:
        assert await status(http, f"http://127.0.0.1:{port}") == 200
    toolspan.process.terminate()
    assert await toolspan.exit_code() == 0
