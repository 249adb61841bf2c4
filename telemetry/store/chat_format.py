"""What the store keeps of a conversation, in the shape chat fine-tuning and eval tools read: the
captured GenAI messages (`{"role", "parts"}`, telemetry.messages) as OpenAI chat messages, and the
captured tool definitions as OpenAI function tools (telemetry.store.dataset writes them).

Every value is masked once more with the redact keys on the way out, as on the spans: the spans
masked what they recorded with the gateway's keys then, and an export may be asked for with more."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from telemetry.arguments import mask_text, masked, masked_schema, too_deep

Message = dict[str, Any]
_KEEPS_ROLE = ("system", "developer", "user")  # a text message of any other role reads as the user's


def arguments_text(arguments: Any, keys: Sequence[str]) -> str:
    """A call's arguments as a function call's `arguments` string: decoded arguments as JSON, text
    (not JSON, or cut) as it is; masked."""
    safe = masked(arguments, keys)
    return safe if isinstance(safe, str) else json.dumps(safe, ensure_ascii=False)


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def decoded_arguments(text: str | None) -> Any:
    """Stored arguments (JSON text, maybe cut) as a value: decoded when they are JSON the gateway
    could take, else the text (not JSON, cut, nested deeper than the gateway takes: too_deep, or
    holding NaN or Infinity, which Python's json reads and JSON has not: a dataset line is JSON)."""
    if text is None:
        return None
    try:
        value = json.loads(text, parse_constant=_not_json)
    except (ValueError, RecursionError):
        return text
    return text if too_deep(value) else value


def captured_arguments(value: Any) -> Any:
    """A call's arguments as a captured answer holds them (decoded when the store was read) as
    decoded_arguments gives them: as their text again when they hold NaN or Infinity."""
    if isinstance(value, str) or too_deep(value):
        return value
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return json.dumps(value, ensure_ascii=False)
    return value


def finite(value: Any) -> Any:
    """`value` with every number JSON has not (NaN, Infinity) as its text: what another writer may
    have stored where no call's arguments are (a tool's declared default, say)."""
    if isinstance(value, float) and not math.isfinite(value):
        return json.dumps(value)
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [finite(item) for item in value]
    return value


def tool_call(call_id: Any, name: Any, arguments: Any, keys: Sequence[str]) -> dict[str, Any]:
    return {"id": str(call_id), "type": "function",
            "function": {"name": str(name), "arguments": arguments_text(arguments, keys)}}


def tool_message(call_id: Any, content: Any, keys: Sequence[str]) -> Message:
    return {"role": "tool", "tool_call_id": str(call_id), "content": mask_text(str(content or ""), keys)}


def _text(part: dict[str, Any], keys: Sequence[str]) -> str | None:
    """A part as text: a text part's content; content the store did not keep (an image, a file)
    as `[its type]`; None for reasoning and the calls and their answers (messages of their own)."""
    kind = part.get("type")
    if kind == "text":
        return mask_text(str(part.get("content", "")), keys)
    if kind in ("reasoning", "tool_call", "tool_call_response"):
        return None
    return f"[{kind}]"


def _messages(message: dict[str, Any], keys: Sequence[str]) -> list[Message]:
    """One GenAI message as chat messages: a tool message per call answered, then the message."""
    parts = [part for part in message.get("parts") or () if isinstance(part, dict)]
    role = str(message.get("role", "user"))
    found = [tool_message(p.get("id"), p.get("response"), keys) for p in parts if p.get("type") == "tool_call_response"]
    texts = [text for text in (_text(part, keys) for part in parts) if text is not None]
    if role == "assistant":
        calls = [tool_call(p.get("id"), p.get("name"), p.get("arguments"), keys)
                 for p in parts if p.get("type") == "tool_call"]
        said: Message = {"role": "assistant", "content": "\n".join(texts) if texts else None}
        if calls:
            said["tool_calls"] = calls
        return [*found, said] if texts or calls else found
    if texts or not found:
        found.append({"role": role if role in _KEEPS_ROLE else "user", "content": "\n".join(texts)})
    return found


def chat_messages(messages: Any, keys: Sequence[str]) -> list[Message]:
    """GenAI messages as chat messages. An assistant message of calls alone that follows another
    assistant message joins it (the Responses API gives each call an item of its own)."""
    out: list[Message] = []
    for message in messages if isinstance(messages, list) else ():
        for said in _messages(message, keys) if isinstance(message, dict) else ():
            last = out[-1] if out else None
            if (last is not None and last["role"] == said["role"] == "assistant" and said["content"] is None
                    and said.get("tool_calls")):
                last["tool_calls"] = [*last.get("tool_calls", ()), *said["tool_calls"]]
            else:
                out.append(said)
    return out


def function_tools(definitions: Any, keys: Sequence[str]) -> list[dict[str, Any]]:
    """Captured tool definitions as OpenAI function tools; a tool that is not a function (a provider's
    own, a custom tool) is left out: a chat dataset declares functions."""
    tools = []
    for definition in definitions if isinstance(definitions, list) else ():
        if not (isinstance(definition, dict) and definition.get("type") == "function"
                and isinstance(definition.get("name"), str)):
            continue
        function: dict[str, Any] = {"name": definition["name"]}
        if isinstance(definition.get("description"), str):
            function["description"] = mask_text(definition["description"], keys)
        if isinstance(definition.get("parameters"), dict):
            function["parameters"] = masked_schema(definition["parameters"], keys)
        tools.append({"type": "function", "function": function})
    return tools


def calls_in(messages: Any) -> set[str]:
    """The ids of the calls captured GenAI messages (an answer) hold."""
    return {str(part.get("id")) for message in messages if isinstance(message, dict)
            for part in message.get("parts") or () if isinstance(part, dict) and part.get("type") == "tool_call"} \
        if isinstance(messages, list) else set()
