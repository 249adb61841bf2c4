"""`/healthz` while a provider answers the pass-through with errors that are not OpenAI-shaped
(issue 33): every error body is read (capped) and wrapped by the gateway, against the same load
relayed as successes.

In one run, on loopback: a tiny provider of the bench's own (aiohttp, in a process of its own) and
one gateway (`python -m gateway serve`, this checkout). For --seconds each, --concurrency clients
send `GET /v1/models/<phase>` in a loop: the provider answers a 60 KB text/plain 503 (wrapped as a
502), a 60 KB gzip-compressed text/plain 404 (decoded, wrapped as a 404), an HTML 502, or a 200 JSON
list (the baseline, relayed byte for byte). Throughout, a `HealthzProbe` (bench/healthz_probe.py) on
its own thread asks `/healthz` every 10 ms.

Reported per phase: the statuses, requests per second, `/healthz` p50/p99/max; it fails when a
request got a 500 or an error body was not OpenAI-shaped.

    python bench/faults_passthrough_errors.py [--seconds 5] [--concurrency 10]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import subprocess
import sys
import time
from typing import Any

import aiohttp
from healthz_probe import HealthzProbe
from proxy import _free_port
from scale import start_gateway

PHASES = ("text-503", "gzip-404", "html-502", "baseline")
PROVIDER = """
import gzip, sys
from aiohttp import web
TEXT = b"upstream connect error or disconnect/reset before headers. " * 1000
ZIPPED = gzip.compress(TEXT)
async def answer(request):
    kind = request.match_info["kind"]
    if kind == "text-503":
        return web.Response(status=503, body=TEXT, content_type="text/plain")
    if kind == "gzip-404":
        return web.Response(status=404, body=ZIPPED, content_type="text/plain", headers={"Content-Encoding": "gzip"})
    if kind == "html-502":
        return web.Response(status=502, text="<html><body><h1>502 Bad Gateway</h1></body></html>",
                            content_type="text/html")
    return web.json_response({"object": "list", "data": [{"id": kind, "object": "model"}]})
app = web.Application()
app.router.add_get("/v1/models/{kind}", answer)
web.run_app(app, port=int(sys.argv[1]), print=None)
"""


async def loop(url: str, phase: str, seconds: float, concurrency: int) -> tuple[collections.Counter[int], int]:
    """Statuses got, and how many error bodies were not OpenAI-shaped."""
    statuses: collections.Counter[int] = collections.Counter()
    misshaped = 0
    deadline = time.monotonic() + seconds

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal misshaped
        while time.monotonic() < deadline:
            async with session.get(f"{url}/v1/models/{phase}", headers={"Accept-Encoding": "gzip"}) as answer:
                body = await answer.read()
                statuses[answer.status] += 1
            if answer.status >= 400:
                error = json.loads(body).get("error") if body.startswith(b"{") else None
                misshaped += not (isinstance(error, dict) and {"message", "type", "param", "code"} <= set(error))

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
    return statuses, misshaped


async def wait_ready(url: str, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(url) as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not come up")
            await asyncio.sleep(0.1)


def phase(url: str, name: str, options: argparse.Namespace) -> dict[str, Any]:
    with HealthzProbe(url) as probe:
        statuses, misshaped = asyncio.run(loop(url, name, options.seconds, options.concurrency))
    return {"phase": name, "statuses": dict(statuses), "rps": round(sum(statuses.values()) / options.seconds),
            "misshaped": misshaped, "healthz": probe.summary()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=10)
    options = parser.parse_args()
    provider_port = _free_port()
    provider = subprocess.Popen([sys.executable, "-c", PROVIDER, str(provider_port)])
    target = start_gateway("passthrough-errors", 1, None, f"http://127.0.0.1:{provider_port}/v1")
    results = []
    try:
        for url in (f"http://127.0.0.1:{provider_port}", target.url):
            asyncio.run(wait_ready(f"{url}/v1/models/baseline"))
        for name in PHASES:
            results.append(phase(target.url, name, options))
            print(json.dumps(results[-1]), flush=True)
    finally:
        for process in (provider, target.process):
            process.terminate()
        for process in (provider, target.process):
            process.wait(timeout=30)
    print(f"\n/healthz every 10 ms while {options.concurrency} clients send requests for {options.seconds:g} s:")
    print(f"{'phase':<10} {'req/s':>6} {'statuses':<14} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7}")
    for result in results:
        health = result["healthz"]
        print(f"{result['phase']:<10} {result['rps']:>6} {json.dumps(result['statuses']):<14} {health['p50_ms']:>7} "
              f"{health['p99_ms']:>7} {health['max_ms']:>7}")
    if any(500 in r["statuses"] or r["misshaped"] for r in results):
        sys.exit("a request got a 500, or an error that is not OpenAI-shaped")


if __name__ == "__main__":
    main()
