"""The Messages side of translation (gateway.translate.messages): requests as Claude Code and the
anthropic SDK send them read into neutral ones, neutral requests written for an Anthropic
upstream, answers read and written; what cannot be said refused or dropped by name."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import BadRequest, UpstreamUnavailable
from gateway.translate.messages import MESSAGES
from gateway.translate.messages_blocks import ANTHROPIC_CALL_ID, anthropic_call_id, neutral_call_id
from gateway.translate.neutral import (
    DEFAULT_MAX_TOKENS,
    Answer,
    Image,
    Request,
    Text,
    Thinking,
    ToolCall,
    ToolDecl,
    ToolResult,
    Turn,
    Usage,
)
from tests.translate.messages_cases import CORPUS, answers, over_the_wire, requests

WEATHER: dict[str, Any] = {"name": "get_weather", "description": "Weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
PIXEL = "iVBORw0KGgo="


def claude_code_request(**extra: Any) -> dict[str, Any]:
    """A request as Claude Code sends it: system blocks with cache_control, thinking on, its
    metadata, a tool loop with parallel calls, their results (one failed, one with an image)."""
    return {
        "model": "claude-sonnet-4-5", "max_tokens": 32000, "stream": True,
        "system": [{"type": "text", "text": "You are Claude Code."},
                   {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": "What is the weather in Lisbon and Porto?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Two cities: two calls.", "signature": "c2lnbmVk"},
                {"type": "text", "text": "Checking both."},
                {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Lisbon"}},
                {"type": "tool_use", "id": "toolu_02", "name": "get_weather", "input": {"city": "Porto"},
                 "caller": {"type": "direct"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": "21°C"},
                {"type": "tool_result", "tool_use_id": "toolu_02", "is_error": True, "content": [
                    {"type": "text", "text": "station offline"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PIXEL}}]},
                {"type": "text", "text": "Thanks", "cache_control": {"type": "ephemeral"}}]}],
        "tools": [WEATHER], "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        "metadata": {"user_id": "user_abc_session_1"}, "thinking": {"type": "enabled", "budget_tokens": 1024},
        "temperature": 1, "top_k": 5, **extra}


LOOP = (Turn("user", (Text("What is the weather in Lisbon and Porto?"),)),
        Turn("assistant", (Thinking("Two cities: two calls.", "c2lnbmVk"), Text("Checking both."),
                           ToolCall("toolu_01", "get_weather", '{"city":"Lisbon"}'),
                           ToolCall("toolu_02", "get_weather", '{"city":"Porto"}'))),
        Turn("user", (ToolResult("toolu_01", (Text("21°C"),)),
                      ToolResult("toolu_02", (Text("station offline"), Image(data=PIXEL, media_type="image/png")),
                                 is_error=True),
                      Text("Thanks"))))


def test_a_claude_code_request_reads_as_the_neutral_request() -> None:
    assert MESSAGES.read_request(claude_code_request()) == Request(
        "claude-sonnet-4-5", ("You are Claude Code.", "Be brief."), LOOP,
        (ToolDecl("get_weather", "Weather in a city", WEATHER["input_schema"]),), "auto", False, 32000, 1.0,
        stop=(), stream=True, stream_usage=True, user="user_abc_session_1",
        dropped=("cache_control", "thinking", "top_k"))


def test_the_neutral_request_writes_as_the_messages_request_it_was_read_from() -> None:
    body, dropped = MESSAGES.write_request(MESSAGES.read_request(claude_code_request()))
    original = claude_code_request()
    assert dropped == ()
    assert body["system"] == "You are Claude Code.\n\nBe brief."
    assistant = original["messages"][1]
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "What is the weather in Lisbon and Porto?"}]},
        {**assistant, "content": [{k: v for k, v in block.items() if k != "caller"} for block in assistant["content"]]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": [{"type": "text", "text": "21°C"}]},
            original["messages"][2]["content"][1], {"type": "text", "text": "Thanks"}]}]
    assert {k: v for k, v in body.items() if k not in ("messages", "system")} == {
        "model": "claude-sonnet-4-5", "max_tokens": 32000, "stream": True, "tools": [WEATHER], "temperature": 1.0,
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        "metadata": {"user_id": "user_abc_session_1"}}


@pytest.mark.parametrize(("choice", "neutral"), [
    ({"type": "auto"}, ("auto", None)), ({"type": "any"}, ("required", None)), ({"type": "none"}, ("none", None)),
    ({"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}, (("tool", "get_weather"), False)),
    ({"type": "any", "disable_parallel_tool_use": False}, ("required", None))])
def test_each_tool_choice_reads_and_writes_back(choice: dict[str, Any], neutral: tuple[Any, Any]) -> None:
    request = MESSAGES.read_request({"model": "m", "messages": [], "tools": [WEATHER], "tool_choice": choice})
    assert (request.tool_choice, request.parallel_tool_calls) == neutral
    written = {k: v for k, v in choice.items() if v is not False}
    assert MESSAGES.write_request(request)[0]["tool_choice"] == written


def test_no_parallel_calls_without_a_choice_is_auto_without_them() -> None:
    request = Request("m", (), (), (ToolDecl("f", None, {"type": "object"}),), parallel_tool_calls=False)
    assert MESSAGES.write_request(request)[0]["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    none = Request("m", (), (), (), "none", parallel_tool_calls=False)
    assert MESSAGES.write_request(none)[0]["tool_choice"] == {"type": "none"}  # it calls nothing at all


@pytest.mark.parametrize(("change", "param", "words"), [
    ({"tools": [WEATHER, {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}]}, "tools",
     "web_search is Anthropic's own web_search_20250305 tool"),
    ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools", "bash is Anthropic's own bash_20250124"),
    ({"tools": [{"name": "f"}]}, "tools[0].input_schema", "JSON Schema"),
    ({"mcp_servers": [{"type": "url", "url": "https://mcp.example", "name": "x"}]}, "mcp_servers", "MCP"),
    ({"output_config": {"format": {"type": "json_schema", "schema": {}}}}, "output_config.format", "structured"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "messages[0].content[0]",
     "`document` block in the user's message"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "document", "source": {}}]}]}]}, "messages[0].content[0].content[0]", "`document` block in a tool"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "text", "text": None}]}]}]}, "messages[0].content[0].content[0].text", "string"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}]},
     "messages[0].content[0]", "source of type `file`"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]},
     "messages[0].content[0]", "in the assistant's message"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": 3}]}]},
     "messages[0].content[0].input", "object"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role", "user or assistant"),
    ({"messages": "hi"}, "messages", "list"),
    ({"model": ""}, "model", "non-empty"),
    ({"max_tokens": "100"}, "max_tokens", "integer"),
    ({"temperature": True}, "temperature", "number"),
    ({"tool_choice": "auto"}, "tool_choice", '"type"'),
    ({"system": [{"type": "image"}]}, "system[0]", "text block"),
    ({"stop_sequences": ["a", 1]}, "stop_sequences", "strings"),
])
def test_what_no_other_api_can_say_is_a_400_naming_the_field(change: dict[str, Any], param: str, words: str) -> None:
    with pytest.raises(BadRequest) as refused:
        MESSAGES.read_request({"model": "m", "max_tokens": 10, "messages": [], **change})
    assert refused.value.param == param
    assert words in refused.value.message
    assert refused.value.message.startswith(param)


def test_what_only_tunes_anthropics_serving_is_dropped_by_name() -> None:
    request = MESSAGES.read_request({
        "model": "m", "messages": [], "top_k": 3, "service_tier": "auto", "thinking": {"type": "adaptive"},
        "output_config": {"effort": "high"}, "metadata": {"user_id": "u", "tag": "x"}, "context_management": {},
        "tools": [{**WEATHER, "cache_control": {"type": "ephemeral"}, "strict": True}], "thread": None})
    assert request.dropped == ("cache_control", "tools.strict", "metadata.tag", "top_k", "service_tier", "thinking",
                               "output_config", "context_management")
    assert MESSAGES.read_request({"model": "m", "messages": [], "thinking": {"type": "disabled"}}).dropped == ()


def test_a_neutral_request_of_a_chat_client_writes_as_anthropic_takes_it() -> None:
    """Consecutive turns of one role merged, results first, empty text left out, a limit given,
    unsigned thinking and arguments that are no object dropped by name."""
    request = Request("m", ("Be brief.", "", "Use tools."), (
        Turn("user", (Text("hi"), Text(""))),
        Turn("user", (Image(url="data:image/png;base64," + PIXEL), Image(url="https://x.example/a.png"))),
        Turn("assistant", (Thinking("hmm"), Text(""), ToolCall("call_1", "f", "{not json"),
                           ToolCall("functions.f:2", "f", ""))),
        Turn("user", (Text("and"),)), Turn("user", (ToolResult("call_1", (), is_error=True),
                                                    ToolResult("functions.f:2", (Text(""),))))),
        (ToolDecl("f", None, {}),), "required", stop=("END",), user="u-1")
    body, dropped = MESSAGES.write_request(request)
    encoded = anthropic_call_id("functions.f:2")
    assert body == {
        "model": "m", "max_tokens": DEFAULT_MAX_TOKENS, "system": "Be brief.\n\nUse tools.", "stream": False,
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "hi"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PIXEL}},
                {"type": "image", "source": {"type": "url", "url": "https://x.example/a.png"}}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "f", "input": {}},
                                              {"type": "tool_use", "id": encoded, "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "is_error": True},
                                         {"type": "tool_result", "tool_use_id": encoded},
                                         {"type": "text", "text": "and"}]}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "any"},
        "stop_sequences": ["END"], "metadata": {"user_id": "u-1"}}
    assert dropped == ("thinking", "tool_use.input")


@pytest.mark.parametrize("image", [Image(url="data:image/svg+xml,%3Csvg%3E"), Image(), Image(url="data:;base64,AA")])
def test_an_image_anthropic_cannot_take_is_a_400(image: Image) -> None:
    with pytest.raises(BadRequest) as refused:
        MESSAGES.write_request(Request("m", (), (Turn("user", (image,)),)))
    assert refused.value.param == "image"


@pytest.mark.parametrize("call_id", ["toolu_01", "call-abc_9", "functions.get_weather:0", "", "ts64_", "ts64_AA",
                                     "ts64_Zg", "id with spaces/é"])
def test_a_call_id_anthropic_refuses_travels_encoded_and_comes_back(call_id: str) -> None:
    said = anthropic_call_id(call_id)
    assert ANTHROPIC_CALL_ID.fullmatch(said)
    assert neutral_call_id(said) == call_id
    assert (said == call_id) == (ANTHROPIC_CALL_ID.fullmatch(call_id) is not None and not call_id.startswith("ts64_"))


@given(st.text())
def test_every_call_id_maps_to_one_of_anthropics_shape_and_back(call_id: str) -> None:
    said = anthropic_call_id(call_id)
    assert ANTHROPIC_CALL_ID.fullmatch(said)
    assert neutral_call_id(said) == call_id


def test_a_client_follow_up_finds_the_calls_of_a_chat_upstream() -> None:
    """A call whose id Anthropic would refuse reaches the client encoded; the client's next request
    names it so, and reads back as the upstream's own id."""
    written = MESSAGES.write_answer(Answer("a", "m", (ToolCall("functions.f:0", "f", "{}"),), "tool_calls"))
    said = written["content"][0]["id"]
    follow_up = {"model": "m", "messages": [{"role": "assistant", "content": written["content"]}, {
        "role": "user", "content": [{"type": "tool_result", "tool_use_id": said, "content": "ok"}]}]}
    turns = MESSAGES.read_request(over_the_wire(follow_up)).turns
    assert turns == (Turn("assistant", (ToolCall("functions.f:0", "f", "{}"),)),
                     Turn("user", (ToolResult("functions.f:0", (Text("ok"),)),)))


