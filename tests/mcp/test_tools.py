"""An MCP tool as a registry Tool, without a server: its name, its parse step, its results."""

from __future__ import annotations

import re
from typing import Any

import mcp_types

from gateway.mcp import registered_name, tool_result
from gateway.mcp.tools import build_tool
from gateway.tools import Parsed, Rejection, ToolContext, ToolResult
from gateway.tools.results import ToolOrigin

OPENAI_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
ORIGIN = ToolOrigin("mcp", "files", "tools/call", "search", "pipe")


def test_names_are_prefixed_and_kept_when_valid() -> None:
    assert registered_name("files", "read_file") == "files__read_file"
    assert registered_name("git-hub", "list-issues") == "git-hub__list-issues"


def test_names_outside_openai_rules_are_sanitized_with_a_hash() -> None:
    dotted, underscored = registered_name("files", "read.file"), registered_name("files", "read_file")
    assert OPENAI_NAME.fullmatch(dotted)
    assert dotted.startswith("files__read_file_")
    assert dotted != underscored
    long_one, long_two = registered_name("files", "x" * 100), registered_name("files", "x" * 101)
    assert len(long_one) == 64
    assert OPENAI_NAME.fullmatch(long_one)
    assert long_one != long_two
    assert registered_name("files", "x" * 100) == long_one  # the same at every start


def _tool(schema: dict[str, Any]) -> Any:
    async def never(name: str, args: dict[str, Any]) -> ToolResult:
        raise AssertionError("the parse step must not call the server")
    listed = mcp_types.Tool(name="search", description="Search", input_schema=schema)
    return build_tool(ORIGIN, listed, never, concurrent=False, timeout=None)


SCHEMA = {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1},
                                           "filters": {"type": "object",
                                                       "properties": {"lang": {"type": "string"}},
                                                       "required": ["lang"]}},
          "required": ["query"]}


async def test_the_parse_step_checks_values_and_names_in_one_message() -> None:
    tool = _tool(SCHEMA)
    context = ToolContext(tool_call_id="call_1")
    assert await tool.parse_arguments('{"query": "x", "limit": 2}', context) == Parsed({"query": "x", "limit": 2})
    rejected = await tool.parse_arguments('{"query": 1, "limit": 0, "filters": {}}', context)
    assert isinstance(rejected, Rejection)
    assert rejected.reason == "schema_violation"  # the values broke the server's input schema
    assert rejected.message.splitlines()[:4] == [
        "Tool 'files__search': 3 arguments do not fit the declared parameters.",
        "- filters: 'lang' is a required property",
        "- limit: 0 is less than the minimum of 1",
        "- query: 1 is not of type 'string'"]
    renamed = await tool.parse_arguments('{"qurey": "x"}', context)
    assert isinstance(renamed, Rejection)
    assert renamed.reason == "missing_arguments"
    assert "Unrecognized: qurey (did you mean 'query'?)" in renamed.message
    assert renamed.names is not None
    assert renamed.names.missing == ("query",)


async def test_other_names_pass_when_the_schema_allows_them() -> None:
    tool = _tool({**SCHEMA, "additionalProperties": True})
    parsed = await tool.parse_arguments('{"query": "x", "extra": 1}', ToolContext(tool_call_id="c"))
    assert parsed == Parsed({"query": "x", "extra": 1})
    closed = await _tool(SCHEMA).parse_arguments('{"query": "x", "extra": 1}', ToolContext(tool_call_id="c"))
    assert isinstance(closed, Rejection)
    assert closed.message.startswith("Tool 'files__search': it does not take arguments under the names sent.")


def test_results_become_the_tool_message() -> None:
    text = mcp_types.TextContent(type="text", text="found 2")
    resource = mcp_types.EmbeddedResource(type="resource", resource=mcp_types.TextResourceContents(
        uri="file:///a.txt", text="alpha"))
    result = tool_result(mcp_types.CallToolResult(content=[text, resource], structured_content={"count": 2}))
    assert result == ToolResult(content="found 2\n[resource file:///a.txt]\nalpha", processed_content={"count": 2})
    only_structured = tool_result(mcp_types.CallToolResult(content=[], structured_content={"count": 2}))
    assert only_structured.content == '{"count": 2}'
    failed = tool_result(mcp_types.CallToolResult(content=[text], is_error=True))
    assert failed.is_error
    assert failed.content == "found 2"
