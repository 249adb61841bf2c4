"""The compose stack's load balancer, for real: Debian's nginx (`/usr/sbin/nginx`, installed by
.ci/run) runs deploy/nginx.conf itself, with only the replica addresses and the listen port
changed (see `shipped_config`), in front of two gateway replicas sharing a real Redis.

Through nginx: requests reach both replicas; a mixed turn started on one replica is completed by
its follow-up on the other, in Chat and in Responses; a streamed answer arrives event by event
while the provider is still mid-answer; the gateway's OpenAI-shaped errors pass through unchanged
(none is replayed to the other replica), and nginx's own failures are OpenAI-shaped too; another
replica is tried only when one cannot be reached, never after a request was sent; MCP sessions and
/ui stay on the replica that holds them."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from openai import APIStatusError, AsyncOpenAI
from pytest_aiohttp import AiohttpServer

from gateway.demo.model import Reply
from gateway.settings.model import Settings
from tests.conftest import TEST_KEY, USER, Gateway, GatewayFactory, Stack, StackFactory, free_port
from tests.e2e.redis_server import RedisServer
from tests.e2e.test_mcp_server import LEGACY, mcp_client
from tests.e2e.test_shared_state import CHAT_TOOLS, RESPONSES_TOOLS, chat_mixed_turn, saw_the_sum

ROOT = Path(__file__).resolve().parents[2]
NGINX_CONF = ROOT / "deploy" / "nginx.conf"
NGINX = "/usr/sbin/nginx"  # Debian's package `nginx` (not on a non-root user's PATH)
SHIPPED_REPLICAS = ("toolspan-1:8080", "toolspan-2:8080")  # as docker-compose.yml names them
SHIPPED_LISTEN = "listen 8080;"
UPSTREAM_BLOCKS = 2  # round robin, and sticky (MCP sessions, /ui)
DEADLINE = 10.0


# --- nginx, as the stack runs it ---------------------------------------------------------------------

def shipped_config(replicas: Sequence[str], port: int) -> str:
    """deploy/nginx.conf with its replica addresses (in each upstream block's `server` lines) and its
    `listen` port replaced; nothing else."""
    text = NGINX_CONF.read_text(encoding="utf-8")
    for shipped, ours in zip(SHIPPED_REPLICAS, replicas, strict=True):
        text, count = re.subn(rf"^(\s*server ){re.escape(shipped)}(?=[\s;])", rf"\g<1>{ours}", text, flags=re.M)
        assert count == UPSTREAM_BLOCKS, f"{shipped}: {count} server lines, expected one per upstream block"
    text, count = re.subn(rf"^(\s*){re.escape(SHIPPED_LISTEN)}", rf"\g<1>listen 127.0.0.1:{port};", text, flags=re.M)
    assert count == 1
    return text


def nginx_args(prefix: Path) -> list[str]:
    """nginx in the foreground, with a prefix of the test's own (its scratch directories, which the
    config names relative to it) and its pid file there; errors to stderr, until the config says."""
    if not os.access(NGINX, os.X_OK):  # CI installs it: a missing one fails, it is never skipped
        pytest.fail(f"{NGINX} is missing: apt-get install -y --no-install-recommends nginx")
    return [NGINX, "-p", f"{prefix}/", "-c", str(prefix / "nginx.conf"), "-e", "stderr",
            "-g", f"daemon off; pid {prefix / 'nginx.pid'};"]


def write_config(prefix: Path, replicas: Sequence[str], port: int) -> None:
    prefix.mkdir(parents=True)
    (prefix / "nginx.conf").write_text(shipped_config(replicas, port), encoding="utf-8")


def log_of(prefix: Path) -> str:
    return "".join(f"--- {name}\n{(prefix / name).read_text(errors='replace')}"
                   for name in ("error.log", "access.log") if (prefix / name).exists())


class Nginx:
    """One nginx process on a free port: stdout (the access log) and stderr (the error log) go to
    files in its prefix directory."""

    def __init__(self, prefix: Path, replicas: Sequence[str]) -> None:
        self.prefix = prefix
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        write_config(prefix, replicas, self.port)
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        with (self.prefix / "access.log").open("wb") as out, (self.prefix / "error.log").open("wb") as err:
            self.process = await asyncio.create_subprocess_exec(*nginx_args(self.prefix), stdout=out, stderr=err,
                                                                stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + DEADLINE
        while True:  # ready once it accepts connections; polled, with a deadline
            if self.process.returncode is not None:
                pytest.fail(f"nginx exited with {self.process.returncode}\n{log_of(self.prefix)}")
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"nginx did not listen on {self.port} within {DEADLINE} s\n{log_of(self.prefix)}")
                await asyncio.sleep(0.01)
                continue
            writer.close()
            await writer.wait_closed()
            return

    async def access_log(self, lines: int) -> list[str]:
        """The access log once it has `lines` lines (nginx writes a line after the answer went out)."""
        deadline = time.monotonic() + DEADLINE
        while True:
            found = (self.prefix / "access.log").read_text(errors="replace").splitlines()
            if len(found) >= lines:
                return found
            if time.monotonic() > deadline:
                pytest.fail(f"the access log has {len(found)} lines, not {lines}\n{log_of(self.prefix)}")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)  # nginx's fast shutdown
            await asyncio.wait_for(self.process.wait(), DEADLINE)


NginxFactory = Callable[[Sequence[str]], Awaitable[Nginx]]


@pytest.fixture
async def nginx(tmp_path: Path) -> AsyncIterator[NginxFactory]:
    """Starts nginx with the shipped config in front of the given replica addresses (host:port)."""
    started: list[Nginx] = []

    async def start(replicas: Sequence[str]) -> Nginx:
        server = Nginx(tmp_path / f"nginx-{len(started)}", replicas)
        started.append(server)
        await server.start()
        return server

    yield start
    for server in started:
        await server.stop()


def address(url: str) -> str:
    return url.removeprefix("http://").rstrip("/")


def served(stack: Stack | Gateway) -> int:
    """Requests the replica's server has taken so far (counted as each arrives, before it is handled)."""
    runner = stack.http.server.runner
    assert runner is not None
    assert runner.server is not None
    return runner.server.requests_count