@settings(max_examples=150, deadline=None)
@given(request=requests())
def test_any_request_messages_can_say_writes_and_reads_back_the_same(request: Request) -> None:
    body, dropped = MESSAGES.write_request(request)
    assert dropped == ()
    assert MESSAGES.read_request(over_the_wire(body)) == request


# --- answers -------------------------------------------------------------------------------------------

CORPUS_ANSWERS = ["text", "thinking", "tool_use", "redacted_thinking"]


def corpus_answer(name: str) -> dict[str, Any]:
    answer: dict[str, Any] = json.loads((CORPUS / f"anthropic_{name}.json").read_text())
    return answer


def test_a_recorded_answer_reads_with_every_field() -> None:
    assert MESSAGES.read_answer(corpus_answer("thinking")) == Answer(
        "msg_011CZd3aQmiP4G1bovX20mcc", "claude-sonnet-4-5-20250929", (
            Thinking(corpus_answer("thinking")["content"][0]["thinking"],
                     corpus_answer("thinking")["content"][0]["signature"]),
            Text("Let me look up the current weather in Paris."),
            ToolCall("toolu_01yQfqSPDqel0AjDVrGORzti", "get_weather", '{"location":"Paris, France","unit":"celsius"}')),
        "tool_calls", Usage(88 + 1836, 156, 1836, 0))
    redacted = MESSAGES.read_answer(corpus_answer("redacted_thinking"))
    assert redacted.parts[1] == Thinking(corpus_answer("redacted_thinking")["content"][1]["data"], redacted=True)
    assert MESSAGES.read_answer(corpus_answer("tool_use")).usage == Usage(412 + 1836, 87, 0, 1836)


