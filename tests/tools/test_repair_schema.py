"""Argument repair checks its fix against the schema the tool declares (gateway.tools.repair): with
the tool's own validator, built once, so that whether a call is repaired does not depend on how busy
the machine is; and a tool whose declared schema is no valid JSON Schema (one that never checks
values may declare one) is left unrepaired, never an error of the gateway's."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.tools import Param, Tool, ToolCall, ToolExecutor, ToolOutcome, ToolRegistry, Turn, schema_bounds
from gateway.tools.repair import RepairPolicy


class SlowClock:
    """time.monotonic of a machine so busy that every reading of the clock is 20 ms after the last:
    a check on the event loop (a budget of 10 ms) is out of time at its first reading after its
    start, which only a check of some hundreds of steps comes to (compiling a schema's validator:
    its metaschema checked); a check of a few arguments' values never reads it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        self.now += 0.02
        return self.now


def adder(**fields: Any) -> Tool:
    return Tool(name="add", function=lambda args: str(args["a"] + args["b"]),
                parameters=[Param("a", "integer", required=True), Param("b", "integer", required=True)], **fields)


async def _run(tool: Tool, arguments: dict[str, Any]) -> ToolOutcome:
    executor = ToolExecutor(ToolRegistry([tool]), repair=RepairPolicy("apply"))
    try:
        return await executor.run_call(ToolCall("call_1", tool.name, json.dumps(arguments)), Turn())
    finally:
        await executor.aclose()


@pytest.mark.parametrize("validate_schema", [True, False], ids=["values-checked", "names-only"])
async def test_a_busy_machine_repairs_what_an_idle_one_does(monkeypatch: pytest.MonkeyPatch,
                                                            validate_schema: bool) -> None:
    tool = adder(validate_schema=validate_schema)
    idle = await _run(tool, {"A": "1", "b": 2})
    assert (idle.status, idle.content, idle.repair is not None) == ("ok", "3", True)
    monkeypatch.setattr(schema_bounds, "time", SimpleNamespace(monotonic=SlowClock().monotonic, sleep=time.sleep))
    busy = await _run(adder(validate_schema=validate_schema), {"A": "1", "b": 2})
    assert (busy.status, busy.content) == ("ok", "3")
    assert busy.repair is not None
    assert busy.repair.changes == idle.repair.changes


async def test_a_declared_schema_that_is_no_json_schema_is_left_unrepaired() -> None:
    """Without validate_schema a tool's schema is never compiled; repair must not fail on it."""
    tool = Tool(name="count", function=lambda args: "counted", parameters_schema={
        "type": "object", "properties": {"n": {"type": "integer", "minimum": "zero"}}, "required": ["n"]})
    outcome = await _run(tool, {"N": 3})
    assert (outcome.status, outcome.repair) == ("rejected", None)
    assert outcome.rejection is not None
    assert outcome.rejection.reason == "missing_arguments"
