"""The Responses side's requests (gateway.translate.responses): a Responses client's request read
into the neutral request (what is kept, what is left out and named, what is refused with a 400
naming the field), the one the pinned Codex CLI sends included, and the neutral request written
for a Responses upstream. Answers and streams: test_responses_answers; properties:
test_responses_properties."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.errors import BadRequest
from gateway.translate.neutral import Image, Request, Text, Thinking, ToolCall, ToolDecl, ToolResult, Turn
from gateway.translate.responses import RESPONSES
from tests.translate.responses_cases import valid_request

# A request of the pinned Codex CLI (tests/e2e/codex), recorded from `codex exec` at its second
# turn (after running a command), its long instructions and descriptions cut.
CODEX_REQUEST = json.loads((Path(__file__).parent / "codex_request.json").read_text())
ADD = {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}


def read(**fields: Any) -> Request:
    return RESPONSES.read_request({"model": "m", **fields})


def refused(**fields: Any) -> BadRequest:
    with pytest.raises(BadRequest) as caught:
        read(**fields)
    return caught.value


def test_a_string_input_is_one_user_turn_and_instructions_the_system_prompt() -> None:
    request = read(input="hi", instructions="be brief")
    assert request.system == ("be brief",)
    assert request.turns == (Turn("user", (Text("hi"),)),)
    assert request.dropped == ()


def test_messages_of_every_role_and_their_parts() -> None:
    request = read(instructions="first", input=[
        {"role": "developer", "content": [{"type": "input_text", "text": "second"},
                                          {"type": "input_text", "text": "third"}]},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "look"},
            {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "auto"},
            {"type": "input_image", "image_url": "data:image/png;base64,iVBOR", "detail": "high"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "seen", "annotations": []},
                                          {"type": "refusal", "refusal": "but no"}], "phase": "final_answer"},
        {"role": "system", "content": "fourth"},
        {"role": "user", "content": "again"}])
    assert request.system == ("first", "second", "third", "fourth")
    assert request.turns == (
        Turn("user", (Text("look"), Image(url="https://example.com/a.png"),
                      Image(data="iVBOR", media_type="image/png"))),
        Turn("assistant", (Text("seen"), Text("but no"))),
        Turn("user", (Text("again"),)))
    assert request.dropped == ("input.content.detail", "input.phase")


def test_calls_and_their_outputs_merge_into_alternating_turns() -> None:
    request = read(input=[
        {"role": "user", "content": "add twice"},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "two calls"}],
         "encrypted_content": "gAAAA..."},
        {"role": "assistant", "content": "On it."},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "add", "arguments": '{"a":1,"b":2}'},
        {"type": "function_call", "call_id": "call_2", "name": "add", "arguments": {"a": 3, "b": 4}},
        {"type": "function_call_output", "call_id": "call_1", "output": "3"},
        {"role": "user", "content": "thanks"},  # before the last result: the results open the turn
        {"type": "function_call_output", "call_id": "call_2",
         "output": [{"type": "input_text", "text": "7"}, {"type": "input_image", "image_url": "https://x/y.png"}]}])
    assert request.turns == (
        Turn("user", (Text("add twice"),)),
        Turn("assistant", (Thinking("two calls"), Text("On it."), ToolCall("call_1", "add", '{"a":1,"b":2}'),
                           ToolCall("call_2", "add", '{"a":3,"b":4}'))),
        Turn("user", (ToolResult("call_1", (Text("3"),)),
                      ToolResult("call_2", (Text("7"), Image(url="https://x/y.png"))), Text("thanks"))))
    assert request.dropped == ("reasoning.encrypted_content",)


def test_a_reasoning_item_with_only_encrypted_content_says_nothing() -> None:
    request = read(input=[{"role": "user", "content": "hi"},
                          {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA..."},
                          {"role": "assistant", "content": "hello"}])
    assert request.turns == (Turn("user", (Text("hi"),)), Turn("assistant", (Text("hello"),)))
    assert request.dropped == ("reasoning.encrypted_content",)


@pytest.mark.parametrize("item", [
    {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "q"}},
    {"type": "file_search_call", "id": "fs_1", "queries": ["q"], "status": "completed"},
    {"type": "computer_call", "id": "cu_1", "call_id": "c", "action": {"type": "screenshot"},
     "pending_safety_checks": [], "status": "completed"},
    {"type": "local_shell_call", "id": "ls_1", "call_id": "c", "status": "completed",
     "action": {"type": "exec", "command": ["ls"], "env": {}}},
    {"type": "custom_tool_call", "call_id": "c", "name": "apply_patch", "input": "*** Begin Patch"},
    {"type": "item_reference", "id": "msg_1"}])
def test_items_of_openai_s_own_tools_are_refused_naming_input_and_the_type(item: dict[str, Any]) -> None:
    error = refused(input=[{"role": "user", "content": "hi"}, item])
    assert (error.status, error.param) == (400, "input")
    assert item["type"] in error.message


@pytest.mark.parametrize(("part", "param"), [
    ({"type": "input_image", "file_id": "file-abc"}, "input.content.file_id"),
    ({"type": "input_file", "file_id": "file-abc"}, "input.content"),
    ({"type": "input_file", "file_data": "data:application/pdf;base64,JVBER", "filename": "a.pdf"}, "input.content")])
def test_files_uploaded_to_openai_cannot_go_elsewhere(part: dict[str, Any], param: str) -> None:
    assert refused(input=[{"role": "user", "content": [part]}]).param == param


def test_function_tools_are_declared_and_hosted_search_left_out() -> None:
    request = read(input="hi", tools=[
        {"type": "function", "name": "add", "description": "Add two numbers", "parameters": ADD, "strict": True},
        {"type": "function", "name": "now", "parameters": None, "strict": False},
        {"type": "web_search", "external_web_access": False}])
    assert request.tools == (ToolDecl("add", "Add two numbers", ADD),
                             ToolDecl("now", None, {"type": "object", "properties": {}}))
    assert request.dropped == ("tools.strict", "tools.web_search")


@pytest.mark.parametrize("tool", [
    {"type": "file_search", "vector_store_ids": ["vs_1"]}, {"type": "mcp", "server_label": "s", "server_url": "u"},
    {"type": "custom", "name": "apply_patch"}, {"type": "local_shell"}, {"type": "code_interpreter", "container": "c"},
    {"type": "image_generation"}, {"type": "computer_use_preview", "display_width": 1, "display_height": 1,
                                   "environment": "linux"}])
def test_tools_only_openai_runs_or_knows_are_refused_naming_tools(tool: dict[str, Any]) -> None:
    error = refused(input="hi", tools=[tool])
    assert (error.status, error.param) == (400, "tools")
    assert tool["type"] in error.message


@pytest.mark.parametrize(("choice", "read_as"), [
    ("auto", "auto"), ("none", "none"), ("required", "required"), (None, None),
    ({"type": "function", "name": "add"}, ("tool", "add"))])
def test_tool_choice(choice: Any, read_as: Any) -> None:
    assert read(input="hi", tool_choice=choice).tool_choice == read_as


@pytest.mark.parametrize("choice", [{"type": "allowed_tools", "mode": "auto", "tools": []},
                                    {"type": "web_search_preview"}, {"type": "custom", "name": "x"}])
def test_tool_choices_of_other_kinds_are_refused(choice: dict[str, Any]) -> None:
    assert refused(input="hi", tool_choice=choice).param == "tool_choice"


def test_the_settings_read() -> None:
    request = read(input="hi", max_output_tokens=300, temperature=1, top_p=0.5, parallel_tool_calls=False,
                   stream=True, user="u-1")
    assert (request.max_tokens, request.temperature, request.top_p, request.parallel_tool_calls) == (300, 1.0, 0.5,
                                                                                                    False)
    assert (request.stream, request.stream_usage, request.user) == (True, True, "u-1")
    assert read(input="hi", safety_identifier="s-1").user == "s-1"


def test_what_only_openai_s_serving_uses_is_left_out_by_name() -> None:
    request = read(input="hi", store=True, include=["reasoning.encrypted_content"], reasoning={"effort": "high"},
                   metadata={"k": "v"}, truncation="auto", service_tier="flex", prompt_cache_key="k",
                   text={"format": {"type": "text"}, "verbosity": "low"}, client_metadata={"session_id": "s"})
    assert set(request.dropped) == {"store", "include", "reasoning", "metadata", "truncation", "service_tier",
                                    "prompt_cache_key", "text", "client_metadata"}
    # Not storing, and plain text, are what every other upstream does anyway: nothing is lost.
    assert read(input="hi", store=False, text={"format": {"type": "text"}}).dropped == ()


@pytest.mark.parametrize(("fields", "param"), [
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}}, "text.format"),
    ({"text": {"format": {"type": "json_object"}}}, "text.format"),
    ({"previous_response_id": "resp_elsewhere"}, "previous_response_id"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"background": True}, "background")])
def test_what_would_change_the_question_is_refused_naming_the_field(fields: dict[str, Any], param: str) -> None:
    error = refused(input="hi", **fields)
    assert (error.status, error.param, error.code) == (400, param, "unsupported_parameter")


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "hi"}, "model"), ({"model": "m", "input": 3}, "input"), ({"model": "m", "input": ["hi"]}, "input[0]"),
    ({"model": "m", "input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ({"model": "m", "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ({"model": "m", "input": [{"type": "function_call_output", "call_id": "c", "output": 3}]}, "input[0].output"),
    ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "input[0].content[0]"),
    ({"model": "m", "input": "hi", "tools": {"type": "function"}}, "tools"),
    ({"model": "m", "input": "hi", "tools": [{"type": "function"}]}, "tools[0].name"),
    ({"model": "m", "input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"model": "m", "input": "hi", "temperature": "hot"}, "temperature"),
    ({"model": "m", "input": "hi", "stream": "yes"}, "stream"),
    ({"model": "m", "input": "hi", "tool_choice": "any"}, "tool_choice"),
    ({"model": "m", "input": "hi", "store": "yes"}, "store"),
    ({"model": "m", "input": "hi", "text": {"format": "json"}}, "text.format")])
def test_fields_of_the_wrong_shape_are_a_400_naming_them(body: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest) as caught:
        RESPONSES.read_request(body)
    assert (caught.value.status, caught.value.param) == (400, param)


def test_the_codex_cli_s_request() -> None:
    request = RESPONSES.read_request(CODEX_REQUEST)
    assert request.system == ("(model.base_instructions: cut from the recording)",
                              "(host_skills.instructions: cut from the recording)",
                              "(permissions.instructions: cut from the recording)")
    [asked, called, answered] = request.turns
    assert asked == Turn("user", (Text("(environments.environment_context: cut from the recording)"),
                                  Text("Say hi by running a command.")))
    assert called == Turn("assistant", (ToolCall("call_1", "exec_command", '{"cmd": "echo hi"}'),))
    assert answered == Turn("user", (ToolResult("call_1", (Text(
        "Chunk ID: c40cdb\nWall time: 0.0000 seconds\nProcess exited with code 0\nOriginal token count: 1\nOutput:"
        "\nhi\n"),)),))
    assert [tool.name for tool in request.tools] == ["exec_command", "write_stdin", "request_user_input",
                                                     "view_image", "get_goal", "create_goal", "update_goal"]
    assert (request.tool_choice, request.parallel_tool_calls, request.stream) == ("auto", True, True)
    # Its hosted search and sub-agent tools are left out (no other upstream has them), named.
    assert request.dropped == ("reasoning", "include", "prompt_cache_key", "client_metadata", "tools.namespace",
                               "tools.web_search")


def test_a_codex_like_request_with_instructions() -> None:
    request = read(instructions="You are Codex.", stream=True, store=False, tool_choice="auto",
                   parallel_tool_calls=False, input=[
                       {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "add 2 and 3"}]},
                       {"type": "function_call", "call_id": "call_a", "name": "add", "arguments": '{"a":2,"b":3}'},
                       {"type": "function_call_output", "call_id": "call_a", "output": "5"}],
                   tools=[{"type": "function", "name": "add", "description": "Add", "parameters": ADD,
                           "strict": False}])
    assert request == Request(
        model="m", system=("You are Codex.",), turns=(
            Turn("user", (Text("add 2 and 3"),)), Turn("assistant", (ToolCall("call_a", "add", '{"a":2,"b":3}'),)),
            Turn("user", (ToolResult("call_a", (Text("5"),)),))),
        tools=(ToolDecl("add", "Add", ADD),), tool_choice="auto", parallel_tool_calls=False, stream=True,
        stream_usage=True)


# --- writing ---------------------------------------------------------------------------------------

def test_a_request_written_for_a_responses_upstream() -> None:
    request = Request(
        model="gpt-5", system=("be brief", "use tools"), turns=(
            Turn("user", (Text("look"), Image(data="iVBOR", media_type="image/png"))),
            Turn("assistant", (Thinking("hmm", signature="sig"), Text("adding"), ToolCall("c1", "add", '{"a":1}'))),
            Turn("user", (ToolResult("c1", (Text("no"),), is_error=True), ToolResult("c2", (Text("a"), Text("b"))),
                          Text("go on")))),
        tools=(ToolDecl("add", None, ADD),), tool_choice=("tool", "add"), parallel_tool_calls=True, max_tokens=100,
        temperature=0.2, stop=("END",), stream=True, user="u")
    body, dropped = RESPONSES.write_request(request)
    assert body == {
        "model": "gpt-5", "instructions": "be brief", "store": False, "stream": True, "input": [
            {"type": "message", "role": "system", "content": "use tools"},
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "look"},
                {"type": "input_image", "image_url": "data:image/png;base64,iVBOR", "detail": "auto"}]},
            {"type": "message", "role": "assistant", "content": "adding"},
            {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a":1}'},
            {"type": "function_call_output", "call_id": "c1", "output": "no"},
            {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "a"},
                                                                         {"type": "input_text", "text": "b"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go on"}]}],
        "tools": [{"type": "function", "name": "add", "parameters": ADD, "strict": False}],
        "tool_choice": {"type": "function", "name": "add"}, "parallel_tool_calls": True, "max_output_tokens": 100,
        "temperature": 0.2, "user": "u"}
    assert dropped == ("thinking", "tool_result.is_error", "stop")
    valid_request(body)
