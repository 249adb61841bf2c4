"""Message content for the `chat {model}` spans, as the OpenTelemetry GenAI conventions shape it
(opt-in: `capture_message_content`).

- `gen_ai.input.messages`: the chat history sent in one provider call, a JSON array of
  `{"role", "parts"}`; a part is `{"type": "text", "content"}`, `{"type": "tool_call", "id",
  "name", "arguments"}` or `{"type": "tool_call_response", "id", "response"}`; any other content
  keeps only its type (an image or a file is not copied onto a span).
- `gen_ai.output.messages`: the model's answer, `[{"role": "assistant", "parts", "finish_reason"}]`.
- `gen_ai.system_instructions`: instructions sent apart from the history (the Responses API's
  `instructions`, the Messages API's `system`), `[{"type": "text", "content"}]`. A Chat system
  message stays in the history.

Every API (Chat Completions messages, Responses input and output items, Messages content blocks,
their thinking as `reasoning` parts) comes out alike. Secrets
are masked as in tool arguments (`telemetry.arguments`), and each attribute is bounded: a string
part is cut to a little less than `max_chars`, then the oldest messages go until the JSON fits.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from telemetry import names
from telemetry.arguments import mask_text, masked

Message = dict[str, Any]

# Chat's finish reasons in the conventions' words (tool_calls -> tool_call); others pass as sent.
_FINISH_REASONS = {"tool_calls": "tool_call", "function_call": "tool_call"}


def _text_of(content: Any) -> list[str | dict[str, Any]]:
    """Message content (a string, or a list of typed parts of either API) as text pieces, with
    the type of each piece that is not text."""
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    pieces: list[str | dict[str, Any]] = []
    for part in content if isinstance(content, list) else [content]:
        if isinstance(part, Mapping) and isinstance(part.get("text"), str):
            pieces.append(part["text"])
        elif isinstance(part, Mapping) and isinstance(part.get("refusal"), str):
            pieces.append(part["refusal"])
        elif isinstance(part, Mapping):
            pieces.append({"type": str(part.get("type", "unknown"))})
    return pieces


def _parts(content: Any) -> list[dict[str, Any]]:
    return [{"type": "text", "content": p} if isinstance(p, str) else p for p in _text_of(content)]


def _arguments(raw: Any) -> Any:
    """A call's arguments: decoded when they are JSON (the conventions' preference), else the text."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def _tool_call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    return {"type": "tool_call", "id": call_id, "name": name, "arguments": _arguments(arguments)}


def _response(call_id: Any, output: Any) -> dict[str, Any]:
    text = output if isinstance(output, str) else "".join(p for p in _text_of(output) if isinstance(p, str))
    return {"type": "tool_call_response", "id": call_id, "response": text}


# --- Chat Completions ---------------------------------------------------------------------------

def _chat_message(message: Any) -> Message | None:
    if not isinstance(message, Mapping):
        return None
    role = str(message.get("role", "user"))
    if role == "tool":
        return {"role": "tool", "parts": [_response(message.get("tool_call_id"), message.get("content"))]}
    parts = _parts(message.get("content"))
    if isinstance(message.get("refusal"), str):
        parts.append({"type": "text", "content": message["refusal"]})
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping):
            parts.append(_tool_call(call.get("id"), function.get("name"), function.get("arguments")))
    return {"role": role, "parts": parts}


def chat_input(body: Mapping[str, Any]) -> list[Message]:
    return [m for m in map(_chat_message, body.get("messages") or ()) if m is not None]


# --- Responses ----------------------------------------------------------------------------------

def _item_message(item: Any) -> Message | None:
    """One Responses item (input or output) as a message, or None for one of no content (reasoning)."""
    if not isinstance(item, Mapping):
        return None
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        return {"role": str(item.get("role", "user")), "parts": _parts(item.get("content"))}
    if kind == "function_call":
        call = _tool_call(item.get("call_id"), item.get("name"), item.get("arguments"))
        return {"role": "assistant", "parts": [call]}
    if kind == "function_call_output":
        return {"role": "tool", "parts": [_response(item.get("call_id"), item.get("output"))]}
    if kind == "reasoning":
        return None
    return {"role": "assistant" if str(kind).endswith("_call") else "user", "parts": [{"type": str(kind)}]}


def responses_input(body: Mapping[str, Any]) -> list[Message]:
    raw = body.get("input")
    if isinstance(raw, str):
        return [{"role": "user", "parts": [{"type": "text", "content": raw}]}]
    return [m for m in map(_item_message, raw or ()) if m is not None]


# --- Messages -----------------------------------------------------------------------------------