@dataclasses.dataclass
class Balanced:
    """Two replicas on one Redis and one scripted provider, and nginx in front of them: `lb` is the
    first replica's Stack with its openai client aimed at nginx (so `lb.ask` goes through nginx)."""

    one: Stack
    other: Stack
    second: Gateway
    nginx: Nginx
    lb: Stack

    def counts(self) -> tuple[int, int]:
        return served(self.one), served(self.other)


@pytest.fixture
async def balanced(make_stack: StackFactory, make_gateway: GatewayFactory, nginx: NginxFactory, tmp_path: Path,
                   redis_up: RedisServer) -> AsyncIterator[Callable[..., Awaitable[Balanced]]]:
    clients: list[AsyncOpenAI] = []

    async def build(**overrides: Any) -> Balanced:
        one = await make_stack(state_url=redis_up.url, **overrides)
        settings = Settings(port=0, upstream=f"{one.model.base_url}/v1", state_url=redis_up.url,
                            trajectory_store_path=tmp_path / "second.sqlite3", **overrides)
        second = await make_gateway(settings, provider_name="toolspan.scripted")
        other = Stack(second.url, second.http, second.client, one.model, one.script, second.exporter,
                      second.metrics, second.observability, one.upstream_server)
        front = await nginx([address(one.url), address(other.url)])
        client = AsyncOpenAI(base_url=f"{front.url}/v1", api_key=TEST_KEY, max_retries=0, timeout=20)
        clients.append(client)
        return Balanced(one, other, second, front, dataclasses.replace(one, url=front.url, client=client))

    yield build
    for client in clients:
        await client.close()


# --- the config itself ---------------------------------------------------------------------------------

