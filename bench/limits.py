"""What the limits of gateway keys (issue 58) cost a plain request: CPU per request of a plain Chat
Completions request (not streamed) through a gateway key without limits, with limits counted in
the gateway's memory, and with the same limits counted in Redis, as ratios in one run.

In one run, on loopback: the built-in fast upstream (bench/proxy.py --serve upstream), a
`redis-server` of the bench's own (Debian's package, no persistence), and one gateway process a
target, each served by this script as bench/proxy.py serves its `toolspan` target (the demo tools,
telemetry on, spans through a BatchSpanProcessor to an exporter that drops them, metrics, the
trajectory store on its own file, no access log), every one with the same gateway key:
  keys        the key and no limit: the baseline;
  memory      the key with LIMITS (requests and tokens per minute, tokens and money per day, a price
              for the bench's model), counted in the gateway's memory;
  redis-keys  the key and no limit, `state_url` set (the gateway's shared state in Redis): the
              baseline of the next;
  redis       the key with LIMITS, `state_url` set: counted in Redis.
Every bound is far above what a run reaches, so nothing is refused: a refusal fails the run.

Before measuring, each target answers once and is checked: 200, "ok", and the quota headers on
the answer exactly where limits are set; then, over 100 requests one at a time, Redis's MONITOR
tells what each asked of Redis: the commands the gateway sent, and those its scripts ran inside
Redis (the redis target must ask more than redis-keys: else its limits are not in Redis); then
each is loaded for WARM_UP_SECONDS unmeasured. At the end, what Redis holds of the limits.

Method (bench/proxy.py's): wrk, one thread, 10 connections for --seconds: requests per second and
the CPU per request of the target's process (utime + stime, all its threads) and of redis-server
over the same run, divided by the requests answered; then one connection for --c1-seconds: the
p50 latency. Every round measures every target, their order rotating. Reported: medians of
per-round values, and the medians of per-round ratios and differences, each round's beside them.

    python bench/limits.py [--rounds 5] [--seconds 3] [--c1-seconds 1] [--targets keys,memory,redis-keys,redis]
    python bench/limits.py --instructions [--seconds 5] [--targets ...]

With the defaults it takes about two minutes. --instructions counts instead, as bench/instructions.py
does, the instructions each target executes per request under callgrind (valgrind), one target at
a time: a figure that does not move with the machine's load (some minutes a target).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ modules, as when run as a script
from instructions import READY_SECONDS, _control, _instructions
from proxy import CHAT, PLAIN, ROOT, TICKS, _free_port, _need_wrk, _start, _wait_ready, cpu_seconds, load, need_program
from redis import Redis as RedisClient
from scale import Redis

KEY_NAME = "bench"
SECRET = "bench-key-for-limits"
AUTHORIZATION = {"Authorization": f"Bearer {SECRET}"}
# Far above what any run reaches, so that nothing is refused: every check goes all the way (found,
# counted, its headers written) as it does for a key well within its limits.
LIMITS = {"requests_per_minute": 1_000_000_000, "tokens_per_minute": 1_000_000_000_000,
          "tokens_per_day": 1_000_000_000_000, "budget_per_day": 1_000_000.0}
PRICES = {"bench": {"input": 2.5, "output": 10.0}}  # per million tokens; the bench's model
TARGETS = ("keys", "memory", "redis-keys", "redis")
LIMITED = {"memory", "redis"}
# What the limits cost in memory, in Redis (both against a baseline of the same state), in Redis
# against memory's baseline, and what state_url alone costs a plain request.
PAIRS = (("memory", "keys"), ("redis", "redis-keys"), ("redis", "keys"), ("redis-keys", "keys"))
QUOTA_HEADER = "x-ratelimit-remaining-requests"
BUSY = 10  # connections of the CPU runs
WARM_UP_SECONDS = 2
COUNTED_REQUESTS = 100  # one at a time, for what a request asks of Redis


# --- the servers, each run as `python bench/limits.py --serve TARGET --port P --upstream URL [--state-url URL]` --

def settings_of(target: str, port: int, upstream: str, state_url: str | None) -> dict[str, Any]:
    """The settings of `target`'s gateway, as keyword arguments of Settings."""
    key: dict[str, Any] = {"key": SECRET, **(LIMITS if target in LIMITED else {})}
    found: dict[str, Any] = {"port": port, "upstream": upstream, "keys": {KEY_NAME: key}}
    if target in LIMITED:
        found["prices"] = PRICES
    if target.startswith("redis"):
        found["state_url"] = state_url
    return found


