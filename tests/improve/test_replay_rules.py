"""What a recorded call counts as in a replay (gateway.improve.replay), call by call: which
recorded outcomes are passes and which rejections, which calls are not replayed and why, masked
values, parsers sync and async, and the text printed for it with stored strings made harmless."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.improve import replay_text
from gateway.improve.replay import RecordedCall, replay, replayed
from gateway.improve.targets import SchemaTarget, ToolsTarget
from gateway.tools import Param, Tool, ToolContext, ToolError
from gateway.tools.repair import RepairPolicy


def _never(args: dict[str, Any]) -> str:
    raise AssertionError("a replay ran a body")


async def _async_parser(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    await asyncio.sleep(0)
    if context.principal != "alpha":
        raise ToolError(f"only alpha may, not {context.principal}")
    return args


def _raising_parser(args: dict[str, Any]) -> None:
    raise KeyError("oops")


TOOLS = ToolsTarget([
    Tool(name="read", function=_never, parameters=[Param("path", "string", required=True)]),
    Tool(name="guarded", function=_never, parse_args=_async_parser),
    Tool(name="fragile", function=_never, parse_args=_raising_parser),
], "three tools", allowed={"beta": frozenset({"read"})})


def call(tool: str = "read", arguments: str | None = '{"path": "/a"}', outcome: str | None = "ok",
         reason: str | None = None, **fields: Any) -> RecordedCall:
    row = {"tool": tool, "side": "gateway", "outcome": outcome, "rejection_reason": reason, "arguments": arguments,
           "cut": False, "masked": False, "id": "alpha~t1", "key": "alpha", "local_id": "t1", "span_id": "s1",
           "trace_id": "0" * 32, "call_id": "call_1", "started": 1.0}
    return RecordedCall.of({**row, **fields})


@pytest.mark.parametrize(("recorded", "kind"), [
    (call(), "still_passing"),
    (call(arguments="{}"), "broken"),  # passed then (say the tool changed), refused now
    (call(outcome="error"), "still_passing"),  # the body ran and failed: the parse step passed
    (call(outcome="timeout"), "still_passing"),
    (call(outcome="interrupted"), "still_passing"),
    (call(outcome="denied"), "still_passing"),  # a reviewer said no, after the parse step
    (call(outcome="repaired"), "still_passing"),
    (call(outcome="rejected", reason="guardrail_denied", arguments="{}"), "broken"),  # guardrails see parsed calls
    (call(outcome="rejected", reason="missing_arguments"), "fixed"),
    (call(outcome="rejected", reason="invalid_json", arguments="{not json"), "still_rejected"),
    (call(outcome="rejected", reason="unknown_tool"), "fixed"),  # the tool is there now, and the call fits it
    (call(tool="gone", outcome="rejected", reason="unknown_tool"), "not_in_target"),
    (call(outcome="rejected", reason="not_allowed"), "not_allowed"),  # the key's list, not the tool, refused it
    (call(outcome=None), "no_outcome"),
    (call(outcome="rejected", reason=None), "no_outcome"),
    (call(side="client"), "no_schema"),
    (call(arguments=None), "not_recorded"),
    (call(cut=True), "cut"),
    (call(masked=True), "still_passing"),
    (call(masked=True, arguments='{"token": "[REDACTED]"}'), "uncertain"),  # the mask may be what fails now
    (call(tool="guarded", arguments="{}"), "still_passing"),  # an async parser, told the call's key
    (call(tool="guarded", arguments="{}", key="beta"), "not_in_target"),  # beta may not use it
    (call(tool="guarded", arguments="{}", key="gamma"), "broken"),
    (call(tool="fragile"), "broken"),  # a parser that raises rejects
])
async def test_what_a_recorded_call_counts_as(recorded: RecordedCall, kind: str) -> None:
    found, verdict = await replayed(recorded, TOOLS)
    assert found == kind
    if kind in ("broken", "still_rejected"):  # with what the model would be told now
        assert verdict is not None
        assert not verdict.passed
        assert verdict.reason
        assert verdict.message


async def test_the_recording_hint_and_the_terminal_escaping() -> None:
    hostile = "read\x1b]0;pwned\x07"
    calls = [call(arguments=None), call(arguments=None, tool=hostile),
             call(outcome="rejected", reason="missing_arguments", arguments='{"p\\u001b[2J": 1}')]
    target = ToolsTarget([Tool(name="read", function=_never, parse_args=lambda args: None)], "read\x1b[2J")
    answer = await replay(calls, target)
    assert (answer["fixed"], answer["not_replayed"]) == (1, {"not_in_target": 1, "not_recorded": 1})
    text = "\n".join(replay_text.replay(answer))
    assert "\x1b" not in text
    assert "\x07" not in text
    assert "replayed against read\\u001b[2J" in text
    assert replay_text.RECORDING_HINT in text


async def test_a_schema_past_the_bounds_leaves_its_calls_unchecked() -> None:
    remote = {"type": "object", "properties": {"x": {"$ref": "https://example.com/schema.json"}}}
    target = SchemaTarget([{"type": "function", "function": {"name": "remote", "parameters": remote}},
                           {"type": "web_search"}, {"name": "shell"}], "schemas")
    assert await replayed(call(tool="remote", arguments='{"x": 1}'), target) == ("unchecked", None)
    assert await replayed(call(tool="shell", arguments="{}"), target) == ("unchecked", None)  # no function tool


async def test_repair_passes_what_it_mends_for_the_keys_it_applies_to() -> None:
    add = Tool(name="add", function=_never, validate_schema=True,
               parameters=[Param("a", "integer", required=True), Param("b", "integer", required=True)])
    target = ToolsTarget([add], "add", repair=RepairPolicy("apply", by_key={"beta": "off"}))
    sent = call(tool="add", outcome="rejected", reason="schema_violation", arguments='{"a": "1", "b": 2}')
    kind, verdict = await replayed(sent, target)
    assert kind == "fixed"
    assert verdict is not None
    assert verdict.repaired
    assert (await replayed(call(tool="add", outcome="repaired", arguments='{"a": "1", "b": 2}'), target))[0] == (
        "still_passing")  # recorded repaired: the body ran; and it would again
    of_beta = call(tool="add", outcome="rejected", reason="schema_violation", arguments='{"a": "1", "b": 2}',
                   key="beta", id="beta~t1")
    assert (await replayed(of_beta, target))[0] == "still_rejected"  # beta's calls are not repaired
    assert (await replayed(sent, ToolsTarget([add], "add")))[0] == "still_rejected"  # no repair configured



async def test_a_tool_whose_values_cannot_be_checked_leaves_its_calls_unchecked() -> None:
    """A tool that asks for its values checked against a schema that refers outside itself passes
    its calls on their names alone (Parsed.unchecked): a replay cannot say they pass, nor did the
    gateway when it ran them."""
    remote = Tool(name="remote", function=_never, validate_schema=True, parameters_schema={
        "type": "object", "properties": {"x": {"$ref": "https://example.com/schema.json"}}, "required": ["x"]})
    target = ToolsTarget([remote], "remote")
    assert await replayed(call(tool="remote", arguments='{"x": 1}'), target) == ("unchecked", None)
    missing = call(tool="remote", arguments="{}")  # the names are checked: a missing one is still refused
    assert (await replayed(missing, target))[0] == "broken"

