"""`/healthz` while requests read garbage out of Redis (issue 32), against the same load reading
what the gateway wrote.

In one run, on loopback: a `redis-server` of the bench's own (no persistence), the built-in fast
upstream (bench/proxy.py --serve upstream) and one gateway (`python -m gateway serve`, this
checkout, the demo tools, TOOLSPAN_STATE_URL set). One mixed turn is held; its key in Redis is then
overwritten with each kind of garbage in turn (a value that is not JSON, one of 200,000 brackets
nested, a list where a string was written), and for --seconds the follow-up that needs that turn
is sent in a loop at --concurrency, each getting a 409 turn_not_held. A last phase runs whole mixed
turns (held, then followed up: 200) at the same concurrency, for the baseline. Throughout, a
`HealthzProbe` (bench/healthz_probe.py) on its own thread asks `/healthz` every 10 ms.

Reported per phase: the statuses, requests per second, `/healthz` p50/p99/max, and whether the
gateway counted each garbage read (toolspan_state_store_unreadable_total{kind="turn"} against the
409s) and answered no 500.

    python bench/faults_redis.py [--seconds 5] [--concurrency 10]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import re
import shutil
import sys
import time
from typing import Any

import aiohttp
from healthz_probe import HealthzProbe
from proxy import _free_port, _start, _wait_ready
from redis.asyncio import Redis as RedisClient
from scale import ASK, Redis, start_gateway

QUESTION = [{"role": "user", "content": "please ask me"}]
GARBAGE: dict[str, bytes | None] = {"not-json": b"{not json", "deep": b"[" * 200_000, "wrong-type": None}
UNREADABLE = re.compile(r'^toolspan_state_store_unreadable_total\{kind="turn"\} (\S+)$', re.MULTILINE)


async def mixed_turn(session: aiohttp.ClientSession, url: str) -> list[dict[str, Any]]:
    """One mixed turn held by the gateway; the follow-up conversation that needs it."""
    async with session.post(f"{url}/v1/chat/completions",
                            json={"model": "bench", "messages": QUESTION, "tools": [ASK]}) as answer:
        message = (await answer.json())["choices"][0]["message"]
    [call] = message["tool_calls"]
    return [*QUESTION, {"role": "assistant", "content": message.get("content"), "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "Paris"}]


async def unreadable_turns(session: aiohttp.ClientSession, url: str) -> float:
    async with session.get(f"{url}/metrics") as page:
        found = UNREADABLE.search(await page.text())
    return float(found.group(1)) if found else 0.0


async def spoil(redis_url: str, garbage: bytes | None) -> None:
    """Every held turn's key overwritten with `garbage` (None: made a list)."""
    client = RedisClient.from_url(redis_url)
    try:
        async for key in client.scan_iter("toolspan:turn:*"):
            if garbage is None:
                await client.delete(key)
                await client.rpush(key, "garbage")
            else:
                await client.set(key, garbage, px=900_000)
    finally:
        await client.aclose()


async def loop(url: str, seconds: float, concurrency: int,
               follow_up: list[dict[str, Any]] | None) -> collections.Counter[int]:
    """For `seconds`, `concurrency` clients each sending, one after another, the follow-up (or,
    without one, whole mixed turns); the statuses they got."""
    statuses: collections.Counter[int] = collections.Counter()
    deadline = time.monotonic() + seconds

    async def client(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < deadline:
            messages = follow_up if follow_up is not None else await mixed_turn(session, url)
            async with session.post(f"{url}/v1/chat/completions",
                                    json={"model": "bench", "messages": messages, "tools": [ASK]}) as answer:
                await answer.read()
                statuses[answer.status] += 1

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
    return statuses


async def phase(url: str, redis_url: str, name: str, options: argparse.Namespace) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        follow_up = None
        if name in GARBAGE:
            follow_up = await mixed_turn(session, url)
            await spoil(redis_url, GARBAGE[name])
        counted = await unreadable_turns(session, url)
        with HealthzProbe(url) as probe:
            statuses = await loop(url, options.seconds, options.concurrency, follow_up)
        counted = await unreadable_turns(session, url) - counted
    return {"phase": name, "statuses": dict(statuses), "rps": round(sum(statuses.values()) / options.seconds),
            "counted_unreadable": counted, "healthz": probe.summary()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=10)
    options = parser.parse_args()
    if shutil.which("redis-server") is None:
        sys.exit("bench/faults_redis.py needs redis-server (apt-get install redis-server)")
    redis = Redis()
    upstream_port = _free_port()
    upstream_process = _start("upstream", upstream_port)
    target = start_gateway("garbage", 1, redis.url, f"http://127.0.0.1:{upstream_port}/v1")
    results = []
    try:
        for url in (f"http://127.0.0.1:{upstream_port}", target.url):
            asyncio.run(_wait_ready(f"{url}/v1/chat/completions"))
        for name in [*GARBAGE, "baseline"]:
            results.append(asyncio.run(phase(target.url, redis.url, name, options)))
            print(json.dumps(results[-1]), flush=True)
    finally:
        for process in (upstream_process, target.process, redis.process):
            process.terminate()
        for process in (upstream_process, target.process, redis.process):
            process.wait(timeout=30)
    print(f"\n/healthz every 10 ms while {options.concurrency} clients send requests for {options.seconds:g} s:")
    print(f"{'phase':<11} {'req/s':>6} {'statuses':<18} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7}  counted")
    for result in results:
        health, statuses = result["healthz"], result["statuses"]
        counted = "" if result["phase"] == "baseline" else (
            "each 409" if result["counted_unreadable"] == statuses.get(409, 0) else f"{result['counted_unreadable']:g}")
        print(f"{result['phase']:<11} {result['rps']:>6} {json.dumps(statuses):<18} {health['p50_ms']:>7} "
              f"{health['p99_ms']:>7} {health['max_ms']:>7}  {counted}")
    if any(500 in r["statuses"] for r in results):
        sys.exit("a request got a 500")


if __name__ == "__main__":
    main()