async def _serve_gateway(target: str, port: int, upstream: str, state_url: str | None) -> None:
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from tool_pipeline import DropExporter

    from gateway.demo.tools import demo_registry
    from gateway.runtime.process import gateway, settle_garbage_collector
    from gateway.settings.model import Settings

    settings = Settings(**settings_of(target, port, upstream, state_url))
    async with gateway(settings, demo_registry(), processors=[BatchSpanProcessor(DropExporter())]):
        settle_garbage_collector()  # as `toolspan serve` does
        await asyncio.Event().wait()


def _start_gateway(target: str, upstream: str, state_url: str, stores: Path,
                   wrapper: Sequence[str] = ()) -> tuple[subprocess.Popen[bytes], int]:
    """`target`'s gateway on a port of its own (the port returned), its trajectory store in
    `stores`, under `wrapper` (callgrind) if given; no TOOLSPAN_* variable of the bench's own
    environment passed on. Python's hash seed fixed, as bench/instructions.py fixes it."""
    port = _free_port()
    args = [*wrapper, sys.executable, str(Path(__file__).resolve()), "--serve", target, "--port", str(port),
            "--upstream", upstream, "--state-url", state_url]
    env = {name: value for name, value in os.environ.items() if not name.startswith("TOOLSPAN_")}
    env.update({"PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "0",
                "TOOLSPAN_TRAJECTORY_STORE_PATH": str(stores / f"{target}.sqlite3")})
    quiet = subprocess.DEVNULL if wrapper else None  # callgrind's own lines; a gateway's errors show
    return subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=quiet), port


# --- checks -----------------------------------------------------------------------------------------------

def ask(url: str) -> tuple[int, dict[str, str], bytes]:
    """One plain request with the key: its status, headers (lower-cased names) and body."""
    host, _, rest = url.removeprefix("http://").partition("/")
    connection = http.client.HTTPConnection(host, timeout=30)
    try:
        connection.request("POST", "/" + rest, json.dumps(PLAIN).encode(),
                           {"Content-Type": "application/json", **AUTHORIZATION})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def check(target: str, url: str) -> None:
    """The target answers "ok", with the quota headers exactly when it has limits."""
    status, headers, body = ask(url)
    if status != 200:
        raise RuntimeError(f"{target}: status {status}: {body[:1000]!r}")
    said = json.loads(body)["choices"][0]["message"]["content"]
    if said != "ok":
        raise RuntimeError(f"{target}: answered {said!r}, expected 'ok'")
    if (QUOTA_HEADER in headers) != (target in LIMITED):
        raise RuntimeError(f"{target}: {QUOTA_HEADER} {'missing' if target in LIMITED else 'present'} on the answer")


@dataclass(frozen=True)
class Traffic:
    """What a plain request of one target asks of Redis, a request."""

    sent: dict[str, float]  # the commands the gateway sent, by name (a pipeline sends several at once)
    scripted: float  # the commands its Lua scripts ran inside Redis

    def __str__(self) -> str:
        sent = ", ".join(f"{name} {count:.2f}" for name, count in sorted(self.sent.items()))
        return f"sent {sum(self.sent.values()):.1f} ({sent}); {self.scripted:.1f} more run by its scripts"


