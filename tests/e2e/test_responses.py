"""The Responses API through the gateway with the official openai client, streamed and not: the
same engine as Chat, rendered as one response."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pytest

from gateway.demo.model import Reply
from gateway.tools import Tool, ToolRegistry, ToolResult
from telemetry import names
from tests.conftest import STREAM, ResponseAnswer, Stack, StackFactory, tool_outcomes, tree

QUESTION = "read notes.txt"
CLIENT_TOOL = {"type": "function", "name": "ask_human", "description": "Ask the user", "strict": False,
               "parameters": {"type": "object", "properties": {"question": {"type": "string"}}}}


def tool_spans(stack: Stack, answer: ResponseAnswer) -> list[tuple[str, str]]:
    return tool_outcomes(stack, answer.headers["x-trace-id"])


def assert_one_response(answer: ResponseAnswer) -> None:
    """A streamed answer is one response: one created, one completed, one id, numbered events,
    output indexes that point into the final output."""
    if not answer.events:
        return
    kinds = [e["type"] for e in answer.events]
    assert kinds.count("response.created") == 1
    assert kinds[0] == "response.created"
    assert kinds[-1] == "response.completed"
    assert [e["sequence_number"] for e in answer.events] == list(range(len(answer.events)))
    ids = {e["response"]["id"] for e in answer.events if "response" in e}
    assert ids == {answer.id}
    for event in answer.events:
        if event["type"] == "response.output_item.done":
            assert answer.output[event["output_index"]] == event["item"]


def round_ids(stack: Stack, answer: ResponseAnswer) -> list[str]:
    """The provider's response ids of every round, in order (from the chat spans)."""
    chats = tree(stack.spans(answer.headers["x-trace-id"]))["chat"]
    return [str(s.attributes[names.ATTR_RESPONSE_ID]) for s in chats]  # type: ignore[index]


