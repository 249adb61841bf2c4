"""`/healthz` while the trajectory store works at its size limit (issue 32), against the same load
into a store with room to spare.

In one run, on loopback: the built-in fast upstream (bench/proxy.py --serve upstream) and, one after
the other, three gateways (`python -m gateway serve`, this checkout, the demo tools, message content
captured so that each trajectory takes about 12 KB): "roomy" with the default size limit (256 MiB),
"at-limit" with --max-bytes (default 4 MiB, about 350 trajectories: more than a batch holds) and
"over" with --over-bytes (default 128 KiB, about 10: less than one batch). Against each, --concurrency clients send tool
rounds (the model calls the demo `echo`, the gateway runs it and asks again) for --seconds, each its
own X-Trajectory-Id and --pad bytes of question. The small stores are full within the first second;
from then on every batch of spans (what ends within 0.2 s) makes its room from the oldest
trajectories, and in "over" every batch is larger than the whole store and keeps its newest part,
the rest counted as dropped. Throughout, a `HealthzProbe` (bench/healthz_probe.py) on its own thread
asks `/healthz` every 10 ms.

Reported per gateway: requests per second, `/healthz` p50/p99/max, and the accounting: every
request answered 200 and counted once (toolspan_requests_total, toolspan_tool_calls_total), the
spans the store counted as dropped (toolspan_trajectory_store_dropped_total), how many trajectories
the file holds and whether they are the newest (missing ones among them: "gaps"; the requests
answered after the oldest one kept that the store does not hold), and the database's size (its pages,
as SQLite counts them against the cap) against its limit.

    python bench/faults_store_limit.py [--seconds 5] [--concurrency 10] [--max-bytes 4194304]
                                       [--over-bytes 131072] [--pad 1500]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from healthz_probe import HealthzProbe
from proxy import ROOT, SYSTEM, _free_port, _start, _wait_ready

METRIC = re.compile(r"^(toolspan_\w+?)(?:_total)?(\{[^}]*\})? (\S+)$", re.MULTILINE)
COUNTED = ("toolspan_requests", "toolspan_tool_calls", "toolspan_trajectory_store_dropped")


def start_gateway(upstream: str, store: Path, max_bytes: int | None) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOOLSPAN_ACCESS_LOG": "false", "TOOLSPAN_LOG_LEVEL": "warning",
           "TOOLSPAN_TRAJECTORY_STORE_PATH": str(store), "TOOLSPAN_CAPTURE_MESSAGE_CONTENT": "true"}
    if max_bytes is not None:
        env["TOOLSPAN_TRAJECTORY_STORE_MAX_BYTES"] = str(max_bytes)
    args = [sys.executable, "-m", "gateway", "serve", "--port", str(port), "--upstream", upstream,
            "--tools", "gateway.demo.tools:demo_registry"]
    return subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL), f"http://127.0.0.1:{port}"


async def counters(session: aiohttp.ClientSession, url: str) -> collections.Counter[str]:
    """The COUNTED metrics, each summed over its labels (requests: of the chat route only, not the
    probe's)."""
    async with session.get(f"{url}/metrics") as page:
        text = await page.text()
    found: collections.Counter[str] = collections.Counter()
    for name, labels, value in METRIC.findall(text):
        if name in COUNTED and (name != "toolspan_requests" or '"/v1/chat/completions"' in labels):
            found[name] += int(float(value))
    return found


async def load(url: str, options: argparse.Namespace, prefix: str) -> tuple[collections.Counter[int], list[str]]:
    """For --seconds, --concurrency clients each sending tool rounds one after another; the
    statuses, and the trajectory ids of the 200s in the order their answers came."""
    statuses: collections.Counter[int] = collections.Counter()
    answered: list[str] = []
    numbers = iter(range(10**9))
    question = "Before you answer, please use a tool to echo this. " + "x" * options.pad
    body = {"model": "bench", "messages": [{"role": "system", "content": SYSTEM},
                                           {"role": "user", "content": question}]}
    deadline = time.monotonic() + options.seconds

    async def client(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < deadline:
            trajectory = f"{prefix}-{next(numbers):07}"
            async with session.post(f"{url}/v1/chat/completions", json=body,
                                    headers={"X-Trajectory-Id": trajectory}) as answer:
                reply = await answer.json()
                statuses[answer.status] += 1
                if answer.status == 200 and reply["choices"][0]["message"]["content"] == "done":
                    answered.append(trajectory)

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(session) for _ in range(options.concurrency)))
    return statuses, answered


