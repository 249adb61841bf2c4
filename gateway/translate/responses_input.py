"""The neutral request written as a Responses API request, for an upstream that speaks it (a Chat
or Messages client's request).

The first piece of the system prompt is `instructions`, the others system messages at the start
of the input; each turn's parts are input items in order (a run of a user's text and images one
message, each of the assistant's texts one message, each call and each result an item of its
own). What the Responses API cannot take back is left out and named: thinking (a reasoning item
must be one OpenAI made), the error flag of a tool result (the result's text goes as it is) and
stop sequences. The request is not stored (`store: false`): every round sends the whole
conversation, as the client sent it."""

from __future__ import annotations

from typing import Any

from gateway.translate.fields import Dropped
from gateway.translate.neutral import Image, Request, Text, Thinking, ToolCall, ToolChoice, ToolResult, Turn


def image_url(image: Image) -> str:
    return image.url if image.url is not None else f"data:{image.media_type};base64,{image.data}"


def input_part(part: Text | Image) -> dict[str, Any]:
    if isinstance(part, Text):
        return {"type": "input_text", "text": part.text}
    return {"type": "input_image", "image_url": image_url(part), "detail": "auto"}


def _call_output(result: ToolResult, dropped: Dropped) -> dict[str, Any]:
    """A result of one text as a string, of any other content as parts (so that each stays one)."""
    if result.is_error:
        dropped.add("tool_result.is_error")
    content = result.content
    output: str | list[dict[str, Any]] = (content[0].text if len(content) == 1 and isinstance(content[0], Text)
                                          else [input_part(part) for part in content])
    return {"type": "function_call_output", "call_id": result.call_id, "output": output}


def function_call(call: ToolCall) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments}


def _turn_items(turn: Turn, dropped: Dropped) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    content: list[dict[str, Any]] = []  # the user's message being gathered

    def close_message() -> None:
        if content:
            items.append({"type": "message", "role": "user", "content": list(content)})
            content.clear()

    for part in turn.parts:
        if isinstance(part, Text | Image) and turn.role == "user":
            content.append(input_part(part))
            continue
        close_message()
        if isinstance(part, Text):
            items.append({"type": "message", "role": "assistant", "content": part.text})
        elif isinstance(part, ToolCall):
            items.append(function_call(part))
        elif isinstance(part, ToolResult):
            items.append(_call_output(part, dropped))
        elif isinstance(part, Thinking):
            dropped.add("thinking")
        else:
            dropped.add(f"{turn.role}.{type(part).__name__.lower()}")
    close_message()
    return items


def _tool_choice_json(choice: ToolChoice) -> str | dict[str, Any]:
    if isinstance(choice, tuple):
        return {"type": "function", "name": choice[1]}
    return choice


def _tool_fields(request: Request) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if request.tools:
        # `strict` is said: the Responses API holds the model to a schema unless told otherwise,
        # and refuses a schema strict mode cannot take.
        fields["tools"] = [{"type": "function", "name": tool.name, "parameters": tool.parameters, "strict": False,
                            **({"description": tool.description} if tool.description is not None else {})}
                           for tool in request.tools]
    if request.tool_choice is not None:
        fields["tool_choice"] = _tool_choice_json(request.tool_choice)
    if request.parallel_tool_calls is not None:
        fields["parallel_tool_calls"] = request.parallel_tool_calls
    return fields


def write_request(request: Request) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The request for a Responses upstream, and what of it the Responses API could not take."""
    dropped = Dropped()
    items: list[dict[str, Any]] = [{"type": "message", "role": "system", "content": text}
                                   for text in request.system[1:]]
    for turn in request.turns:
        items.extend(_turn_items(turn, dropped))
    body: dict[str, Any] = {"model": request.model, "input": items, "store": False}
    if request.system:
        body["instructions"] = request.system[0]
    body.update(_tool_fields(request))
    optional = {"max_output_tokens": request.max_tokens, "temperature": request.temperature,
                "top_p": request.top_p, "user": request.user}
    body.update({key: value for key, value in optional.items() if value is not None})
    if request.stream:
        body["stream"] = True
    if request.stop:
        dropped.add("stop")
    return body, tuple(dropped.names)