def outputs_sent(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [item for item in body["input"] if item.get("type") == "function_call_output"]


@STREAM
async def test_plain_answer(stack: Stack, stream: bool) -> None:
    stack.script.then(Reply(content="Hi there, how can I help?"))
    answer = await stack.respond(stream, input="hello")
    assert answer.text == "Hi there, how can I help?"
    assert answer.status == "completed"
    assert answer.calls == []
    assert_one_response(answer)
    [sent] = stack.upstream_requests
    assert sent["input"] == "hello"  # as the client sent it
    assert [(t["type"], t["name"], t["strict"]) for t in sent["tools"]] == [
        ("function", "read_file", False), ("function", "add", False)]
    assert answer.tools == []  # the gateway's tools are not echoed back as the client's
    if not stream:
        assert answer.headers["x-toolspan-rounds"] == "1"
    found = tree(stack.spans(answer.headers["x-trace-id"]))
    assert found["root"].name == "POST /v1/responses"
    assert len(found["chat"]) == 1


@STREAM
async def test_one_gateway_tool_round_replays_the_items(stack: Stack, stream: bool) -> None:
    stack.script.then(Reply(tool_calls=[("read_file", {"path": "notes.txt"})]), Reply(content="It says hi."))
    answer = await stack.respond(stream, input=QUESTION)
    assert answer.text == "It says hi."
    assert answer.calls == []  # the gateway's call never reaches the client
    assert not [e for e in answer.events if "function_call" in e["type"] or
                e.get("item", {}).get("type") == "function_call"]
    _, second = stack.upstream_requests
    assert "previous_response_id" not in second
    [call] = [item for item in second["input"] if item.get("type") == "function_call"]
    assert call["name"] == "read_file"
    assert outputs_sent(second) == [{"type": "function_call_output", "call_id": call["call_id"],
                                     "output": "contents of notes.txt"}]
    assert answer.usage is not None
    assert (answer.usage["input_tokens"], answer.usage["output_tokens"], answer.usage["total_tokens"]) == (20, 10, 30)
    assert answer.id.startswith("resp_tspan_")  # an answer over several responses goes by the gateway's id
    assert answer.id not in round_ids(stack, answer)
    assert_one_response(answer)
    assert tool_spans(stack, answer) == [("read_file", "ok")]
    assert len(tree(stack.spans(answer.headers["x-trace-id"]))["chat"]) == 2


@STREAM
async def test_renamed_argument_is_diagnosed_and_corrected(stack: Stack, stream: bool) -> None:
    def corrected(body: dict[str, Any]) -> Reply:
        message = body["messages"][-1]["content"]
        assert "Unrecognized: file_path (did you mean 'path'?)" in message
        return Reply(tool_calls=[("read_file", {"path": "notes.txt"})])

    stack.script.then(Reply(tool_calls=[("read_file", {"file_path": "notes.txt"})]), corrected,
                      Reply(content="It says hi."))
    answer = await stack.respond(stream, input=QUESTION)
    assert answer.text == "It says hi."
    assert tool_spans(stack, answer) == [("read_file", "rejected"), ("read_file", "ok")]
    calls = [s for s in stack.spans(answer.headers["x-trace-id"]) if s.name == names.SPAN_TOOL_CALL]
    assert calls[0].attributes is not None
    assert calls[0].attributes[names.ATTR_REJECTION_REASON] == "missing_arguments"
    assert calls[1].attributes is not None
    assert calls[1].attributes[names.ATTR_RETRY_KIND] == "corrected"
    assert stack.metric(names.METRIC_TOOL_RETRIES, tool="read_file", kind="corrected") == 1


@STREAM
async def test_client_tool_call_comes_back_to_the_client(stack: Stack, stream: bool) -> None:
    stack.script.then(Reply(tool_calls=[("ask_human", {"question": "Which file?"})]))
    answer = await stack.respond(stream, input=QUESTION, tools=[CLIENT_TOOL])
    [call] = answer.calls
    assert call["name"] == "ask_human"
    assert json.loads(call["arguments"]) == {"question": "Which file?"}
    assert not call["call_id"].startswith("tspan_")  # nothing held: the provider's own id
    assert answer.tools == [CLIENT_TOOL]
    assert_one_response(answer)
    if stream:
        kinds = [e["type"] for e in answer.events]
        assert kinds[-5:] == ["response.output_item.added", "response.function_call_arguments.delta",
                              "response.function_call_arguments.done", "response.output_item.done",
                              "response.completed"]
    [sent] = stack.upstream_requests
    assert sent["tools"][0] == CLIENT_TOOL


@STREAM
async def test_mixed_turn_is_held_and_completed_by_replayed_follow_up(stack: Stack, stream: bool) -> None:
    stack.script.then(Reply(tool_calls=[("read_file", {"path": "a.txt"}), ("ask_human", {"question": "Next?"})]),
                      Reply(content="Done."))
    first = await stack.respond(stream, input=QUESTION, tools=[CLIENT_TOOL], store=False)
    [call] = first.calls
    assert call["name"] == "ask_human"
    assert call["call_id"].startswith("tspan_")
    assert tool_spans(stack, first) == [("read_file", "ok")]
    follow_up = [{"role": "user", "content": QUESTION}, *first.output,
                 {"type": "function_call_output", "call_id": call["call_id"], "output": "b.txt"}]
    second = await stack.respond(stream, input=follow_up, tools=[CLIENT_TOOL], store=False)
    assert second.text == "Done."
    sent = stack.upstream_requests[-1]
    kinds = [(item.get("type"), item.get("name")) for item in sent["input"]]
    assert kinds[1:3] == [("function_call", "read_file"), ("function_call", "ask_human")]
    outputs = outputs_sent(sent)
    assert [o["output"] for o in outputs] == ["contents of a.txt", "b.txt"]
    assert not any(o["call_id"].startswith("tspan_") for o in outputs)


async def test_mixed_turn_follow_up_by_previous_response_id(stack: Stack) -> None:
    stack.script.then(Reply(tool_calls=[("read_file", {"path": "a.txt"}), ("ask_human", {"question": "Next?"})]),
                      Reply(content="Done."))
    first = await stack.respond(False, input=QUESTION, tools=[CLIENT_TOOL])
    [call] = first.calls
    second = await stack.respond(False, previous_response_id=first.id, tools=[CLIENT_TOOL], input=[
        {"type": "function_call_output", "call_id": call["call_id"], "output": "b.txt"}])
    assert second.text == "Done."
    assert second.previous_response_id == first.id
    sent = stack.upstream_requests[-1]
    assert sent["previous_response_id"] == round_ids(stack, first)[0]  # the provider's response behind it
    assert [o["output"] for o in outputs_sent(sent)] == ["contents of a.txt", "b.txt"]


@STREAM
async def test_stored_rounds_chain_and_the_client_id_continues_the_last(stack: Stack, stream: bool) -> None:
    stack.script.then(Reply(tool_calls=[("add", {"a": 1, "b": 2})]), Reply(content="3"), Reply(content="Bye."))
    answer = await stack.respond(stream, input="add 1 and 2", store=True)
    assert answer.text == "3"
    first, second = stack.upstream_requests
    ids = round_ids(stack, answer)
    assert "previous_response_id" not in first
    assert second["previous_response_id"] == ids[0]  # round 2 continues round 1 at the provider
    assert second["input"] == [{"type": "function_call_output", "call_id": second["input"][0]["call_id"],
                                "output": "3"}]
    assert answer.id.startswith("resp_tspan_")  # the gateway's id for an answer over several responses
    follow = await stack.respond(stream, input="thanks", previous_response_id=answer.id)
    assert follow.text == "Bye."
    assert stack.upstream_requests[-1]["previous_response_id"] == ids[1]  # the last round: it holds every round
    assert follow.previous_response_id == answer.id  # as the client sent it


async def test_built_in_tools_pass_to_the_provider_untouched(stack: Stack) -> None:
    stack.script.then(Reply(content="Searched."))
    web_search = {"type": "web_search", "search_context_size": "low"}
    answer = await stack.respond(False, input="news?", tools=[web_search, CLIENT_TOOL])
    assert answer.text == "Searched."
    [sent] = stack.upstream_requests
    assert sent["tools"][:2] == [web_search, CLIENT_TOOL]
    assert {t["name"] for t in sent["tools"][2:]} == {"read_file", "add"}


@STREAM
async def test_a_caller_tool_named_like_a_gateway_tool_is_a_400(stack: Stack, stream: bool) -> None:
    clash = {**CLIENT_TOOL, "name": "read_file"}
    with pytest.raises(openai.BadRequestError) as caught:
        await stack.respond(stream, input=QUESTION, tools=[clash])
    assert caught.value.code == "tool_name_conflict"
    assert stack.upstream_requests == []


@pytest.mark.parametrize(("body", "param"), [
    ({"model": "m", "input": 7}, "input"),
    ({"model": "m", "input": "x", "stream": "yes"}, "stream"),
    ({"model": "m", "input": "x", "tools": [{"name": "t"}]}, "tools"),
    ({"input": "x"}, "model"),
    ({"model": "m", "input": "x", "previous_response_id": 5}, "previous_response_id"),
])
async def test_a_request_of_the_wrong_shape_is_a_400_naming_the_field(stack: Stack, body: dict[str, Any],
                                                                       param: str) -> None:
    response = await stack.http.post("/v1/responses", json=body)
    assert response.status == 400
    error = (await response.json())["error"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"


@STREAM
async def test_round_limit_ends_with_a_tool_less_call(make_stack: StackFactory, stream: bool) -> None:
    stack = await make_stack(max_rounds=1)
    stack.script.then(Reply(tool_calls=[("add", {"a": 1, "b": 1})]), Reply(tool_calls=[("add", {"a": 2, "b": 2})]))
    answer = await stack.respond(stream, input="loop")
    assert answer.calls == []
    assert stack.upstream_requests[-1]["tool_choice"] == "none"
    assert len(stack.upstream_requests) == 2
    if not stream:
        assert answer.headers["x-toolspan-round-limit"] == "reached"
    [root] = [s for s in stack.spans(answer.headers["x-trace-id"]) if s.parent is None]
    assert root.attributes is not None
    assert root.attributes[names.ATTR_ROUND_LIMIT_REACHED] is True


async def test_a_forced_gateway_tool_is_forced_once(stack: Stack) -> None:
    stack.script.then(Reply(tool_calls=[("add", {"a": 1, "b": 1})]), Reply(content="2"))
    await stack.respond(False, input="add", tool_choice={"type": "function", "name": "add"})
    first, second = stack.upstream_requests
    assert first["tool_choice"] == {"type": "function", "name": "add"}
    assert second["tool_choice"] == "auto"


async def test_reasoning_and_text_events_pass_on_as_they_arrive(stack: Stack) -> None:
    """The provider stalls mid-answer: what it streamed so far has reached the client already."""
    stack.script.then(Reply(reasoning="Let me think about it", content="hello there, world", pause_after=14))
    raw = await stack.client.responses.with_raw_response.create(model="m", input="hi", stream=True)
    seen: list[str] = []
    async for event in raw.parse():
        seen.append(event.type)
        if event.type == "response.output_text.delta":
            break
    assert "response.reasoning_summary_text.delta" in seen
    assert not stack.model.dropped.is_set()  # the provider is still mid-answer
    await raw.http_response.aclose()
    await asyncio.wait_for(stack.model.dropped.wait(), 10)


async def test_keepalive_comments_while_tools_run(make_stack: StackFactory) -> None:
    release = asyncio.Event()

    async def slow(args: dict[str, Any]) -> str:
        await release.wait()
        return "late"

    stack = await make_stack(registry=ToolRegistry([Tool(name="slow", function=slow)]), keepalive_seconds=0.05)
    stack.script.then(Reply(tool_calls=[("slow", {})]), Reply(content="ok"))
    response = await stack.http.post("/v1/responses", json={"model": "m", "input": "go", "stream": True})
    assert response.status == 200
    async for line in response.content:
        if line.startswith(b": toolspan: running tools"):
            release.set()  # seen while the tool was still running: now let it finish
        if line.startswith(b"event: response.completed"):
            break
    assert release.is_set()


async def test_upstream_refusal_passes_through(stack: Stack) -> None:
    stack.script.then(Reply(status=429, error="slow down", headers={"retry-after": "7"}))
    with pytest.raises(openai.RateLimitError) as caught:
        await stack.respond(False, input="hi")
    assert caught.value.response.headers["retry-after"] == "7"
    assert "slow down" in caught.value.message


@STREAM
async def test_a_malformed_provider_response_is_a_502(stack: Stack, stream: bool) -> None:
    stack.script.then(Reply(raw=b'{"id": "resp_x", "output": "not a list"}'))
    with pytest.raises(openai.APIStatusError) as caught:
        await stack.respond(stream, input="hi")
    assert caught.value.status_code == 502
    assert "wrong shape" in caught.value.message or "complete" in caught.value.message


@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/responses/resp_1"), ("DELETE", "/v1/responses/resp_1"),
                                               ("GET", "/v1/responses/resp_1/input_items?limit=5"),
                                               ("POST", "/v1/responses/resp_1/cancel")])