@pytest.mark.parametrize("name", CORPUS_ANSWERS)
def test_a_recorded_answer_read_and_written_is_the_answer_the_client_would_have_had(name: str) -> None:
    recorded = corpus_answer(name)
    written = MESSAGES.write_answer(MESSAGES.read_answer(recorded))
    assert written["content"] == [{k: v for k, v in block.items() if k != "caller"} for block in recorded["content"]]
    assert {k: written[k] for k in ("id", "model", "type", "role", "stop_reason", "stop_sequence")} == {
        k: recorded[k] for k in ("id", "model", "type", "role", "stop_reason", "stop_sequence")}
    assert written["usage"] == {k: recorded["usage"][k] for k in (
        "input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")}


@pytest.mark.parametrize(("reason", "stop"), [
    ("end_turn", "end"), ("tool_use", "tool_calls"), ("max_tokens", "length"), ("stop_sequence", "stop_sequence"),
    ("refusal", "content_filter"), ("model_context_window_exceeded", "length"), ("pause_turn", "end")])
def test_each_stop_reason_reads(reason: str, stop: str) -> None:
    answer = MESSAGES.read_answer({"id": "m", "model": "x", "content": [], "stop_reason": reason,
                                   "stop_sequence": "END" if reason == "stop_sequence" else None})
    assert answer.stop == stop
    assert answer.stop_sequence == ("END" if reason == "stop_sequence" else None)


