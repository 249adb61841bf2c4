"""`toolspan serve --workers 2` as an operator runs it: a process of its own (`python -m gateway`),
its held turns in a real redis-server, its traces exported over OTLP/HTTP to a receiver here. The
requests spread over both workers, /metrics counts them all, SIGTERM lets the requests under way
finish (or answer an error) and flushes their spans, a worker's death stops the whole, and memory
state is refused."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_classic
from prometheus_client.samples import Sample
from pytest_aiohttp import AiohttpServer

from telemetry import names
from tests.conftest import free_port
from tests.e2e.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]  # the checkout under test: its code is what the processes run
START_TIMEOUT = 30.0
WAIT = 10.0  # for anything else the test awaits
WORKERS_LINE = re.compile(r"INFO toolspan: workers: 2 processes on the port \(pids (\d+), (\d+)\)$")
CHAT = "/v1/chat/completions"
QUESTION = {"model": "m", "messages": [{"role": "user", "content": "What is the weather in Oslo?"}]}
OPENMETRICS = "application/openmetrics-text; version=1.0.0"
INSTANCE_ID = "service.instance.id"


# --- an OTLP/HTTP receiver -------------------------------------------------------------------------

class Receiver:
    """A real OTLP/HTTP endpoint on the test's loop (the gateway is another process): the spans
    it received, each with its process's service.instance.id."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, ProtoSpan]] = []
        self._arrived = asyncio.Condition()

    async def traces(self, request: web.Request) -> web.Response:
        export = ExportTraceServiceRequest()
        export.ParseFromString(await request.read())
        for resource_spans in export.resource_spans:
            instance = next(a.value.string_value for a in resource_spans.resource.attributes if a.key == INSTANCE_ID)
            self.spans.extend((instance, span) for scope in resource_spans.scope_spans for span in scope.spans)
        async with self._arrived:
            self._arrived.notify_all()
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    def request_spans(self) -> dict[str, str]:
        """The process (service.instance.id) of each request's SERVER span, by trace id."""
        return {span.trace_id.hex(): instance for instance, span in self.spans
                if span.kind == ProtoSpan.SPAN_KIND_SERVER}

    async def until_requests(self, trace_ids: set[str]) -> dict[str, str]:
        """The request spans of `trace_ids`, once they all arrived."""
        async with asyncio.timeout(WAIT), self._arrived:
            await self._arrived.wait_for(lambda: trace_ids <= self.request_spans().keys())
        return {trace: instance for trace, instance in self.request_spans().items() if trace in trace_ids}


@pytest.fixture
async def receiver(aiohttp_server: AiohttpServer) -> tuple[Receiver, str]:
    found = Receiver()
    app = web.Application()
    app.router.add_post("/v1/traces", found.traces)
    server = await aiohttp_server(app)
    return found, str(server.make_url("")).rstrip("/")


# --- the gateway, in a process of its own ----------------------------------------------------------

class Toolspan:
    """`python -m gateway serve ...` of this checkout; its output (logs go to stderr) read line by line."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.lines: list[str] = []
        self._new_line = asyncio.Condition()
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def start(cls, *args: str, env: dict[str, str]) -> Toolspan:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "serve", *args, cwd=ROOT, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        return cls(process)

    async def _read(self) -> None:
        assert self.process.stdout is not None
        async for line in self.process.stdout:
            async with self._new_line:
                self.lines.append(line.decode().rstrip("\n"))
                self._new_line.notify_all()
        async with self._new_line:
            self._new_line.notify_all()

    async def line(self, pattern: re.Pattern[str]) -> re.Match[str]:
        """The first line `pattern` finds, once the process wrote it."""
        return (await self.matches(pattern, 1))[0]

    async def matches(self, pattern: re.Pattern[str], count: int) -> list[re.Match[str]]:
        """The first `count` lines `pattern` finds, once the process wrote them."""
        def found() -> list[re.Match[str]]:
            return [m for m in map(pattern.search, self.lines) if m][:count]

        try:
            async with asyncio.timeout(START_TIMEOUT), self._new_line:
                await self._new_line.wait_for(lambda: len(found()) == count or self._reader.done())
        except TimeoutError:
            pytest.fail(f"not {count} lines like {pattern.pattern!r} within {START_TIMEOUT} s: {self.output()}")
        if len(matches := found()) < count:
            pytest.fail(f"toolspan exited ({await self.process.wait()}) without {count} lines like "
                        f"{pattern.pattern!r}: {self.output()}")
        return matches

    async def pids(self) -> tuple[int, int]:
        """The workers' process ids, from the line the supervisor logs once both listen."""
        first, second = (await self.line(WORKERS_LINE)).groups()
        return int(first), int(second)

    async def exit_code(self) -> int:
        async with asyncio.timeout(START_TIMEOUT):
            code = await self.process.wait()
            await self._reader
        return code

    def output(self) -> str:
        return "\n".join(self.lines)


