"""Gateway keys: who may call, which tools each key may use, and that keys stay here."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from gateway.demo.model import Reply
from telemetry import names
from tests.conftest import AUTH, TEST_KEY, USER, Stack, StackFactory, tool_messages

KEYS = {"reader": {"key": TEST_KEY, "tools": ["read_file"]}, "admin": {"key": "tsk-admin-0000"}}


@pytest.fixture
async def keyed(make_stack: StackFactory) -> Stack:
    return await make_stack(keys=KEYS)


@pytest.mark.parametrize("authorization", [None, "Bearer wrong-key-123", TEST_KEY, "Bearer "])
@pytest.mark.parametrize(("method", "path"), [("POST", "/v1/chat/completions"), ("GET", "/v1/tools"),
                                              ("GET", "/v1/models"), ("POST", "/v1/tools/add/invoke")])
async def test_requests_without_a_valid_key_are_refused(keyed: Stack, authorization: str | None, method: str,
                                                        path: str) -> None:
    headers = {"Authorization": authorization} if authorization is not None else {}
    async with keyed.http.request(method, path, headers=headers, json={"model": "m", "messages": USER}) as response:
        assert response.status == 401
        body: dict[str, Any] = await response.json()
    assert body["error"]["type"] == "authentication_error"
    assert body["error"]["code"] == "invalid_api_key"
    assert keyed.upstream_requests == []


async def test_health_and_metrics_need_no_key(keyed: Stack) -> None:
    for path in ("/healthz", "/readyz", "/metrics"):
        async with keyed.http.get(path) as response:
            assert response.status == 200


async def test_the_openapi_document_names_no_tools_when_keys_are_set(keyed: Stack, make_stack: StackFactory) -> None:
    """Which tools a key may use is for its own GET /v1/tools to say, not for an open document."""
    def tool_names(document: dict[str, Any]) -> Any:
        parameters = document["paths"]["/v1/tools/{name}/invoke"]["post"]["parameters"]
        [name] = [p for p in parameters if p.get("in") == "path"]
        return name["schema"].get("enum")

    async with keyed.http.get("/openapi.json") as response:
        assert tool_names(await response.json()) is None
    open_stack = await make_stack()
    async with open_stack.http.get("/openapi.json") as response:
        assert "read_file" in tool_names(await response.json())


async def test_a_key_sees_and_offers_only_its_tools(keyed: Stack) -> None:
    listed = await keyed.client.get("/tools", cast_to=dict)  # type: ignore[type-var]
    assert [t["function"]["name"] for t in listed["data"]] == ["read_file"]
    keyed.script.then(Reply(content="hi"))
    await keyed.ask(False, messages=USER)
    [sent] = keyed.upstream_requests
    assert [t["function"]["name"] for t in sent["tools"]] == ["read_file"]
    assert "Authorization" not in keyed.model.request_headers[0]  # the gateway key stops here


async def test_a_call_outside_the_keys_tools_is_not_allowed(keyed: Stack) -> None:
    keyed.script.then(Reply(tool_calls=[("add", {"a": 1, "b": 2})]), Reply(content="cannot"))
    answer = await keyed.ask(False, messages=USER)
    assert answer.content == "cannot"
    [result] = tool_messages(keyed.upstream_requests[1])
    assert "not available to this caller" in result["content"]
    assert "Available tools: read_file." in result["content"]
    assert keyed.metric(names.METRIC_TOOL_REJECTIONS, tool="add", reason="not_allowed") == 1


async def test_a_key_without_a_tool_list_may_use_every_tool(keyed: Stack) -> None:
    async with openai.AsyncOpenAI(base_url=keyed.url + "/v1", api_key="tsk-admin-0000", max_retries=0) as admin:
        listed = await admin.get("/tools", cast_to=dict)  # type: ignore[type-var]
    assert {t["function"]["name"] for t in listed["data"]} == {"read_file", "add"}


async def test_invoke_outside_the_keys_tools_is_a_403(keyed: Stack) -> None:
    async with keyed.http.post("/v1/tools/add/invoke", json={"arguments": {"a": 1, "b": 2}}, headers=AUTH) as response:
        assert response.status == 403
        body = await response.json()
    assert body["error"]["code"] == "not_allowed"


async def test_a_held_turn_continues_only_for_the_key_that_got_it(keyed: Stack) -> None:
    client_tool = {"type": "function", "function": {"name": "ask_human", "parameters": {"type": "object"}}}
    keyed.script.then(Reply(tool_calls=[("read_file", {"path": "a"}), ("ask_human", {})]))
    first = await keyed.ask(False, messages=USER, tools=[client_tool])
    [call] = first.tool_calls
    follow_up = [*USER, {"role": "assistant", "content": None, "tool_calls": first.tool_calls},
                 {"role": "tool", "tool_call_id": call["id"], "content": "yes"}]
    keyed.script.then(Reply(content="admin sees only its copy"))
    async with openai.AsyncOpenAI(base_url=keyed.url + "/v1", api_key="tsk-admin-0000", max_retries=0) as admin:
        await admin.chat.completions.create(model="m", messages=follow_up, tools=[client_tool])  # type: ignore[arg-type]
    sent = keyed.upstream_requests[-1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool"]  # nothing of the turn the gateway held
    assert "read_file" not in str(sent)
    keyed.script.then(Reply(content="done"))
    assert (await keyed.ask(False, messages=follow_up, tools=[client_tool])).content == "done"  # still held
