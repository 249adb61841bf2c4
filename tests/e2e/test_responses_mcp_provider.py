"""responses_mcp_runner = "provider" with an OpenAI upstream: the provider runs a Responses request's
`mcp` tools, so the gateway passes them through. The scripted upstream receives the client's `mcp`
spec and its `mcp_approval_response` exactly as the official openai client sent them, the `mcp_*`
items it answers with reach the client unchanged, streamed and not, and the gateway never connects
to the server (even one on its allow list)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.demo.model import Reply
from tests.conftest import Stack, StackFactory
from tests.mcp.conftest import HttpServer, Recorded, files, http_server, recorded

__all__ = ["files", "http_server", "recorded"]  # the fixtures of tests/mcp, used here

pytestmark = pytest.mark.slow

LISTED = {"type": "mcp_list_tools", "id": "mcpl_provider_1", "server_label": "files", "error": None,
          "tools": [{"name": "read_file", "description": "Read a file.", "annotations": None,
                     "input_schema": {"type": "object", "properties": {"path": {"type": "string"}},
                                      "required": ["path"]}}]}
ASKED = {"type": "mcp_approval_request", "id": "mcpr_provider_1", "server_label": "files", "name": "read_file",
         "arguments": '{"path": "/etc/motd"}'}
CALLED = {"type": "mcp_call", "id": "mcp_provider_1", "server_label": "files", "name": "read_file",
          "arguments": '{"path": "/etc/motd"}', "output": "provider's contents", "error": None,
          "status": "completed", "approval_request_id": "mcpr_provider_1"}


def spec(url: str) -> dict[str, Any]:
    """An `mcp` tool with fields the gateway would refuse or rewrite if it ran the tool itself."""
    return {"type": "mcp", "server_label": "files", "server_url": url, "require_approval": "always",
            "allowed_tools": {"tool_names": ["read_file"], "read_only": True},
            "headers": {"X-Team": "blue"}, "server_description": "The team's files"}


def output_of(answer: dict[str, Any]) -> list[dict[str, Any]]:
    return [item for item in answer["output"] if item["type"].startswith("mcp_")]


async def answer(stack: Stack, streamed: bool, **request: Any) -> dict[str, Any]:
    """The gateway's answer as JSON: the body, or the streamed response.completed's response with
    every output_item.done item checked against it."""
    if not streamed:
        raw = await stack.client.responses.with_raw_response.create(model="test-model", **request)
        whole: dict[str, Any] = json.loads(raw.content)
        return whole
    done: list[dict[str, Any]] = []
    completed: dict[str, Any] = {}
    async with stack.client.responses.with_streaming_response.create(model="test-model", stream=True,
                                                                     **request) as raw:
        async for line in raw.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[len("data: "):])
            if event["type"] == "response.output_item.done":
                done.append(event["item"])
            elif event["type"] == "response.completed":
                completed = event["response"]
    assert done == completed["output"]
    return completed


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("listed", [True, False], ids=["on-the-allow-list", "elsewhere"])
async def test_the_provider_gets_the_spec_and_the_approval_as_sent(
        make_stack: StackFactory, files: tuple[HttpServer, Recorded], streamed: bool, listed: bool) -> None:
    server, recorded = files
    stack = await make_stack(upstream_kind="openai", responses_mcp_runner="provider",
                             responses_mcp_servers={"files": {"url": server.url}})
    declared = spec(server.url if listed else "https://mcp.example.com/mcp")
    stack.script.then(Reply(items=[LISTED, ASKED]), Reply(items=[CALLED], content="The motd says hello."))

    first = await answer(stack, streamed, input="What does /etc/motd say?", tools=[declared])
    approval = {"type": "mcp_approval_response", "approval_request_id": "mcpr_provider_1", "approve": True,
                "reason": "fine by me"}
    second = await answer(stack, streamed, input=[approval], tools=[declared], previous_response_id=first["id"])

    asked, followed = stack.upstream_requests
    for body in (asked, followed):
        [upstream_spec] = [tool for tool in body["tools"] if tool.get("type") == "mcp"]
        assert json.dumps(upstream_spec) == json.dumps(declared)  # the same fields, in the same order
    assert json.dumps(followed["input"]) == json.dumps([approval])
    assert followed["previous_response_id"] == first["id"]
    assert output_of(first) == [LISTED, ASKED]
    assert output_of(second) == [CALLED]
    assert second["output"][-1]["content"][0]["text"] == "The motd says hello."
    assert recorded.calls() == []  # the provider ran it; the gateway called nothing