def redis_traffic(target: str, url: str, redis: RedisClient) -> Traffic:
    """What Redis was asked while `target` answered COUNTED_REQUESTS plain requests one at a time,
    read from MONITOR (which tells a client's commands from those a script runs) up to an ECHO
    this sends once they are answered."""
    done = f"bench-counted-{target}"
    sent: collections.Counter[str] = collections.Counter()
    scripted = 0
    with redis.monitor() as monitor:  # type: ignore[no-untyped-call]
        for _ in range(COUNTED_REQUESTS):
            status, _, body = ask(url)
            if status != 200:
                raise RuntimeError(f"{target}: status {status}: {body[:1000]!r}")
        redis.echo(done)
        for command in monitor.listen():
            name = command["command"].split(" ", 1)[0].lower()
            if name == "echo" and done in command["command"]:
                break
            if command["client_type"] == "lua":
                scripted += 1
            else:
                sent[name] += 1
    return Traffic({name: count / COUNTED_REQUESTS for name, count in sent.items()}, scripted / COUNTED_REQUESTS)


def redis_held(redis: RedisClient) -> str:
    """What Redis holds of the limits (its keys named `...limit:...`), and in all."""
    found = list(redis.scan_iter(match="*limit:*", count=1000))
    size = sum(int(redis.memory_usage(key) or 0) for key in found)
    used = int(redis.info("memory")["used_memory"])
    return (f"Redis at the end: {len(found)} keys of the limits, {size / 1024:,.0f} KiB by MEMORY USAGE; "
            f"used_memory {used / 2**20:.1f} MiB")


# --- measuring --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sample:
    """One target in one round."""

    rps: float  # at concurrency 10
    cpu_us: float  # the gateway process's CPU per request, at concurrency 10
    kernel_us: float  # of which in the kernel (stime): its sockets' work, loopback's delivery included
    redis_us: float  # redis-server's CPU per request over the same run
    p50_1_ms: float  # at concurrency 1


@dataclass
class Target:
    name: str
    process: subprocess.Popen[bytes]
    url: str  # of its Chat Completions route


def kernel_seconds(pid: int) -> float:
    """stime of a process (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[12]) / TICKS


def sample(target: Target, redis_pid: int, seconds: int, single_seconds: int) -> Sample:
    body, pid = json.dumps(PLAIN).encode(), target.process.pid
    cpu, kernel, redis_cpu = cpu_seconds(pid), kernel_seconds(pid), cpu_seconds(redis_pid)
    busy = load(target.url, body, seconds, BUSY, AUTHORIZATION)
    cpu, kernel = cpu_seconds(pid) - cpu, kernel_seconds(pid) - kernel
    redis_cpu = cpu_seconds(redis_pid) - redis_cpu
    single = load(target.url, body, single_seconds, 1, AUTHORIZATION)
    per = 1e6 / busy.requests
    return Sample(busy.requests / busy.seconds, cpu * per, kernel * per, redis_cpu * per, single.p50_ms)


Results = dict[str, list[Sample]]  # target name -> one Sample per round


def measure(targets: list[Target], redis_pid: int, rounds: int, seconds: int, single_seconds: int) -> Results:
    body = json.dumps(PLAIN).encode()
    for target in targets:  # unmeasured: a process's first thousand requests cost more than the rest
        load(target.url, body, WARM_UP_SECONDS, BUSY, AUTHORIZATION)
    results: Results = {target.name: [] for target in targets}
    for round_ in range(rounds):
        shift = round_ % len(targets)  # each target goes first in turn
        for target in targets[shift:] + targets[:shift]:
            results[target.name].append(sample(target, redis_pid, seconds, single_seconds))
        print(f"round {round_ + 1}: " + ", ".join(f"{name} {found[-1].cpu_us:.0f} µs {found[-1].rps:.0f}/s"
                                                  for name, found in results.items()), flush=True)
    return results


def _stop(process: subprocess.Popen[Any], seconds: float) -> None:
    process.terminate()
    try:
        process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@dataclass
class Backends:
    """What every target shares: the upstream, a redis-server and a client of it, a folder."""

    upstream: str  # its /v1 URL
    redis: Redis
    client: RedisClient
    folder: Path


@contextmanager
def backends() -> Iterator[Backends]:
    """The upstream and a redis-server of the bench's own, stopped on the way out."""
    with ExitStack() as stack:
        redis = Redis()
        stack.callback(_stop, redis.process, 30)
        upstream_port = _free_port()
        stack.callback(_stop, _start("upstream", upstream_port), 30)
        client = stack.enter_context(RedisClient.from_url(redis.url))
        folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="toolspan-bench-limits-"))
        yield Backends(f"http://127.0.0.1:{upstream_port}/v1", redis, client, Path(folder))


