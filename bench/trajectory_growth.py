"""What showing one trajectory costs as it grows: 500, 1,000 and 2,000 requests (any caller can make
such a trajectory, every request naming one `X-Trajectory-Id`).

The gateway is `toolspan serve` in a process of its own, with the built-in model: each request is
the demo's session (a renamed argument rejected, its corrected retry, a second tool, the answer:
four model turns and three tool calls), sent with the real openai client, and the store writes it
as it writes any. Then, for each trajectory, the least of --repeats (the machine is shared: other work
only ever adds to a time) of:
- `GET /ui/trajectories/{id}`, its first page (200 requests) and its last, asked over HTTP;
- `?limit=1000`, the most a page may hold;
- `report.trajectory` of the whole trajectory (every request; what the CLI's --json reads with a
  --limit that takes them all), and the whole of it rendered as the page renders a page
  (`timeline_page`), both in this process.
Each shows wall time and CPU (the gateway process's for the HTTP requests, a mean over the repeats
at the kernel's clock tick; this thread's for the others), the cost per request, and each
doubling's ratio. Linear within 1.5x per doubling: a doubling costs at most 3 times as much (cost
per request grows at most 1.5 times).

Last, `/healthz` (bench/healthz_probe.py) while --clients clients ask for the largest trajectory's
first page, one request after another each, for --seconds, then its ?limit=1000: target p99 < 50 ms.

--write-cost measures instead what the two request indexes (`model_turns_of_request`,
`tool_calls_of_request`) do to the store's writer, into a store with them and one without, the two
taking turns at each batch (of 400 requests, with the age pruning):
- requests of one model turn and one tool call (bench/store_growth.py's plain request and a call),
  each its own trajectory, up to --requests: the CPU per request;
- one trajectory of up to 8,000 such requests, each request's span written a batch after its turn
  and call (as a request that outlasts its batch is): the CPU per request, each tenth of the way.

    python bench/trajectory_growth.py [--sizes 500 1000 2000] [--repeats 7] [--clients 4] [--seconds 10]
    python bench/trajectory_growth.py --write-cost [--requests 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sqlite3
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
from openai import AsyncOpenAI

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from healthz_probe import HealthzProbe  # bench/, beside this file
from opentelemetry.trace import SpanKind
from proxy import _free_port
from store_growth import plain_request

from gateway.caller import request_ids
from gateway.cli.demo import QUESTION
from gateway.ui.timeline import PAGE_REQUESTS, Paging, timeline_page
from telemetry import names
from telemetry.store import report
from telemetry.store.records import prune, write
from telemetry.store.schema import connect
from telemetry.store.span_records import SpanRecord

Measure = Callable[[], Awaitable[Any]]
TICK = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """CPU seconds a process has used (user and system), at the kernel's clock tick."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


