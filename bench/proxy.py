"""Throughput and latency of toolspan against the direct upstream and a bare pass-through floor.

In one run, on loopback, against the built-in fast upstream (FastPolicy), each in its own process:
  direct  - the upstream itself;
  floor   - a bare aiohttp pass-through written here (reads the body, forwards it, streams back);
  toolspan- the gateway with telemetry on (spans through a BatchSpanProcessor, metrics on).
For a plain chat request, a streamed one (time to first byte) and a request with one gateway tool
round, at concurrency 1, 10 and 50: requests per second and p50/p99 latency. Load comes from this
process with raw aiohttp (the openai client would cost more than what is measured). The upstream
gets the same request in all three cases: toolspan adds its tools (the demo registry) to what the
client sends, so direct and floor are sent those tool specs by the client itself. Each cell runs
--repeats rounds; within a round the three targets take --blocks short turns in rotation, so that
a slow spell of the machine falls on all three alike. Figures are medians over rounds. The three
servers run on the event loop `toolspan serve` uses (uvloop, where installed).

    python bench/proxy.py [--requests 600] [--seconds 5] [--repeats 5] [--blocks 3] [--scenarios plain,stream,one]

Targets (plain request): toolspan >= 0.6 x the floor's throughput at concurrency 10, and at most
1.5 ms added at p50 over direct at concurrency 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
PLAIN = {"model": "bench", "messages": [{"role": "user", "content": "hello"}]}
STREAMED = {**PLAIN, "stream": True}
TOOL_ROUND = {"model": "bench", "messages": [{"role": "user", "content": "please use a tool"}]}
SCENARIOS: dict[str, dict[str, Any]] = {"plain": PLAIN, "stream (TTFB)": STREAMED, "one tool round": TOOL_ROUND}
CONCURRENCY = (1, 10, 50)


# --- the servers, each run as `python bench/proxy.py --serve KIND --port P [--upstream URL]` -------------

async def _serve_upstream(port: int) -> None:
    from gateway.demo.agent import FastPolicy
    from gateway.demo.model import ScriptedModel
    from gateway.runtime import serving

    async with serving(ScriptedModel(FastPolicy()).app(), "127.0.0.1", port):
        await asyncio.Event().wait()


async def _serve_floor(port: int, upstream: str) -> None:
    """The least a proxy can do: forward the body, stream the answer back."""
    session = aiohttp.ClientSession(auto_decompress=False)

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        async with session.post(upstream + "/chat/completions", data=body,
                                headers={"Content-Type": "application/json"}) as answer:
            response = web.StreamResponse(status=answer.status,
                                          headers={"Content-Type": answer.headers["Content-Type"]})
            await response.prepare(request)
            async for data in answer.content.iter_any():
                await response.write(data)
            await response.write_eof()
            return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", forward)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


async def _serve_toolspan(port: int, upstream: str) -> None:
    from collections.abc import Sequence as Seq

    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    from gateway.demo.tools import demo_registry
    from gateway.runtime import gateway
    from gateway.settings import Settings

    class Drop(SpanExporter):
        def export(self, spans: Seq[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    settings = Settings(port=port, upstream=upstream)
    async with gateway(settings, demo_registry(), processors=[BatchSpanProcessor(Drop())]):
        await asyncio.Event().wait()


# --- the load --------------------------------------------------------------------------------------

@dataclass
class Result:
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int


async def _one(session: aiohttp.ClientSession, url: str, body: bytes, stream: bool) -> float:
    """Seconds to the answer (to the first body byte when streamed)."""
    start = time.perf_counter()
    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
        if response.status != 200:
            raise RuntimeError(f"status {response.status}")
        if stream:
            await response.content.readany()
            elapsed = time.perf_counter() - start
            await response.read()
            return elapsed
        await response.read()
        return time.perf_counter() - start


async def _batch(session: aiohttp.ClientSession, url: str, body: bytes, stream: bool, concurrency: int,
                 count: int, seconds: float) -> tuple[list[float], float, int]:
    """`count` requests from `concurrency` workers (or fewer, at the time cap): latencies, wall
    time, errors."""
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds
    remaining = count

    async def worker() -> None:
        nonlocal remaining, errors
        while remaining > 0 and time.perf_counter() < deadline:
            remaining -= 1
            try:
                latencies.append(await _one(session, url, body, stream))
            except (aiohttp.ClientError, RuntimeError):
                errors += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, time.perf_counter() - start, errors


async def measure(urls: dict[str, str], request: dict[str, Any], concurrency: int, count: int, blocks: int,
                  seconds: float) -> dict[str, Result]:
    """One round: every target gets `count` requests, in `blocks` short turns taken in rotation,
    so that whatever the machine does meanwhile falls on all targets alike."""
    sessions = {name: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) for name in urls}
    bodies = {name: json.dumps(_request_for(name, request)).encode() for name in urls}
    stream = bool(request.get("stream"))
    latencies: dict[str, list[float]] = {name: [] for name in urls}
    elapsed = dict.fromkeys(urls, 0.0)
    errors = dict.fromkeys(urls, 0)
    try:
        for name, url in urls.items():  # warm-up: connections, caches
            for _ in range(min(50, count)):
                await _one(sessions[name], url, bodies[name], stream)
        names = list(urls)
        for block in range(blocks):
            shift = block % len(names)  # each target goes first in turn, and follows each other one
            for name in names[shift:] + names[:shift]:
                found, took, failed = await _batch(sessions[name], urls[name], bodies[name], stream, concurrency,
                                                   max(1, count // blocks), seconds / blocks)
                latencies[name] += found
                elapsed[name] += took
                errors[name] += failed
    finally:
        for session in sessions.values():
            await session.close()
    results = {}
    for name, found in latencies.items():
        found.sort()
        p = statistics.quantiles(found, n=100) if len(found) > 1 else found * 99
        results[name] = Result(len(found) / elapsed[name], p[49] * 1000, p[98] * 1000, errors[name])
    return results


# --- orchestration ----------------------------------------------------------------------------------

def _request_for(target: str, request: dict[str, Any]) -> dict[str, Any]:
    if target == "toolspan":
        return request
    from gateway.demo.tools import demo_registry

    return {**request, "tools": demo_registry().openai_tools()}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _wait_ready(url: str, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.post(url, json=PLAIN) as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not come up")
            await asyncio.sleep(0.1)  # polling a starting process: there is no event to await


def _start(kind: str, port: int, upstream: str | None = None) -> subprocess.Popen[bytes]:
    args = [sys.executable, __file__, "--serve", kind, "--port", str(port)]
    if upstream:
        args += ["--upstream", upstream]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL)


async def run(count: int, seconds: float, repeats: int, blocks: int, scenarios: Sequence[str]) -> None:
    upstream_port, floor_port, toolspan_port = _free_port(), _free_port(), _free_port()
    upstream = f"http://127.0.0.1:{upstream_port}/v1"
    processes = [_start("upstream", upstream_port)]
    processes += [_start("floor", floor_port, upstream), _start("toolspan", toolspan_port, upstream)]
    targets = {"direct": upstream, "floor": f"http://127.0.0.1:{floor_port}/v1",
               "toolspan": f"http://127.0.0.1:{toolspan_port}/v1"}
    try:
        for base in targets.values():
            await _wait_ready(base + "/chat/completions")
        print(f"{repeats} rounds per cell; within a round the targets take turns, {blocks} times each; "
              "medians over rounds\n")
        print(f"{'scenario':16} {'conc':>4} {'target':9} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}")
        verdict: dict[str, list[float]] = {"ratio": [], "added": [], "hop": []}
        for scenario, request in SCENARIOS.items():
            if scenario.split()[0] not in scenarios:
                continue
            for concurrency in CONCURRENCY:
                rounds: dict[str, list[Result]] = {name: [] for name in targets}
                urls = {name: base + "/chat/completions" for name, base in targets.items()}
                for _ in range(repeats):
                    found = await measure(urls, request, concurrency, count * max(1, concurrency // 5), blocks,
                                          seconds)
                    for name, result in found.items():
                        rounds[name].append(result)
                for name, results in rounds.items():
                    print(f"{scenario:16} {concurrency:>4} {name:9} {_median(results, 'rps'):8.0f} "
                          f"{_median(results, 'p50_ms'):8.2f} {_median(results, 'p99_ms'):8.2f} "
                          f"{sum(r.errors for r in results):>6}", flush=True)
                if scenario == "plain" and concurrency == 10:
                    verdict["ratio"] = [t.rps / f.rps for t, f in zip(rounds["toolspan"], rounds["floor"], strict=True)]
                if scenario == "plain" and concurrency == 1:
                    verdict["added"] = [t.p50_ms - d.p50_ms
                                        for t, d in zip(rounds["toolspan"], rounds["direct"], strict=True)]
                    verdict["hop"] = [f.p50_ms - d.p50_ms
                                      for f, d in zip(rounds["floor"], rounds["direct"], strict=True)]
        if not verdict["ratio"]:
            return
        print(f"\nplain, concurrency 10: toolspan/floor throughput = {statistics.median(verdict['ratio']):.2f} "
              f"(per round: {', '.join(f'{r:.2f}' for r in verdict['ratio'])}; target >= 0.6)")
        print(f"plain, concurrency 1: toolspan p50 - direct p50 = {statistics.median(verdict['added']):.2f} ms "
              f"(per round: {', '.join(f'{a:.2f}' for a in verdict['added'])}; target <= 1.5 ms)")
        print(f"plain, concurrency 1: the hop alone, floor p50 - direct p50 = "
              f"{statistics.median(verdict['hop']):.2f} ms "
              f"(per round: {', '.join(f'{a:.2f}' for a in verdict['hop'])})")
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=10)


def _median(results: list[Result], field: str) -> float:
    return float(statistics.median(getattr(r, field) for r in results))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=600, help="requests per target per round (x concurrency/5)")
    parser.add_argument("--seconds", type=float, default=5.0, help="time cap per target per round")
    parser.add_argument("--repeats", type=int, default=5, help="rounds per cell")
    parser.add_argument("--blocks", type=int, default=3, help="turns each target takes within a round")
    parser.add_argument("--scenarios", default="plain,stream,one", help="which scenarios (default: all)")
    parser.add_argument("--serve", choices=("upstream", "floor", "toolspan"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    from gateway.runtime import run as serve  # every server on the event loop `toolspan serve` uses

    if options.serve == "upstream":
        serve(_serve_upstream(options.port))
    elif options.serve == "floor":
        serve(_serve_floor(options.port, options.upstream))
    elif options.serve == "toolspan":
        serve(_serve_toolspan(options.port, options.upstream))
    else:
        asyncio.run(run(options.requests, options.seconds, options.repeats, options.blocks,
                        options.scenarios.split(",")))


if __name__ == "__main__":
    main()