def _checked_redis(traffic: dict[str, Traffic]) -> None:
    """Raises when the redis target asks Redis what redis-keys does: its limits are elsewhere."""
    if {"redis", "redis-keys"} <= traffic.keys() and traffic["redis"] == traffic["redis-keys"]:
        raise RuntimeError(f"the redis target asked Redis what redis-keys did ({traffic['redis']}): its limits "
                           f"are not in Redis")


def run(chosen: Sequence[str], rounds: int, seconds: int, single_seconds: int) -> None:
    with backends() as shared:
        targets: list[Target] = []
        try:
            for name in chosen:
                process, port = _start_gateway(name, shared.upstream, shared.redis.url, shared.folder)
                targets.append(Target(name, process, f"http://127.0.0.1:{port}/v1{CHAT}"))
            for target in targets:
                asyncio.run(_wait_ready(target.url, headers=AUTHORIZATION))
                check(target.name, target.url)
            traffic = {target.name: redis_traffic(target.name, target.url, shared.client) for target in targets}
            _checked_redis(traffic)
            results = measure(targets, shared.redis.process.pid, rounds, seconds, single_seconds)
            held = redis_held(shared.client)
        finally:
            for target in targets:
                _stop(target.process, 30)
    report(results, traffic, rounds, seconds, single_seconds)
    print(f"\n{held}")


def instructions_of(name: str, shared: Backends, seconds: int) -> tuple[float, Traffic]:
    """`name`'s gateway under callgrind: the instructions it executes per plain request under wrk at
    10 connections over `seconds` (all its threads; bench/instructions.py's method), and what a
    request asks of Redis."""
    body, own = json.dumps(PLAIN).encode(), shared.folder / name
    own.mkdir()
    callgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={own / name}.out", "--dump-instr=no"]
    process, port = _start_gateway(name, shared.upstream, shared.redis.url, own, callgrind)
    url = f"http://127.0.0.1:{port}/v1{CHAT}"
    try:
        asyncio.run(_wait_ready(url, READY_SECONDS, AUTHORIZATION))
        check(name, url)
        traffic = redis_traffic(name, url, shared.client)
        load(url, body, WARM_UP_SECONDS + 1, BUSY, AUTHORIZATION)
        dumps = set(own.glob(f"{name}.out*"))
        _control("-z", process.pid)
        counted = load(url, body, seconds, BUSY, AUTHORIZATION)
        _control("-d", process.pid)
        [dump] = set(own.glob(f"{name}.out*")) - dumps
    finally:
        _stop(process, 120)
    found = _instructions(dump) / counted.requests
    print(f"{name}: {found / 1000:.0f} thousand instructions a request "
          f"({counted.requests / counted.seconds:.0f} requests a second under callgrind)", flush=True)
    return found, traffic


def count_instructions(chosen: Sequence[str], seconds: int) -> None:
    """Each target in turn under callgrind: its instructions per request, and the ratios."""
    need_program("valgrind", "`sudo apt-get install valgrind`")
    with backends() as shared:
        found = {name: instructions_of(name, shared, seconds) for name in chosen}
    _checked_redis({name: traffic for name, (_, traffic) in found.items()})
    counts = {name: count for name, (count, _) in found.items()}
    print()
    for ours, theirs in PAIRS:
        if ours in counts and theirs in counts:
            print(f"{ours}/{theirs}: {counts[ours] / counts[theirs]:.3f} "
                  f"({(counts[ours] - counts[theirs]) / 1000:+.0f} thousand instructions a request)")


# --- the report -------------------------------------------------------------------------------------------

