"""What argument repair (issue 61) costs a tool call: CPU per call of ToolExecutor.run_turn for
`add(a: integer, b: integer)` (its values checked against its schema), called with arguments that
pass (`{"a": 1, "b": 2}`) and with arguments repair can mend (`{"A": "1", "b": 2}`: a rename and a
type), with repair off (no policy: the executor's `repair` is None), in observe and in apply.

Method: every repeat runs every target and argument set, one call at a time, --calls calls each,
their order rotating; process CPU time per call; the median over the repeats. A passing call never
reaches repair, so its three figures differ by the machine's noise only; a mendable call in observe
pays for the search, the schema check and the second parse; in apply also the body (on a thread).

    python bench/repair.py [--calls 3000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from gateway.tools import Param, Tool, ToolCall, ToolExecutor, ToolRegistry, Turn
from gateway.tools.repair import RepairPolicy

PASSING: dict[str, Any] = {"a": 1, "b": 2}
MENDABLE: dict[str, Any] = {"A": "1", "b": 2}
MODES: dict[str, RepairPolicy | None] = {"off": None, "observe": RepairPolicy("observe"),
                                         "apply": RepairPolicy("apply")}


def adder() -> Tool:
    return Tool(name="add", function=lambda args: args["a"] + args["b"], validate_schema=True,
                parameters=[Param("a", "integer", required=True), Param("b", "integer", required=True)])


async def per_call(executor: ToolExecutor, arguments: dict[str, Any], calls: int) -> float:
    """CPU seconds per call, over `calls` calls."""
    started = time.process_time()
    for _ in range(calls):
        await executor.run_turn([ToolCall("c", "add", arguments)], Turn())
    return (time.process_time() - started) / calls


async def main(calls: int, repeats: int) -> None:
    executors = {mode: ToolExecutor(ToolRegistry([adder()]), repair=policy) for mode, policy in MODES.items()}
    targets = [(mode, name, arguments) for mode in MODES for name, arguments in (("passing", PASSING),
                                                                              ("mendable", MENDABLE))]
    found: dict[tuple[str, str], list[float]] = {(mode, name): [] for mode, name, _ in targets}
    for executor in executors.values():  # warm: the validators built, the thread pool started
        await per_call(executor, MENDABLE, 100)
    for repeat in range(repeats):
        for mode, name, arguments in targets[repeat % len(targets):] + targets[:repeat % len(targets)]:
            found[(mode, name)].append(await per_call(executors[mode], arguments, calls))
    for executor in executors.values():
        await executor.aclose()
    print(f"{'repair':8} {'passing call':>14} {'mendable call':>14}")
    for mode in MODES:
        passing, mendable = (statistics.median(found[(mode, name)]) * 1e6 for name in ("passing", "mendable"))
        print(f"{mode:8} {passing:11.1f} µs {mendable:11.1f} µs")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=7)
    options = parser.parse_args()
    asyncio.run(main(options.calls, options.repeats))