def _block_part(block: Any) -> dict[str, Any]:
    """One Messages content block as a part."""
    if not isinstance(block, Mapping):
        return {"type": "unknown"}
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "content": str(block.get("text", ""))}
    if kind == "thinking":
        return {"type": "reasoning", "content": str(block.get("thinking", ""))}
    if kind == "tool_use":
        return _tool_call(block.get("id"), block.get("name"), block.get("input"))
    if kind == "tool_result":
        return _response(block.get("tool_use_id"), block.get("content"))
    return {"type": str(kind or "unknown")}


def _anthropic_message(message: Any) -> Message | None:
    if not isinstance(message, Mapping):
        return None
    content = message.get("content")
    parts = _parts(content) if isinstance(content, str) else [_block_part(b) for b in content or ()]
    answers = bool(parts) and all(part["type"] == "tool_call_response" for part in parts)
    return {"role": "tool" if answers else str(message.get("role", "user")), "parts": parts}


def messages_input(body: Mapping[str, Any]) -> list[Message]:
    return [m for m in map(_anthropic_message, body.get("messages") or ()) if m is not None]


_INPUTS = {"chat": chat_input, "responses": responses_input, "messages": messages_input}


def _instructions(api: str, body: Mapping[str, Any]) -> str | None:
    """Instructions sent apart from the history: Responses' `instructions`, Messages' `system`."""
    found = body.get("instructions") if api == "responses" else body.get("system") if api == "messages" else None
    if isinstance(found, list):  # Messages' system as text blocks
        found = "\n".join(str(b.get("text", "")) for b in found if isinstance(b, Mapping))
    return found if isinstance(found, str) and found else None


def output_message(api: str, output: Sequence[Mapping[str, Any]], finish_reason: str | None) -> Message:
    """The answer as one assistant message: Chat's message, or the parts of every output item or block."""
    if api == "chat":
        parts = (_chat_message(output[0]) or {"parts": []})["parts"] if output else []
    elif api == "messages":
        parts = [_block_part(block) for block in output]
    else:
        parts = [part for item in output for part in (_item_message(item) or {"parts": []})["parts"]]
    reason = _FINISH_REASONS.get(finish_reason or "", finish_reason or "stop")
    return {"role": "assistant", "parts": parts, "finish_reason": reason}


# --- masking and bounds -------------------------------------------------------------------------

def _cut(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[:max_chars] + f"...[truncated; {len(text)} chars]"


def _safe_part(part: dict[str, Any], keys: Sequence[str], max_chars: int) -> dict[str, Any]:
    out = dict(part)
    for field in ("content", "response"):
        if isinstance(out.get(field), str):
            out[field] = _cut(mask_text(out[field], keys), max_chars)
    if "arguments" in out:
        arguments = masked(out["arguments"], keys)
        out["arguments"] = _cut(arguments, max_chars) if isinstance(arguments, str) else arguments
    return out


def _bounded_json(messages: list[Any], max_chars: int) -> str:
    """The JSON of `messages`, the oldest dropped until it fits (the newest is cut to a stub last)."""
    text = json.dumps(messages, ensure_ascii=False)
    while len(text) > max_chars and len(messages) > 1:
        messages = messages[1:]
        text = json.dumps(messages, ensure_ascii=False)
    if len(text) > max_chars:  # one message too big even with its strings cut: arguments nested deep
        stub: dict[str, Any] = {"type": "text", "content": f"[truncated; {len(text)} chars]"}
        if "role" in messages[0]:
            stub = {"role": messages[0]["role"], "parts": [stub]}
        text = json.dumps([stub])
    return text


@dataclass(frozen=True)
class MessageCapture:
    """Message content on the chat spans: masked with `redact_keys`, each attribute at most about
    `max_chars` characters."""

    max_chars: int = 16384
    redact_keys: Sequence[str] = ()

    def _safe(self, messages: list[Message]) -> list[Message]:
        keys, cut = self.redact_keys, max(64, self.max_chars - 256)  # room for the JSON around a text
        return [{**m, "parts": [_safe_part(p, keys, cut) for p in m["parts"]]} for m in messages]

    def request_attributes(self, api: str, body: Mapping[str, Any]) -> dict[str, str]:
        """What goes on the span of the provider call that sent `body`."""
        history = _INPUTS.get(api, chat_input)(body)
        attributes = {names.ATTR_INPUT_MESSAGES: _bounded_json(self._safe(history), self.max_chars)}
        if (instructions := _instructions(api, body)) is not None:
            parts = self._safe([{"role": "system", "parts": [{"type": "text", "content": instructions}]}])[0]["parts"]
            attributes[names.ATTR_SYSTEM_INSTRUCTIONS] = _bounded_json(parts, self.max_chars)
        return attributes

    def answer_attributes(self, api: str, output: Sequence[Mapping[str, Any]],
                          finish_reason: str | None) -> dict[str, str]:
        """What goes on the span of the answer."""
        message = self._safe([output_message(api, output, finish_reason)])
        return {names.ATTR_OUTPUT_MESSAGES: _bounded_json(message, self.max_chars)}
