"""A real `redis-server` (Debian's package) for the tests that share state between gateways:
started on a free port once per session, without persistence."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
from redis.asyncio import Redis

from tests.conftest import free_port


class RedisServer:
    """A `redis-server` of the tests' own, without persistence; stopped and started again on the
    same port by the outage tests."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert self.process.stdout is not None
        for line in self.process.stdout:  # waits for the server's word that it listens, no sleeping
            if "Ready to accept connections" in line:
                break
        else:
            raise RuntimeError(f"redis-server on port {self.port} did not start")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
            if self.process.stdout is not None:
                self.process.stdout.close()
            self.process = None

    async def ping(self) -> bool:
        client = Redis.from_url(self.url, socket_connect_timeout=2)
        try:
            return bool(await client.ping())
        finally:
            await client.aclose()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def redis_up(redis_server: RedisServer) -> RedisServer:
    if redis_server.process is None:  # an outage test that failed half-way
        redis_server.start()
    assert await redis_server.ping()
    return redis_server