def database_bytes(store: Path) -> int:
    """The database's size as SQLite counts it against its page cap (the pages in the write-ahead
    log included, which the file on disk gets at the next checkpoint)."""
    with sqlite3.connect(store) as db:
        pages, size = db.execute("SELECT (SELECT page_count FROM pragma_page_count()), "
                                 "(SELECT page_size FROM pragma_page_size())").fetchone()
    return int(pages) * int(size)


def stored(store: Path) -> set[str]:
    with sqlite3.connect(store) as db:
        return {row[0] for row in db.execute("SELECT id FROM trajectories")}


async def settled(store: Path, last: str, seconds: float = 10.0) -> set[str]:
    """The store's trajectories once the last one answered is in it (the writer lingers 0.2 s per
    batch; no event reaches this process, so: polled, with a deadline)."""
    deadline = time.monotonic() + seconds
    while True:
        kept = stored(store)
        if last in kept or time.monotonic() > deadline:
            return kept
        await asyncio.sleep(0.05)


async def run(name: str, upstream: str, max_bytes: int | None, options: argparse.Namespace) -> dict[str, Any]:
    store = Path(tempfile.mkdtemp(prefix="toolspan-store-limit-")) / "store.sqlite3"
    process, url = start_gateway(upstream, store, max_bytes)
    try:
        await _wait_ready(f"{url}/v1/chat/completions")
        async with aiohttp.ClientSession() as session:
            before = await counters(session, url)
            with HealthzProbe(url) as probe:
                statuses, answered = await load(url, options, name)
            kept = await settled(store, answered[-1])
            counted = await counters(session, url) - before
    finally:
        process.terminate()
        process.wait(timeout=30)
    oldest_kept = min((answered.index(t) for t in kept if t in answered), default=len(answered))
    gaps = sum(t not in kept for t in answered[oldest_kept:])
    return {"gateway": name, "statuses": dict(statuses), "rps": round(sum(statuses.values()) / options.seconds),
            "healthz": probe.summary(), "requests_counted": counted["toolspan_requests"],
            "tool_calls_counted": counted["toolspan_tool_calls"],
            "spans_dropped": counted["toolspan_trajectory_store_dropped"], "answered": len(answered),
            "kept": len(kept), "gaps": gaps, "database_bytes": database_bytes(store), "max_bytes": max_bytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--max-bytes", type=int, default=4 * 2**20, help="the at-limit store's limit")
    parser.add_argument("--over-bytes", type=int, default=128 * 1024,
                        help="the over store's limit: smaller than one batch of spans")
    parser.add_argument("--pad", type=int, default=1500, help="bytes of question per request")
    options = parser.parse_args()
    upstream_port = _free_port()
    upstream = _start("upstream", upstream_port)
    results = []
    try:
        asyncio.run(_wait_ready(f"http://127.0.0.1:{upstream_port}/v1/chat/completions"))
        for name, max_bytes in (("roomy", None), ("at-limit", options.max_bytes), ("over", options.over_bytes)):
            results.append(asyncio.run(run(name, f"http://127.0.0.1:{upstream_port}/v1", max_bytes, options)))
            print(json.dumps(results[-1]), flush=True)
    finally:
        upstream.terminate()
        upstream.wait(timeout=30)
    print(f"\n/healthz every 10 ms while {options.concurrency} clients send tool rounds for {options.seconds:g} s:")
    print(f"{'gateway':<9} {'req/s':>6} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7}  {'counted':<8} "
          f"{'dropped':>7} {'kept':>6} {'gaps':>5}  database / limit")
    for r in results:
        health, answered = r["healthz"], r["answered"]
        counted = "each" if r["requests_counted"] == r["tool_calls_counted"] == answered else "NO"
        limit = "-" if r["max_bytes"] is None else f"{r['max_bytes']}"
        print(f"{r['gateway']:<9} {r['rps']:>6} {health['p50_ms']:>7} {health['p99_ms']:>7} {health['max_ms']:>7}  "
              f"{counted:<8} {r['spans_dropped']:>7} {r['kept']:>6} {r['gaps']:>5}  {r['database_bytes']} / {limit}")
    if any(set(r["statuses"]) != {200} or r["answered"] != sum(r["statuses"].values()) for r in results):
        sys.exit("a request was not answered 200 with the tool round's answer")


if __name__ == "__main__":
    main()