def test_a_request_that_is_no_object_is_a_400() -> None:
    with pytest.raises(BadRequest, match="JSON object"):
        MESSAGES.read_request([{"model": "m"}])  # type: ignore[arg-type]


@pytest.mark.parametrize("body", [
    [], {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}, {"id": "m"},
    {"content": "hi"}, {"content": ["hi"]}, {"content": [{"type": "tool_use", "name": "f", "input": {}}]},
    {"content": [{"type": "text", "text": 3}]},
    {"content": [{"type": "tool_use", "id": "t", "name": "f", "input": 1}]}])
def test_a_malformed_answer_is_the_providers_fault(body: dict[str, Any]) -> None:
    with pytest.raises(UpstreamUnavailable):
        MESSAGES.read_answer(body)


def test_a_written_answer_counts_the_uncached_input_apart() -> None:
    written = MESSAGES.write_answer(Answer("a", "m", (ToolCall("c", "f", "[1]"),), "length", Usage(100, 7, 60, 30)))
    assert written["usage"] == {"input_tokens": 10, "output_tokens": 7, "cache_read_input_tokens": 60,
                                "cache_creation_input_tokens": 30}
    assert written["stop_reason"] == "max_tokens"
    assert written["content"] == [{"type": "tool_use", "id": "c", "name": "f", "input": {}}]  # not an object
    assert MESSAGES.write_answer(Answer("a", "m", (), "end"))["usage"] == {"input_tokens": 0, "output_tokens": 0}


@settings(max_examples=150, deadline=None)
@given(answer=answers)
def test_any_answer_messages_can_say_writes_and_reads_back_the_same(answer: Answer) -> None:
    assert MESSAGES.read_answer(over_the_wire(MESSAGES.write_answer(answer))) == answer
