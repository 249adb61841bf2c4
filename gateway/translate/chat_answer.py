"""A Chat Completions answer (a `chat.completion`) read into the neutral Answer and written from
it, with what the stream side shares: finish reasons, usage, the shape of a tool call.

Chat's message has one content string, its reasoning beside it (`reasoning_content`, as vLLM and
DeepSeek send it; newer vLLM says `reasoning`) and its calls after it; an answer of several text
parts is written as their joined text. A refusal (`refusal`, OpenAI's) is what the model said: it
is read as text."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.errors import UpstreamUnavailable
from gateway.translate.neutral import Answer, Stop, Text, Thinking, ToolCall, Usage, arguments_text

# Chat's finish reasons and the neutral stops (a Chat answer that met a stop sequence says "stop";
# vLLM names the sequence in `stop_reason`). Mistral says model_length, some servers eos.
_STOPS: dict[str, Stop] = {"stop": "end", "eos": "end", "length": "length", "model_length": "length",
                           "tool_calls": "tool_calls", "function_call": "tool_calls",
                           "content_filter": "content_filter"}
FINISH_REASONS: dict[Stop, str] = {"end": "stop", "stop_sequence": "stop", "length": "length",
                                   "tool_calls": "tool_calls", "content_filter": "content_filter"}
THINKING_FIELDS = ("reasoning_content", "reasoning")  # vLLM and DeepSeek, newer vLLM


def unreadable(what: str) -> UpstreamUnavailable:
    return UpstreamUnavailable(f"the provider's Chat answer {what}")


def stop_of(finish_reason: Any, stop_reason: Any, calls: bool) -> tuple[Stop, str | None]:
    """The neutral stop (and stop sequence) of a finish reason. Some servers say "stop" (or
    nothing) when the model called tools: the calls tell. An unknown reason is taken as an end."""
    stop = _STOPS.get(finish_reason, "end") if isinstance(finish_reason, str) else "end"
    if stop == "end" and isinstance(stop_reason, str) and stop_reason:
        return "stop_sequence", stop_reason
    if stop == "end" and calls:
        return "tool_calls", None
    return stop, None


def finish_fields(answer_stop: Stop, stop_sequence: str | None) -> dict[str, Any]:
    """A choice's finish reason (and the stop sequence, where vLLM says it)."""
    fields: dict[str, Any] = {"finish_reason": FINISH_REASONS[answer_stop]}
    if answer_stop == "stop_sequence" and stop_sequence is not None:
        fields["stop_reason"] = stop_sequence
    return fields


def _tokens(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def usage_from(raw: Mapping[str, Any]) -> Usage:
    """Chat's usage: prompt tokens (cached ones included) and their cached part (OpenAI's
    prompt_tokens_details, or DeepSeek's prompt_cache_hit_tokens); Chat says nothing of cache writes."""
    details = raw.get("prompt_tokens_details")
    cached = _tokens(details.get("cached_tokens")) if isinstance(details, Mapping) else None
    if cached is None:
        cached = _tokens(raw.get("prompt_cache_hit_tokens"))
    return Usage(input_tokens=_tokens(raw.get("prompt_tokens")), output_tokens=_tokens(raw.get("completion_tokens")),
                 cache_read_tokens=cached)


def usage_json(usage: Usage) -> dict[str, Any] | None:
    """The usage a Chat client reads; None when the provider said nothing of it."""
    if usage.input_tokens is None and usage.output_tokens is None:
        return None
    prompt, completion = usage.input_tokens or 0, usage.output_tokens or 0
    written: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                               "total_tokens": prompt + completion}
    if usage.cache_read_tokens is not None:
        written["prompt_tokens_details"] = {"cached_tokens": usage.cache_read_tokens}
    return written


def call_json(call: ToolCall) -> dict[str, Any]:
    return {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def _call(raw: Any) -> ToolCall:
    function = raw.get("function") if isinstance(raw, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(raw, Mapping) or not isinstance(function, Mapping) or not isinstance(name, str) or not name:
        raise unreadable("holds a tool call without a function name")
    arguments = function.get("arguments")
    if arguments is not None and not isinstance(arguments, str | Mapping):
        raise unreadable("holds a tool call whose arguments are neither JSON text nor an object")
    return ToolCall(str(raw.get("id") or ""), name, arguments_text(arguments))  # some servers send an object


def _text(message: Mapping[str, Any], key: str) -> str:
    value = message.get(key)
    if value is not None and not isinstance(value, str):
        raise unreadable(f"holds a {key} that is not text")
    return value or ""


def _message_parts(message: Mapping[str, Any]) -> tuple[Text | Thinking | ToolCall, ...]:
    thinking = next((text for key in THINKING_FIELDS if (text := _text(message, key))), "")
    said = _text(message, "content") or _text(message, "refusal")
    calls = message.get("tool_calls") or []
    if not isinstance(calls, Sequence) or isinstance(calls, str):
        raise unreadable("holds tool_calls that are not a list")
    return (*([Thinking(thinking)] if thinking else []), *([Text(said)] if said else []),
            *(_call(call) for call in calls))


def read_answer(body: Mapping[str, Any]) -> Answer:
    """A chat.completion as the neutral answer: its first choice."""
    choices = body.get("choices") if isinstance(body, Mapping) else None
    choice = choices[0] if isinstance(choices, list) and choices else None
    message = choice.get("message") if isinstance(choice, Mapping) else None
    if not isinstance(choice, Mapping) or not isinstance(message, Mapping):
        raise unreadable("is not a chat completion (no choice with a message)")
    parts = _message_parts(message)
    stop, sequence = stop_of(choice.get("finish_reason"), choice.get("stop_reason"),
                             any(isinstance(part, ToolCall) for part in parts))
    usage = body.get("usage")
    return Answer(str(body.get("id") or ""), str(body.get("model") or ""), parts, stop,
                  usage_from(usage) if isinstance(usage, Mapping) else Usage(), sequence)


def write_answer(answer: Answer) -> dict[str, Any]:
    """The answer as a chat.completion: its texts joined into the content, its reasoning (not
    redacted) as vLLM's `reasoning_content`; a thinking signature has no place in Chat."""
    texts = [part.text for part in answer.parts if isinstance(part, Text)]
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    thinking = "".join(part.text for part in answer.parts if isinstance(part, Thinking) and not part.redacted)
    if thinking:
        message["reasoning_content"] = thinking
    calls = [call_json(part) for part in answer.parts if isinstance(part, ToolCall)]
    if calls:
        message["tool_calls"] = calls
    body: dict[str, Any] = {
        "id": answer.answer_id, "object": "chat.completion", "created": int(time.time()), "model": answer.model,
        "choices": [{"index": 0, "message": message, **finish_fields(answer.stop, answer.stop_sequence)}]}
    if (usage := usage_json(answer.usage)) is not None:
        body["usage"] = usage
    return body
