"""`/healthz` while an MCP server is hard on the gateway listing its tools (issue 32).

The server is tests/mcp/servers/hostile.py (the `mcp` package's low-level server), over stdio:
- `churn`: 800 tools, announcing `tools/list_changed` every 0.5 s (each announcement changes one
  tool's description), for --seconds: once with the settings at their defaults (max_tools 256,
  relist_min_seconds 1), once with max_tools raised to 1000 so that all 800 are taken;
- `badschema`: one good tool beside three unusable ones, while --calls calls of the good tool
  run through POST /v1/tools/hostile__echo/invoke.

Each phase runs `toolspan serve` (this checkout, the built-in scripted model, a temporary data
directory) in a process of its own, and bench/healthz_probe.py asks `/healthz` every 10 ms
throughout. Reported per phase: `/healthz` p50/p99/max, the announcements the server made and the
listings it answered (it writes them to a file), the tools the gateway took, and the calls'
outcomes. Target: p99 < 50 ms.

    python bench/faults_mcp_listing.py [--seconds 20] [--calls 200]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
from healthz_probe import HealthzProbe
from mcp_result_growth import until_up
from proxy import _free_port

ROOT = Path(__file__).resolve().parent.parent
HOSTILE = ROOT / "tests" / "mcp" / "servers" / "hostile.py"


@asynccontextmanager
async def serve(server: dict[str, Any]) -> AsyncIterator[str]:
    """`toolspan serve` with `server` as its MCP source `hostile`; its URL once the source is up."""
    port = _free_port()
    with tempfile.TemporaryDirectory() as data:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_DATA_HOME": data,
               "TOOLSPAN_MCP_SERVERS": json.dumps({"hostile": server})}
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "serve", "--port", str(port), "--no-access-log", "--log-level", "error",
            env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            await until_up(url)
            yield url
        finally:
            process.terminate()
            await process.wait()


async def tools_taken(url: str) -> int:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/readyz") as response:
        count: int = (await response.json())["mcp_servers"][0]["tools"]
    return count


def recorded(path: Path) -> tuple[int, int]:
    """(announcements made, listings answered) by the server, from its record."""
    listings = [json.loads(line)["listed"] for line in path.read_text().splitlines() if '"listed"' in line]
    return (listings[-1] if listings else 0), len(listings)


async def churn(seconds: float, settings: dict[str, Any]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        record = Path(scratch) / "record.jsonl"
        server = {"command": sys.executable, "args": [str(HOSTILE), "churn", "800", "0.5"],
                  "env": {"RECORD": str(record)}, **settings}
        async with serve(server) as url:
            with HealthzProbe(url) as probe:
                await asyncio.sleep(seconds)  # the fault is the server's doing: the bench only watches
            announced, listed = recorded(record)
            return {"phase": f"churn {settings or 'defaults'}", "announced": announced, "listings": listed,
                    "tools": await tools_taken(url), "healthz": probe.summary()}


async def badschema(calls: int) -> dict[str, Any]:
    server = {"command": sys.executable, "args": [str(HOSTILE), "badschema"]}
    outcomes: collections.Counter[str] = collections.Counter()
    async with serve(server) as url, aiohttp.ClientSession() as session:
        with HealthzProbe(url) as probe:
            for _ in range(calls):
                async with session.post(f"{url}/v1/tools/hostile__echo/invoke",
                                        json={"arguments": {"text": "hi"}}) as response:
                    outcomes[(await response.json())["status"]] += 1
        return {"phase": "badschema", "tools": await tools_taken(url), "outcomes": dict(outcomes),
                "healthz": probe.summary()}


async def main(seconds: float, calls: int) -> None:
    print(json.dumps(await churn(seconds, {})), flush=True)
    print(json.dumps(await churn(seconds, {"max_tools": 1000})), flush=True)
    print(json.dumps(await badschema(calls)), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--calls", type=int, default=200)
    options = parser.parse_args()
    asyncio.run(main(options.seconds, options.calls))
