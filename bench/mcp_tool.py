"""What a tool call costs through MCP, beside the same tool registered in the gateway.

One process, one run: the gateway's executor with full telemetry (spans to an exporter that drops
them, metrics on a fresh registry) calls `echo` one call at a time,
- registered: the example tool, registered in the gateway;
- mcp:        the same tool from `toolspan mcp-examples`, an MCP server over stdio, whose
              calls the gateway validates against the tool's inputSchema and sends as tools/call.
The two take turns within each repeat; the figure is the median over the repeats of the time
per call, and of the time MCP adds (mcp - registered, taken within each repeat). Target: MCP adds
at most 2 ms per call.

    python bench/mcp_tool.py [--calls 300] [--repeats 11]
"""

from __future__ import annotations

import gc
import statistics
import time

from prometheus_client import CollectorRegistry
from tool_pipeline import DropExporter, run_bench  # bench/, beside this file

from gateway.demo.mcp_server import SOURCE_NAME, with_mcp_examples
from gateway.demo.tools import demo_registry
from gateway.mcp import McpSources
from gateway.settings.model import Settings
from gateway.tools import ToolCall, ToolExecutor, ToolRegistry, Turn
from telemetry.instrument import Telemetry
from telemetry.metrics import Metrics
from telemetry.tracing import build_provider, tracer_of

TARGET_MS = 2.0


async def per_call_seconds(executor: ToolExecutor, call: ToolCall, turn: Turn, count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        [outcome] = await executor.run_turn([call], turn)
        if outcome.status != "ok":
            raise RuntimeError(f"the bench's call failed: {outcome.content_text()}")
    return (time.perf_counter() - start) / count


async def main(calls: int, repeats: int) -> None:
    provider = build_provider(exporters=[DropExporter()])
    telemetry = Telemetry(tracer_of(provider), Metrics(CollectorRegistry()))
    registered = ToolExecutor(demo_registry(), telemetry)
    through_mcp = ToolRegistry()
    sources = McpSources(with_mcp_examples(Settings()).mcp_servers, through_mcp, telemetry)
    await sources.start()
    try:
        mcp = ToolExecutor(through_mcp, telemetry)
        turn = Turn(trajectory_id="bench", round=1)
        arguments = '{"text": "hi"}'
        targets = {"registered": (registered, ToolCall("call_1", "echo", arguments)),
                   "mcp": (mcp, ToolCall("call_1", f"{SOURCE_NAME}__echo", arguments))}
        runs: dict[str, list[float]] = {name: [] for name in targets}
        for repeat in range(repeats + 1):  # the first round warms up: connections, caches, label children
            for name, (executor, call) in targets.items():
                provider.force_flush()
                gc.collect()
                seconds = await per_call_seconds(executor, call, turn, calls if repeat else 50)
                if repeat:
                    runs[name].append(seconds)
    finally:
        await sources.stop()
        provider.shutdown()

    added = sorted(m - r for m, r in zip(runs["mcp"], runs["registered"], strict=True))
    quartiles = statistics.quantiles(added, n=4)
    median = {name: statistics.median(values) for name, values in runs.items()}
    print(f"calls measured: {calls} per run, {repeats} runs each (medians), one call at a time")
    print(f"registered tool : {median['registered'] * 1e3:7.3f} ms/call")
    print(f"MCP tool (stdio): {median['mcp'] * 1e3:7.3f} ms/call")
    print(f"MCP adds        : {statistics.median(added) * 1e3:7.3f} ms/call (quartiles {quartiles[0] * 1e3:.3f}-"
          f"{quartiles[2] * 1e3:.3f}); target <= {TARGET_MS:g}")


if __name__ == "__main__":
    run_bench(main, __doc__, calls=300, repeats=11)