def test_the_shipped_config_passes_nginx_t(tmp_path: Path) -> None:
    write_config(tmp_path / "nginx", ["127.0.0.1:1", "127.0.0.1:2"], free_port())
    ours = (tmp_path / "nginx" / "nginx.conf").read_text().splitlines()
    shipped = NGINX_CONF.read_text().splitlines()
    changed = [(a.strip(), b.strip()) for a, b in zip(shipped, ours, strict=True) if a != b]
    assert len(changed) == 2 * UPSTREAM_BLOCKS + 1, changed  # the server lines and the listen line, no more
    run = subprocess.run([*nginx_args(tmp_path / "nginx"), "-t"], capture_output=True, text=True, timeout=30,
                         check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "syntax is ok" in run.stderr
    assert "test is successful" in run.stderr


# --- requests through nginx -----------------------------------------------------------------------------

async def test_requests_reach_both_replicas_in_turn(balanced: Callable[..., Awaitable[Balanced]]) -> None:
    found = await balanced()
    before = found.counts()
    found.one.script.then(*[Reply(content=f"answer {n}") for n in range(4)])
    answers = [await found.lb.ask(False, messages=USER) for _ in range(4)]
    assert [a.content for a in answers] == [f"answer {n}" for n in range(4)]
    after = found.counts()
    assert (after[0] - before[0], after[1] - before[1]) == (2, 2)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_a_chat_turn_started_through_nginx_is_completed_through_nginx(
        balanced: Callable[..., Awaitable[Balanced]], stream: bool) -> None:
    found = await balanced()
    start = found.counts()
    messages = await chat_mixed_turn(found.lb, stream)
    middle = found.counts()
    found.one.script.then(saw_the_sum)
    assert (await found.lb.ask(stream, messages=messages, tools=CHAT_TOOLS)).content == "5, in Paris."
    end = found.counts()
    first_on = [n for n in (0, 1) if middle[n] > start[n]]
    follow_up_on = [n for n in (0, 1) if end[n] > middle[n]]
    assert len(first_on) == len(follow_up_on) == 1
    assert first_on != follow_up_on  # round robin: the follow-up went to the replica that did not hold the turn
    assert [m["role"] for m in found.one.upstream_requests[-1]["messages"]] == ["user", "assistant", "tool", "tool"]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_a_responses_turn_started_through_nginx_is_completed_through_nginx(
        balanced: Callable[..., Awaitable[Balanced]], stream: bool) -> None:
    found = await balanced()
    found.one.script.then(Reply(content="Adding.", tool_calls=[("add", {"a": 2, "b": 3})]),
                          Reply(tool_calls=[("ask_human", {})]), saw_the_sum)
    start = found.counts()
    first = await found.lb.respond(stream, input="add, then ask me where", tools=RESPONSES_TOOLS, store=False)
    middle = found.counts()
    [call] = first.calls
    assert call["call_id"].startswith("tspan_")
    follow_up = [{"role": "user", "content": "add, then ask me where"}, *first.output,
                 {"type": "function_call_output", "call_id": call["call_id"], "output": "Paris"}]
    second = await found.lb.respond(stream, input=follow_up, tools=RESPONSES_TOOLS, store=False)
    end = found.counts()
    assert second.text == "5, in Paris."
    first_on = [n for n in (0, 1) if middle[n] > start[n]]
    follow_up_on = [n for n in (0, 1) if end[n] > middle[n]]
    assert len(first_on) == len(follow_up_on) == 1
    assert first_on != follow_up_on


async def test_a_stream_comes_through_event_by_event(balanced: Callable[..., Awaitable[Balanced]]) -> None:
    found = await balanced()
    # The provider sends three events, then stalls until its client leaves: whatever reaches the
    # client meanwhile went through nginx unbuffered.
    found.one.script.then(Reply(content="one two three four five six", pause_after=3))
    body = {"model": "test-model", "messages": USER, "stream": True}
    async with aiohttp.ClientSession() as http:
        response = await http.post(f"{found.nginx.url}/v1/chat/completions", json=body,
                                   headers={"Authorization": f"Bearer {TEST_KEY}"})
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        received: list[dict[str, Any]] = []
        while not any(c["choices"] and c["choices"][0]["delta"].get("content") for c in received):
            line = await asyncio.wait_for(response.content.readline(), DEADLINE)
            assert line, "the stream ended"
            if line.startswith(b"data: "):
                received.append(json.loads(line[len(b"data: "):]))
        await asyncio.wait_for(found.one.model.paused.wait(), DEADLINE)
        assert not found.one.model.dropped.is_set()  # the provider is mid-answer, and the client has text
        response.close()  # the client leaves: nginx hangs up on the replica, which hangs up on the provider
    await asyncio.wait_for(found.one.model.dropped.wait(), DEADLINE)


async def test_a_passed_through_stream_comes_through_piece_by_piece(
        make_gateway: GatewayFactory, nginx: NginxFactory, aiohttp_server: AiohttpServer) -> None:
    """A stream the gateway passes through from the provider (here audio) comes through as it is
    written too, although it lacks the `X-Accel-Buffering: no` that the gateway's own SSE carries."""
    release = asyncio.Event()

    async def speech(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "audio/mpeg"})
        await response.prepare(request)
        await response.write(b"first part;")
        await release.wait()  # the rest only once the client has the first part
        await response.write(b"the rest")
        await response.write_eof()
        return response

    provider = web.Application()
    provider.router.add_post("/v1/audio/speech", speech)
    provider_url = str((await aiohttp_server(provider)).make_url("/v1"))
    replicas = [await make_gateway(Settings(port=0, upstream=provider_url)) for _ in range(2)]
    front = await nginx([address(r.url) for r in replicas])
    async with aiohttp.ClientSession() as http, \
            http.post(f"{front.url}/v1/audio/speech", json={"model": "tts-1", "input": "hi", "voice": "alloy"},
                      headers={"Authorization": f"Bearer {TEST_KEY}"}) as response:
        assert response.status == 200
        assert "X-Accel-Buffering" not in response.headers
        assert await asyncio.wait_for(response.content.readexactly(len(b"first part;")), DEADLINE) == b"first part;"
        release.set()
        assert await asyncio.wait_for(response.content.read(), DEADLINE) == b"the rest"