def child_env(**settings: str) -> dict[str, str]:
    """This environment without the machine's TOOLSPAN_* and OTEL_* variables, plus `settings`;
    this checkout's code first on the path."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(("TOOLSPAN_", "OTEL_"))}
    return {**env, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **settings}


@pytest.fixture
def run_dir() -> Iterator[Path]:
    """The TMPDIR of the gateway's processes, where the supervisor makes its run directory (short:
    it holds unix sockets, whose paths may not be long)."""
    with tempfile.TemporaryDirectory(prefix="tsw-") as path:
        yield Path(path)


@pytest.fixture
async def workers(redis_up: RedisServer, receiver: tuple[Receiver, str],
                  run_dir: Path) -> AsyncIterator[Callable[..., Any]]:
    """Starts `toolspan serve --workers 2` on a free port, with Redis state and OTLP export (spans
    sent every 100 ms); yields the process and its base URL once both workers listen."""
    started: list[Toolspan] = []

    async def start(*args: str, **settings: str) -> tuple[Toolspan, str]:
        port = free_port()
        env = child_env(**{"TOOLSPAN_STATE_URL": redis_up.url, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver[1],
                           "OTEL_BSP_SCHEDULE_DELAY": "100", "TMPDIR": str(run_dir), **settings})
        toolspan = await Toolspan.start("--workers", "2", "--port", str(port), *args, env=env)
        started.append(toolspan)
        await toolspan.pids()
        return toolspan, f"http://127.0.0.1:{port}"

    yield start
    for toolspan in started:  # what a test left running: stopped as an orchestrator would
        if toolspan.process.returncode is None:
            toolspan.process.terminate()
        try:
            await toolspan.exit_code()
        except TimeoutError:
            toolspan.process.kill()
            await toolspan.exit_code()


def fresh_connections() -> aiohttp.ClientSession:
    """A client whose every request opens a connection of its own (the kernel picks a worker per
    connection)."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True),
                                 timeout=aiohttp.ClientTimeout(total=30))


async def ask(http: aiohttp.ClientSession, url: str) -> tuple[int, str, dict[str, Any]]:
    """One chat completion: its status, trace id and body."""
    async with http.post(f"{url}{CHAT}", json=QUESTION) as response:
        return response.status, response.headers["X-Trace-Id"], await response.json()


