"""What toolspan costs as a proxy: CPU per request, throughput and latency, against the upstream
itself and a bare aiohttp pass-through, under load from `wrk`.

Targets, each its own process on loopback, on the event loop `toolspan serve` uses (uvloop):
  direct          the built-in fast upstream (FastPolicy) itself; every other target forwards to it;
  floor           a bare aiohttp pass-through written here: reads the body, posts it to the same
                  path of the upstream, streams the answer back;
  toolspan        the gateway with the demo tools, telemetry on: spans through a BatchSpanProcessor
                  to an exporter that drops them, metrics, the trajectory store on its own file;
  toolspan-notel  the same with Settings(telemetry=False);
  before          with --compare DIR only: toolspan served by the checkout at DIR (its own
                  bench/proxy.py, with DIR first on PYTHONPATH; checked at start-up);
  floor-otel      with --sdk only: the floor plus what the OpenTelemetry SDK and prometheus_client
                  alone do for a plain request (request_telemetry.SdkTelemetry: toolspan's two
                  spans with their attributes, through the same kind of BatchSpanProcessor, the
                  chat span's trace context written into the upstream request by the SDK's
                  propagators, and the metric updates): what the SDK's telemetry costs a bare hop;
  toolspan-nostore  with --sdk only: toolspan with the trajectory store off, so that toolspan's
                  spans and metrics (toolspan-nostore - toolspan-notel) compare with the SDK's
                  (floor-otel - floor).
The floors are served as the gateway is: uvloop, and the garbage collector settled once listening.
The upstream gets the same request from every target: the gateways add the demo tools to what the
client sends, so the client sends those tool specs to direct and floor itself.

Scenarios, for Chat Completions (/v1/chat/completions) and the Responses API (/v1/responses):
  plain   a ~300-byte request, answered "ok";
  stream  the same, streamed (time to first byte);
  tool    "please use a tool": the model calls the demo `echo`; a gateway runs it and asks the model
          again (direct and floor just return the call);
  30kb    a 30 KB conversation: 40 messages of a coding agent's session, 19 tool calls of the
          client's own tools with their results (for Responses: the same as input items, messages,
          function_call and function_call_output), ending with a result, so the model answers "done".
Before measuring, each target answers each scenario once and the answer is checked ("ok", "done",
or the `echo` call), then is loaded for WARM_UP_SECONDS under wrk, unmeasured.

Method. Load comes from wrk (a C load generator: `apt-get install wrk`), one thread, a Lua script
that posts the request body and prints the request count and latency percentiles when done. For
each target and scenario, one measurement is:
  - 10 connections for --seconds: requests per second, p50/p99 latency, and the CPU per request of
    the target's process: its utime + stime (/proc/PID/stat, all its threads: the span processor's
    and the trajectory store's included) over the run, divided by the requests wrk got answered.
    wrk's own CPU (its rusage) is reported beside it, as a share of one core, to show the load
    generator is not the bottleneck;
  - 1 connection for --seconds: p50/p99 latency;
  - for a streamed scenario, --ttfb-requests requests one at a time from a Python client here (at
    concurrency 1 it is not the bottleneck): time from sending the request to the first body byte.
Rounds: every round measures every scenario on every target, the targets' order rotating from one
measurement to the next, so that a slow spell of the shared machine falls on all of them alike.
Reported: medians of per-round values, and for the verdicts, medians of per-round ratios (or
differences), the per-round values beside them.

Verdicts, with the targets of issue 14:
  toolspan CPU/request / floor CPU/request           <= 1.5    plain and 30kb, both APIs
  telemetry share: (toolspan - notel) / toolspan     <= 20%    plain and 30kb, both APIs
  p50 added over direct at concurrency 1             <= 1.0 ms plain and 30kb, both APIs
  time to first byte added over direct               <= 1.0 ms stream, both APIs
  toolspan CPU/request, tool round / plain           <= 2.2    tool, both APIs (needs plain too)
  with --sdk, toolspan's spans and metrics over the SDK's alone:
  (toolspan-nostore - notel) / (floor-otel - floor)  <= 1.0    plain, both APIs
  and, without a target, the SDK's share of floor-otel's CPU and the store's CPU per request
  (toolspan - toolspan-nostore).
The other scenarios' ratios are printed without a target, and beside each latency verdict, what the
floor added in the same rounds (a yardstick: the machine's speed moves the absolute figures).

    python bench/proxy.py [--scenarios plain,stream,tool,30kb|all] [--rounds 5] [--seconds 5]
                          [--ttfb-requests 300] [--compare DIR] [--sdk]

--scenarios: a comma-separated list of plain, stream, tool, 30kb (Chat Completions) and
responses-plain, responses-stream, responses-tool, responses-30kb, or `all`; the default is the four
Chat ones. A quick look, in about a minute: --rounds 1 --seconds 2.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ modules, as when run as a script
from proxy_bounds import print_bounds

ROOT = Path(__file__).resolve().parent.parent
CHAT, RESPONSES = "/chat/completions", "/responses"  # the two APIs' paths, under /v1
GATEWAYS = ("toolspan", "toolspan-notel", "toolspan-nostore", "before")  # targets that add the demo tools themselves
DEFAULTS = "serve-defaults"  # `toolspan serve` as a user starts it: no tools of its own, so sent them like floor
TICKS = os.sysconf("SC_CLK_TCK")
CORES = os.cpu_count() or 1
BUSY = 10  # connections of the throughput and CPU runs

# --- the requests -------------------------------------------------------------------------------------

SYSTEM = ("You are a careful assistant working in the user's repository. Answer briefly, cite the files you "
          "read, and ask before changing anything.")
PLAIN = {"model": "bench", "temperature": 0.2, "messages": [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "What does the retry helper in the client module do when the server "
                                "answers 503?"}]}
TOOL_ROUND = {"model": "bench", "temperature": 0.2, "messages": [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "Before you answer, please use a tool to echo the name of the retry helper."}]}
RESPONSES_PLAIN = {"model": "bench", "temperature": 0.2, "instructions": SYSTEM,
                   "input": PLAIN["messages"][1]["content"]}
RESPONSES_TOOL_ROUND = {"model": "bench", "temperature": 0.2, "instructions": SYSTEM,
                        "input": TOOL_ROUND["messages"][1]["content"]}

CLIENT_TOOLS = [  # the tools of the agent whose session the 30 KB conversation is
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a file of the repository",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "grep", "description": "Search the repository for a regular expression",
        "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}},
                       "required": ["pattern"]}}},
]
CALLS = 19  # tool calls in the 30 KB conversation: system, user, then 19 calls and their results
SIZE = 30_000  # bytes of the 30 KB Chat request, as the client sends it to a gateway


def _source(index: int, size: int) -> str:
    """`size` characters of made-up source code, different for each `index`."""
    lines: list[str] = []
    number = 0
    while sum(len(line) + 1 for line in lines) < size:
        number += 1
        limit = (index * 31 + number * 7) % 97
        lines.append(f"{number:4d}  def step_{index}_{number}(state, limit={limit}):  "
                     f"return state.advance(limit) if state.ready else None")
    return "\n".join(lines)[:size]


def _conversation(result_size: int) -> list[dict[str, Any]]:
    """A coding agent's session: the task, then the agent's tool calls (every third with a word of
    explanation) and their results, ending with a result."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "The client sometimes retries a request that already succeeded. Find where the "
                                    "retry decision is made and explain what goes wrong."}]
    for index in range(CALLS):
        name, arguments = (("read_file", {"path": f"src/client/module_{index}.py"}) if index % 2 == 0 else
                           ("grep", {"pattern": f"retry_{index}|backoff", "path": "src/client"}))
        call = {"id": f"call_{index:02d}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)}}
        text = f"Next I look at step {index} of the retry path." if index % 3 == 0 else None
        messages.append({"role": "assistant", "content": text, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": _source(index, result_size)})
    return messages


def _long_chat() -> dict[str, Any]:
    """The 30 KB Chat request: tool results sized so that the body is SIZE bytes, near enough."""
    def request(result_size: int) -> dict[str, Any]:
        return {"model": "bench", "temperature": 0.2, "messages": _conversation(result_size), "tools": CLIENT_TOOLS}

    size = 1000
    for _ in range(2):  # the body grows linearly with the results' size, but for escapes: twice is enough
        size += (SIZE - len(json.dumps(request(size)))) // CALLS
    return request(size)


def _as_responses(chat: dict[str, Any]) -> dict[str, Any]:
    """The same conversation as a Responses request: the system message as instructions, the rest
    as input items."""
    items: list[dict[str, Any]] = []
    for message in chat["messages"][1:]:
        if message["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": message["tool_call_id"],
                          "output": message["content"]})
        elif message["role"] == "assistant":
            if message["content"]:
                items.append({"type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": message["content"]}]})
            items += [{"type": "function_call", "call_id": call["id"], "name": call["function"]["name"],
                       "arguments": call["function"]["arguments"]} for call in message["tool_calls"]]
        else:
            items.append({"type": "message", "role": message["role"], "content": message["content"]})
    tools = [{"type": "function", **tool["function"]} for tool in chat["tools"]]
    return {"model": "bench", "temperature": 0.2, "instructions": chat["messages"][0]["content"], "input": items,
            "tools": tools}


