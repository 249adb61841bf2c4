"""`/healthz`, and gateway tool runs per app call, while the provider fails the round after a
gateway tool ran (issue 33, item 1): the gateway retries within the request, and a provider that
keeps failing ends in one final error (`x-should-retry: false`) that the openai client does not resend.

In one run, on loopback: a tiny provider of the bench's own (aiohttp, in a process of its own) and
one gateway (`python -m gateway serve`, this checkout, with the demo tools). For --seconds each,
--concurrency openai clients (AsyncOpenAI, default max_retries=2) make Chat calls in a loop; the
provider asks for the gateway's `echo` tool, then, once its result is in the conversation, per
phase: answers (baseline), answers 429 with retry-after-ms 50 once, answers 500 once, or keeps
answering 503. Throughout, a `HealthzProbe` (bench/healthz_probe.py) asks `/healthz` every 10 ms.

Reported per phase: app calls that succeeded and failed, gateway tool runs per app call (from
`toolspan_tool_calls_total`, which must be 1.0), provider requests per app call, `/healthz`
p50/p99/max; it fails when a tool ran more than once for an app call.

    python bench/faults_tool_retries.py [--seconds 5] [--concurrency 10]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import re
import sys
import time
from typing import Any

import aiohttp
import openai
from healthz_probe import phases_under_probe

PHASES = ("baseline", "429-once", "500-once", "keeps-failing")
PROVIDER = """
import itertools, sys, time
from aiohttp import web
ids = itertools.count()
failed = set()  # call ids whose next round already failed once
requests = 0
def chunkless(content=None, calls=None):
    message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return {"id": f"chatcmpl-{next(ids)}", "object": "chat.completion", "created": int(time.time()), "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}
async def chat(request):
    global requests
    requests += 1
    body = await request.json()
    results = [m for m in body["messages"] if m.get("role") == "tool"]
    if not results:
        echo = {"name": "echo", "arguments": '{"text": "x"}'}
        call = {"id": f"call_{next(ids)}", "type": "function", "function": echo}
        return web.json_response(chunkless(calls=[call]))
    phase, call_id = body["model"], results[0]["tool_call_id"]
    error = {"error": {"message": "try again", "type": "server_error", "param": None, "code": None}}
    if phase == "keeps-failing":
        return web.json_response(error, status=503)
    if phase in ("429-once", "500-once") and call_id not in failed:
        failed.add(call_id)
        status = 429 if phase == "429-once" else 500
        return web.json_response(error, status=status, headers={"retry-after-ms": "50"} if status == 429 else {})
    return web.json_response(chunkless(content="done"))
async def count(request):
    return web.json_response({"requests": requests})
app = web.Application()
app.router.add_post("/v1/chat/completions", chat)
app.router.add_get("/count", count)
web.run_app(app, port=int(sys.argv[1]), print=None)
"""
TOOL_RUNS = re.compile(r'^toolspan_tool_calls_total\{[^}]*tool="echo"[^}]*\} ([0-9.e+]+)$', re.MULTILINE)


async def tool_runs(session: aiohttp.ClientSession, url: str) -> float:
    async with session.get(f"{url}/metrics") as answer:
        return sum(float(v) for v in TOOL_RUNS.findall(await answer.text()))


async def provider_requests(session: aiohttp.ClientSession, url: str) -> int:
    async with session.get(f"{url}/count") as answer:
        found: int = (await answer.json())["requests"]
        return found


async def loop(url: str, provider: str, phase: str, seconds: float, concurrency: int) -> dict[str, Any]:
    ok = failed = 0
    deadline = time.monotonic() + seconds
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-bench", timeout=30)

    async def one(worker: int) -> None:
        nonlocal ok, failed
        for n in itertools.count():
            if time.monotonic() >= deadline:
                return
            # Each app call its own question: the same body again would be a replay, which resumes.
            question = f"call {worker}.{n}"
            try:
                await client.chat.completions.create(model=phase, messages=[{"role": "user", "content": question}])
                ok += 1
            except openai.APIError:
                failed += 1

    async with aiohttp.ClientSession() as session:
        runs, asked = await tool_runs(session, url), await provider_requests(session, provider)
        await asyncio.gather(*(one(worker) for worker in range(concurrency)))
        runs, asked = await tool_runs(session, url) - runs, await provider_requests(session, provider) - asked
    await client.close()
    calls = ok + failed
    return {"phase": phase, "ok": ok, "failed": failed, "runs_per_call": round(runs / calls, 3),
            "provider_requests_per_call": round(asked / calls, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=10)
    options = parser.parse_args()
    results = phases_under_probe("tool-retries", PROVIDER, "/count", PHASES, lambda url, provider, phase: loop(
        url, provider, phase, options.seconds, options.concurrency))
    print(f"\n/healthz every 10 ms while {options.concurrency} openai clients call for {options.seconds:g} s each:")
    print(f"{'phase':<14} {'ok':>6} {'failed':>6} {'runs/call':>9} {'provider/call':>13} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'max ms':>7}")
    for r in results:
        health = r["healthz"]
        print(f"{r['phase']:<14} {r['ok']:>6} {r['failed']:>6} {r['runs_per_call']:>9} "
              f"{r['provider_requests_per_call']:>13} {health['p50_ms']:>7} {health['p99_ms']:>7} "
              f"{health['max_ms']:>7}")
    if any(r["runs_per_call"] > 1.0 for r in results):
        sys.exit("a gateway tool ran more than once for an app call")


if __name__ == "__main__":
    main()
