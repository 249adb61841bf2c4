"""The provider's SSE reader and the faults of issue 32 items 5-7, measured (run by hand, not in CI).

1. The reader alone (gateway.provider.sse.sse_events, this checkout's or the one first on PYTHONPATH):
   the event-loop CPU to read one event of 1, 4 and 15 MiB given in reads of 16 KiB (a TLS
   record) and of 256 KiB (asyncio's largest read), the best of --repeat runs. Linear means its
   cost per MiB stays flat: the ratio per doubling of the size is printed (1.0 is flat).
2. One gateway (`python -m gateway serve`, the demo tools) in front of a provider of this bench's
   own, a raw asyncio server on loopback, while a `HealthzProbe` (bench/healthz_probe.py) asks
   `/healthz` every 10 ms:
   - big-event: a streamed answer whose one event is 15 MiB, written in 16 KiB writes, 1 ms apart
     (so that the gateway reads it 16 KiB at a time), --big times, one after another;
   - deep / deep-stream: for --seconds at --concurrency, answers whose tool call's `arguments`
     are an object nested 300 levels deep (plain, and as one stream event): each a 502;
   - baseline: plain answers at the same concurrency, for comparison;
   - burst: --burst requests at once, each answered after 1 s; the gateway process's open
     descriptors before, right after, and once TOOLSPAN_UPSTREAM_IDLE_SECONDS (--idle) has passed.

    python bench/sse_reader.py [--repeat 3] [--seconds 5] [--concurrency 10] [--big 3] [--burst 300] [--idle 5]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from healthz_probe import HealthzProbe
from scale import start_gateway

from gateway.provider.sse import sse_events

MIB = 1024 * 1024
SIZES = (1, 4, 15)
READS = (16 * 1024, 256 * 1024)


def event_of(size: int) -> bytes:
    """One SSE event of `size` bytes: a chat chunk whose content fills it."""
    head, tail = b'data: {"choices": [{"index": 0, "delta": {"content": "', b'"}}]}\n\n'
    return head + b"x" * (size - len(head) - len(tail)) + tail


async def read_all(event: bytes, read_size: int) -> float:
    """CPU seconds to read `event` through the reader, given in `read_size` reads."""
    async def reads() -> AsyncIterator[bytes]:
        for start in range(0, len(event), read_size):
            yield event[start:start + read_size]

    began = time.process_time()
    async for decoded in sse_events(reads()):
        assert decoded["choices"]
    return time.process_time() - began


def reader_curve(repeat: int) -> None:
    print("reader: event-loop CPU for one event (best of", repeat, "runs)")
    print(f"{'read':>8} {'MiB':>4} {'ms':>8} {'ms/MiB':>7} {'per doubling':>13}")
    for read_size in READS:
        previous: tuple[int, float] | None = None
        for mib in SIZES:
            event = event_of(mib * MIB)
            cost = min(asyncio.run(read_all(event, read_size)) for _ in range(repeat))
            ratio = ""
            if previous is not None:  # the per-MiB cost's growth, per doubling of the size
                per_mib = (cost / mib) / (previous[1] / previous[0])
                ratio = f"{per_mib ** (1 / math.log2(mib / previous[0])):.2f}x"
            print(f"{read_size // 1024:>6}Ki {mib:>4} {cost * 1000:>8.1f} {cost * 1000 / mib:>7.1f} {ratio:>13}")
            previous = (mib, cost)


# --- a provider of the bench's own ----------------------------------------------------------------

def deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {"a": 1}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def deep_completion() -> bytes:
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": deep(300)}}
    return json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [
        {"index": 0, "finish_reason": "tool_calls",
         "message": {"role": "assistant", "content": None, "tool_calls": [call]}}]}).encode()


def deep_chunk() -> bytes:
    call = {"index": 0, "id": "c1", "type": "function", "function": {"name": "add", "arguments": deep(300)}}
    chunk = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [
        {"index": 0, "finish_reason": "tool_calls", "delta": {"role": "assistant", "tool_calls": [call]}}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n"


def plain(model: str) -> bytes:
    return json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": model, "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}]}).encode()


class Provider:
    """Answers by the request's model: big (a 15 MiB event in 16 KiB writes), deep, deep-stream,
    slow (a plain answer after 1 s), anything else a plain answer at once."""

    def __init__(self) -> None:
        big = event_of(15 * MIB)
        self.answers = {"big": (big, "text/event-stream"), "deep": (deep_completion(), "application/json"),
                        "deep-stream": (deep_chunk(), "text/event-stream")}
        self.big = big + b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                model = json.loads(await reader.readexactly(length)).get("model", "")
                await self.answer(model, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def answer(self, model: str, writer: asyncio.StreamWriter) -> None:
        if model == "slow":
            await asyncio.sleep(1.0)
        body, kind = (self.big, "text/event-stream") if model == "big" else self.answers.get(
            model, (plain(model), "application/json"))
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n\r\n".encode())
        if model != "big":
            writer.write(body)
            await writer.drain()
            return
        for start in range(0, len(body), 16 * 1024):  # a TLS record's size, each read on its own
            writer.write(body[start:start + 16 * 1024])
            await writer.drain()
            await asyncio.sleep(0.001)


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def to_provider(port: int) -> int:
    """Open TCP connections to the provider's `port` (only the gateway makes any)."""
    rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for row in rows if int(row.split()[2].rsplit(":", 1)[1], 16) == port and row.split()[3] == "01")