LONG_CHAT = _long_chat()
LONG_RESPONSES = _as_responses(LONG_CHAT)


@dataclass(frozen=True)
class Scenario:
    option: str  # as named in --scenarios
    name: str  # as printed
    kind: str  # plain, stream, tool or 30kb: which verdicts apply
    path: str  # CHAT or RESPONSES
    request: dict[str, Any]  # as a client sends it to a gateway

    def body(self, target: str) -> bytes:
        """What the client sends `target`: a gateway adds the demo tools itself, the others are sent
        them in the shape of the scenario's API."""
        if target in GATEWAYS:
            return json.dumps(self.request).encode()
        from gateway.apis.registry import ADAPTERS
        from gateway.demo.tools import demo_registry

        api = ADAPTERS["responses" if self.path == RESPONSES else "chat"]
        demo = demo_registry().specs(api.name, api.tool_spec)
        return json.dumps({**self.request, "tools": [*self.request.get("tools", []), *demo]}).encode()

    @property
    def plain(self) -> str:
        """The option of the plain request in this scenario's API (a tool round's verdict is a multiple of it)."""
        return "plain" if self.path == CHAT else "responses-plain"

    def expected(self, target: str) -> str | None:
        """What the answer must say (see `_answer`); None: a stream, only its status is checked."""
        if self.kind == "stream":
            return None
        if self.kind == "tool":
            return "done" if target in GATEWAYS else "call:echo"
        return "done" if self.kind == "30kb" else "ok"


