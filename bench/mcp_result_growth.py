"""What an MCP tool's result costs the gateway as it grows, over stdio: 1, 8 and 24 MB; and
`/healthz` while such a result, or a flood of bytes with no newline, comes in.

The server is tests/mcp/servers/flood.py (the `mcp` package's MCPServer): `big` answers `size`
characters, `flood` writes `size` bytes with no newline straight before its answer.

Growth, in this process: the gateway's executor with full telemetry (spans to an exporter that
drops them, metrics on a fresh registry) calls `big` through its McpConnection, with
mcp_max_message_bytes raised to 64 MiB so that 24 MB is taken. For each size, the least over
--repeats (the machine is shared: other work only ever adds to a time) of the event loop's CPU
(this thread's, `time.thread_time`; the server is another process) and of the wall time of one
call, each per MB; then each step's growth of the CPU per MB, and that growth per doubling
(`growth ** (1 / log2(step))`). Linear within 1.5x per doubling: at most 1.5.

`/healthz`: `toolspan serve` in a process of its own, the same server as its MCP source, and
bench/healthz_probe.py asking `/healthz` every 10 ms while
- --calls calls of `big` for 8 MB (the largest the default cap takes) run one after another, in
  chat completions (the model calls it, the gateway sends its result up) and through
  POST /v1/tools/.../invoke, all settings at their defaults;
- the same for 24 MB, mcp_max_message_bytes raised to 64 MiB;
- --calls calls of `flood` for 32 MB run one after another (the default cap, 8 MiB: each drops
  the connection, and the next waits until the gateway has reconnected).
Target: p99 < 50 ms.

    python bench/mcp_result_growth.py [--sizes 1 8 24] [--repeats 5] [--calls 5]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from healthz_probe import HealthzProbe  # bench/, beside this file
from proxy import _free_port
from tool_pipeline import DropExporter

from gateway.demo.model import Policy, Reply, ScriptedModel
from gateway.mcp import McpSources
from gateway.runtime.process import serving
from gateway.settings.parts import McpServer
from gateway.tools import ToolCall, ToolExecutor, ToolRegistry, Turn
from telemetry.instrument import Telemetry
from telemetry.metrics import Metrics
from telemetry.tracing import build_provider, tracer_of

FLOOD_SERVER = Path(__file__).resolve().parent.parent / "tests" / "mcp" / "servers" / "flood.py"
MB = 1_000_000
RAISED_CAP = 64 * 1024 * 1024
TARGET_GROWTH = 1.5
TARGET_P99_MS = 50.0
SERVER = {"command": sys.executable, "args": [str(FLOOD_SERVER)], "ping_interval_seconds": 0,
          "reconnect_min_seconds": 0.05, "reconnect_max_seconds": 1, "timeout_seconds": 120}


async def one_call(executor: ToolExecutor, size: int) -> tuple[float, float]:
    """The loop thread's CPU and the wall time of one call of `big` for `size` characters."""
    call = ToolCall("call_1", "flood__big", json.dumps({"size": size}))
    gc.collect()
    cpu, wall = time.thread_time(), time.perf_counter()
    [outcome] = await executor.run_turn([call], Turn(trajectory_id="bench", round=1))
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    if outcome.status != "ok" or len(outcome.content_text()) != size:
        raise RuntimeError(f"the bench's call failed: {outcome.content_text()[:200]}")
    return cpu, wall


async def growth(sizes: list[int], repeats: int) -> None:
    provider = build_provider(exporters=[DropExporter()])
    telemetry = Telemetry(tracer_of(provider), Metrics(CollectorRegistry()))
    registry = ToolRegistry()
    sources = McpSources({"flood": McpServer.model_validate(SERVER)}, registry, telemetry,
                         max_message_bytes=RAISED_CAP)
    await sources.start()
    try:
        executor = ToolExecutor(registry, telemetry)
        await one_call(executor, MB)  # warms up: the connection, the caches, the metrics' label children
        best = {size: min([await one_call(executor, size * MB) for _ in range(repeats)]) for size in sizes}
    finally:
        await sources.stop()
        provider.shutdown()
    print(f"an MCP result over stdio, one call at a time, least of {repeats}:")
    print("   size   loop CPU   per MB    wall   per MB   CPU/MB growth (per doubling)")
    previous: int | None = None
    for size in sizes:
        cpu, wall = best[size]
        line = (f"{size:4d} MB  {cpu * 1e3:7.0f} ms {cpu / size * 1e3:6.1f} ms "
                f"{wall * 1e3:6.0f} ms {wall / size * 1e3:5.1f} ms")
        if previous is not None:
            step = best[size][0] / size / (best[previous][0] / previous)
            per_doubling = step ** (1 / math.log2(size / previous))
            line += f"   x{step:.2f} (x{per_doubling:.2f}; target <= {TARGET_GROWTH:g})"
        print(line)
        previous = size