async def test_stored_response_routes_pass_through(stack: Stack, method: str, path: str) -> None:
    response = await stack.http.request(method, path)
    assert response.status == 200
    assert response.headers["X-Echo-Method"] == method
    assert response.headers["X-Echo-Path"] == path
    assert stack.upstream_requests == []  # not the tool loop


async def test_a_stream_that_breaks_after_it_began_ends_with_an_error_event(stack: Stack) -> None:
    stack.script.then(Reply(content="hello world, a long answer", break_stream_after=6))
    raw = await stack.client.responses.with_raw_response.create(model="m", input="hi", stream=True)
    events = [event async for event in raw.parse()]
    assert events[0].type == "response.created"
    last = events[-1]
    assert last.type == "error"
    assert "stream" in last.message
    assert [e.sequence_number for e in events] == list(range(len(events)))
    [root] = [s for s in stack.spans(raw.headers["x-trace-id"]) if s.parent is None]
    assert root.attributes is not None
    assert root.attributes[names.ATTR_ERROR_TYPE] == "upstream_error"


# --- review findings: each of these failed before its fix ----------------------------------------------

def raw_response(*items: dict[str, Any], status: str = "completed") -> Reply:
    """A provider response with exactly these output items (what the scripted model cannot say)."""
    body = {"id": "resp_raw", "object": "response", "status": status, "model": "m", "output": list(items),
            "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}}
    return Reply(raw=json.dumps(body).encode())


async def test_a_namespaced_call_is_the_clients_even_under_a_gateway_tools_name(stack: Stack) -> None:
    namespace = {"type": "namespace", "name": "crm", "description": "CRM tools",
                 "tools": [{"type": "function", "name": "add", "parameters": {"type": "object", "properties": {}}}]}
    stack.script.then(raw_response({"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "add",
                                    "namespace": "crm", "arguments": '{"a": 1}', "status": "completed"}))
    answer = await stack.respond(False, input="hi", tools=[namespace])
    assert [(c["name"], c.get("namespace"), c["call_id"]) for c in answer.calls] == [("add", "crm", "call_1")]
    assert len(stack.upstream_requests) == 1
    assert tool_spans(stack, answer) == []  # the gateway's own `add` never ran


async def test_a_computer_call_beside_a_gateway_call_goes_to_the_client_and_is_held(stack: Stack) -> None:
    computer = {"type": "computer_call", "id": "cu_1", "call_id": "call_c", "action": {"type": "screenshot"},
                "pending_safety_checks": [], "status": "completed"}
    stack.script.then(raw_response(computer, {"type": "function_call", "id": "fc_1", "call_id": "call_1",
                                              "name": "add", "arguments": '{"a": 1, "b": 2}', "status": "completed"}))
    answer = await stack.respond(False, input="hi", store=False)
    [shown] = [item for item in answer.output if item["type"] == "computer_call"]
    assert shown["call_id"].startswith("tspan_")  # it names the held turn, whose `add` the gateway ran
    assert len(stack.upstream_requests) == 1
    assert tool_spans(stack, answer) == [("add", "ok")]


async def test_store_false_with_a_previous_response_replays_from_that_response(stack: Stack) -> None:
    stack.script.then(Reply(content="Hello."), Reply(tool_calls=[("add", {"a": 1, "b": 2})]), Reply(content="3"))
    first = await stack.respond(False, input="hi")
    second = await stack.respond(False, input="add 1 and 2", previous_response_id=first.id, store=False)
    assert second.text == "3"
    round_one, round_two = stack.upstream_requests[1:]
    assert round_one["previous_response_id"] == round_two["previous_response_id"] == first.id
    assert [i.get("type") for i in round_two["input"]] == [None, "function_call", "function_call_output"]


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_a_call_dropped_at_the_round_limit_is_not_held(make_stack: StackFactory, api: str) -> None:
    """The last call allowed no tools; the model called a gateway tool and a client tool anyway.
    The gateway's call never ran, so the follow-up must not carry it without a result."""
    stack = await make_stack(max_rounds=1)
    stack.script.then(Reply(tool_calls=[("add", {"a": 1, "b": 1})]),
                      Reply(tool_calls=[("add", {"a": 2, "b": 2}), ("ask_human", {"question": "?"})]),
                      Reply(content="ok"))
    if api == "responses":
        first = await stack.respond(False, input="go", tools=[CLIENT_TOOL], store=False)
        [call] = first.calls
        follow = [{"role": "user", "content": "go"}, *first.output,
                  {"type": "function_call_output", "call_id": call["call_id"], "output": "yes"}]
        second = await stack.respond(False, input=follow, tools=[CLIENT_TOOL], store=False)
        assert second.text == "ok"  # the scripted model refuses a call without its output, as OpenAI does
        calls = [i for i in stack.upstream_requests[-1]["input"] if i.get("type") == "function_call"]
        assert [json.loads(c["arguments"]) for c in calls] == [{"a": 1, "b": 1}, {"question": "?"}]
        return
    tool = {"type": "function", "function": {k: v for k, v in CLIENT_TOOL.items() if k not in ("type", "strict")}}
    chat = await stack.ask(False, messages=[{"role": "user", "content": "go"}], tools=[tool])
    [call] = chat.tool_calls
    messages = [{"role": "user", "content": "go"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call["id"], "content": "yes"}]
    await stack.ask(False, messages=messages, tools=[tool])
    sent = stack.upstream_requests[-1]["messages"]
    called = [c["function"]["name"] for m in sent for c in m.get("tool_calls") or []]
    answered = [m["tool_call_id"] for m in sent if m["role"] == "tool"]
    assert called == ["add", "ask_human"]
    assert len(answered) == 2


async def test_an_input_item_with_an_odd_id_is_passed_on_not_a_500(stack: Stack) -> None:
    stack.script.then(Reply(content="fine"))
    response = await stack.http.post("/v1/responses", json={
        "model": "m", "input": [{"role": "user", "content": "hi", "id": ["x"]}]})
    assert response.status == 200


async def test_streamed_output_before_the_tools_names_the_answer_by_the_first_response(stack: Stack) -> None:
    stack.script.then(Reply(content="Let me add.", tool_calls=[("add", {"a": 1, "b": 2})]), Reply(content="3"),
                      Reply(content="Bye."))
    answer = await stack.respond(True, input="add")
    assert_one_response(answer)
    ids = round_ids(stack, answer)
    assert answer.id == ids[0]  # the client saw it in response.created before the tools ran
    await stack.respond(False, input="thanks", previous_response_id=answer.id)
    assert stack.upstream_requests[-1]["previous_response_id"] == ids[1]


async def test_reasoning_of_a_gateway_round_gets_its_call_back_when_replayed(stack: Stack) -> None:
    """A reasoning item must be followed by the call it led to; the client never saw that call."""
    stack.script.then(Reply(reasoning="I should add.", tool_calls=[("add", {"a": 1, "b": 2})]), Reply(content="3"),
                      Reply(content="You are welcome."))
    answer = await stack.respond(False, input="add", store=False)
    assert [item["type"] for item in answer.output] == ["reasoning", "message"]
    replay = [{"role": "user", "content": "add"}, *answer.output, {"role": "user", "content": "thanks"}]
    await stack.respond(False, input=replay, store=False)
    sent = stack.upstream_requests[-1]["input"]
    assert [i.get("type") for i in sent] == [None, "reasoning", "function_call", "function_call_output", "message",
                                             None]


async def test_background_responses_cannot_run_gateway_tools(stack: Stack) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await stack.respond(False, input="hi", background=True)
    assert caught.value.param == "background"
    assert stack.upstream_requests == []


async def test_content_parts_of_a_tool_result_go_in_the_responses_shape(make_stack: StackFactory) -> None:
    async def picture(args: dict[str, Any]) -> ToolResult:
        return ToolResult(content=[{"type": "text", "text": "a cat"},
                                   {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}])

    stack = await make_stack(registry=ToolRegistry([Tool(name="picture", function=picture)]))
    stack.script.then(Reply(tool_calls=[("picture", {})]), Reply(content="A cat."))
    await stack.respond(False, input="show me")
    [output] = outputs_sent(stack.upstream_requests[-1])
    assert output["output"] == [{"type": "input_text", "text": "a cat"},
                                {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto"}]


async def test_the_answer_shows_the_tool_choice_the_client_sent(stack: Stack) -> None:
    stack.script.then(Reply(tool_calls=[("add", {"a": 1, "b": 1})]), Reply(content="2"))
    sent = {"type": "function", "name": "add"}
    response = await stack.http.post("/v1/responses", json={"model": "m", "input": "add", "tool_choice": sent})
    assert (await response.json())["tool_choice"] == sent


@STREAM
async def test_tool_call_spans_read_the_same_in_both_apis(make_stack: StackFactory, stream: bool) -> None:
    """The same story told over Chat and over Responses gives the same tool.call and chat spans,
    ids aside."""
    def story(stack: Stack) -> None:
        stack.script.then(Reply(tool_calls=[("read_file", {"file_path": "a.txt"})]),
                          Reply(tool_calls=[("read_file", {"path": "a.txt"}), ("no_such_tool", {})]),
                          Reply(content="done"))

    ignored = {names.ATTR_TOOL_CALL_ID, names.ATTR_CONVERSATION_ID, names.ATTR_RESPONSE_ID,
               names.ATTR_RETRY_OF_SPAN_ID, names.ATTR_RETRY_OF_TRACE_ID}
    seen = []
    for api in ("chat", "responses"):
        stack = await make_stack()
        story(stack)
        if api == "chat":
            trace_id = (await stack.ask(stream, messages=[{"role": "user", "content": "read"}])).headers["x-trace-id"]
        else:
            trace_id = (await stack.respond(stream, input="read")).headers["x-trace-id"]
        spans = [s for s in stack.spans(trace_id) if s.parent is not None]
        seen.append([(s.name, {k: v for k, v in (s.attributes or {}).items() if k not in ignored},
                      s.status.description) for s in spans])
    chat, responses = seen
    # 3 provider calls, 3 tool calls: a rejected one (parse only), an ok one (parse, execute), an unknown one
    assert len(chat) == 3 + 3 + 1 + 2
    assert chat == responses