SCENARIOS = (
    Scenario("plain", "Chat plain", "plain", CHAT, PLAIN),
    Scenario("stream", "Chat stream", "stream", CHAT, {**PLAIN, "stream": True}),
    Scenario("tool", "Chat tool round", "tool", CHAT, TOOL_ROUND),
    Scenario("30kb", "Chat 30 KB", "30kb", CHAT, LONG_CHAT),
    Scenario("responses-plain", "Responses plain", "plain", RESPONSES, RESPONSES_PLAIN),
    Scenario("responses-stream", "Responses stream", "stream", RESPONSES, {**RESPONSES_PLAIN, "stream": True}),
    Scenario("responses-tool", "Responses tool round", "tool", RESPONSES, RESPONSES_TOOL_ROUND),
    Scenario("responses-30kb", "Responses 30 KB", "30kb", RESPONSES, LONG_RESPONSES),
)


# --- the servers, each run as `python bench/proxy.py --serve KIND --port P [--upstream URL]` -------------

async def _serve_upstream(port: int) -> None:
    from gateway.demo.agent import FastPolicy
    from gateway.demo.model import ScriptedModel
    from gateway.runtime.process import serving

    async with serving(ScriptedModel(FastPolicy()).app(), "127.0.0.1", port):
        await asyncio.Event().wait()


async def _pass_through(session: aiohttp.ClientSession, upstream: str, request: web.Request,
                        headers: dict[str, str] | None = None) -> web.StreamResponse:
    """The least a proxy can do: the body forwarded to the same path of the upstream (with
    `headers`, default a JSON content type), the answer streamed back."""
    body = await request.read()
    async with session.post(upstream + request.path.removeprefix("/v1"), data=body,
                            headers=headers or {"Content-Type": "application/json"}) as answer:
        response = web.StreamResponse(status=answer.status, headers={"Content-Type": answer.headers["Content-Type"]})
        try:
            await response.prepare(request)
            async for data in answer.content.iter_any():
                await response.write(data)
        except ConnectionError:
            pass  # the client left (wrk does, in the middle of requests, at the end of a run)
        return response  # aiohttp ends the body


async def _serve_floor(port: int, upstream: str) -> None:
    session = aiohttp.ClientSession(auto_decompress=False)
    await _serve_app(port, partial(_pass_through, session, upstream))


