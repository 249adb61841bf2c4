"""The scripted model's OpenAI Responses API (`POST /v1/responses`), on top of the same policies.

A Responses request is turned into the Chat-shaped view the policies already read (`chat_request`),
after the checks OpenAI makes (a known `previous_response_id`, every function call answered), and a
policy's `Reply` is turned into a Response object (`build_response`) or its SSE events
(`response_events`). `Conversations` keeps what each response continued, for `previous_response_id`.
"""

from __future__ import annotations

import copy
import json
import time
from typing import Any

from gateway.demo.reply import Reply

_TEXT_PARTS = {"input_text", "output_text", "text"}
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}  # finish reason -> reason
_ECHOED: dict[str, Any] = {  # request fields a Response repeats, with OpenAI's defaults
    "instructions": None, "max_output_tokens": None, "metadata": {}, "parallel_tool_calls": True,
    "previous_response_id": None, "reasoning": {"effort": None, "summary": None}, "store": True,
    "temperature": 1.0, "text": {"format": {"type": "text"}}, "tool_choice": "auto", "tools": [],
    "top_p": 1.0, "truncation": "disabled", "user": None,
}


def pieces(text: str, size: int = 6) -> list[str]:
    """`text` cut into stream deltas (one empty delta for empty text)."""
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


def arguments_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


class RequestRefused(Exception):
    """A request OpenAI refuses with 400; `body()` is its error JSON."""

    def __init__(self, message: str, param: str, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": "invalid_request_error", "param": self.param,
                          "code": self.code}}


def check_chat_request(body: dict[str, Any]) -> None:
    """Refuses a Chat request whose messages a model could not read, as OpenAI does (400)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestRefused("'messages' must be a non-empty array.", "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestRefused(f"messages[{i}] must be an object with a 'role'.", f"messages[{i}]")
        if "tool_call_id" in message and not isinstance(message["tool_call_id"], str):
            raise RequestRefused("'tool_call_id' must be a string.", f"messages[{i}].tool_call_id")
        calls = message.get("tool_calls") or []
        if not isinstance(calls, list):
            raise RequestRefused("'tool_calls' must be an array.", f"messages[{i}].tool_calls")
        for j, call in enumerate(calls):
            function = call.get("function") if isinstance(call, dict) else None
            if not (isinstance(function, dict) and isinstance(call.get("id"), str)
                    and isinstance(function.get("name"), str) and isinstance(function.get("arguments"), str)):
                raise RequestRefused("a tool call needs an 'id' and a 'function' with 'name' and 'arguments'.",
                                     f"messages[{i}].tool_calls[{j}]")


class Conversations:
    """Response id -> the Chat messages up to and including that response's output (without its
    instructions, which OpenAI does not carry over). Keeps the last `keep` responses."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._histories: dict[str, list[dict[str, Any]]] = {}

    def before(self, previous_id: str | None) -> list[dict[str, Any]]:
        if previous_id is None:
            return []
        if previous_id not in self._histories:
            raise RequestRefused(f"Previous response with id '{previous_id}' not found.",
                                 "previous_response_id", "previous_response_not_found")
        return self._histories[previous_id]

    def knows(self, response_id: str) -> bool:
        return response_id in self._histories

    def forget(self, response_id: str) -> None:
        self._histories.pop(response_id, None)

    def add(self, response_id: str, history: list[dict[str, Any]]) -> None:
        self._histories[response_id] = history
        while len(self._histories) > self.keep:
            del self._histories[next(iter(self._histories))]


def _text(value: Any) -> str:
    """A message's or tool output's text: a string, or the text parts of a list joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(str(part.get("text", "")) for part in value
                       if isinstance(part, dict) and part.get("type") in _TEXT_PARTS)
    return ""


def input_messages(items: Any) -> list[dict[str, Any]]:
    """Responses input (a string, or input/output items) as Chat messages. Function calls join the
    assistant message just before them; reasoning and unknown items are left out."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            messages.append({"role": item.get("role", "user"), "content": _text(item.get("content"))})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "")}}
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": _text(item.get("output"))})
    return messages


def _check_tool_outputs(messages: list[dict[str, Any]]) -> None:
    """Refuses, as OpenAI does, a call without an output after it, or an output without its call."""
    called: set[Any] = set()
    unanswered: dict[Any, None] = {}  # in call order
    for message in messages:
        for call in message.get("tool_calls") or []:
            called.add(call["id"])
            unanswered[call["id"]] = None
        if message["role"] == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in called:
                raise RequestRefused(f"No tool call found for function call output with call_id {call_id}.", "input")
            unanswered.pop(call_id, None)
    if unanswered:
        raise RequestRefused(f"No tool output found for function call {next(iter(unanswered))}.", "input")


def _chat_tool(tool: Any) -> Any:
    if isinstance(tool, dict) and tool.get("type") == "function" and "function" not in tool:
        return {"type": "function",
                "function": {key: tool[key] for key in ("name", "description", "parameters") if key in tool}}
    return tool


