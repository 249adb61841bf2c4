"""A burst of concurrent requests on new connections (issue 53, item 14): --requests at once
through the openai client's default transport (httpx, a pool of up to 1,000 connections), or
through aiohttp's client (100 connections per session by default), to a fresh `toolspan serve`
with the built-in model, whose tool loop then opens as many connections to the model.

A listen queue (the kernel's backlog) that a burst overflows does not refuse connections: Linux
drops the handshake and the client's kernel tries again 1, 3, 7 s later, so those requests are
served seconds late, past a short client timeout. Each trial starts a gateway (so that the burst
opens new connections on both legs), sends one burst, and reports the answers, the failures,
the latencies, the client's CPU time (this process's) and how many connections overflowed a
listen queue on this machine meanwhile (Linux's TcpExtListenOverflows: counted machine-wide, so
another process's overflows would show).

    python bench/connection_burst.py [--requests 200] [--trials 3] [--timeout 1.25] [--compare DIR]

--compare DIR measures the checkout at DIR too (its gateway, this bench's clients), trial by trial.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import openai
from proxy import _free_port

ROOT = Path(__file__).resolve().parents[1]
Send = Callable[[int], Awaitable[None]]


def listen_overflows() -> int:
    """Connections this machine's listen queues have dropped since boot (Linux)."""
    names, values = (line.split() for line in Path("/proc/net/netstat").read_text().splitlines()
                     if line.startswith("TcpExt:"))
    return int(values[names.index("ListenOverflows")])


def start(checkout: Path, port: int, home: Path) -> subprocess.Popen[bytes]:
    env = {name: value for name, value in os.environ.items() if not name.startswith(("TOOLSPAN_", "OTEL_"))}
    env.update({"PYTHONPATH": str(checkout), "HOME": str(home), "XDG_DATA_HOME": str(home / "data"),
                "TOOLSPAN_ACCESS_LOG": "false", "TOOLSPAN_LOG_LEVEL": "warning"})
    return subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--port", str(port)], env=env,
                            cwd=home, stdout=subprocess.DEVNULL)


async def ready(url: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(f"{url}/healthz") as answer:
                    if answer.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not come up")
            await asyncio.sleep(0.1)  # a starting process: no event to await


def question(n: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"The weather in Lisbon? ({n})"}]


async def burst(url: str, client: str, stream: bool, requests: int,
                read_timeout: float) -> tuple[Counter[str], list[float]]:
    outcomes: Counter[str] = Counter()
    latencies: list[float] = []

    async def timed(send: Send, n: int) -> None:
        began = time.monotonic()
        try:
            await send(n)
        except Exception as exc:  # every failure counted by its kind, none ends the burst
            outcomes[type(exc).__name__] += 1
        else:
            outcomes["ok"] += 1
            latencies.append(time.monotonic() - began)

    if client == "openai":
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0,
                                      timeout=read_timeout) as sdk:
            async def send(n: int) -> None:
                answer = await sdk.chat.completions.create(model="m", messages=question(n),  # type: ignore[arg-type]
                                                           stream=stream)
                if stream:
                    async for _ in answer:  # type: ignore[union-attr]
                        pass
            await asyncio.gather(*(timed(send, n) for n in range(requests)))
    else:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(sock_read=read_timeout)) as session:
            async def send(n: int) -> None:
                body = {"model": "m", "messages": question(n), "stream": stream}
                async with session.post(f"{url}/v1/chat/completions", json=body) as answer:
                    answer.raise_for_status()
                    await answer.read()
            await asyncio.gather(*(timed(send, n) for n in range(requests)))
    return outcomes, latencies


async def trial(checkout: Path, client: str, stream: bool, args: argparse.Namespace) -> str:
    port = _free_port()
    with tempfile.TemporaryDirectory() as home:
        process = start(checkout, port, Path(home))
        try:
            url = f"http://127.0.0.1:{port}"
            await ready(url)
            before, cpu = listen_overflows(), time.process_time()
            outcomes, latencies = await burst(url, client, stream, args.requests, args.timeout)
            overflows, cpu = listen_overflows() - before, time.process_time() - cpu
        finally:
            process.terminate()
            process.wait()
    failed = ", ".join(f"{kind} {count}" for kind, count in outcomes.items() if kind != "ok") or "none"
    p50 = statistics.median(latencies) if latencies else 0.0
    worst = max(latencies, default=0.0)
    return (f"answered {outcomes['ok']:4}/{args.requests}  failed: {failed:24}  p50 {p50:5.2f} s  "
            f"max {worst:5.2f} s  client CPU {cpu:4.2f} s  listen overflows {overflows}")


async def main(args: argparse.Namespace) -> None:
    checkouts = [("this", ROOT)] + ([("compare", args.compare.resolve())] if args.compare else [])
    for client in args.clients.split(","):
        for stream in (False, True):
            for n in range(args.trials):
                for name, checkout in checkouts:
                    line = await trial(checkout, client, stream, args)
                    print(f"{client:7} {'stream' if stream else 'plain':6} #{n + 1} {name:8} {line}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=60.0, help="the clients' read timeout, seconds")
    parser.add_argument("--clients", default="openai,aiohttp", help="openai (its default httpx client), aiohttp")
    parser.add_argument("--compare", type=Path, metavar="DIR", help="also measure the gateway of the checkout at DIR")
    asyncio.run(main(parser.parse_args()))