async def _serve_floor_otel(port: int, upstream: str) -> None:
    """The floor, with what the OpenTelemetry SDK and prometheus_client alone do for a request
    (`request_telemetry.SdkTelemetry`: toolspan's two spans with their attributes, through a
    BatchSpanProcessor to an exporter that drops them, the chat span's trace context written into
    the upstream request, and the metric updates): what telemetry costs a bare hop, against which
    toolspan's own telemetry is measured."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from prometheus_client import CollectorRegistry
    from request_telemetry import SdkTelemetry
    from tool_pipeline import DropExporter

    from telemetry.tracing import INSTRUMENTATION_SCOPE, build_provider

    provider = build_provider()
    provider.add_span_processor(BatchSpanProcessor(DropExporter()))
    sdk = SdkTelemetry(provider.get_tracer(INSTRUMENTATION_SCOPE), CollectorRegistry())  # the SDK's own
    session = aiohttp.ClientSession(auto_decompress=False)

    async def forward(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        server, token = sdk.request()
        try:
            chat = sdk.chat()  # around the provider call: here, the whole pass-through
            try:
                headers = {"Content-Type": "application/json"}
                sdk.inject(chat, headers)
                return await _pass_through(session, upstream, request, headers)
            finally:
                sdk.chat_done(chat, time.perf_counter() - started)
        finally:
            sdk.request_done(server, token, time.perf_counter() - started)

    await _serve_app(port, forward)


async def _serve_app(port: int, forward: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> None:
    """`forward` on both paths, served as the gateway serves (its garbage collector settled the
    same way once listening)."""
    from gateway.runtime.process import settle_garbage_collector

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1" + CHAT, forward)
    app.router.add_post("/v1" + RESPONSES, forward)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)  # as the gateway's
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    settle_garbage_collector()
    await asyncio.Event().wait()


async def _serve_toolspan(port: int, upstream: str, telemetry: bool, store: bool = True) -> None:
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from tool_pipeline import DropExporter

    from gateway.demo.tools import demo_registry
    from gateway.runtime.process import gateway, settle_garbage_collector
    from gateway.settings.model import Settings

    settings = Settings(port=port, upstream=upstream, telemetry=telemetry, trajectory_store=store)
    async with gateway(settings, demo_registry(), processors=[BatchSpanProcessor(DropExporter())]):
        settle_garbage_collector()  # as `toolspan serve` does
        await asyncio.Event().wait()


def _serve(kind: str, port: int, upstream: str | None) -> None:
    from gateway.runtime.process import run  # every server on the event loop `toolspan serve` uses

    if kind == "upstream":
        run(_serve_upstream(port))
    elif kind == "floor":
        run(_serve_floor(port, str(upstream)))
    elif kind == "floor-otel":
        run(_serve_floor_otel(port, str(upstream)))
    else:
        run(_serve_toolspan(port, str(upstream), telemetry=kind != "toolspan-notel", store=kind != "toolspan-nostore"))


# --- processes ------------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _start_defaults(port: int, upstream: str, folder: Path, wrapper: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """`toolspan serve` as the README's first command starts it: the console script, no flags, every
    setting at its default (no TOOLSPAN_* or OTEL_* variable of the bench's environment passed on),
    so the access log on, the trajectory store in $XDG_DATA_HOME (here `folder`), no tools. The
    upstream and the port come by the variables a user would set (TOOLSPAN_UPSTREAM,
    TOOLSPAN_PORT), not flags, so that the command line stays the README's. Its log (the start-up
    lines, then one access line a request) goes to a file, as a service manager's would. `wrapper`:
    a command it runs under (bench/instructions.py's callgrind)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith(("TOOLSPAN_", "OTEL_"))}
    env.update({"TOOLSPAN_UPSTREAM": upstream, "TOOLSPAN_PORT": str(port), "XDG_DATA_HOME": str(folder / "data")})
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "serve.log", "wb") as log:  # the child keeps its own descriptor
        return subprocess.Popen([*wrapper, str(Path(sys.executable).parent / "toolspan"), "serve"], env=env,
                                stdout=log, stderr=subprocess.STDOUT, cwd=folder)


def _start(kind: str, port: int, upstream: str | None = None, checkout: Path = ROOT,
           store_dir: Path | None = None) -> subprocess.Popen[bytes]:
    """A server, run by `checkout`'s bench/proxy.py with `checkout` first on PYTHONPATH; a gateway
    writes its own trajectory store in `store_dir` (default: the temporary directory).
    `serve-defaults` is `toolspan serve` itself (`_start_defaults`)."""
    if kind == DEFAULTS:
        return _start_defaults(port, str(upstream), (store_dir or Path(tempfile.gettempdir())) / DEFAULTS)
    args = [sys.executable, str(checkout / "bench" / "proxy.py"), "--serve", kind, "--port", str(port)]
    if upstream:
        args += ["--upstream", upstream]
    # Each server its own trajectory store: two gateways writing one file would wait on its lock.
    store = (store_dir or Path(tempfile.gettempdir())) / f"toolspan-bench-{kind}-{port}.sqlite3"
    env = {**os.environ, "PYTHONPATH": str(checkout), "TOOLSPAN_TRAJECTORY_STORE_PATH": str(store)}
    return subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL)


def _check_imports(checkout: Path) -> str:
    """Where the `gateway` and `telemetry` packages come from in a server `_start` runs for
    `checkout`: the same interpreter, environment and first sys.path entry (the script's folder).
    Raises unless both are `checkout`'s (this venv has its own checkout installed in editable mode,
    which must not win)."""
    code = "import gateway, telemetry; print(gateway.__file__); print(telemetry.__file__)"
    found = subprocess.run([sys.executable, "-c", code], cwd=checkout / "bench",
                           env={**os.environ, "PYTHONPATH": str(checkout)},
                           capture_output=True, text=True, check=True).stdout.splitlines()
    for file in found:
        if not Path(file).resolve().is_relative_to(checkout.resolve()):
            raise RuntimeError(f"a server for {checkout} would import {file}, not that checkout's code")
    return found[0]


async def _wait_ready(url: str, seconds: float = 120.0, headers: Mapping[str, str] | None = None) -> None:
    """Until `url` answers PLAIN (sent with `headers`) with 200."""
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.post(url, json=PLAIN, headers=headers) as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not come up")
            await asyncio.sleep(0.1)  # polling a starting process: there is no event to await


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _children_cpu() -> float:
    """CPU seconds of this process's waited-for children: the wrk runs."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def need_program(program: str, how: str) -> None:
    """Installs `program` (its Debian package has its name) with apt-get when it is missing and this
    is root on Debian; else exits, saying `how` to install it."""
    if shutil.which(program) is not None:
        return
    if os.geteuid() == 0 and shutil.which("apt-get") is not None:
        print(f"{program} is missing: apt-get install -y {program}", flush=True)
        subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", program], check=False)
    if shutil.which(program) is None:
        sys.exit(f"the bench needs {program}: {how}")


def _need_wrk() -> None:
    need_program("wrk", "`sudo apt-get install wrk` (Debian, Ubuntu), `brew install wrk` (macOS), or build it "
                        "from https://github.com/wg/wrk")


# --- the load --------------------------------------------------------------------------------------------

WRK_SCRIPT = """\
local file = assert(io.open(%s, "rb"))
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
%s
wrk.body = file:read("*a")
file:close()

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("bench-result %%d %%d %%d %%.0f %%.0f\\n", summary.requests, summary.duration,
                         e.connect + e.read + e.write + e.status + e.timeout,
                         latency:percentile(50), latency:percentile(99)))
