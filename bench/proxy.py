"""Throughput and latency of toolspan against the direct upstream and a bare pass-through floor.

In one run, on loopback, against the built-in fast upstream (FastPolicy), each in its own process:
  direct  - the upstream itself;
  floor   - a bare aiohttp pass-through written here (reads the body, forwards it to the same path
            of the upstream, streams back);
  toolspan- the gateway with telemetry on (spans through a BatchSpanProcessor, metrics on);
  before  - with --compare DIR only: toolspan as served by another checkout at DIR (that checkout's
            bench/proxy.py, with DIR first on PYTHONPATH, so that its `gateway` package is the one
            imported; checked at start-up).
Six scenarios, three for each API, at concurrency 1, 10 and 50: requests per second and p50/p99
latency. Chat Completions (POST /v1/chat/completions): a plain request, a streamed one (time to
first byte) and a request with one gateway tool round. The Responses API (POST /v1/responses): the
same three. `before` is measured in the Chat scenarios only (an older checkout may not run the tool
loop for /v1/responses). Load comes from this process with raw aiohttp (the openai client would
cost more than what is measured). The upstream gets the same request from every target: toolspan
adds its tools (the demo registry) to what the client sends, so direct and floor are sent those
tool specs by the client itself, in the shape of the API (Chat: `openai_tools()`, Responses:
`responses_tools()`). Each cell runs --repeats rounds; within a round the targets take --blocks
short turns in rotation, so that a slow spell of the machine falls on all of them alike. Figures are
medians over rounds. The servers run on the event loop `toolspan serve` uses (uvloop, where
installed). Requests that fail are counted in the table, and the first failure of each target in a
scenario is printed after it, with the request that got it.

    python bench/proxy.py [--requests 600] [--seconds 5] [--repeats 5] [--blocks 3]
                          [--scenarios plain,stream,one] [--compare DIR]

--scenarios takes a comma-separated list of plain, stream, one (Chat Completions),
responses-plain, responses-stream, responses-one (Responses API), or `all`; the default is the three
Chat scenarios.

The verdict, for every scenario measured (medians of the per-round values, which are listed too):
toolspan/floor throughput at concurrency 10, and toolspan p50 minus direct p50 at concurrency 1
(with the hop alone, floor p50 minus direct p50); with --compare, also toolspan/before throughput
at concurrency 10 and toolspan p50 minus before p50 at concurrency 1.

Targets (plain Chat request): toolspan >= 0.6 x the floor's throughput at concurrency 10, and at
most 1.5 ms added at p50 over direct at concurrency 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
CHAT, RESPONSES = "/chat/completions", "/responses"  # the two APIs' paths, under /v1
PLAIN = {"model": "bench", "messages": [{"role": "user", "content": "hello"}]}
TOOL_ROUND = {"model": "bench", "messages": [{"role": "user", "content": "please use a tool"}]}
RESPONSES_PLAIN = {"model": "bench", "input": "hello"}
RESPONSES_TOOL_ROUND = {"model": "bench", "input": "please use a tool"}
CONCURRENCY = (1, 10, 50)
GATEWAYS = ("toolspan", "before")  # the targets that add the demo tools themselves


@dataclass(frozen=True)
class Scenario:
    name: str  # as printed
    option: str  # as named in --scenarios
    path: str  # CHAT or RESPONSES
    request: dict[str, Any]


SCENARIOS = (
    Scenario("plain", "plain", CHAT, PLAIN),
    Scenario("stream (TTFB)", "stream", CHAT, {**PLAIN, "stream": True}),
    Scenario("one tool round", "one", CHAT, TOOL_ROUND),
    Scenario("responses plain", "responses-plain", RESPONSES, RESPONSES_PLAIN),
    Scenario("responses stream (TTFB)", "responses-stream", RESPONSES, {**RESPONSES_PLAIN, "stream": True}),
    Scenario("responses one tool round", "responses-one", RESPONSES, RESPONSES_TOOL_ROUND),
)


# --- the servers, each run as `python bench/proxy.py --serve KIND --port P [--upstream URL]` -------------

async def _serve_upstream(port: int) -> None:
    from gateway.demo.agent import FastPolicy
    from gateway.demo.model import ScriptedModel
    from gateway.runtime import serving

    async with serving(ScriptedModel(FastPolicy()).app(), "127.0.0.1", port):
        await asyncio.Event().wait()


async def _serve_floor(port: int, upstream: str) -> None:
    """The least a proxy can do: forward the body to the same path of the upstream, stream the
    answer back."""
    session = aiohttp.ClientSession(auto_decompress=False)

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        async with session.post(upstream + request.path.removeprefix("/v1"), data=body,
                                headers={"Content-Type": "application/json"}) as answer:
            response = web.StreamResponse(status=answer.status,
                                          headers={"Content-Type": answer.headers["Content-Type"]})
            await response.prepare(request)
            async for data in answer.content.iter_any():
                await response.write(data)
            await response.write_eof()
            return response

    app = web.Application()
    app.router.add_post("/v1" + CHAT, forward)
    app.router.add_post("/v1" + RESPONSES, forward)
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
    first_error: str | None  # what the first failed request got


async def _one(session: aiohttp.ClientSession, url: str, body: bytes, stream: bool) -> float:
    """Seconds to the answer (to the first body byte when streamed)."""
    start = time.perf_counter()
    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
        if response.status != 200:
            answer = await response.text()
            raise RuntimeError(f"status {response.status}, body {answer[:1000]}")
        if stream:
            await response.content.readany()
            elapsed = time.perf_counter() - start
            await response.read()
            return elapsed
        await response.read()
        return time.perf_counter() - start


async def _batch(session: aiohttp.ClientSession, url: str, body: bytes, stream: bool, concurrency: int,
                 count: int, seconds: float) -> tuple[list[float], float, list[str]]:
    """`count` requests from `concurrency` workers (or fewer, at the time cap): latencies, wall
    time, and what each failed request got."""
    latencies: list[float] = []
    errors: list[str] = []
    deadline = time.perf_counter() + seconds
    remaining = count

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0 and time.perf_counter() < deadline:
            remaining -= 1
            try:
                latencies.append(await _one(session, url, body, stream))
            except (aiohttp.ClientError, RuntimeError) as error:
                errors.append(str(error) or repr(error))

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, time.perf_counter() - start, errors


async def measure(urls: dict[str, str], bodies: dict[str, bytes], stream: bool, concurrency: int, count: int,
                  blocks: int, seconds: float) -> dict[str, Result]:
    """One round: every target gets `count` requests, in `blocks` short turns taken in rotation,
    so that whatever the machine does meanwhile falls on all targets alike."""
    sessions = {name: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) for name in urls}
    latencies: dict[str, list[float]] = {name: [] for name in urls}
    elapsed = dict.fromkeys(urls, 0.0)
    errors: dict[str, list[str]] = {name: [] for name in urls}
    try:
        for name, url in urls.items():  # warm-up: connections, caches (its failures show in the turns)
            await _batch(sessions[name], url, bodies[name], stream, 1, min(50, count), seconds)
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
        first_error = errors[name][0] if errors[name] else None
        if not found:  # every request failed
            results[name] = Result(0.0, math.nan, math.nan, len(errors[name]), first_error)
            continue
        found.sort()
        p = statistics.quantiles(found, n=100) if len(found) > 1 else found * 99
        results[name] = Result(len(found) / elapsed[name], p[49] * 1000, p[98] * 1000, len(errors[name]),
                               first_error)
    return results


# --- orchestration ----------------------------------------------------------------------------------

def _request_for(target: str, scenario: Scenario) -> dict[str, Any]:
    """What the client sends: a gateway adds the demo tools itself, the others are sent them in the
    shape of the scenario's API."""
    if target in GATEWAYS:
        return scenario.request
    from gateway.demo.tools import demo_registry

    registry = demo_registry()
    tools = registry.responses_tools() if scenario.path == RESPONSES else registry.openai_tools()
    return {**scenario.request, "tools": tools}


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


