"""`/healthz` while the gateway checks calls of client tools declared with hostile schemas (issue 53,
item 2): references fanning out (each of 30 levels pointing twice at the next), `uniqueItems` over
100,000 objects and over 8,000, a `type` listing 1,500 objects; and a usual schema, as the baseline.

In one run, on loopback: a tiny provider of the bench's own (aiohttp, in a process of its own)
whose every answer calls the client's tool `lookup` with the phase's arguments (written once, at its
start), and one gateway (`python -m gateway serve`, this checkout). For --seconds each,
--concurrency openai clients make Chat calls in a loop, each declaring `lookup` with the phase's
schema, made a schema of its own per call (its description numbered) so that no compiled one is
reused, as an attacker would. Throughout, a `HealthzProbe` (bench/healthz_probe.py) asks `/healthz`
every 10 ms.

Reported per phase: the calls made, how the checks came out (`toolspan_tool_calls_total` and
`toolspan_tool_unchecked_total` of side client), `/healthz` p50/p99/max.

    python bench/faults_client_schemas.py [--seconds 5] [--concurrency 4]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import re
import time
from typing import Any

import aiohttp
import openai
from healthz_probe import phases_under_probe

PROVIDER = """
import json, sys
from aiohttp import web
ARGUMENTS = {
    "baseline": {"path": "notes.txt"},
    "fan-out": {"query": "x"},
    "unique-100k": {"rows": [{"id": i} for i in range(100_000)]},
    "unique-8k": {"rows": [{"id": i} for i in range(8_000)]},
    "types": {"kind": 1},
}
ANSWERS = {phase: json.dumps({"id": "chatcmpl-b", "object": "chat.completion", "created": 1, "model": phase,
    "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": None,
        "tool_calls": [{"id": "call_b", "type": "function",
                        "function": {"name": "lookup", "arguments": json.dumps(arguments)}}]}}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
    for phase, arguments in ARGUMENTS.items()}
async def chat(request):
    body = await request.json()
    return web.Response(body=ANSWERS[body["model"]], content_type="application/json")
async def ready(request):
    return web.json_response({})
app = web.Application(client_max_size=64 * 1024 * 1024)
app.router.add_post("/v1/chat/completions", chat)
app.router.add_get("/ready", ready)
web.run_app(app, port=int(sys.argv[1]), print=None)
"""
PHASES = ("baseline", "fan-out", "unique-100k", "unique-8k", "types")
COUNTED = re.compile(r'^(toolspan_tool_(?:calls|unchecked)_total)\{([^}]*)\} ([0-9.e+]+)$', re.MULTILINE)


def schema(phase: str, salt: int) -> dict[str, Any]:
    described = {"type": "object", "description": f"call {salt}"}
    if phase == "fan-out":
        defs: dict[str, Any] = {f"l{i}": {"allOf": [{"$ref": f"#/$defs/l{i + 1}"}, {"$ref": f"#/$defs/l{i + 1}"}]}
                                for i in range(30)}
        defs["l30"] = {"type": "string"}
        return {**described, "$defs": defs, "properties": {"query": {"$ref": "#/$defs/l0"}}}
    if phase.startswith("unique"):
        return {**described, "properties": {"rows": {"type": "array", "uniqueItems": True}}}
    if phase == "types":
        return {**described, "properties": {"kind": {"type": [{"name": i} for i in range(1_500)]}}}
    return {**described, "properties": {"path": {"type": "string"}}, "required": ["path"]}


async def counted(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """Client-side checks by outcome and by unchecked reason, as /metrics has them now."""
    async with session.get(f"{url}/metrics") as answer:
        text = await answer.text()
    found: dict[str, float] = {}
    for metric, labels, value in COUNTED.findall(text):
        if 'side="client"' in labels:
            key = re.search(r'(?:outcome|reason)="([^"]+)"', labels)
            name = ("unchecked:" if "unchecked" in metric else "") + (key.group(1) if key else "?")
            found[name] = found.get(name, 0.0) + float(value)
    return found


async def loop(url: str, phase: str, seconds: float, concurrency: int) -> dict[str, Any]:
    calls = 0
    salts = itertools.count()
    deadline = time.monotonic() + seconds
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-bench", timeout=60, max_retries=0)

    async def one() -> None:
        nonlocal calls
        while time.monotonic() < deadline:
            tool = {"type": "function", "function": {"name": "lookup", "parameters": schema(phase, next(salts))}}
            await client.chat.completions.create(model=phase, messages=[{"role": "user", "content": "go"}],
                                                 tools=[tool])  # type: ignore[list-item]
            calls += 1

    async with aiohttp.ClientSession() as session:
        before = await counted(session, url)
        await asyncio.gather(*(one() for _ in range(concurrency)))
        after = await counted(session, url)
    await client.close()
    return {"phase": phase, "calls": calls,
            "checks": {name: n - before.get(name, 0.0) for name, n in after.items() if n > before.get(name, 0.0)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=4)
    options = parser.parse_args()
    results = phases_under_probe("client-schemas", PROVIDER, "/ready", PHASES,
                                 lambda url, provider, phase: loop(url, phase, options.seconds, options.concurrency))
    print(f"\n/healthz every 10 ms while {options.concurrency} openai clients call for {options.seconds:g} s each:")
    print(f"{'phase':<12} {'calls':>6} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7}  checks")
    for r in results:
        health = r["healthz"]
        print(f"{r['phase']:<12} {r['calls']:>6} {health['p50_ms']:>7} {health['p99_ms']:>7} {health['max_ms']:>7}  "
              f"{r['checks']}")


if __name__ == "__main__":
    main()
