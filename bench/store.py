"""What the trajectory store costs per tool call, as a ratio to full telemetry without it, and
how much disk 10,000 tool calls take.

Runs, in one process and one run, a trivial tool through the executor:
- off:   no hooks;
- full:  full telemetry (spans through a BatchSpanProcessor to an exporter that counts and drops
         them, and the metrics), no store;
- store: the same with the trajectory store's span processor too.
Each run ends with a flush of its provider (the batch exporter and, for `store`, the store's
writer), inside the measurement: the background threads' work is counted on both sides, not only
the queueing on the request path. The batch processor's queue holds a whole run, so neither side
drops a span (the bench checks that both exported the same number).

Two clocks: wall time, and the process's CPU time (`time.process_time`, all threads): the writer
shares the cores with the requests, so its CPU is what a busy gateway pays. The runs take turns
within each repeat; the ratio (store - off) / (full - off) is taken per repeat, then the median.
Target: <= 1.25 (of the CPU figure, the stricter one).

    python bench/store.py [--calls 2000] [--repeats 15]
"""

from __future__ import annotations

import gc
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tool_pipeline import registry, run_bench

from gateway.tools import ToolCall, ToolExecutor, Turn
from telemetry.instrument import Telemetry
from telemetry.metrics import Metrics
from telemetry.store.writer import TrajectoryStore
from telemetry.tracing import build_resource, tracer_of

GOOD = [ToolCall("call_1", "echo", '{"text": "hi"}')]
BAD = [ToolCall("call_2", "echo", '{"txt": "a rejected call, whose arguments are kept"}')]
SPANS_PER_CALL = 3  # tool.call, tool.parse, tool.execute


class CountingExporter(SpanExporter):
    def __init__(self) -> None:
        self.exported = 0

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        self.exported += len(spans)
        return SpanExportResult.SUCCESS


class Side:
    """One way of running the calls: an executor, and the flush that ends a run."""

    def __init__(self, calls: int, store: TrajectoryStore | None = None, *, telemetry: bool = True) -> None:
        self.exporter = CountingExporter()
        self.provider = TracerProvider(resource=build_resource())
        if telemetry:
            self.provider.add_span_processor(BatchSpanProcessor(
                self.exporter, max_queue_size=SPANS_PER_CALL * calls + 1024))
        if store is not None:
            self.provider.add_span_processor(store)
        hooks = Telemetry(tracer_of(self.provider), Metrics(CollectorRegistry())) if telemetry else None
        self.executor = ToolExecutor(registry(), hooks)

    def flush(self) -> None:
        self.provider.force_flush()


async def run_calls(executor: ToolExecutor, count: int, start: int = 0) -> None:
    """`count` calls, one in ten rejected (its arguments stored), ten calls per trajectory."""
    for i in range(start, start + count):
        await executor.run_turn(BAD if i % 10 == 0 else GOOD, Turn(trajectory_id=f"t{i // 10}", round=1))


async def measure(calls: int, repeats: int, store: TrajectoryStore) -> tuple[dict[str, list[float]], ...]:
    """Seconds per call (wall, CPU), one value per repeat and side."""
    sides = {"off": Side(calls, telemetry=False), "full": Side(calls), "store": Side(calls, store)}
    wall: dict[str, list[float]] = {name: [] for name in sides}
    cpu: dict[str, list[float]] = {name: [] for name in sides}
    for repeat in range(repeats + 1):  # the first round warms up
        for name, side in sides.items():
            side.flush()
            gc.collect()
            started, started_cpu = time.perf_counter(), time.process_time()
            await run_calls(side.executor, calls, repeat * calls)
            side.flush()
            if repeat:
                wall[name].append((time.perf_counter() - started) / calls)
                cpu[name].append((time.process_time() - started_cpu) / calls)
    if sides["full"].exporter.exported != sides["store"].exporter.exported:
        raise SystemExit(f"unfair: full exported {sides['full'].exporter.exported} spans, "
                         f"store {sides['store'].exporter.exported}")
    return wall, cpu


async def size_per_10k(directory: Path) -> int:
    store = TrajectoryStore(directory / "size.sqlite3")
    side = Side(10_000, store)
    await run_calls(side.executor, 10_000)
    side.flush()
    store.shutdown()
    return sum(p.stat().st_size for p in directory.glob("size.sqlite3*"))  # noqa: ASYNC240 (after the run)


def summary(label: str, runs: dict[str, list[float]]) -> None:
    ratios = sorted((s - o) / (f - o) for s, f, o in zip(runs["store"], runs["full"], runs["off"], strict=True))
    t = {name: statistics.median(values) for name, values in runs.items()}
    quartiles = statistics.quantiles(ratios, n=4)
    print(f"{label}: off {t['off'] * 1e6:6.1f}, full {t['full'] * 1e6:6.1f}, full + store "
          f"{t['store'] * 1e6:6.1f} us/call; store / full telemetry: median {statistics.median(ratios):.2f} "
          f"(quartiles {quartiles[0]:.2f}-{quartiles[2]:.2f})")


async def main(calls: int, repeats: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        store = TrajectoryStore(Path(directory) / "bench.sqlite3")
        wall, cpu = await measure(calls, repeats, store)
        store.shutdown()
        size = await size_per_10k(Path(directory))
    print(f"calls measured: {calls} per run, {repeats} runs each (medians); 1 in 10 calls rejected; "
          "flushes included; target <= 1.25")
    summary("wall", wall)
    summary("cpu ", cpu)
    print(f"size on disk: {size / 1024:.0f} KiB per 10,000 tool calls (database and WAL)")


if __name__ == "__main__":
    run_bench(main, __doc__, calls=2000, repeats=15)