def listening_sockets(port: int) -> set[str]:
    """The inodes of the sockets listening on 127.0.0.1:`port` (/proc/net/tcp)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == f"0100007F:{port:04X}" and fields[3] == "0A":  # LISTEN
            found.add(fields[9])
    return found


def sockets_of(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd) if fd.is_symlink() else ""
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    return inodes


# --- 1. the requests spread over both workers ------------------------------------------------------

async def test_requests_on_fresh_connections_spread_over_both_workers(
        workers: Callable[..., Any], receiver: tuple[Receiver, str]) -> None:
    toolspan, url = await workers()
    async with fresh_connections() as http:
        answers = await asyncio.gather(*(ask(http, url) for _ in range(20)))
    assert {status for status, _, _ in answers} == {200}
    served_by = await receiver[0].until_requests({trace for _, trace, _ in answers})
    assert len(set(served_by.values())) == 2  # two processes, each its own service.instance.id
    # Both workers listen on the port, each a socket of its own; the supervisor holds none.
    listening = listening_sockets(int(url.rsplit(":", 1)[1]))
    first, second = await toolspan.pids()
    assert len(listening) == 2
    assert len(listening & sockets_of(first)) == len(listening & sockets_of(second)) == 1
    assert not listening & sockets_of(toolspan.process.pid)


# --- 2. /metrics: one picture of both workers ------------------------------------------------------

def sample_values(samples: list[Sample], name: str, **labels: str) -> list[float]:
    return [s.value for s in samples if s.name == name and labels.items() <= s.labels.items()]


async def test_metrics_count_every_request_whichever_worker_answers_the_scrape(
        workers: Callable[..., Any]) -> None:
    _, url = await workers()
    sent = 12
    async with fresh_connections() as http:
        answers = await asyncio.gather(*(ask(http, url) for _ in range(sent)))
        traces = {trace for _, trace, _ in answers}
        assert {status for status, _, _ in answers} == {200}
        for _ in range(4):  # fresh connections: the scrapes land on either worker
            async with http.get(f"{url}/metrics") as response:
                assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                classic = [s for f in parse_classic(await response.text()) for s in f.samples]
            async with http.get(f"{url}/metrics", headers={"Accept": OPENMETRICS}) as response:
                assert response.headers["Content-Type"].startswith("application/openmetrics-text")
                openmetrics = [s for f in parse_openmetrics(await response.text()) for s in f.samples]
            for samples in (classic, openmetrics):
                assert sum(sample_values(samples, names.METRIC_REQUESTS, route=CHAT)) == sent
                assert sample_values(samples, f"{names.METRIC_REQUEST_DURATION}_count", route=CHAT) == [sent]
                assert sample_values(samples, f"{names.METRIC_REQUEST_DURATION}_bucket", route=CHAT, le="+Inf") == [
                    sent]
                assert sample_values(samples, names.METRIC_STATE_STORE_UP) == [1]
            exemplars = {s.exemplar.labels[names.EXEMPLAR_TRACE_ID] for s in openmetrics
                         if s.name == f"{names.METRIC_REQUEST_DURATION}_bucket" and s.exemplar is not None
                         and s.labels["route"] == CHAT}
            assert exemplars  # the requests' trace ids, kept through the merge
            assert exemplars <= traces
            assert not [s for s in classic if s.exemplar is not None]


# --- 3. SIGTERM with requests under way ------------------------------------------------------------

class HeldModel:
    """A provider whose answers wait until the test lets them go, one by one."""

    def __init__(self) -> None:
        self.waiting: list[asyncio.Event] = []
        self._arrived = asyncio.Condition()

    async def chat(self, request: web.Request) -> web.Response:
        await request.read()
        release = asyncio.Event()
        async with self._arrived:
            self.waiting.append(release)
            self._arrived.notify_all()
        await release.wait()
        return web.json_response({
            "id": f"chatcmpl-{len(self.waiting)}", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "done"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})

    async def until_waiting(self, count: int) -> None:
        async with asyncio.timeout(WAIT), self._arrived:
            await self._arrived.wait_for(lambda: len(self.waiting) >= count)


@pytest.fixture
async def held_model(aiohttp_server: AiohttpServer) -> AsyncIterator[tuple[HeldModel, str]]:
    model = HeldModel()
    app = web.Application()
    app.router.add_post(CHAT, model.chat)
    server = await aiohttp_server(app)
    yield model, f"{str(server.make_url('')).rstrip('/')}/v1"
    for release in model.waiting:  # none left hanging when the server stops
        release.set()


async def until_refused(url: str) -> None:
    """Polls until nothing takes a connection on `url`'s port any more."""
    host, port = url.removeprefix("http://").split(":")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while loop.time() < deadline:
        try:
            _, writer = await asyncio.open_connection(host, int(port))
        except ConnectionRefusedError:
            return
        writer.close()
        await writer.wait_closed()
        await asyncio.sleep(0.05)
    pytest.fail(f"{url} still took connections {WAIT} s after SIGTERM")