end
"""


@dataclass(frozen=True)
class WrkRun:
    requests: int  # answered
    seconds: float  # wrk's own measure of the run
    p50_ms: float
    p99_ms: float
    wrk_cpu: float  # seconds of wrk's CPU (its rusage)


def load(url: str, body: bytes, seconds: int, connections: int, headers: Mapping[str, str] | None = None) -> WrkRun:
    """One wrk run, one thread: POST `body` to `url` over `connections` connections for `seconds`,
    with `headers` besides the JSON content type. Any failed request (refused, reset, timed out, not
    2xx) aborts the bench: that is not what is measured."""
    extra = "\n".join(f"wrk.headers[{json.dumps(name)}] = {json.dumps(value)}"
                      for name, value in (headers or {}).items())
    with tempfile.TemporaryDirectory(prefix="toolspan-bench-") as folder:
        Path(folder, "body.json").write_bytes(body)
        script = Path(folder, "post.lua")
        script.write_text(WRK_SCRIPT % (json.dumps(str(Path(folder, "body.json"))), extra))
        cpu = _children_cpu()
        done = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "10s",
                               "-s", str(script), url], capture_output=True, text=True, check=False)
        wrk_cpu = _children_cpu() - cpu
    line = next((line for line in done.stdout.splitlines() if line.startswith("bench-result ")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed on {url}:\n{done.stdout}{done.stderr}")
    requests, microseconds, errors, p50, p99 = (float(value) for value in line.split()[1:])
    if errors:
        raise RuntimeError(f"{url}: {errors:.0f} of {requests:.0f} requests failed under wrk:\n{done.stdout}")
    return WrkRun(int(requests), microseconds / 1e6, p50 / 1000, p99 / 1000, wrk_cpu)


class Client:
    """One keep-alive connection, a request at a time (http.client: little to measure of its own)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.path = parts.path
        self.connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)

    def post(self, body: bytes) -> tuple[int, str, bytes, float]:
        """(status, content type, body, seconds from sending the request to its body's first byte)."""
        start = time.perf_counter()
        self.connection.request("POST", self.path, body, {"Content-Type": "application/json"})
        response = self.connection.getresponse()
        first = response.read1(1)
        first_byte = time.perf_counter() - start
        return response.status, response.getheader("Content-Type", ""), first + response.read(), first_byte

    def close(self) -> None:
        self.connection.close()


def first_byte_ms(url: str, body: bytes, count: int) -> float:
    """Median over `count` requests, one at a time, of the time from sending one to the first byte
    of its answer's body, in ms."""
    client = Client(url)
    found: list[float] = []
    try:
        for _ in range(count):
            status, _, answer, first_byte = client.post(body)
            if status != 200:
                raise RuntimeError(f"{url} answered {status}: {answer[:500]!r}")
            found.append(first_byte)
    finally:
        client.close()
    return statistics.median(found) * 1000


