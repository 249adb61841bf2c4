"""Smaller first-hour items (issue 35): `--outcome` takes only outcomes that exist, and a call whose
values break a tool's declared parameters is labelled schema_violation, not parser. Issue 53's: the
docs list every outcome `--outcome` takes, and say that a client schema's `pattern` is not checked."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.cli.main import main
from gateway.demo.model import Reply
from gateway.demo.tools import demo_registry
from gateway.tools import Param, Tool, ToolRegistry
from telemetry import names
from tests.conftest import USER, StackFactory, tool_outcomes


def test_an_unknown_outcome_is_a_usage_error_listing_the_outcomes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["trajectories", "list", "--outcome", "bogus"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --outcome: invalid choice: 'bogus' (choose from " in err
    for outcome in names.OUTCOMES:
        assert f"'{outcome}'" in err


TELEMETRY_PAGE = Path(__file__).resolve().parents[2] / "docs" / "telemetry-and-trajectories.md"


def page_text() -> str:
    """The telemetry page's text, its line breaks read as spaces."""
    return " ".join(TELEMETRY_PAGE.read_text(encoding="utf-8").split())


def test_the_docs_list_every_outcome_the_option_takes() -> None:
    said = re.search(r"`toolspan trajectories list --outcome` takes one of `([^`]+)`", page_text())
    assert said is not None
    assert [outcome.strip() for outcome in said.group(1).split(",")] == list(names.OUTCOMES)


async def test_a_client_schemas_pattern_is_not_checked_and_the_docs_say_so(make_stack: StackFactory) -> None:
    """Even in reject mode a value that breaks `pattern` reaches the client (a hostile pattern would
    hold the event loop), and the client's tools section of the docs says so."""
    stack = await make_stack(client_tool_check="reject")
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[0-9]+$"}},
              "required": ["code"], "additionalProperties": False}
    stack.script.then(Reply(tool_calls=[("lookup", {"code": "not digits"})]))
    answer = await stack.ask(False, messages=USER, tools=[{"type": "function", "function": {
        "name": "lookup", "description": "d", "parameters": schema}}])
    assert [call["function"]["arguments"] for call in answer.tool_calls] == ['{"code": "not digits"}']
    assert tool_outcomes(stack, answer.headers["x-trace-id"], side=names.SIDE_CLIENT) == [("lookup", "ok")]
    section = page_text().split("### The client's own tools", 1)[1].split("## ", 1)[0]
    assert "Regular expressions are not checked: a value that breaks a `pattern` passes" in section


def test_serve_help_says_which_tools_are_served_without_tools(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps at the terminal's width, hyphens too
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--help"])
    assert exited.value.code == 0
    said = re.search(r"--tools MODULE:ATTR \[MODULE:ATTR \.\.\.\] (.+?) --app-dir DIR ",
                     " ".join(capsys.readouterr().out.split()))
    assert said is not None
    served = demo_registry().names()
    assert said.group(1).endswith(f"(default: the example tools {', '.join(served[:-1])} and {served[-1]} without "
                                  "--upstream, none with it; env TOOLSPAN_TOOLS)")


def otlp_line(trajectory: str) -> str:
    """One request span with one tool call under it, as `toolspan trajectories import` reads them."""
    def attributes(*pairs: tuple[str, str]) -> list[dict[str, Any]]:
        return [{"key": key, "value": {"stringValue": value}} for key, value in pairs]

    call = {"traceId": "0" * 31 + "1", "spanId": "0" * 15 + "a", "parentSpanId": "0" * 15 + "b",
            "name": "tool.call", "kind": 1, "startTimeUnixNano": "1700000000000000000",
            "endTimeUnixNano": "1700000001000000000",
            "attributes": attributes(("gen_ai.conversation.id", trajectory), ("gen_ai.tool.name", "x"))}
    request = {"traceId": "0" * 31 + "1", "spanId": "0" * 15 + "b", "name": "POST /v1/chat/completions",
               "kind": 2, "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000002000000000",
               "attributes": attributes(("gen_ai.conversation.id", trajectory))}
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [call, request]}]}]})


@pytest.mark.parametrize("command", [["export"], ["report"], ["list"], ["list", "--json"], ["show", "t1"]])
def test_output_to_a_reader_that_left_ends_quietly(tmp_path: Path, command: list[str]) -> None:
    """`toolspan trajectories export | head`: the reader is gone before the output ends (here before
    it begins: the pipe's reading end is closed first). No traceback; a shell's status for a
    program SIGPIPE ended."""
    (tmp_path / "one.jsonl").write_text(otlp_line("t1") + "\n")
    store = str(tmp_path / "store.sqlite3")
    assert main(["trajectories", "import", "--db", store, str(tmp_path / "one.jsonl")]) == 0
    reading, writing = os.pipe()
    os.close(reading)
    try:
        done = subprocess.run([sys.executable, "-m", "gateway", "trajectories", *command, "--db", store],
                              stdout=writing, stderr=subprocess.PIPE, timeout=60, check=False)
    finally:
        os.close(writing)
    assert (done.returncode, done.stderr.decode()) == (141, "")


async def test_a_schema_violation_is_labelled_as_such(make_stack: StackFactory) -> None:
    checked = Tool(name="checked", parameters=[Param("n", "integer", required=True)], validate_schema=True,
                   function=lambda a: a["n"])
    stack = await make_stack(registry=ToolRegistry([checked]))
    stack.script.then(Reply(tool_calls=[("checked", {"n": "many"})]), Reply(content="done"))
    raw = await stack.client.chat.completions.with_raw_response.create(model="m", messages=USER)
    [call] = [s for s in stack.spans(raw.headers["x-trace-id"]) if s.name == names.SPAN_TOOL_CALL]
    assert (call.attributes or {})[names.ATTR_REJECTION_REASON] == "schema_violation"
    assert stack.metric(names.METRIC_TOOL_REJECTIONS, tool="checked", reason="schema_violation") == 1
    assert stack.metric(names.METRIC_TOOL_REJECTIONS, tool="checked", reason="parser") == 0