async def test_sigterm_lets_requests_under_way_finish_or_answer_an_error_and_flushes_their_spans(
        workers: Callable[..., Any], receiver: tuple[Receiver, str], held_model: tuple[HeldModel, str],
        run_dir: Path) -> None:
    model, model_url = held_model
    # Spans leave in batches once a minute: only the flush on the way out can send these.
    toolspan, url = await workers("--upstream", model_url, TOOLSPAN_SHUTDOWN_GRACE_SECONDS="2",
                                  OTEL_BSP_SCHEDULE_DELAY="60000")
    async with fresh_connections() as http:
        requests = [asyncio.ensure_future(ask(http, url)) for _ in range(6)]
        await model.until_waiting(6)  # every request is under way, waiting on the provider
        toolspan.process.send_signal(signal.SIGTERM)
        await until_refused(url)  # both workers stopped taking connections
        for release in model.waiting[:3]:  # three answers come within the grace period; three never do
            release.set()
        answers = await asyncio.gather(*requests)
    assert await toolspan.exit_code() == 0
    assert sorted(status for status, _, _ in answers) == [200, 200, 200, 503, 503, 503]
    for status, _, body in answers:
        if status == 200:
            assert body["choices"][0]["message"]["content"] == "done"
        else:  # the provider call ended by the shutdown, said in the OpenAI shape
            assert set(body["error"]) == {"message", "type", "param", "code"}
    # Every request's spans left with the workers (each flushed its batch, and waited for the
    # receiver's answer, before it exited).
    served_by = receiver[0].request_spans()
    assert {trace for _, trace, _ in answers} <= served_by.keys()
    assert "Traceback" not in toolspan.output()
    assert os.listdir(run_dir) == []  # the run directory and its sockets are gone


# --- 4. memory state is refused ----------------------------------------------------------------------

@pytest.mark.parametrize(("args", "settings", "said"), [
    (("--workers", "2"), {}, "TOOLSPAN_STATE_URL"),
    ((), {"TOOLSPAN_WORKERS": "2"}, "TOOLSPAN_STATE_URL"),
    (("--workers", "2", "--port", "0"), {"TOOLSPAN_STATE_URL": "redis://127.0.0.1:1/0"}, "needs a port"),
], ids=["flag", "env", "port-0"])
def test_workers_without_shared_state_or_a_port_are_refused(
        args: tuple[str, ...], settings: dict[str, str], said: str) -> None:
    port = ("--port", str(free_port())) if "--port" not in args else ()
    done = subprocess.run([sys.executable, "-m", "gateway", "serve", *port, *args], cwd=ROOT,
                          env=child_env(**settings), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert said in done.stderr
    assert done.stderr.startswith("toolspan: ")
    assert "Traceback" not in done.stderr
    assert "listening" not in done.stdout + done.stderr


async def test_a_port_in_use_is_said_once(redis_up: RedisServer) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        toolspan = await Toolspan.start("--workers", "2", "--port", str(port),
                                        env=child_env(TOOLSPAN_STATE_URL=redis_up.url))
        assert await toolspan.exit_code() == 2
    # Both workers failed to bind; the supervisor says so once, as `toolspan serve` alone would.
    assert toolspan.lines == [f"toolspan: cannot listen on 127.0.0.1:{port}: Address already in use"]


# --- 5. a worker's death ends the whole ------------------------------------------------------------

async def test_a_killed_worker_stops_the_others_and_the_supervisor_exits_non_zero(
        workers: Callable[..., Any], run_dir: Path) -> None:
    toolspan, _ = await workers()
    first, second = await toolspan.pids()
    os.kill(second, signal.SIGKILL)
    assert await toolspan.exit_code() == 1
    assert f"worker 1 (pid {second}) ended on its own (killed by SIGKILL)" in toolspan.output()
    with pytest.raises(ProcessLookupError):  # stopped, and reaped by the supervisor
        os.kill(first, 0)
    assert os.listdir(run_dir) == []


def running(pid: int) -> bool:
    """The process exists and has not exited (a zombie no one reaped yet has)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


async def test_workers_stop_by_themselves_when_the_supervisor_is_killed(workers: Callable[..., Any]) -> None:
    toolspan, url = await workers()
    pids = await toolspan.pids()
    toolspan.process.kill()
    assert await toolspan.exit_code() == -signal.SIGKILL
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while any(map(running, pids)):  # polled: they are no children of ours, no event says they ended
        if loop.time() > deadline:
            pytest.fail(f"workers {pids} still run {WAIT} s after their supervisor was killed")
        await asyncio.sleep(0.05)
    await until_refused(url)
    said = sorted(line.split("WARNING toolspan: ")[-1] for line in toolspan.lines if "supervisor is gone" in line)
    assert said == ["worker 0: its supervisor is gone; stopping", "worker 1: its supervisor is gone; stopping"]