# --- errors -------------------------------------------------------------------------------------------------

def openai_error(body: Any, **expected: str) -> dict[str, Any]:
    """`{"error": {"message", "type", "param", "code"}}`: the inner object, with the values expected."""
    assert isinstance(body, dict)
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["message"]
    assert {key: error[key] for key in expected} == expected
    return error


async def exchange(http: aiohttp.ClientSession, url: str, body: bytes) -> tuple[int, str, str | None, bytes]:
    async with http.post(f"{url}/v1/chat/completions", data=body,
                         headers={"Authorization": f"Bearer {TEST_KEY}", "Content-Type": "application/json"}) as r:
        return r.status, r.headers["Content-Type"], r.headers.get("Retry-After"), await r.read()


@pytest.mark.parametrize("case", ["too_large", "provider_429", "provider_500", "tool_name_conflict"])
async def test_the_gateways_errors_pass_through_unchanged(
        balanced: Callable[..., Awaitable[Balanced]], case: str) -> None:
    found = await balanced(max_body_bytes=1024)
    request: dict[str, Any] = {"model": "test-model", "messages": USER}
    reply: Reply | None = None
    if case == "too_large":  # the gateway's own limit decides, not nginx's (client_max_body_size 0)
        request["messages"] = [{"role": "user", "content": "x" * 2048}]
    elif case == "provider_429":
        reply = Reply(status=429, error="slow down", headers={"retry-after": "7"})
    elif case == "provider_500":  # the gateway's 502, which nginx neither replaces nor retries elsewhere
        reply = Reply(status=500, error="the provider broke")
    else:  # a tool of the client's named like one of the gateway's: the gateway's 400
        request["tools"] = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    body = json.dumps(request).encode()
    async with aiohttp.ClientSession() as http:
        seen = []
        for url in (found.one.url, found.nginx.url, found.nginx.url):  # directly, then through nginx on both
            if reply is not None:
                found.one.script.then(reply)
            asked = len(found.one.upstream_requests)
            seen.append(await exchange(http, url, body))
            assert len(found.one.upstream_requests) - asked == (0 if reply is None else 1)  # sent once, not replayed
    direct, *through = seen
    assert direct[0] >= 400
    openai_error(json.loads(direct[3]))
    assert through == [direct, direct], (direct, through)
    if case == "provider_429":
        assert direct[2] == "7"


