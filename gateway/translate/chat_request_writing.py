"""The neutral request written as a Chat Completions request, for an upstream that speaks only
Chat (a Messages or Responses client's request). What Chat cannot say is left out and named:
thinking (Chat takes no reasoning back), a tool result's images (a tool message is text only) and
its error flag (Chat has none: the result's text goes as it is)."""

from __future__ import annotations

from typing import Any

from gateway.translate.chat_answer import call_json
from gateway.translate.fields import Dropped
from gateway.translate.neutral import Image, Request, Text, Thinking, ToolCall, ToolChoice, ToolResult, Turn


def _text_content(texts: list[str]) -> str | list[dict[str, Any]]:
    """One text as a string, several as text parts (so that each stays one)."""
    return texts[0] if len(texts) == 1 else [{"type": "text", "text": text} for text in texts]


def _image_url(image: Image) -> str:
    return image.url if image.url is not None else f"data:{image.media_type};base64,{image.data}"


def _user_message(content: list[Text | Image]) -> dict[str, Any]:
    if len(content) == 1 and isinstance(content[0], Text):
        return {"role": "user", "content": content[0].text}
    return {"role": "user", "content": [{"type": "text", "text": part.text} if isinstance(part, Text) else
                                        {"type": "image_url", "image_url": {"url": _image_url(part)}}
                                        for part in content]}


def _tool_message(result: ToolResult, dropped: Dropped) -> dict[str, Any]:
    """Chat's tool message takes text only, and has no error flag: the text goes as it is."""
    if any(isinstance(part, Image) for part in result.content):
        dropped.add("tool_result.image")
    if result.is_error:
        dropped.add("tool_result.is_error")
    texts = [part.text for part in result.content if isinstance(part, Text)]
    return {"role": "tool", "tool_call_id": result.call_id, "content": _text_content(texts) if texts else ""}


def _turn_messages(turn: Turn, dropped: Dropped) -> list[dict[str, Any]]:
    """A turn's messages: its tool results (each a tool message) before the rest."""
    results: list[dict[str, Any]] = []
    content: list[Text | Image] = []
    calls: list[dict[str, Any]] = []
    for part in turn.parts:
        if isinstance(part, ToolResult):
            results.append(_tool_message(part, dropped))
        elif isinstance(part, Thinking):
            dropped.add("thinking")
        elif isinstance(part, ToolCall) and turn.role == "assistant":
            calls.append(call_json(part))
        elif isinstance(part, Text) or (isinstance(part, Image) and turn.role == "user"):
            content.append(part)
        else:
            dropped.add(f"{turn.role}.{type(part).__name__.lower()}")
    if turn.role == "user":
        return [*results, *([_user_message(content)] if content else [])]
    texts = [part.text for part in content if isinstance(part, Text)]
    message: dict[str, Any] = {"role": "assistant", "content": _text_content(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    return [*results, *([message] if texts or calls else [])]


def _tool_choice_json(choice: ToolChoice) -> str | dict[str, Any]:
    if isinstance(choice, tuple):
        return {"type": "function", "function": {"name": choice[1]}}
    return choice


def _tool_fields(request: Request, dropped: Dropped) -> dict[str, Any]:
    """Tools, and the choice among them; without tools, Chat takes neither tool_choice nor
    parallel_tool_calls (OpenAI refuses them), and they say nothing then."""
    if not request.tools:
        for name in ("tool_choice", "parallel_tool_calls"):
            if getattr(request, name) is not None:
                dropped.add(name)
        return {}
    fields: dict[str, Any] = {"tools": [
        {"type": "function", "function": {"name": tool.name, "parameters": tool.parameters,
                                          **({"description": tool.description} if tool.description is not None
                                             else {})}}
        for tool in request.tools]}
    if request.tool_choice is not None:
        fields["tool_choice"] = _tool_choice_json(request.tool_choice)
    if request.parallel_tool_calls is not None:
        fields["parallel_tool_calls"] = request.parallel_tool_calls
    return fields


def _other_fields(request: Request) -> dict[str, Any]:
    fields: dict[str, Any] = {"max_tokens": request.max_tokens, "temperature": request.temperature,
                              "top_p": request.top_p, "stop": list(request.stop) or None, "user": request.user}
    written = {key: value for key, value in fields.items() if value is not None}
    if request.stream:  # the usage is asked for always: the client's API reports it in its own way
        written.update(stream=True, stream_options={"include_usage": True})
    return written


def write_request(request: Request) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The request as a Chat-only upstream takes it, and the names of what Chat cannot say."""
    dropped = Dropped()
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({"role": "system", "content": _text_content(list(request.system))})
    for turn in request.turns:
        messages.extend(_turn_messages(turn, dropped))
    body = {"model": request.model, "messages": messages, **_tool_fields(request, dropped), **_other_fields(request)}
    return body, tuple(dropped.names)
