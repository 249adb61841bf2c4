#!/usr/bin/env python3
"""Register two tools, run a few model-style calls through the executor, print what happened.

    python examples/quickstart.py        (any python: it runs itself with the project's .venv)
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

VENV = Path(__file__).resolve().parent.parent / ".venv"


def _in_the_venv() -> None:
    """Without toolspan importable (the venv not active), run again with the project's .venv python;
    without one, say how to make it, in one line."""
    try:
        import opentelemetry.sdk  # noqa: F401

        import gateway  # noqa: F401
    except ImportError as missing:
        python = VENV / "bin" / "python"
        if python.is_file() and Path(sys.prefix).resolve() != VENV.resolve():  # not the venv yet: once
            os.execv(python, [str(python), *sys.argv])
        sys.exit(f"quickstart: {missing.name or missing} is not importable from {sys.executable}; install "
                 f"toolspan first (python -m venv .venv && .venv/bin/pip install -e .), then run "
                 f".venv/bin/python examples/quickstart.py")


if __name__ == "__main__":
    _in_the_venv()

from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402 (after the venv check)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402 (after the venv check)
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402 (after the venv check)

from gateway.tools import Param, Tool, ToolCall, ToolExecutor, ToolRegistry, Turn, tool  # noqa: E402 (after the venv check)
from telemetry.instrument import Telemetry  # noqa: E402 (after the venv check)
from telemetry.metrics import Metrics  # noqa: E402 (after the venv check)
from telemetry.tracing import build_provider, tracer_of  # noqa: E402 (after the venv check)


@tool
async def read_file(path: str, offset: int = 0) -> str:
    """Read a text file.

    Args:
        path: the file to read
        offset: characters to skip
    """
    return f"<contents of {path} from {offset}>"


def convert(args: dict[str, object]) -> dict[str, object]:
    return {"celsius": round((float(str(args["fahrenheit"])) - 32) * 5 / 9, 1)}


registry = ToolRegistry([
    read_file,
    Tool(name="to_celsius", description="Convert a temperature", function=convert,
         parameters=[Param("fahrenheit", "number", required=True)]),
])

CALLS = [
    ToolCall("call_1", "read_file", '{"file_path": "notes.txt"}'),  # renamed argument
    ToolCall("call_2", "read_file", '{"path": "notes.txt"}'),       # the model corrects itself
    ToolCall("call_3", "to_celsius", '{"fahrenheit": 98.6}'),
    ToolCall("call_4", "weather", "{}"),                           # no such tool
    ToolCall("call_5", "to_celsius", "{oops"),                      # not JSON
]


async def main() -> None:
    exporter = InMemorySpanExporter()
    provider = build_provider(processors=[SimpleSpanProcessor(exporter)])
    metrics = CollectorRegistry()
    executor = ToolExecutor(registry, Telemetry(tracer_of(provider), Metrics(metrics)))
    for call in CALLS:
        [outcome] = await executor.run_turn([call], Turn(trajectory_id="quickstart"))
        print(f"--- {call.name}({call.arguments}) -> {outcome.status}")
        print(outcome.content_text())
    print("\n=== spans")
    for span in exporter.get_finished_spans():
        attrs = span.attributes or {}
        detail = {k: v for k, v in attrs.items() if k.startswith("toolspan.") and k != "toolspan.round"}
        print(f"{span.name:13} {attrs.get('gen_ai.tool.name', ''):11} {span.status.status_code.name:6} {detail}")
    print("\n=== metrics")
    for line in generate_latest(metrics).decode().splitlines():
        if line.startswith("toolspan_tool_calls_total") or line.startswith("toolspan_tool_rejections_total"):
            print(line)


if __name__ == "__main__":
    asyncio.run(main())
