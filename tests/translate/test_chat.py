"""The Chat Completions side of translation (gateway.translate.chat): requests read and written,
answers read and written, what is dropped and what is refused, and the recorded provider answers
of tests/corpus read into the neutral form. Streams: test_chat_stream.py; properties:
test_chat_roundtrip.py; the openai client on both ends: test_chat_openai.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat import ChatCompletion

from gateway.errors import BadRequest, UpstreamUnavailable
from gateway.translate.chat import CHAT
from gateway.translate.neutral import (
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

CORPUS = Path(__file__).parents[1] / "corpus"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# --- reading requests ----------------------------------------------------------------------------

def test_a_tool_loop_conversation_reads_into_alternating_turns() -> None:
    request = CHAT.read_request({"model": "m", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [
            _call("call_1", "weather", '{"city": "Paris"}'), _call("call_2", "weather", '{"city": "Rome"}')]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "rain"}]},
        {"role": "user", "content": "And tomorrow?"},
    ]})
    assert request.system == ("Be brief.",)
    assert request.turns == (
        Turn("user", (Text("Weather in Paris and Rome?"),)),
        Turn("assistant", (ToolCall("call_1", "weather", '{"city": "Paris"}'),
                           ToolCall("call_2", "weather", '{"city": "Rome"}'))),
        Turn("user", (ToolResult("call_1", (Text("sunny"),)), ToolResult("call_2", (Text("rain"),)),
                      Text("And tomorrow?"))),
    )
    assert request.dropped == ()


def test_every_field_with_a_neutral_meaning_is_read() -> None:
    request = CHAT.read_request({
        "model": "gpt-4o", "stream": True, "stream_options": {"include_usage": True},
        "messages": [
            {"role": "developer", "content": [{"type": "text", "text": "One."}, {"type": "text", "text": "Two."}]},
            {"role": "user", "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "auto"}}]},
            {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
            {"role": "system", "content": "Three."},
            {"role": "user", "content": "Thanks"}],
        "tools": [
            {"type": "function", "function": {"name": "weather", "description": "Weather", "parameters": WEATHER}},
            {"type": "function", "function": {"name": "now"}}],
        "tool_choice": {"type": "function", "function": {"name": "weather"}}, "parallel_tool_calls": False,
        "max_completion_tokens": 300, "max_tokens": 100, "temperature": 1, "top_p": 0.5, "stop": "END",
        "user": "u-1"})
    assert request == Request(
        model="gpt-4o", system=("One.", "Two.", "Three."),
        turns=(Turn("user", (Text("What is this?"), Image(url="https://example.com/cat.png"),
                             Image(data="iVBORw0KGgo=", media_type="image/png"))),
               Turn("assistant", (Text("A cat."),)), Turn("user", (Text("Thanks"),))),
        tools=(ToolDecl("weather", "Weather", WEATHER),
               ToolDecl("now", None, {"type": "object", "properties": {}})),
        tool_choice=("tool", "weather"), parallel_tool_calls=False, max_tokens=300, temperature=1.0, top_p=0.5,
        stop=("END",), stream=True, stream_usage=True, user="u-1")


@pytest.mark.parametrize(("choice", "read"), [
    ("auto", "auto"), ("none", "none"), ("required", "required"),
    ({"type": "function", "function": {"name": "f"}}, ("tool", "f")), (None, None)])
def test_tool_choice(choice: Any, read: Any) -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert CHAT.read_request({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": tools,
                              "tool_choice": choice}).tool_choice == read


def test_max_tokens_alone_and_a_stop_list() -> None:
    request = CHAT.read_request({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 7,
                                 "stop": ["a", "b"], "safety_identifier": "hash-1"})
    assert (request.max_tokens, request.stop, request.user) == (7, ("a", "b"), "hash-1")


def test_consecutive_messages_of_one_side_merge_with_tool_results_first() -> None:
    request = CHAT.read_request({"model": "m", "messages": [
        {"role": "user", "content": "a"}, {"role": "user", "content": "b"},
        {"role": "assistant", "content": "", "tool_calls": [_call("c1", "f", "{}")]},
        {"role": "assistant", "content": "more"},
        {"role": "user", "content": "c"}, {"role": "tool", "tool_call_id": "c1", "content": ""}]})
    assert request.turns == (
        Turn("user", (Text("a"), Text("b"))),
        Turn("assistant", (ToolCall("c1", "f", "{}"), Text("more"))),  # an empty content is no part
        Turn("user", (ToolResult("c1", (Text(""),)), Text("c"))))


def test_arguments_sent_as_an_object_are_read_as_json_text() -> None:
    request = CHAT.read_request({"model": "m", "messages": [
        {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": {"a": 1}}}]}]})
    assert request.turns[0].parts == (ToolCall("c1", "f", '{"a":1}'),)


@pytest.mark.parametrize(("field", "value", "name"), [
    ("logprobs", True, "logprobs"), ("top_logprobs", 2, "top_logprobs"), ("seed", 7, "seed"), ("n", 1, "n"),
    ("frequency_penalty", 0.5, "frequency_penalty"), ("presence_penalty", 0.1, "presence_penalty"),
    ("logit_bias", {"50256": -100}, "logit_bias"), ("response_format", {"type": "text"}, "response_format"),
    ("store", True, "store"), ("metadata", {"run": "1"}, "metadata"), ("service_tier", "auto", "service_tier"),
    ("reasoning_effort", "low", "reasoning_effort"), ("modalities", ["text"], "modalities"),
    ("prompt_cache_key", "k", "prompt_cache_key"),
    ("stream_options", {"include_usage": True, "include_obfuscation": False}, "stream_options.include_obfuscation"),
])
def test_a_field_harmless_to_leave_out_is_dropped_by_name(field: str, value: Any, name: str) -> None:
    request = CHAT.read_request({"model": "m", "messages": [{"role": "user", "content": "x"}], field: value})
    assert request.dropped == (name,)


def test_what_a_message_says_beside_its_content_is_dropped_by_name() -> None:
    request = CHAT.read_request({"model": "m", "user": "u", "safety_identifier": "s", "messages": [
        {"role": "user", "name": "ann", "content": [
            {"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "high"}}]},
        {"role": "assistant", "content": "ok", "reasoning_content": "thought"}],
        "tools": [{"type": "function", "function": {"name": "f", "strict": True, "parameters": WEATHER}}]})
    assert set(request.dropped) == {"messages.name", "image_url.detail", "messages.reasoning_content",
                                    "tools.function.strict", "safety_identifier"}
    assert request.turns[1].parts == (Text("ok"),)
    assert request.user == "u"


def test_null_fields_are_absent() -> None:
    request = CHAT.read_request({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": None,
                                 "response_format": None, "logprobs": None, "tools": None, "stop": None})
    assert (request.dropped, request.tools, request.stop) == ((), (), ())


USER = [{"role": "user", "content": "x"}]


@pytest.mark.parametrize(("body", "param"), [
    ({"n": 2}, "n"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {}}}}, "response_format"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"function_call": "auto"}, "function_call"),
    ({"web_search_options": {}}, "web_search_options"),
    ({"top_k": 5}, "top_k"),
    ({"tools": [{"type": "custom", "custom": {"name": "grep"}}]}, "tools[0].type"),
    ({"tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}}, "tool_choice"),
    ({"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "file", "file": {"file_id": "f"}}]}]},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "function", "name": "f", "content": "1"}]}, "messages[0].role"),
    ({"messages": [{"role": "assistant", "audio": {"id": "a1"}}]}, "messages[0].audio"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "custom", "custom": {"name": "g"}}]}]},
     "messages[0].tool_calls[0].type"),
], ids=lambda value: value if isinstance(value, str) else None)
def test_a_field_whose_loss_would_change_the_question_is_refused(body: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest, match="the upstream's API cannot express it") as raised:
        CHAT.read_request({"model": "m", "messages": USER, **body})
    assert raised.value.param == param
    assert raised.value.status == 400


@pytest.mark.parametrize(("body", "param"), [
    ({"model": ""}, "model"), ({"messages": []}, "messages"), ({"messages": "hi"}, "messages"),
    ({"messages": ["hi"]}, "messages[0]"), ({"messages": [{"content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "https://x"}]}]},
     "messages[0].content[0].image_url.url"),
    ({"messages": [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "https://x"}}]}]},
     "messages[0].content[0]"),
    ({"messages": [{"role": "tool", "content": "r"}]}, "messages[0].tool_call_id"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}]},
     "messages[0].tool_calls[0].id"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "function": {}}]}]},
     "messages[0].tool_calls[0].function.name"),
    ({"messages": [{"role": "assistant", "tool_calls": {"id": "c"}}]}, "messages[0].tool_calls"),
    ({"messages": [{"role": "assistant", "content": 5}]}, "messages[0].content"),
    ({"stream": "true"}, "stream"), ({"max_tokens": 0}, "max_tokens"), ({"max_completion_tokens": 1.5},
                                                                        "max_completion_tokens"),
    ({"temperature": True}, "temperature"), ({"stop": 5}, "stop"), ({"stop": ["a", 1]}, "stop"),
    ({"n": "2"}, "n"), ({"user": 5}, "user"), ({"parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ({"stream_options": []}, "stream_options"), ({"stream_options": {"include_usage": 1}},
                                                 "stream_options.include_usage"),
    ({"tools": {"type": "function"}}, "tools"), ({"tools": [{"function": {"name": "f"}}]}, "tools[0]"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools[0].function.parameters"),
    ({"tool_choice": "any"}, "tool_choice"), ({"response_format": "json"}, "response_format"),
], ids=lambda value: value if isinstance(value, str) else None)
def test_a_field_of_the_wrong_shape_is_a_bad_request_naming_it(body: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest) as raised:
        CHAT.read_request({"model": "m", "messages": USER, **body})
    assert raised.value.param == param


# --- writing requests ----------------------------------------------------------------------------

CONVERSATION = Request(
    model="local-model", system=("Be brief.", "Use tools."),
    turns=(Turn("user", (Text("Look:"), Image(url="https://example.com/a.png"),
                         Image(data="AAAA", media_type="image/jpeg"))),
           Turn("assistant", (Thinking("hmm", signature="sig"), Text("Checking."),
                              ToolCall("toolu_1", "weather", '{"city":"Paris"}'),
                              ToolCall("toolu_2", "weather", '{"city":"Rome"}'))),
           Turn("user", (ToolResult("toolu_1", (Text("sunny"), Image(url="https://example.com/map.png"))),
                         ToolResult("toolu_2", (Text("no such city"),), is_error=True),
                         Text("Thanks")))),
    tools=(ToolDecl("weather", "The weather", WEATHER),), tool_choice="required", parallel_tool_calls=True,
    max_tokens=1024, temperature=0.2, stop=("END",), stream=True, user="u-1")


def test_a_conversation_is_written_as_chat_messages() -> None:
    body, dropped = CHAT.write_request(CONVERSATION)
    assert body == {
        "model": "local-model",
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "Be brief."},
                                           {"type": "text", "text": "Use tools."}]},
            {"role": "user", "content": [
                {"type": "text", "text": "Look:"},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,AAAA"}}]},
            {"role": "assistant", "content": "Checking.", "tool_calls": [
                _call("toolu_1", "weather", '{"city":"Paris"}'), _call("toolu_2", "weather", '{"city":"Rome"}')]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "toolu_2", "content": "no such city"},
            {"role": "user", "content": "Thanks"}],
        "tools": [{"type": "function", "function": {"name": "weather", "description": "The weather",
                                                    "parameters": WEATHER}}],
        "tool_choice": "required", "parallel_tool_calls": True, "max_tokens": 1024, "temperature": 0.2,
        "stop": ["END"], "user": "u-1", "stream": True, "stream_options": {"include_usage": True}}
    assert set(dropped) == {"thinking", "tool_result.image", "tool_result.is_error"}


def test_a_named_tool_and_no_stream() -> None:
    request = Request(model="m", system=(), turns=(Turn("user", (Text("x"),)),),
                      tools=(ToolDecl("f", None, {"type": "object"}),), tool_choice=("tool", "f"))
    body, dropped = CHAT.write_request(request)
    assert body == {"model": "m", "messages": [{"role": "user", "content": "x"}],
                    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
                    "tool_choice": {"type": "function", "function": {"name": "f"}}}
    assert dropped == ()


def test_without_tools_the_choice_among_them_is_dropped() -> None:
    request = Request(model="m", system=(), turns=(Turn("user", (Text("x"),)),), tool_choice="none",
                      parallel_tool_calls=False)
    body, dropped = CHAT.write_request(request)
    assert "tool_choice" not in body
    assert "parallel_tool_calls" not in body
    assert set(dropped) == {"tool_choice", "parallel_tool_calls"}


def test_a_tool_result_of_several_texts_keeps_each_and_one_of_images_only_is_empty() -> None:
    request = Request(model="m", system=(), turns=(Turn("user", (
        ToolResult("c1", (Text("a"), Text("b"))), ToolResult("c2", (Image(url="https://x/y.png"),)))),))
    body, dropped = CHAT.write_request(request)
    assert body["messages"] == [
        {"role": "tool", "tool_call_id": "c1",
         "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "tool", "tool_call_id": "c2", "content": ""}]
    assert dropped == ("tool_result.image",)


def test_an_assistant_turn_of_thinking_only_writes_no_message() -> None:
    request = Request(model="m", system=(), turns=(Turn("user", (Text("x"),)), Turn("assistant", (Thinking("t"),))))
    body, dropped = CHAT.write_request(request)
    assert body["messages"] == [{"role": "user", "content": "x"}]
    assert dropped == ("thinking",)


# --- answers -------------------------------------------------------------------------------------

def _completion(message: dict[str, Any], finish: str | None = "stop", **extra: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}], **extra}


def test_an_answer_with_reasoning_text_calls_and_usage_is_read() -> None:
    answer = CHAT.read_answer(_completion(
        {"content": "Let me look.", "reasoning_content": "They want weather.",
         "tool_calls": [_call("call_1", "weather", '{"city":"Paris"}'), _call("call_2", "now", "")]},
        "tool_calls", usage={"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120,
                             "prompt_tokens_details": {"cached_tokens": 64}}))
    assert answer == Answer("chatcmpl-1", "m", (Thinking("They want weather."), Text("Let me look."),
                                               ToolCall("call_1", "weather", '{"city":"Paris"}'),
                                               ToolCall("call_2", "now", "")),
                            "tool_calls", Usage(100, 20, 64))


@pytest.mark.parametrize(("finish", "calls", "stop"), [
    ("stop", False, "end"), ("length", False, "length"), ("tool_calls", True, "tool_calls"),
    ("content_filter", False, "content_filter"), ("function_call", True, "tool_calls"),
    ("stop", True, "tool_calls"), (None, True, "tool_calls"), (None, False, "end"), ("abort", False, "end"),
    ("length", True, "length")])
def test_finish_reasons(finish: str | None, calls: bool, stop: str) -> None:
    message = {"content": "x", **({"tool_calls": [_call("c", "f", "{}")]} if calls else {})}
    assert CHAT.read_answer(_completion(message, finish)).stop == stop


def test_a_stop_sequence_named_by_vllm_and_deepseeks_cache_hits() -> None:
    body = _completion({"content": "x"}, usage={"prompt_tokens": 10, "completion_tokens": 1,
                                                "prompt_cache_hit_tokens": 8, "prompt_cache_miss_tokens": 2})
    body["choices"][0]["stop_reason"] = "END"
    answer = CHAT.read_answer(body)
    assert (answer.stop, answer.stop_sequence, answer.usage) == ("stop_sequence", "END", Usage(10, 1, 8))


def test_an_answer_without_usage_has_none() -> None:
    assert CHAT.read_answer(_completion({"content": None})) == Answer("chatcmpl-1", "m", (), "end")


@pytest.mark.parametrize("body", [
    [], {}, {"choices": []}, {"choices": ["x"]}, {"choices": [{"message": "hi"}]},
    _completion({"tool_calls": "x"}), _completion({"tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]}),
    _completion({"tool_calls": [{"id": "c", "function": {"name": "f", "arguments": 5}}]}),
    _completion({"content": ["x"]}), _completion({"reasoning_content": 5, "content": "x"}),
], ids=["list", "empty", "no-choice", "choice-not-object", "message-not-object", "calls-not-list", "call-without-name",
        "arguments-a-number", "content-a-list", "reasoning-a-number"])
def test_an_answer_of_the_wrong_shape_is_the_providers_fault(body: Any) -> None:
    with pytest.raises(UpstreamUnavailable, match="the provider's Chat answer") as raised:
        CHAT.read_answer(body)
    assert raised.value.status == 502


def test_an_answer_is_written_as_a_chat_completion_the_openai_types_accept() -> None:
    answer = Answer("msg_1", "claude", (Thinking("t1", signature="s"), Text("Hi "), Thinking("", redacted=True),
                                        ToolCall("toolu_1", "f", '{"a":1}'), Text("there")),
                    "tool_calls", Usage(50, 5, cache_read_tokens=30, cache_write_tokens=10))
    body = CHAT.write_answer(answer)
    assert isinstance(body.pop("created"), int)
    assert body == {
        "id": "msg_1", "object": "chat.completion", "model": "claude",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": "Hi there", "reasoning_content": "t1",
            "tool_calls": [_call("toolu_1", "f", '{"a":1}')]}}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 55,
                  "prompt_tokens_details": {"cached_tokens": 30}}}
    completion = ChatCompletion.model_validate({**body, "created": 1})
    assert completion.choices[0].message.tool_calls is not None


def test_an_answer_without_text_or_usage() -> None:
    body = CHAT.write_answer(Answer("a", "m", (), "length"))
    assert body["choices"][0] == {"index": 0, "message": {"role": "assistant", "content": None},
                                  "finish_reason": "length"}
    assert "usage" not in body
    assert CHAT.write_answer(Answer("a", "m", (Text("x"),), "stop_sequence", stop_sequence="END"))["choices"][0][
        "stop_reason"] == "END"


# --- the recorded answers ------------------------------------------------------------------------

# What each recorded Chat answer says: its text, calls, reasoning, stop and usage.
RECORDED = {
    "azure_content_filter": ("The capital of France is Paris.", (), "", "end", Usage(14, 8, 0)),
    "deepseek_reasoner": ('There are **3** r\'s in "strawberry".', (),
                          "Spell it out: s-t-r-a-w-b-e-r-r-y. The r's are letters 3, 8 and 9, so three.", "end",
                          Usage(17, 96, 0)),
    "llamacpp_object_arguments": ("", (ToolCall("Xk2p9QvR7mTb4sLw1nZc8yHd3fJg6aE0", "get_weather",
                                                '{"city":"Paris","unit":"celsius"}'),), "", "tool_calls",
                                  Usage(212, 24)),
    "openai_logprobs": ("Hello! How can I help?", (), "", "end", Usage(9, 7, 0)),
    "openai_refusal": ("I'm sorry, I can't assist with that request.", (), "", "end", Usage(112, 11, 0)),
    "vllm_continuous_usage": ("Hi there!", (), "The user wants a one-word greeting.", "end", Usage(14, 9)),
    "vllm_reasoning": ("9.8 is greater than 9.11.", (),
                       "Compare the decimals digit by digit: 9.11 has 1 tenth, 9.8 has 8 tenths, so 9.8 is bigger.\n",
                       "end", Usage(18, 45)),
}


def test_every_recorded_chat_answer_is_listed() -> None:
    chat = {path.stem for path in CORPUS.glob("*.json") if not path.stem.startswith(("anthropic_", "openai_responses"))}
    assert chat == set(RECORDED)


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_a_recorded_answer_reads_into_the_neutral_form(name: str) -> None:
    body = json.loads((CORPUS / f"{name}.json").read_text())
    text, calls, thinking, stop, usage = RECORDED[name]
    answer = CHAT.read_answer(body)
    assert (answer.answer_id, answer.model) == (body["id"], body["model"])
    assert answer.parts == (*([Thinking(thinking)] if thinking else []), *([Text(text)] if text else []), *calls)
    assert (answer.stop, answer.usage) == (stop, usage)