def big_result(size: int) -> Policy:
    """A model that calls `big` for `size` characters, then answers."""

    def policy(body: dict[str, Any]) -> Reply:
        if body["messages"][-1]["role"] == "tool":
            return Reply(content="done")
        return Reply(tool_calls=[("flood__big", {"size": size})])

    return policy


@asynccontextmanager
async def serve(cap: int | None, upstream: str) -> AsyncIterator[tuple[str, int]]:
    """`toolspan serve` with the flood server as its MCP source; its base URL and process id once
    it is ready."""
    port = _free_port()
    with tempfile.TemporaryDirectory() as data:  # its trajectory store, as any gateway's, but not the user's
        env = {**os.environ, "XDG_DATA_HOME": data, "TOOLSPAN_MCP_SERVERS": json.dumps({"flood": SERVER}),
               **({"TOOLSPAN_MCP_MAX_MESSAGE_BYTES": str(cap)} if cap else {})}
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "serve", "--port", str(port), "--upstream", upstream,
            "--no-access-log", "--log-level", "error", env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            await until_up(url)
            yield url, process.pid
        finally:
            process.terminate()
            await process.wait()


async def until_up(url: str, disconnects: int = 0) -> None:
    """Until the gateway answers and its MCP server is up, after `disconnects` losses of its
    connection (another process: nothing to await)."""
    deadline = time.monotonic() + 60
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(f"{url}/readyz") as response:
                    servers = (await response.json()).get("mcp_servers", [])
                    if servers and servers[0]["state"] == "up" and servers[0]["disconnects"] >= disconnects:
                        return
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.02)
    raise RuntimeError("the gateway or its MCP server did not come up")


async def ask(session: aiohttp.ClientSession, url: str) -> str:
    """One chat completion: the model calls `big`, the gateway sends the result up, the model answers."""
    body = {"model": "m", "messages": [{"role": "user", "content": "a big one"}]}
    async with session.post(f"{url}/v1/chat/completions", json=body) as answer:
        return "ok" if answer.status == 200 else f"HTTP {answer.status}"


async def invoke(session: aiohttp.ClientSession, url: str, tool: str, size: int) -> str:
    async with session.post(f"{url}/v1/tools/flood__{tool}/invoke", json={"arguments": {"size": size}}) as answer:
        outcome: dict[str, Any] = await answer.json()
        return str(outcome["status"])


async def healthz_while(label: str, cap: int | None, calls: int, one: Callable[[aiohttp.ClientSession, str],
                                                                              Awaitable[str]],
                        drops: bool = False, size: int = 24 * MB) -> None:
    """/healthz while `calls` calls of `one` run one after another (after each, when it `drops` the
    connection, the next waits until the gateway has reconnected); the model asks for `size`."""
    model = ScriptedModel(big_result(size), keep=1)
    async with serving(model.app(), "127.0.0.1", 0) as upstream, serve(cap, f"{upstream}/v1") as (url, pid), \
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        outcomes = []
        before = rss_mib(pid)
        with HealthzProbe(url) as probe:
            for call in range(calls):
                await until_up(url, call if drops else 0)
                outcomes.append(await one(session, url))
        summary = probe.summary()
        after = rss_mib(pid)
    print(f"/healthz while {label}: p50 {summary.get('p50_ms')} ms, p99 {summary.get('p99_ms')} ms, "
          f"max {summary.get('max_ms')} ms over {summary['count']} probes, {summary['failed']} failed "
          f"(target p99 < {TARGET_P99_MS:g}); the gateway's RSS {before:.0f} -> {after:.0f} MiB; "
          f"calls: {summarized(outcomes)}")


def rss_mib(pid: int) -> float:
    [line] = [line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmRSS:")]
    return int(line.split()[1]) / 1024


def summarized(outcomes: list[str]) -> str:
    return ", ".join(f"{outcomes.count(outcome)} {outcome}" for outcome in dict.fromkeys(outcomes))


async def main(sizes: list[int], repeats: int, calls: int) -> None:
    await growth(sizes, repeats)
    # The defaults first: the largest result they take (8 MB, under the 8 MiB cap with its envelope).
    await healthz_while(f"{calls} chat completions each get an 8 MB result and send it up", None, calls, ask,
                        size=8 * MB)
    await healthz_while(f"{calls} invocations each answer an 8 MB result", None, calls,
                        lambda session, url: invoke(session, url, "big", 8 * MB))
    await healthz_while(f"{calls} chat completions each get a 24 MB result and send it up", RAISED_CAP, calls, ask)
    await healthz_while(f"{calls} invocations each answer a 24 MB result", RAISED_CAP, calls,
                        lambda session, url: invoke(session, url, "big", 24 * MB))
    await healthz_while(f"{calls * 4} floods of 32 MB with no newline come in", None, calls * 4,
                        lambda session, url: invoke(session, url, "flood", 32 * MB), drops=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 24], help="result sizes, in MB")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5)
    options = parser.parse_args()
    asyncio.run(main(options.sizes, options.repeats, options.calls))