async def ask(session: aiohttp.ClientSession, url: str, model: str, stream: bool) -> int:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    async with session.post(f"{url}/v1/chat/completions", json=body) as answer:
        await answer.read()
        return answer.status


async def big_events(url: str, count: int) -> collections.Counter[int]:
    async with aiohttp.ClientSession() as session:
        return collections.Counter([await ask(session, url, "big", True) for _ in range(count)])


async def answers(url: str, model: str, seconds: float, concurrency: int, stream: bool) -> collections.Counter[int]:
    statuses: collections.Counter[int] = collections.Counter()
    deadline = time.monotonic() + seconds

    async def client(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < deadline:
            statuses[await ask(session, url, model, stream)] += 1

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
    return statuses


async def burst(url: str, pid: int, port: int, count: int, idle: float) -> dict[str, Any]:
    before = open_descriptors(pid), to_provider(port)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        statuses = collections.Counter(await asyncio.gather(*(ask(session, url, "slow", False) for _ in range(count))))
    after = open_descriptors(pid), to_provider(port)  # the bench's own connections are closing by now
    await asyncio.sleep(idle + 2.0)  # the idle timeout and the pool's next look at it
    later = open_descriptors(pid), to_provider(port)
    return {"statuses": dict(statuses), "gateway_fds": [before[0], after[0], later[0]],
            "to_provider": [before[1], after[1], later[1]], "when": ["before", "after burst", f"+{idle + 2:g} s"]}


async def serve_and_run(options: argparse.Namespace) -> None:
    provider = Provider()
    provider.server = await asyncio.start_server(provider.handle, "127.0.0.1", 0, limit=64 * 1024)
    port = provider.server.sockets[0].getsockname()[1]
    os.environ["TOOLSPAN_UPSTREAM_IDLE_SECONDS"] = str(options.idle)
    os.environ["TOOLSPAN_MAX_CONCURRENT_REQUESTS"] = str(max(1000, options.burst * 2))
    target = start_gateway("sse", 1, None, f"http://127.0.0.1:{port}/v1")
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(200):
                try:
                    if await ask(session, target.url, "plain", False) == 200:
                        break
                except aiohttp.ClientError:
                    await asyncio.sleep(0.1)
        phases: list[tuple[str, Any]] = [
            ("big-event", lambda: big_events(target.url, options.big)),
            ("deep", lambda: answers(target.url, "deep", options.seconds, options.concurrency, False)),
            ("deep-stream", lambda: answers(target.url, "deep-stream", options.seconds, options.concurrency, True)),
            ("baseline", lambda: answers(target.url, "plain", options.seconds, options.concurrency, False))]
        for name, run in phases:
            with HealthzProbe(target.url) as probe:
                statuses = await run()
            print(json.dumps({"phase": name, "statuses": dict(statuses), "healthz": probe.summary()}), flush=True)
        print(json.dumps({"phase": "burst", **await burst(target.url, target.process.pid, port, options.burst,
                                                          options.idle)}), flush=True)
    finally:
        target.process.terminate()
        target.process.wait(timeout=30)
        provider.server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--big", type=int, default=3)
    parser.add_argument("--burst", type=int, default=300)
    parser.add_argument("--idle", type=float, default=5.0)
    parser.add_argument("--reader-only", action="store_true", help="only part 1")
    options = parser.parse_args()
    print("gateway from", Path(sys.modules["gateway.provider.sse"].__file__ or "").parent)
    reader_curve(options.repeat)
    if not options.reader_only:
        asyncio.run(serve_and_run(options))


if __name__ == "__main__":
    main()
