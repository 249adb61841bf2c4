"""Scaling out: `toolspan serve --workers 1` against `--workers 2`, with the state in memory and in
Redis, and what Redis costs per mixed turn, as ratios in one run.

In one run, on loopback: the built-in fast upstream (bench/proxy.py --serve upstream), a
`redis-server` of the bench's own (Debian's package, no persistence) and three gateways, each
started as `python -m gateway serve` from this checkout with the demo tools (no span exporter, so
spans are made and dropped; the trajectory store on, each its own file; no access log):
  memory-1 - one worker, held turns in memory (the default);
  redis-1  - one worker, TOOLSPAN_STATE_URL set;
  redis-2  - `--workers 2`, TOOLSPAN_STATE_URL set.

1. Throughput of a plain Chat request under `wrk -t1 -c10` (a C load generator, Debian package
   `wrk`), the targets taking turns within each round: requests per second, the gateway's CPU per
   request (utime + stime of the supervisor and every worker), and the share of the machine's
   cores that the gateway, wrk and the upstream used. On a 2-core machine, wrk, the upstream and
   two workers compete for two cores, so the workers' figure is informational: the shares say
   how much was left to the gateway.
2. A mixed turn (the model calls the gateway's `echo` and the client's `ask_human`; the gateway
   runs `echo`, holds its part and hands `ask_human` back; the client's follow-up restores it):
   `--turns` turns at concurrency 10 from this process, against memory-1 and redis-1. Reported:
   the gateway's CPU per turn (both requests) and Redis's, the ratio of the two setups, and Redis's
   memory per held turn (used_memory growth / turns held, entries and their recency sets).
3. Redis's memory per trajectory with a failure record (the retry state), written directly
   through the gateway's RedisState.

    python bench/scale.py [--rounds 3] [--seconds 5] [--connections 10] [--turns 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from proxy import PLAIN, ROOT, _free_port, _start, _wait_ready, cpu_seconds, load

CORES = os.cpu_count() or 1
ASK = {"type": "function", "function": {"name": "ask_human", "description": "Ask the user",
                                        "parameters": {"type": "object", "properties": {}}}}
TARGETS = {"memory-1": (1, False), "redis-1": (1, True), "redis-2": (2, True)}


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and all its descendants (a supervisor and its workers)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
            children.setdefault(ppid, []).append(int(entry.name))
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        try:
            total += cpu_seconds(current)
        except OSError:
            continue
        todo.extend(children.get(current, []))
    return total


class Redis:
    """A redis-server of the bench's own, without persistence."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if "Ready to accept connections" in line:
                break
        else:
            raise RuntimeError("redis-server did not start")

    def used_memory(self) -> int:
        info = subprocess.run(["redis-cli", "-p", str(self.port), "info", "memory"], capture_output=True, text=True,
                              check=True).stdout
        return int(next(line for line in info.splitlines() if line.startswith("used_memory:")).split(":")[1])


@dataclass
class Run:
    requests: int
    seconds: float
    gateway_cpu: float
    wrk_cpu: float
    upstream_cpu: float

    def share(self, cpu: float) -> float:
        return cpu / (self.seconds * CORES)


@dataclass
class Target:
    name: str
    workers: int
    redis: bool
    process: subprocess.Popen[bytes]
    url: str
    runs: list[Run] = field(default_factory=list)


def start_gateway(name: str, workers: int, state_url: str | None, upstream: str) -> Target:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOOLSPAN_ACCESS_LOG": "false", "TOOLSPAN_LOG_LEVEL": "warning",
           "TOOLSPAN_TRAJECTORY_STORE_PATH": str(Path(tempfile.gettempdir()) / f"toolspan-scale-{name}-{port}.db")}
    env.pop("TOOLSPAN_STATE_URL", None)
    if state_url is not None:
        env["TOOLSPAN_STATE_URL"] = state_url
    args = [sys.executable, "-m", "gateway", "serve", "--port", str(port), "--upstream", upstream,
            "--tools", "gateway.demo.tools:demo_registry"]
    if workers > 1:
        args += ["--workers", str(workers)]
    process = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL)
    return Target(name, workers, state_url is not None, process, f"http://127.0.0.1:{port}")


