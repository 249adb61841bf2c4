"""A soak: many requests through one gateway, and whether it gives everything back.

In one run, on loopback: the built-in fast upstream and toolspan with telemetry on (spans through a
BatchSpanProcessor to an exporter that drops them, metrics, the trajectory store on its own file),
each its own process (bench/proxy.py --serve). A warm-up of --warm-up requests, then --requests
requests at --concurrency from this process, the plain Chat request and, one in --tool-every, a
request with a gateway tool round. The gateway's resident memory (VmRSS) is read after the warm-up
and after every tenth of the run; at the end, /metrics must count every request sent (warm-up
included, readiness probes not) as answered 200 and show nothing in flight.

    python bench/soak.py [--requests 10000] [--concurrency 20] [--warm-up 1000] [--tool-every 10] [--no-store]

With --no-store, the gateway runs without the trajectory store (bench/proxy.py's toolspan-nostore).
TOOLSPAN_TRAJECTORY_STORE=false in the environment would not do it: the bench names the store in
the gateway's settings, and what the code names wins over the environment.

Target (issue 14): RSS flat, within 10% of its size after the warm-up; the in-flight gauge back
to 0; every request accounted for in /metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from proxy import PLAIN, ROOT, _free_port, _start, _wait_ready

TOOL_ROUND = {"model": "bench", "messages": [{"role": "user", "content": "please use a tool"}]}


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


async def send(url: str, count: int, concurrency: int, tool_every: int) -> None:
    """`count` requests, `concurrency` at a time; any answer but a 200 stops the soak."""
    numbers = iter(range(count))

    async def worker(http: aiohttp.ClientSession) -> None:
        for n in numbers:
            body = TOOL_ROUND if tool_every and n % tool_every == 0 else PLAIN
            async with http.post(f"{url}/v1/chat/completions", json=body) as answer:
                await answer.read()
                if answer.status != 200:
                    raise RuntimeError(f"request {n}: {answer.status} {await answer.text()}")

    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))


async def scrape(url: str) -> dict[str, float]:
    """Requests answered per status on the chat route, and requests in flight besides the scrape."""
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as answer:
        text = await answer.text()
    found: dict[str, float] = {"in_flight": -1.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "toolspan_requests_total" and sample.labels.get("route") == "/v1/chat/completions":
                found[sample.labels["status"]] = found.get(sample.labels["status"], 0.0) + sample.value
            elif sample.name == "toolspan_requests_in_flight":
                found["in_flight"] = sample.value - 1  # the scrape is a request in flight too
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--warm-up", type=int, default=1000)
    parser.add_argument("--tool-every", type=int, default=10, help="one request in N has a tool round (0: none)")
    parser.add_argument("--no-store", action="store_true", help="the gateway without its trajectory store")
    options = parser.parse_args()
    upstream_port, port = _free_port(), _free_port()
    upstream = f"http://127.0.0.1:{upstream_port}/v1"
    url = f"http://127.0.0.1:{port}"
    kind = "toolspan-nostore" if options.no_store else "toolspan"
    processes = [_start("upstream", upstream_port), _start(kind, port, upstream, ROOT)]
    gateway = processes[1]
    try:
        asyncio.run(_wait_ready(f"{upstream}/chat/completions"))
        asyncio.run(_wait_ready(f"{url}/v1/chat/completions"))
        before = asyncio.run(scrape(url))  # the readiness probes' requests
        asyncio.run(send(url, options.warm_up, options.concurrency, options.tool_every))
        baseline = rss_mib(gateway.pid)
        readings = []
        tenth = options.requests // 10
        for _ in range(10):
            asyncio.run(send(url, tenth, options.concurrency, options.tool_every))
            readings.append(rss_mib(gateway.pid))
        counted = asyncio.run(scrape(url))
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=30)
    sent = options.warm_up + 10 * tenth
    counted = {status: value - before.get(status, 0.0) if status != "in_flight" else value
               for status, value in counted.items()}
    growth = max(readings) / baseline - 1
    print(f"RSS after the warm-up of {options.warm_up}: {baseline:.1f} MiB; after each tenth of "
          f"{10 * tenth} requests at concurrency {options.concurrency}: "
          + ", ".join(f"{r:.1f}" for r in readings) + " MiB")
    print(f"RSS growth after warm-up: {growth:+.1%} (target: within 10%): {'holds' if growth <= 0.10 else 'FAILS'}")
    answered = counted.get("200", 0.0)
    others = {k: v for k, v in counted.items() if k not in ("200", "in_flight")}
    print(f"/metrics: {answered:.0f} answered 200 of {sent} sent, other statuses {others or 'none'}, "
          f"in flight {counted['in_flight']:.0f}: "
          f"{'holds' if answered == sent and not others and counted['in_flight'] == 0 else 'FAILS'}")
    if answered != sent or counted["in_flight"] != 0 or growth > 0.10:
        sys.exit(1)


if __name__ == "__main__":
    main()
