"""What the tool.call telemetry costs, in units of one bare OpenTelemetry SDK span.

Runs, in one process and one run, calls per second through the executor for a trivial tool:
- off:  no hooks;
- full: tool.call / tool.parse / tool.execute spans through a BatchSpanProcessor to an exporter
        that drops them, and the three tool metrics on a fresh CollectorRegistry;
- bare: hooks that open one SDK span per call (no attributes, no metrics) and nothing else.
A bare span costs (bare - off) per call, measured exactly as full telemetry's (full - off), so
both carry the same executor and garbage-collector context. Target: full <= 4 bare spans.
A bare span in an empty loop is printed as well, for reference.

    python bench/tool_pipeline.py [--calls 2000] [--repeats 15]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import nullcontext
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Tracer
from prometheus_client import CollectorRegistry

from gateway.tools import Param, Tool, ToolCall, ToolExecutor, ToolOutcome, ToolRegistry, Turn
from telemetry.instrument import Telemetry
from telemetry.metrics import Metrics
from telemetry.tracing import INSTRUMENTATION_SCOPE, build_provider, tracer_of


class DropExporter(SpanExporter):
    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


class _BareSpan:
    """One span, current while the call runs: the unit the target is stated in."""

    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer

    async def __aenter__(self) -> _BareSpan:
        self._span = self._tracer.start_span("bare")
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._span.end()
        otel_context.detach(self._token)

    def step(self, name: str) -> nullcontext[None]:
        return nullcontext()

    def finish(self, outcome: ToolOutcome) -> None:
        return None


class BareSpanHooks:
    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer

    def tool_call(self, call: ToolCall, tool: Tool | None, turn: Turn) -> _BareSpan:
        return _BareSpan(self._tracer)


async def echo(args: dict[str, Any]) -> str:
    return str(args["text"])


def registry() -> ToolRegistry:
    return ToolRegistry([Tool(name="echo", description="Echo", function=echo,
                              parameters=[Param("text", "string", required=True)])])


async def per_op_seconds(op: Callable[[], Awaitable[Any]], count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        await op()
    return (time.perf_counter() - start) / count


async def measure(ops: dict[str, Callable[[], Awaitable[Any]]], count: int, repeats: int,
                  settle: Callable[[], None]) -> dict[str, list[float]]:
    """Seconds per op, one value per repeat. The ops take turns within each repeat, and every
    run starts from the same state (span queue flushed, garbage collected), so drift and
    background load hit them all alike."""
    runs: dict[str, list[float]] = {name: [] for name in ops}
    for _ in range(repeats):
        for name, op in ops.items():
            settle()
            runs[name].append(await per_op_seconds(op, count))
    return runs


async def main(calls: int, repeats: int) -> None:
    provider = build_provider(exporters=[DropExporter()])
    sdk_tracer = provider.get_tracer(INSTRUMENTATION_SCOPE)  # the unit: the SDK's own span
    executors = {
        "off": ToolExecutor(registry()),
        "full": ToolExecutor(registry(), Telemetry(tracer_of(provider), Metrics(CollectorRegistry()))),
        "bare": ToolExecutor(registry(), BareSpanHooks(sdk_tracer)),
    }
    turn = Turn(trajectory_id="bench", round=1)
    batch = [ToolCall("call_1", "echo", '{"text": "hi"}')]

    def through(executor: ToolExecutor) -> Callable[[], Awaitable[Any]]:
        return lambda: executor.run_turn(batch, turn)

    async def nothing() -> None:
        return None

    async def loop_span() -> None:
        with sdk_tracer.start_as_current_span("bare"):
            pass

    def settle() -> None:
        provider.force_flush()
        gc.collect()

    ops = {name: through(ex) for name, ex in executors.items()} | {"loop_span": loop_span, "empty": nothing}
    await measure(ops, 500, 1, settle)  # warm-up: caches, label children, code paths
    runs = await measure(ops, calls, repeats, settle)
    provider.shutdown()

    # The ratio is taken within each repeat (same moment, same machine state), then the median.
    ratios = sorted((f - o) / (b - o) for f, o, b in zip(runs["full"], runs["off"], runs["bare"], strict=True))
    t = {name: statistics.median(values) for name, values in runs.items()}
    full_cost, span_cost = t["full"] - t["off"], t["bare"] - t["off"]
    quartiles = statistics.quantiles(ratios, n=4)
    print(f"calls measured: {calls} per run, {repeats} runs each (medians)")
    print(f"telemetry off      : {1 / t['off']:9.0f} calls/s  ({t['off'] * 1e6:6.1f} us/call)")
    print(f"full telemetry     : {1 / t['full']:9.0f} calls/s  ({t['full'] * 1e6:6.1f} us/call)")
    print(f"one bare span/call : {1 / t['bare']:9.0f} calls/s  ({t['bare'] * 1e6:6.1f} us/call)")
    print(f"bare span, alone   : {(t['loop_span'] - t['empty']) * 1e6:6.1f} us/span (empty loop, for reference)")
    print(f"bare span cost     : {span_cost * 1e6:6.1f} us/call")
    print(f"telemetry cost     : {full_cost * 1e6:6.1f} us/call")
    print(f"cost in bare spans : median {statistics.median(ratios):.2f} (quartiles {quartiles[0]:.2f}-"
          f"{quartiles[2]:.2f}) over {repeats} runs; target <= 4")


def run_bench(main: Callable[[int, int], Awaitable[None]], doc: str | None, calls: int, repeats: int) -> None:
    """The command line every micro bench here shares: `--calls` per run and `--repeats` runs."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=calls)
    parser.add_argument("--repeats", type=int, default=repeats)
    options = parser.parse_args()
    asyncio.run(main(options.calls, options.repeats))


if __name__ == "__main__":
    run_bench(main, __doc__, calls=2000, repeats=15)