def throughput(target: Target, upstream_pid: int, seconds: int, connections: int) -> Run:
    url, body = f"{target.url}/v1/chat/completions", json.dumps(PLAIN).encode()
    load(url, body, 1, connections)  # warm-up
    gateway, upstream = tree_cpu(target.process.pid), cpu_seconds(upstream_pid)
    run = load(url, body, seconds, connections)
    return Run(run.requests, run.seconds, tree_cpu(target.process.pid) - gateway, run.wrk_cpu,
               cpu_seconds(upstream_pid) - upstream)


async def mixed_turns(url: str, turns: int, concurrency: int = 10) -> None:
    """`turns` mixed turns, each a request and its follow-up, `concurrency` at a time."""
    question = [{"role": "user", "content": "please ask me"}]
    queue = iter(range(turns))

    async def one(session: aiohttp.ClientSession) -> None:
        for _ in queue:
            async with session.post(f"{url}/v1/chat/completions",
                                    json={"model": "bench", "messages": question, "tools": [ASK]}) as answer:
                message = (await answer.json())["choices"][0]["message"]
            [call] = message["tool_calls"]
            follow_up = [*question, {"role": "assistant", "content": message.get("content"), "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": call["id"], "content": "Paris"}]
            async with session.post(f"{url}/v1/chat/completions",
                                    json={"model": "bench", "messages": follow_up, "tools": [ASK]}) as answer:
                if answer.status != 200 or (await answer.json())["choices"][0]["message"]["content"] != "done":
                    raise RuntimeError(f"{url}: the follow-up got {answer.status}: {await answer.text()}")

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(one(session) for _ in range(concurrency)))


def mixed_turn_cost(target: Target, redis: Redis, turns: int) -> tuple[float, float, float]:
    """(gateway CPU µs per turn, Redis CPU µs per turn, Redis bytes per held turn)."""
    asyncio.run(mixed_turns(target.url, 20))  # warm-up
    memory = redis.used_memory()
    gateway, server = tree_cpu(target.process.pid), cpu_seconds(redis.process.pid)
    asyncio.run(mixed_turns(target.url, turns))
    gateway_cpu = (tree_cpu(target.process.pid) - gateway) / turns * 1e6
    redis_cpu = (cpu_seconds(redis.process.pid) - server) / turns * 1e6
    return gateway_cpu, redis_cpu, (redis.used_memory() - memory) / turns


async def failure_record_bytes(redis: Redis, count: int = 10_000) -> float:
    """Redis's memory per trajectory holding one failure record, written through RedisState."""
    from gateway.state import RedisState

    store = RedisState(redis.url, 1000, 900.0, 2.0, prefix="bench-failures:")
    before = redis.used_memory()
    record = f"{'0' * 32} {'0' * 16} 01 {'0' * 64} 0"  # the shape telemetry.trajectory writes
    try:
        for n in range(count):
            await store.failures.remember_failure("a-gateway-key", f"trajectory-{n:08d}", "read_file", record)
    finally:
        await store.aclose()
    return (redis.used_memory() - before) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=10)
    parser.add_argument("--turns", type=int, default=1000)
    options = parser.parse_args()
    for program in ("wrk", "redis-server", "redis-cli"):
        if shutil.which(program) is None:
            sys.exit(f"bench/scale.py needs {program} (apt-get install wrk redis-server)")
    redis = Redis()
    upstream_port = _free_port()
    upstream = f"http://127.0.0.1:{upstream_port}/v1"
    upstream_process = _start("upstream", upstream_port)
    targets = [start_gateway(name, workers, redis.url if in_redis else None, upstream)
               for name, (workers, in_redis) in TARGETS.items()]
    try:
        for url in [upstream.removesuffix("/v1"), *(t.url for t in targets)]:
            asyncio.run(_wait_ready(f"{url}/v1/chat/completions"))
        for round_ in range(options.rounds):
            order = targets[round_ % len(targets):] + targets[:round_ % len(targets)]
            for target in order:
                target.runs.append(throughput(target, upstream_process.pid, options.seconds, options.connections))
            print(f"round {round_ + 1}: " + ", ".join(
                f"{t.name} {t.runs[-1].requests / t.runs[-1].seconds:.0f} req/s" for t in targets), flush=True)
        costs = {t.name: mixed_turn_cost(t, redis, options.turns) for t in targets if t.workers == 1}
        record_bytes = asyncio.run(failure_record_bytes(redis))
    finally:
        for process in [upstream_process, *(t.process for t in targets)]:
            process.terminate()
        for process in [upstream_process, *(t.process for t in targets)]:
            process.wait(timeout=30)
        redis.process.terminate()
        redis.process.wait(timeout=10)
    report(targets, costs, record_bytes, options)