async def test_nginx_answers_in_the_openai_shape_when_no_replica_is_reachable(nginx: NginxFactory) -> None:
    front = await nginx([f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"])
    async with AsyncOpenAI(base_url=f"{front.url}/v1", api_key=TEST_KEY, max_retries=0, timeout=20) as client:
        with pytest.raises(APIStatusError) as caught:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hello"}])
    assert caught.value.status_code == 502
    assert caught.value.response.headers["Content-Type"] == "application/json"
    error = openai_error(caught.value.response.json(), type="server_error", code="replica_unreachable")
    assert "replica" in error["message"]


# --- retries: only when a replica cannot be reached ------------------------------------------------------------

@dataclasses.dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    peer_port: int


async def recording_replica(aiohttp_server: AiohttpServer) -> tuple[str, list[Received]]:
    """A stand-in replica that answers every request with a small chat completion."""
    received: list[Received] = []

    async def answer(request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        received.append(Received(request.method, request.path, dict(request.headers), peer[1] if peer else 0))
        await request.read()
        return web.json_response({"object": "chat.completion", "choices": []})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    server = await aiohttp_server(app)
    return address(str(server.make_url(""))), received


async def test_a_replica_that_cannot_be_reached_is_skipped(nginx: NginxFactory,
                                                          aiohttp_server: AiohttpServer) -> None:
    refused = f"127.0.0.1:{free_port()}"  # nothing listens: the connection is refused, nothing was sent
    replica, received = await recording_replica(aiohttp_server)
    front = await nginx([refused, replica])
    async with aiohttp.ClientSession() as http:
        for _ in range(2):  # round robin: one of the two starts on the unreachable replica
            async with http.post(f"{front.url}/v1/chat/completions", json={"messages": USER}) as response:
                assert response.status == 200
    assert [(r.method, r.path) for r in received] == [("POST", "/v1/chat/completions")] * 2
    first, second = received
    assert first.headers["Host"] == f"127.0.0.1:{front.port}"  # the client's Host, with its port
    assert first.headers["X-Forwarded-For"] == "127.0.0.1"
    assert first.headers["X-Forwarded-Proto"] == "http"
    assert first.headers.get("Connection", "keep-alive").lower() != "close"
    assert first.peer_port == second.peer_port  # one kept-alive connection to the replica served both
    # The request that met the unreachable replica first went on to the other one.
    log = await front.access_log(2)
    assert sum(f"upstream={refused}, {replica} upstream_status=502, 200" in line for line in log) == 1, log


async def test_a_request_sent_to_a_replica_is_never_replayed_to_another(nginx: NginxFactory) -> None:
    taken: list[bytes] = []

    async def read_then_drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A replica that dies holding the request: it reads it whole, then closes the connection."""
        head = await reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
        await reader.readexactly(int(length.group(1)) if length else 0)
        taken.append(head.split(b"\r\n", 1)[0])
        writer.close()
        await writer.wait_closed()

    droppers = [await asyncio.start_server(read_then_drop, "127.0.0.1", 0) for _ in range(2)]
    try:
        ports = [s.sockets[0].getsockname()[1] for s in droppers]
        front = await nginx([f"127.0.0.1:{p}" for p in ports])
        async with aiohttp.ClientSession() as http, \
                http.post(f"{front.url}/v1/chat/completions", json={"messages": USER}) as response:
            assert response.status == 502
            openai_error(await response.json(), type="server_error", code="replica_unreachable")
        assert taken == [b"POST /v1/chat/completions HTTP/1.1"]  # one replica got it; nobody got it twice
    finally:
        for server in droppers:
            server.close()
            await server.wait_closed()


# --- what a replica keeps to itself follows the client -------------------------------------------------------

async def test_an_mcp_session_stays_on_the_replica_that_opened_it(
        balanced: Callable[..., Awaitable[Balanced]]) -> None:
    found = await balanced()
    start = found.counts()
    through = dataclasses.replace(found.second, url=found.nginx.url)
    async with mcp_client(through, key=None, mode=LEGACY) as (client, seen):
        for _ in range(3):
            listed = (await client.list_tools()).tools
            assert "add" in [t.name for t in listed]
            result = await client.call_tool("add", {"a": 2, "b": 3})
            assert not result.is_error
        [session] = seen.header("mcp-session-id")
    end = found.counts()
    moved = [end[n] - start[n] for n in (0, 1)]
    idle, busy = sorted(moved)
    assert idle == 0, moved  # every exchange on one replica:
    assert busy >= 2 + 6, moved  # initialize and initialized, three lists and three calls
    # The other replica does not know the session: without the stickiness, half the calls would fail.
    elsewhere = found.one if moved[0] == 0 else found.other
    async with elsewhere.http.post("/mcp", json={"jsonrpc": "2.0", "id": 9, "method": "tools/list"},
                                   headers={"Accept": "application/json, text/event-stream",
                                            "Mcp-Session-Id": session,
                                            "Mcp-Protocol-Version": "2025-06-18"}) as response:
        assert response.status == 404


async def test_the_trajectory_page_stays_on_one_replica(balanced: Callable[..., Awaitable[Balanced]]) -> None:
    found = await balanced()
    start = found.counts()
    async with aiohttp.ClientSession() as http:
        for _ in range(4):
            async with http.get(f"{found.nginx.url}/ui") as response:
                assert response.status == 200
                assert response.headers["Content-Type"].startswith("text/html")
    end = found.counts()
    assert sorted(end[n] - start[n] for n in (0, 1)) == [0, 4]