def _chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def chat_request(body: dict[str, Any], before: list[dict[str, Any]],
                 model_name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The Chat-shaped view of a Responses request that a policy sees, and the conversation it
    continues (`before`, then the new input), checked as OpenAI checks it."""
    conversation = [*before, *input_messages(body.get("input"))]
    _check_tool_outputs(conversation)
    instructions = body.get("instructions")
    system = [{"role": "system", "content": instructions}] if isinstance(instructions, str) and instructions else []
    view = {key: value for key, value in body.items() if key not in ("input", "instructions")}
    view["model"] = body.get("model", model_name)
    view["messages"] = copy.deepcopy([*system, *conversation])  # a policy may not edit the stored history
    view["stream"] = bool(body.get("stream"))
    if isinstance(body.get("tools"), list):
        view["tools"] = [_chat_tool(tool) for tool in body["tools"]]
    if "tool_choice" in body:
        view["tool_choice"] = _chat_tool_choice(body["tool_choice"])
    return view, conversation


def _output_items(reply: Reply, number: int, cut: bool) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if reply.reasoning:
        items.append({"type": "reasoning", "id": f"rs_scripted_{number}", "status": "completed",
                      "summary": [{"type": "summary_text", "text": reply.reasoning}]})
    items += [copy.deepcopy(item) for item in reply.items]
    if reply.content:
        items.append({"type": "message", "id": f"msg_scripted_{number}", "role": "assistant",
                      "status": "incomplete" if cut else "completed",
                      "content": [{"type": "output_text", "text": reply.content, "annotations": [], "logprobs": []}]})
    items += [{"type": "function_call", "id": f"fc_scripted_{number}_{i}", "call_id": f"call_scripted_{number}_{i}",
               "name": name, "arguments": arguments_text(arguments), "status": "completed"}
              for i, (name, arguments) in enumerate(reply.tool_calls)]
    return items


def build_response(body: dict[str, Any], reply: Reply, number: int, model_name: str) -> dict[str, Any]:
    """The Response object for `reply`; `number` makes its ids (and call ids) unique."""
    reason = _INCOMPLETE.get(reply.finish())
    prompt, completion = reply.usage
    echoed = {key: copy.deepcopy(default if body.get(key) is None else body[key]) for key, default in _ECHOED.items()}
    return {
        "id": f"resp_scripted_{number}", "object": "response", "created_at": int(time.time()),
        "status": "incomplete" if reason else "completed", "background": False, "error": None,
        "incomplete_details": {"reason": reason} if reason else None, "model": body.get("model", model_name),
        "output": _output_items(reply, number, cut=reason is not None), **echoed, "service_tier": "default",
        "usage": {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                  "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": prompt + completion},
    }


Event = tuple[str, dict[str, Any]]  # type, fields


def _item_events(index: int, item: dict[str, Any]) -> list[Event]:
    """The events that stream one finished output item, from `output_item.added` to `.done`."""
    at = {"output_index": index, "item_id": item["id"]}
    middle: list[Event] = []
    if item["type"] == "reasoning":
        start = {**item, "summary": [], "status": "in_progress"}
        for i, part in enumerate(item["summary"]):
            where = {**at, "summary_index": i}
            middle += [("response.reasoning_summary_part.added", {**where, "part": {**part, "text": ""}}),
                       *[("response.reasoning_summary_text.delta", {**where, "delta": piece})
                         for piece in pieces(part["text"])],
                       ("response.reasoning_summary_text.done", {**where, "text": part["text"]}),
                       ("response.reasoning_summary_part.done", {**where, "part": part})]
    elif item["type"] == "message":
        start = {**item, "content": [], "status": "in_progress"}
        for i, part in enumerate(item["content"]):
            where = {**at, "content_index": i}
            middle += [("response.content_part.added", {**where, "part": {**part, "text": ""}}),
                       *[("response.output_text.delta", {**where, "delta": piece, "logprobs": []})
                         for piece in pieces(part["text"])],
                       ("response.output_text.done", {**where, "text": part["text"], "logprobs": []}),
                       ("response.content_part.done", {**where, "part": part})]
    elif item["type"] != "function_call":  # an item given as it is: added whole, then done
        start = item
    else:
        start = {**item, "arguments": "", "status": "in_progress"}
        middle += [("response.function_call_arguments.delta", {**at, "delta": piece})
                   for piece in pieces(item["arguments"])]
        middle.append(("response.function_call_arguments.done", {**at, "arguments": item["arguments"]}))
    return [("response.output_item.added", {"output_index": index, "item": start}), *middle,
            ("response.output_item.done", {"output_index": index, "item": item})]


def response_events(response: dict[str, Any]) -> list[bytes]:
    """`response` streamed as OpenAI streams it: created, in progress, each output item, then
    completed (or incomplete); SSE with `event:` lines, numbered from 0, and no `[DONE]`."""
    started = {**response, "status": "in_progress", "incomplete_details": None, "output": [], "usage": None}
    events: list[Event] = [("response.created", {"response": started}),
                           ("response.in_progress", {"response": started})]
    for index, item in enumerate(response["output"]):
        events += _item_events(index, item)
    events.append((f"response.{response['status']}", {"response": response}))
    return [f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': n, **fields})}\n\n".encode()
            for n, (kind, fields) in enumerate(events)]