def report(targets: list[Target], costs: dict[str, tuple[float, float, float]], record_bytes: float,
           options: argparse.Namespace) -> None:
    def median(values: list[float]) -> float:
        return statistics.median(values)

    print(f"\nPlain Chat request, wrk -t1 -c{options.connections}, {options.seconds} s per run, medians of "
          f"{options.rounds} rounds, {CORES} cores:")
    print(f"{'target':<10} {'req/s':>7} {'CPU/req':>9} {'gateway':>8} {'wrk':>6} {'upstream':>9}")
    rates = {t.name: [r.requests / r.seconds for r in t.runs] for t in targets}
    for t in targets:
        print(f"{t.name:<10} {median(rates[t.name]):>7.0f} "
              f"{median([r.gateway_cpu / r.requests * 1e6 for r in t.runs]):>7.0f} µs "
              f"{median([r.share(r.gateway_cpu) for r in t.runs]):>7.0%} "
              f"{median([r.share(r.wrk_cpu) for r in t.runs]):>6.0%} "
              f"{median([r.share(r.upstream_cpu) for r in t.runs]):>8.0%}")
    print("(shares: CPU time over wall time x cores, so 100% is the whole machine)")

    def ratio(ours: str, theirs: str) -> str:
        per_round = [a / b for a, b in zip(rates[ours], rates[theirs], strict=True)]
        return f"{median(per_round):.2f} (per round: {', '.join(f'{r:.2f}' for r in per_round)})"

    print(f"throughput redis-1 / memory-1: {ratio('redis-1', 'memory-1')}")
    print(f"throughput redis-2 / redis-1:  {ratio('redis-2', 'redis-1')}  (informational on {CORES} cores)")
    memory, in_redis = costs["memory-1"], costs["redis-1"]
    print(f"\nMixed turn (request + follow-up), {options.turns} turns at concurrency 10:")
    print(f"  memory-1: gateway {memory[0]:.0f} µs CPU per turn")
    print(f"  redis-1:  gateway {in_redis[0]:.0f} µs + redis-server {in_redis[1]:.0f} µs CPU per turn, "
          f"{in_redis[2]:.0f} bytes of Redis memory per held turn")
    print(f"  Redis cost per mixed turn: {(in_redis[0] + in_redis[1]) / memory[0]:.2f} x the memory store's CPU "
          f"(+{in_redis[0] + in_redis[1] - memory[0]:.0f} µs, of which {in_redis[0] - memory[0]:.0f} µs in the "
          f"gateway)")
    print(f"Redis memory per trajectory with one failure record: {record_bytes:.0f} bytes")
    print(json.dumps({"rates": rates, "costs": costs, "record_bytes": record_bytes}))


if __name__ == "__main__":
    main()
