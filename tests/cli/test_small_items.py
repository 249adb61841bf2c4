"""Smaller first-hour items (issue 35): `--outcome` takes only outcomes that exist, and a call whose
values break a tool's declared parameters is labelled schema_violation, not parser."""

from __future__ import annotations

import pytest

from gateway.cli import main
from gateway.demo.model import Reply
from gateway.tools import Param, Tool, ToolRegistry
from telemetry import names
from tests.conftest import USER, StackFactory


def test_an_unknown_outcome_is_a_usage_error_listing_the_outcomes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["trajectories", "list", "--outcome", "bogus"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --outcome: invalid choice: 'bogus' (choose from " in err
    for outcome in names.OUTCOMES:
        assert f"'{outcome}'" in err


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