def _answer(path: str, body: bytes) -> str:
    """What a JSON answer says: its text, or `call:NAME` for its first tool call."""
    answer = json.loads(body)
    if path == CHAT:
        message = answer["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        return f"call:{calls[0]['function']['name']}" if calls else str(message.get("content"))
    for item in answer["output"]:
        if item["type"] == "function_call":
            return f"call:{item['name']}"
    return "".join(part.get("text", "") for item in answer["output"] if item["type"] == "message"
                   for part in item["content"])


def check(url: str, scenario: Scenario, target: str) -> str | None:
    """Sends the scenario's request once and checks the answer; None when all is well, else what went
    wrong. (The callers warm the target up after it, under wrk.)"""
    client = Client(url)
    body = scenario.body(target)
    try:
        status, content_type, answer, _ = client.post(body)
        if status != 200:
            return f"status {status}: {answer[:1000]!r}"
        expected = scenario.expected(target)
        if expected is None:
            if not content_type.startswith("text/event-stream"):
                return f"not a stream ({content_type}): {answer[:1000]!r}"
        elif (said := _answer(scenario.path, answer)) != expected:
            return f"answered {said!r}, expected {expected!r}: {answer[:1000]!r}"
    finally:
        client.close()
    return None


# --- measuring ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sample:
    """One target in one scenario in one round."""

    rps: float  # at concurrency 10
    cpu_us: float  # the target process's CPU per request, at concurrency 10
    server_share: float  # of one core, the target process, at concurrency 10
    wrk_share: float  # of one core, wrk, at concurrency 10
    p50_ms: float  # at concurrency 10
    p99_ms: float
    p50_1_ms: float  # at concurrency 1
    p99_1_ms: float
    ttfb_ms: float | None  # streamed scenarios: time to first byte at concurrency 1


def sample(pid: int, url: str, scenario: Scenario, target: str, seconds: int, ttfb_requests: int,
           single_seconds: int | None = None) -> Sample:
    body = scenario.body(target)
    cpu, start = cpu_seconds(pid), time.monotonic()
    busy = load(url, body, seconds, BUSY)
    cpu, wall = cpu_seconds(pid) - cpu, time.monotonic() - start
    single = load(url, body, single_seconds or seconds, 1)
    ttfb = first_byte_ms(url, body, ttfb_requests) if scenario.kind == "stream" else None
    return Sample(busy.requests / busy.seconds, cpu / busy.requests * 1e6, cpu / wall, busy.wrk_cpu / wall,
                  busy.p50_ms, busy.p99_ms, single.p50_ms, single.p99_ms, ttfb)


@dataclass
class Target:
    name: str
    process: subprocess.Popen[bytes]
    base: str  # http://127.0.0.1:PORT/v1


Results = dict[str, dict[str, list[Sample]]]  # scenario option -> target name -> one Sample per round


WARM_UP_SECONDS = 2


def measure(targets: list[Target], scenarios: Sequence[Scenario], rounds: int, seconds: int,
            ttfb_requests: int, single_seconds: int | None = None) -> Results:
    """Checks every target on every scenario (a `before` that fails one is left out of it), loads
    each for WARM_UP_SECONDS unmeasured, then the rounds. Without the warm-up the first round was
    not like the others: the floor's CPU per request in it 773 and 756 us (Chat, Responses) against
    495 to 561 in the two after it, every gateway target's likewise, so the flatness bound (then the
    last round over the first, as multiples of the floor's) read 1.14 to 1.60 for CPU that fell from
    the first round to the last."""
    taking: dict[str, list[Target]] = {}
    for scenario in scenarios:
        taking[scenario.option] = []
        for target in targets:
            problem = check(target.base + scenario.path, scenario, target.name)
            if problem is None:
                taking[scenario.option].append(target)
            elif target.name == "before":
                print(f"{scenario.name}: `before` left out, it {problem}", flush=True)
            else:
                raise RuntimeError(f"{scenario.name}, {target.name}: POST {target.base + scenario.path} {problem}")
    for scenario in scenarios:  # unmeasured: a process's first thousand requests cost more than the rest
        for target in taking[scenario.option]:
            load(target.base + scenario.path, scenario.body(target.name), WARM_UP_SECONDS, BUSY)
    results: Results = {scenario.option: {t.name: [] for t in taking[scenario.option]} for scenario in scenarios}
    turn = 0
    for round_ in range(rounds):
        for scenario in scenarios:
            names = taking[scenario.option]
            shift = turn % len(names)  # each target goes first in turn
            turn += 1
            for target in names[shift:] + names[:shift]:
                results[scenario.option][target.name].append(
                    sample(target.process.pid, target.base + scenario.path, scenario, target.name, seconds,
                           ttfb_requests, single_seconds))
            print(f"round {round_ + 1}, {scenario.name}: " + ", ".join(
                f"{name} {found[-1].cpu_us:.0f} µs {found[-1].rps:.0f}/s"
                for name, found in results[scenario.option].items()), flush=True)
    return results


TARGETS = ("floor", "toolspan", "toolspan-notel", "toolspan-nostore", DEFAULTS)  # beside direct, by default


def run(scenarios: Sequence[Scenario], rounds: int, seconds: int, ttfb_requests: int, compare: Path | None,
        sdk: bool = False, chosen: Sequence[str] = TARGETS, single_seconds: int | None = None) -> bool:
    """Measures, reports; whether every bound judged holds."""
    servers = [(name, name, ROOT) for name in chosen]
    if sdk and "floor-otel" not in chosen:
        servers.append(("floor-otel", "floor-otel", ROOT))
    if compare is not None:
        print(f"before: toolspan from {compare} (its gateway package: {_check_imports(compare)})")
        servers.append(("before", "toolspan", compare))
    with tempfile.TemporaryDirectory(prefix="toolspan-bench-stores-") as stores:
        upstream_port = _free_port()
        upstream = f"http://127.0.0.1:{upstream_port}/v1"
        targets = [Target("direct", _start("upstream", upstream_port), upstream)]
        try:
            for name, kind, checkout in servers:
                port = _free_port()
                targets.append(Target(name, _start(kind, port, upstream, checkout, Path(stores)),
                                      f"http://127.0.0.1:{port}/v1"))
            for target in targets:
                try:
                    asyncio.run(_wait_ready(target.base + CHAT))
                except RuntimeError as error:
                    log = Path(stores, DEFAULTS, "serve.log")
                    said = log.read_text()[-3000:] if target.name == DEFAULTS and log.exists() else ""
                    raise RuntimeError(f"{target.name}: {error}\n{said}") from None
            results = measure(targets, scenarios, rounds, seconds, ttfb_requests, single_seconds)
        finally:
            for target in targets:
                target.process.terminate()
            for target in targets:
                target.process.wait(timeout=30)
        if DEFAULTS in chosen:  # the access log was on: a line a request, and the store in XDG_DATA_HOME
            log = Path(stores, DEFAULTS, "serve.log").read_text(errors="replace")
            written = sorted(Path(stores, DEFAULTS, "data").rglob("*.sqlite3"))
            lines = log.count('"POST /v1/')  # the access log's request line
            print(f"\n{DEFAULTS}: {lines:,} access log lines; store "
                  f"{', '.join(str(f.relative_to(stores)) for f in written) or 'NOT WRITTEN'}")
    report(results, scenarios, rounds, seconds, ttfb_requests)
    return print_bounds(results, scenarios)


# --- the report ---------------------------------------------------------------------------------------------

def _median(samples: list[Sample], field: str) -> float:
    return float(statistics.median(getattr(s, field) for s in samples))


def report(results: Results, scenarios: Sequence[Scenario], rounds: int, seconds: int, ttfb_requests: int) -> None:
    print(f"\nMedians of {rounds} round(s); wrk -t1, {seconds} s per run; {CORES} cores. Concurrency 10: req/s, the "
          f"target process's CPU per request, its share of one core and wrk's; p50/p99 latency at concurrency 10 "
          f"and 1; streamed: time to first byte at concurrency 1 (p50 of {ttfb_requests} requests).")
    print("Requests: " + ", ".join(f"{s.name} {len(s.body('toolspan')):,} B" for s in scenarios)
          + " (to direct and floor, with the demo tools' specs added)\n")
    print("| scenario | target | req/s | CPU/req | server CPU | wrk CPU | p50 / p99, c=10 | p50 / p99, c=1 | TTFB |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for scenario in scenarios:
        for name, samples in results[scenario.option].items():
            ttfb = f"{_median(samples, 'ttfb_ms'):.2f} ms" if scenario.kind == "stream" else ""
            print(f"| {scenario.name} | {name} | {_median(samples, 'rps'):.0f} | {_median(samples, 'cpu_us'):.0f} µs "
                  f"| {_median(samples, 'server_share'):.0%} | {_median(samples, 'wrk_share'):.0%} "
                  f"| {_median(samples, 'p50_ms'):.2f} / {_median(samples, 'p99_ms'):.2f} ms "
                  f"| {_median(samples, 'p50_1_ms'):.2f} / {_median(samples, 'p99_1_ms'):.2f} ms | {ttfb} |")
    cells = [samples for found in results.values() for samples in found.values()]
    busiest = max(_median(samples, "wrk_share") for samples in cells)
    print(f"\nThe load generator: wrk's own CPU was at most {busiest:.0%} of one core in any row (the targets' "
          f"processes: {min(_median(c, 'server_share') for c in cells):.0%} to "
          f"{max(_median(c, 'server_share') for c in cells):.0%}), "
          + ("so it is not what limits throughput." if busiest < 0.5 else "so it may limit throughput."))
    print("\nThe splits (medians of per-round values; per round in brackets; the bounds follow):")
    for scenario in scenarios:
        for line in verdicts(scenario, results):
            print(line)


def _line(scenario: Scenario, label: str, per_round: list[float], form: str, target: float | None) -> str:
    value = statistics.median(per_round)
    rounds = " ".join(form.format(v) for v in per_round)
    if target is None:
        bound = "(no target)"
    else:
        bound = f"target ≤ {form.format(target)}: {'holds' if value <= target else 'FAILS'}"
    return f"  {scenario.name:<21} {label:<33} {form.format(value):>9}  [{rounds}]  {bound}"


def verdicts(scenario: Scenario, results: Results) -> list[str]:
    """The verdict lines of one scenario (see the module's docstring for the targets)."""
    found = results[scenario.option]

    def per_round(of: Callable[[Sample, Sample], float], ours: str, theirs: str) -> list[float]:
        return [of(a, b) for a, b in zip(found[ours], found[theirs], strict=True)]

    before: list[str] = []
    if {"toolspan", "before"} <= found.keys():  # with --compare, whatever the other targets
        before = [_line(scenario, "toolspan/before CPU per request",
                        per_round(lambda a, b: a.cpu_us / b.cpu_us, "toolspan", "before"), "{:.2f}", None),
                  _line(scenario, "p50 toolspan - before, c=1",
                        per_round(lambda a, b: a.p50_1_ms - b.p50_1_ms, "toolspan", "before"), "{:+.2f} ms", None)]
    if not {"direct", "floor", "toolspan", "toolspan-notel"} <= found.keys():
        return before  # a subset of the targets (--targets): the bounds' table says what it can

    def added(label: str, of: Callable[[Sample, Sample], float], target: float | None) -> list[str]:
        """Milliseconds toolspan adds over direct, and beside them what the floor adds (a yardstick)."""
        return [_line(scenario, label, per_round(of, "toolspan", "direct"), "{:.2f} ms", target),
                _line(scenario, "  the bare hop's (floor)", per_round(of, "floor", "direct"), "{:.2f} ms", None)]

    lines = [
        _line(scenario, "toolspan/floor CPU per request", per_round(lambda a, b: a.cpu_us / b.cpu_us,
                                                                     "toolspan", "floor"), "{:.2f}", None),
        _line(scenario, "telemetry share of toolspan's CPU",
              per_round(lambda a, b: (a.cpu_us - b.cpu_us) / a.cpu_us, "toolspan", "toolspan-notel"), "{:.0%}",
              None),
        *added("p50 added over direct, c=1", lambda a, b: a.p50_1_ms - b.p50_1_ms, None),
    ]
    if scenario.kind == "stream":
        lines += added("TTFB added over direct, c=1", lambda a, b: (a.ttfb_ms or 0) - (b.ttfb_ms or 0), None)
    if scenario.kind == "tool" and scenario.plain in results:
        ratios = [a.cpu_us / b.cpu_us for a, b in zip(found["toolspan"], results[scenario.plain]["toolspan"],
                                                      strict=True)]
        lines.append(_line(scenario, "toolspan CPU, tool round / plain", ratios, "{:.2f}", None))
    split = ("floor", "floor-otel", "toolspan", "toolspan-notel", "toolspan-nostore")
    if all(name in found for name in split):
        cpu = {name: [sample.cpu_us for sample in found[name]] for name in split}
        ours = [a - b for a, b in zip(cpu["toolspan-nostore"], cpu["toolspan-notel"], strict=True)]
        sdk = [a - b for a, b in zip(cpu["floor-otel"], cpu["floor"], strict=True)]
        lines += [
            _line(scenario, "toolspan's spans and metrics", ours, "{:.0f} µs", None),
            _line(scenario, "  the SDK's alone (floor-otel)", sdk, "{:.0f} µs", None),
            _line(scenario, "toolspan's / the SDK's", [a / b if b > 0 else float("nan")
                                                       for a, b in zip(ours, sdk, strict=True)], "{:.2f}", None),
            _line(scenario, "  the SDK's share of floor-otel",
                  [b / a for a, b in zip(cpu["floor-otel"], sdk, strict=True)], "{:.0%}", None),
            _line(scenario, "the trajectory store", [a - b for a, b in zip(cpu["toolspan"], cpu["toolspan-nostore"],
                                                                          strict=True)], "{:.0f} µs", None),
        ]
    return lines + before


def _chosen(names: str) -> list[Scenario]:
    """The scenarios named in --scenarios, in the table's order."""
    known = [scenario.option for scenario in SCENARIOS]
    wanted = set(known) if names == "all" else set(names.split(","))
    if unknown := wanted - set(known):
        raise ValueError(f"unknown scenario {', '.join(sorted(unknown))}; known: {', '.join(known)}, all")
    return [scenario for scenario in SCENARIOS if scenario.option in wanted]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", default="plain,stream,tool,30kb",
                        help="comma-separated, or all (default: the four Chat Completions ones)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=5, help="length of each wrk run")
    parser.add_argument("--ttfb-requests", type=int, default=300, help="streamed requests per time-to-first-byte run")
    parser.add_argument("--compare", type=Path, metavar="DIR", help="also measure toolspan from the checkout at DIR")
    parser.add_argument("--sdk", action="store_true",
                        help="also measure floor-otel and toolspan-nostore: toolspan's spans and metrics against "
                             "the SDK's")
    parser.add_argument("--targets", default=",".join(TARGETS),
                        help=f"comma-separated, beside direct (default {','.join(TARGETS)}; also floor-otel)")
    parser.add_argument("--c1-seconds", type=int, help="length of each concurrency-1 run (default: --seconds)")
    parser.add_argument("--serve", choices=("upstream", "floor", "floor-otel", "toolspan", "toolspan-notel",
                                            "toolspan-nostore"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.serve is not None:
        _serve(options.serve, options.port, options.upstream)
        return
    try:
        scenarios = _chosen(options.scenarios)
    except ValueError as error:
        parser.error(str(error))
    if options.compare is not None and not (options.compare / "bench" / "proxy.py").is_file():
        parser.error(f"--compare: no bench/proxy.py in {options.compare}")
    chosen = options.targets.split(",")
    if unknown := set(chosen) - {*TARGETS, "floor-otel"}:
        parser.error(f"unknown target {', '.join(sorted(unknown))}")
    _need_wrk()
    held = run(scenarios, options.rounds, options.seconds, options.ttfb_requests,
               options.compare.resolve() if options.compare is not None else None, options.sdk, chosen,
               options.c1_seconds)
    sys.exit(0 if held else 1)


if __name__ == "__main__":
    main()