@asynccontextmanager
async def serving(folder: str) -> AsyncIterator[tuple[str, int, Path]]:
    """`toolspan serve` with the built-in model and its store in `folder`: its URL, its pid, its store."""
    store, port = Path(folder, "store.sqlite3"), _free_port()
    env = {**os.environ, "TOOLSPAN_TRAJECTORY_STORE_PATH": str(store), "XDG_DATA_HOME": folder}
    process = await asyncio.create_subprocess_exec(sys.executable, "-m", "gateway", "serve", "--port", str(port),
                                                   "--no-access-log", "--log-level", "warning", env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 30
            while True:  # another process: nothing to await but its port
                try:
                    async with session.get(f"{url}/readyz") as response:
                        if response.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    pass
                assert process.returncode is None, "the gateway exited"
                assert time.monotonic() < deadline, "the gateway did not start"
                await asyncio.sleep(0.1)
        yield url, process.pid, store
    finally:
        process.terminate()
        await process.wait()


async def grow(client: AsyncOpenAI, trajectory_id: str, requests: int) -> None:
    for _ in range(requests):
        await client.chat.completions.create(model="toolspan-demo", messages=[{"role": "user", "content": QUESTION}],
                                             extra_headers={"X-Trajectory-Id": trajectory_id})


async def stored(store: Path, trajectory_id: str, requests: int) -> None:
    """Until the gateway's store has written all the trajectory's requests (its writer is another
    process's thread: the file is all there is to watch)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            db = report.open_readonly(str(store))
            try:
                found = report.trajectory(db, trajectory_id, limit=1)
            finally:
                db.close()
            if found is not None and found["totals"]["requests"] == requests:
                return
        except sqlite3.Error:  # not written yet
            pass
        assert time.monotonic() < deadline, f"{trajectory_id}: not all stored"
        await asyncio.sleep(0.2)


def _page_asker(session: aiohttp.ClientSession, url: str) -> Measure:
    async def ask() -> None:
        async with session.get(url) as response:
            assert response.status == 200, response.status
            await response.read()
    return ask


def _measures(session: aiohttp.ClientSession, url: str, store: Path, trajectory_id: str,
              requests: int) -> dict[str, tuple[Measure, bool]]:
    """What is measured of one trajectory: (measure, whether it runs in this process)."""
    def whole() -> dict[str, Any]:
        db = report.open_readonly(str(store))
        try:
            found = report.trajectory(db, trajectory_id)
        finally:
            db.close()
        assert found is not None
        assert len(found["requests"]) == requests
        return found

    async def read() -> None:
        whole()

    async def rendered() -> None:
        timeline_page(whole(), Paging(trajectory_id, 1, requests), None)

    page = f"{url}/ui/trajectories/{trajectory_id}"
    return {f"page 1 (GET, {PAGE_REQUESTS} requests)": (_page_asker(session, page), False),
            "last page (GET)": (_page_asker(session, f"{page}?page={-(-requests // PAGE_REQUESTS)}"), False),
            "?limit=1000 (GET)": (_page_asker(session, f"{page}?limit=1000"), False),
            "report.trajectory, whole": (read, True),
            "report.trajectory + timeline_page, whole": (rendered, True)}


async def _timed(measure: Measure, repeats: int, pid: int | None) -> tuple[float, float]:
    """The least wall seconds of `measure` over `repeats`; its CPU seconds, of this thread (the least)
    or of the gateway process `pid` (the mean: the kernel counts ticks)."""
    walls, cpus = [], []
    started = process_cpu(pid) if pid is not None else 0.0
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.thread_time()
        await measure()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.thread_time() - cpu)
    if pid is not None:
        return min(walls), (process_cpu(pid) - started) / repeats
    return min(walls), min(cpus)


def _print_curve(name: str, sizes: list[int], figures: dict[int, tuple[float, float]]) -> None:
    print(f"\n{name}")
    previous: int | None = None
    for size in sizes:
        wall, cpu = figures[size]
        line = (f"  {size:>5,} requests: {wall * 1000:7.1f} ms wall, {cpu * 1000:7.1f} ms CPU, "
                f"{wall / size * 1e6:6.1f} us a request")
        if previous is not None:
            ratio = wall / figures[previous][0]
            line += (f"  x{ratio:.2f} for x{size / previous:.0f} requests "
                     f"(per request x{ratio * previous / size:.2f}; CPU x{cpu / max(figures[previous][1], 1e-9):.2f})")
        print(line)
        previous = size


async def _healthz_while_paging(session: aiohttp.ClientSession, url: str, page: str, clients: int,
                                seconds: float) -> None:
    ask = _page_asker(session, f"{url}{page}")
    asked = 0
    deadline = time.monotonic() + seconds

    async def client() -> None:
        nonlocal asked
        while time.monotonic() < deadline:
            await ask()
            asked += 1

    with HealthzProbe(url) as probe:
        await asyncio.gather(*(client() for _ in range(clients)))
    print(f"\n/healthz while {clients} clients ask for {page} ({asked} pages in {seconds:.0f} s): {probe.summary()}")


def tool_request(trajectory_id: str, start_ns: int) -> list[SpanRecord]:
    """store_growth's plain request, its model turn asking for one tool call."""
    chat, server = plain_request(trajectory_id, start_ns)
    call = SpanRecord(names.SPAN_TOOL_CALL, SpanKind.INTERNAL, chat.trace_id, secrets.token_hex(8), server.span_id,
                      start_ns + 300_000, start_ns + 400_000, {
                          names.ATTR_CONVERSATION_ID: trajectory_id, names.ATTR_TOOL_NAME: "read_file",
                          names.ATTR_TOOL_CALL_ID: "call_" + secrets.token_hex(6), names.ATTR_OUTCOME: "ok",
                          names.ATTR_ROUND: 1})
    return [chat, call, server]


def _stores(folder: str) -> dict[str, sqlite3.Connection]:
    stores = {"with the request indexes": connect(str(Path(folder, "with.sqlite3"))),
              "without them": connect(str(Path(folder, "without.sqlite3")))}
    for index in ("model_turns_of_request", "tool_calls_of_request"):
        stores["without them"].execute(f"DROP INDEX {index}")
    return stores


def _written(db: sqlite3.Connection, records: list[SpanRecord]) -> float:
    """CPU seconds to write one batch as the store's writer does (with its age pruning)."""
    began = time.process_time()
    db.execute("BEGIN IMMEDIATE")
    write(db, records)
    prune(db, before=time.time() - 30 * 86400)
    db.execute("COMMIT")
    return time.process_time() - began


def write_cost(requests: int, batch: int = 400) -> None:
    """The two stores take turns at each batch (which goes first alternates), so that both see
    the same machine."""
    with tempfile.TemporaryDirectory(prefix="toolspan-trajectory-indexes-") as folder:
        stores = _stores(folder)
        spent = dict.fromkeys(stores, 0.0)
        for number in range(requests // batch):
            for name, db in (stores.items() if number % 2 else reversed(stores.items())):
                spent[name] += _written(db, [r for _ in range(batch)
                                             for r in tool_request(request_ids({})[0], time.time_ns())])
        print(f"{requests // batch * batch:,} requests, each its own trajectory (a model turn and a tool call), "
              f"in batches of {batch}:")
        for name, seconds in spent.items():
            print(f"  {name:>24}: {seconds / (requests // batch * batch) * 1e6:5.1f} us of CPU per request")
    with tempfile.TemporaryDirectory(prefix="toolspan-trajectory-indexes-") as folder:
        _one_long_trajectory(_stores(folder), min(requests, 8_000), batch)


def _one_long_trajectory(stores: dict[str, sqlite3.Connection], requests: int, batch: int) -> None:
    """One trajectory growing, each request's span written a batch after its turn and call (as a
    request that outlasts its batch is): its turn is counted and its request kept by queries over
    the trajectory's rows."""
    print(f"\none trajectory of {requests:,} requests, each request's span a batch after its turn and call:")
    late: dict[str, list[SpanRecord]] = {name: [] for name in stores}
    spent = dict.fromkeys(stores, 0.0)
    tenth = max(requests // 10 // batch, 1) * batch
    for done in range(batch, requests + 1, batch):
        for name, db in stores.items():
            records = [r for _ in range(batch) for r in tool_request("one-long-trajectory", time.time_ns())]
            spent[name] += _written(db, [r for r in records if r.kind is not SpanKind.SERVER] + late[name])
            late[name] = [r for r in records if r.kind is SpanKind.SERVER]
        if done % tenth == 0:
            print(f"  {done:>7,} requests: " + ", ".join(f"{name} {seconds / tenth * 1e6:6.1f} us per request"
                                                        for name, seconds in spent.items()))
            spent = dict.fromkeys(stores, 0.0)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[500, 1000, 2000])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--write-cost", action="store_true", help="what the request indexes cost the writer")
    parser.add_argument("--requests", type=int, default=100_000, help="with --write-cost")
    options = parser.parse_args()
    if options.write_cost:
        write_cost(options.requests)
        return
    sizes = sorted(options.sizes)
    with tempfile.TemporaryDirectory(prefix="toolspan-trajectory-growth-") as folder:
        async with serving(folder) as (url, pid, store), aiohttp.ClientSession() as session, \
                AsyncOpenAI(base_url=f"{url}/v1", api_key="bench", max_retries=0) as client:
            began = time.perf_counter()
            for size in sizes:
                await grow(client, f"bench-{size}", size)
                await stored(store, f"bench-{size}", size)
            print(f"{sum(sizes):,} requests sent ({time.perf_counter() - began:.0f} s), each 4 model turns and "
                  f"3 tool calls: trajectories of {', '.join(f'{s:,}' for s in sizes)} requests")
            curves: dict[str, dict[int, tuple[float, float]]] = {}
            for size in sizes:
                for name, (measure, here) in _measures(session, url, store, f"bench-{size}", size).items():
                    await measure()  # warm: the page cache, the connection
                    curves.setdefault(name, {})[size] = await _timed(measure, options.repeats, None if here else pid)
            for name, figures in curves.items():
                _print_curve(name, sizes, figures)
            for page in (f"/ui/trajectories/bench-{sizes[-1]}", f"/ui/trajectories/bench-{sizes[-1]}?limit=1000"):
                await _healthz_while_paging(session, url, page, options.clients, options.seconds)


if __name__ == "__main__":
    asyncio.run(main())