def _median(samples: list[Sample], field: str) -> float:
    return float(statistics.median(getattr(s, field) for s in samples))


def _line(label: str, per_round: list[float], form: str) -> str:
    rounds = " ".join(form.format(value) for value in per_round)
    return f"  {label:<46} {form.format(statistics.median(per_round)):>9}  [{rounds}]"


def report(results: Results, traffic: dict[str, Traffic], rounds: int, seconds: int, single_seconds: int) -> None:
    print(f"\nPlain Chat request, not streamed. Medians of {rounds} round(s); wrk -t1 -c{BUSY} for {seconds} s "
          f"(req/s, CPU per request of the gateway and of redis-server), then -c1 for {single_seconds} s (p50); "
          f"what Redis was asked, a request, over {COUNTED_REQUESTS} requests one at a time.\n")
    print("| target | req/s | gateway CPU/req | of it in the kernel | Redis CPU/req | p50, c=1 "
          "| Redis commands sent/req |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, samples in results.items():
        cells = [f"{_median(samples, 'rps'):.0f}", *(f"{_median(samples, field):.0f} µs"
                                                      for field in ("cpu_us", "kernel_us", "redis_us")),
                 f"{_median(samples, 'p50_1_ms'):.2f} ms", f"{sum(traffic[name].sent.values()):.1f}"]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print()
    for name, found in traffic.items():
        print(f"{name}, Redis a request: {found}")
    print("\nThe limits' cost (medians of per-round values; per round in brackets):")
    for line in splits(results):
        print(line)


def splits(results: Results) -> list[str]:
    """The ratios and differences the targets present allow."""
    def per_round(of: Callable[[Sample, Sample], float], ours: str, theirs: str) -> list[float]:
        return [of(a, b) for a, b in zip(results[ours], results[theirs], strict=True)]

    def cpu(a: Sample, b: Sample) -> float:
        return a.cpu_us / b.cpu_us

    lines: list[str] = []
    for ours, theirs in PAIRS:
        if ours in results and theirs in results:
            lines += [_line(f"{ours}/{theirs}, gateway CPU per request", per_round(cpu, ours, theirs), "{:.2f}"),
                      _line(f"{ours} - {theirs}, gateway CPU per request",
                            per_round(lambda a, b: a.cpu_us - b.cpu_us, ours, theirs), "{:+.0f} µs"),
                      _line(f"{ours} - {theirs}, p50 at c=1",
                            per_round(lambda a, b: a.p50_1_ms - b.p50_1_ms, ours, theirs), "{:+.2f} ms")]
    if "redis" in results and "redis-keys" in results:
        lines.append(_line("redis/redis-keys, gateway + Redis CPU per request",
                           per_round(lambda a, b: (a.cpu_us + a.redis_us) / (b.cpu_us + b.redis_us),
                                     "redis", "redis-keys"), "{:.2f}"))
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=3, help="length of each run at concurrency 10")
    parser.add_argument("--c1-seconds", type=int, default=1, help="length of each run at concurrency 1")
    parser.add_argument("--targets", default=",".join(TARGETS), help=f"comma-separated, of {','.join(TARGETS)}")
    parser.add_argument("--instructions", action="store_true",
                        help="instead: each target in turn under callgrind, instructions per request over --seconds")
    parser.add_argument("--serve", choices=TARGETS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    parser.add_argument("--state-url", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.serve is not None:
        from gateway.runtime.process import run as serve  # on the event loop `toolspan serve` uses

        serve(_serve_gateway(options.serve, options.port, str(options.upstream), options.state_url))
        return
    chosen = options.targets.split(",")
    if unknown := set(chosen) - set(TARGETS):
        parser.error(f"unknown target {', '.join(sorted(unknown))}")
    _need_wrk()
    # Stopped by SIGTERM as by Ctrl-C: the servers it started are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))
    if options.instructions:
        count_instructions(chosen, options.seconds)
    else:
        run(chosen, options.rounds, options.seconds, options.c1_seconds)


if __name__ == "__main__":
    main()