def _start(kind: str, port: int, upstream: str | None = None, checkout: Path = ROOT) -> subprocess.Popen[bytes]:
    """A server, run by `checkout`'s bench/proxy.py with `checkout` first on PYTHONPATH."""
    args = [sys.executable, str(checkout / "bench" / "proxy.py"), "--serve", kind, "--port", str(port)]
    if upstream:
        args += ["--upstream", upstream]
    # Each server its own trajectory store: two gateways writing one file would wait on its lock.
    store = Path(tempfile.gettempdir()) / f"toolspan-bench-{kind}-{port}.sqlite3"
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


async def run(count: int, seconds: float, repeats: int, blocks: int, scenarios: Sequence[Scenario],
              compare: Path | None) -> None:
    upstream_port, floor_port, toolspan_port = _free_port(), _free_port(), _free_port()
    upstream = f"http://127.0.0.1:{upstream_port}/v1"
    processes = [_start("upstream", upstream_port)]
    processes += [_start("floor", floor_port, upstream), _start("toolspan", toolspan_port, upstream)]
    targets = {"direct": upstream, "floor": f"http://127.0.0.1:{floor_port}/v1",
               "toolspan": f"http://127.0.0.1:{toolspan_port}/v1"}
    if compare is not None:
        before_port = _free_port()
        print(f"before: toolspan from {compare} (its gateway package: {_check_imports(compare)})")
        processes.append(_start("toolspan", before_port, upstream, checkout=compare))
        targets["before"] = f"http://127.0.0.1:{before_port}/v1"
    try:
        for base in targets.values():
            await _wait_ready(base + CHAT)
        print(f"{repeats} rounds per cell; within a round the targets take turns, {blocks} times each; "
              "medians over rounds\n")
        print(f"{'scenario':24} {'conc':>4} {'target':9} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}")
        cells: dict[tuple[str, int], dict[str, list[Result]]] = {}  # (scenario, concurrency) -> rounds
        failures: list[str] = []
        for scenario in scenarios:
            names = [name for name in targets if name != "before" or scenario.path == CHAT]
            urls = {name: targets[name] + scenario.path for name in names}
            bodies = {name: json.dumps(_request_for(name, scenario)).encode() for name in names}
            first_errors: dict[str, str] = {}
            for concurrency in CONCURRENCY:
                rounds: dict[str, list[Result]] = {name: [] for name in names}
                for _ in range(repeats):
                    found = await measure(urls, bodies, bool(scenario.request.get("stream")), concurrency,
                                          count * max(1, concurrency // 5), blocks, seconds)
                    for name, result in found.items():
                        rounds[name].append(result)
                        if result.first_error is not None:
                            first_errors.setdefault(name, result.first_error)
                for name, results in rounds.items():
                    print(f"{scenario.name:24} {concurrency:>4} {name:9} {_median(results, 'rps'):8.0f} "
                          f"{_median(results, 'p50_ms'):8.2f} {_median(results, 'p99_ms'):8.2f} "
                          f"{sum(r.errors for r in results):>6}", flush=True)
                cells[scenario.name, concurrency] = rounds
            failures += [f"{scenario.name}, {name}: POST {urls[name]} {bodies[name].decode()}\n  got {error}"
                         for name, error in first_errors.items()]
        if failures:
            print("\nfirst failure of each target that had some, per scenario:")
            print("\n".join(failures))
        print()
        for scenario in scenarios:
            _verdict(scenario, cells[scenario.name, 10], cells[scenario.name, 1])
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=10)


def _verdict(scenario: Scenario, busy: dict[str, list[Result]], single: dict[str, list[Result]]) -> None:
    """The verdict lines for one scenario, from its rounds at concurrency 10 (`busy`) and 1 (`single`)."""
    targets = scenario.option == "plain"  # the targets are set for the plain Chat request
    _print_median(f"{scenario.name}, concurrency 10: toolspan/floor throughput",
                  _ratios(busy["toolspan"], busy["floor"]), "", "; target >= 0.6" if targets else "")
    _print_median(f"{scenario.name}, concurrency 1: toolspan p50 - direct p50",
                  _added(single["toolspan"], single["direct"]), " ms", "; target <= 1.5 ms" if targets else "")
    _print_median(f"{scenario.name}, concurrency 1: the hop alone, floor p50 - direct p50",
                  _added(single["floor"], single["direct"]), " ms")
    if "before" in busy:
        _print_median(f"{scenario.name}, concurrency 10: toolspan/before throughput",
                      _ratios(busy["toolspan"], busy["before"]), "")
        _print_median(f"{scenario.name}, concurrency 1: toolspan p50 - before p50",
                      _added(single["toolspan"], single["before"]), " ms")


def _ratios(ours: list[Result], theirs: list[Result]) -> list[float]:
    """Per round: our throughput over theirs."""
    return [o.rps / t.rps if t.rps else math.nan for o, t in zip(ours, theirs, strict=True)]


def _added(ours: list[Result], theirs: list[Result]) -> list[float]:
    """Per round: our p50 minus theirs, in ms."""
    return [o.p50_ms - t.p50_ms for o, t in zip(ours, theirs, strict=True)]


def _print_median(label: str, per_round: list[float], unit: str, target: str = "") -> None:
    print(f"{label} = {statistics.median(per_round):.2f}{unit} "
          f"(per round: {', '.join(f'{value:.2f}' for value in per_round)}{target})")


def _median(results: list[Result], field: str) -> float:
    return float(statistics.median(getattr(r, field) for r in results))


def _chosen(names: str) -> list[Scenario]:
    """The scenarios named in --scenarios, in the table's order."""
    wanted = {scenario.option for scenario in SCENARIOS} if names == "all" else set(names.split(","))
    unknown = wanted - {scenario.option for scenario in SCENARIOS}
    if unknown:
        raise ValueError(f"unknown scenario {', '.join(sorted(unknown))}; known: "
                         f"{', '.join(scenario.option for scenario in SCENARIOS)}, all")
    return [scenario for scenario in SCENARIOS if scenario.option in wanted]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=600, help="requests per target per round (x concurrency/5)")
    parser.add_argument("--seconds", type=float, default=5.0, help="time cap per target per round")
    parser.add_argument("--repeats", type=int, default=5, help="rounds per cell")
    parser.add_argument("--blocks", type=int, default=3, help="turns each target takes within a round")
    parser.add_argument("--scenarios", default="plain,stream,one",
                        help="which scenarios, or all (default: the three Chat Completions ones)")
    parser.add_argument("--compare", type=Path, metavar="DIR",
                        help="also measure toolspan from the checkout at DIR (target `before`, Chat scenarios)")
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
        try:
            scenarios = _chosen(options.scenarios)
        except ValueError as error:
            parser.error(str(error))
        if options.compare is not None and not (options.compare / "bench" / "proxy.py").is_file():
            parser.error(f"--compare: no bench/proxy.py in {options.compare}")
        asyncio.run(run(options.requests, options.seconds, options.repeats, options.blocks, scenarios,
                        options.compare))


if __name__ == "__main__":
    main()
