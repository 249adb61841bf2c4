"""An Anthropic message (the provider's whole answer) read into the neutral answer, and the neutral
answer written as the message an Anthropic client gets; with the stop reasons and token counts
that its stream says too.

Anthropic counts a prompt's tokens in three parts (uncached `input_tokens`, those read from the
cache, those written to it); the neutral `input_tokens` is their sum, as Chat's prompt_tokens is."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.errors import UpstreamUnavailable
from gateway.translate.messages_blocks import Malformed, assistant_part, thinking_block, tool_use_block
from gateway.translate.neutral import Answer, Stop, Text, Thinking, ToolCall, Usage

STOPS: dict[str, Stop] = {"end_turn": "end", "tool_use": "tool_calls", "max_tokens": "length",
                          "model_context_window_exceeded": "length", "stop_sequence": "stop_sequence",
                          "refusal": "content_filter",
                          "pause_turn": "end"}  # only a server tool pauses, and a translated request has none
STOP_REASONS: dict[Stop, str] = {"end": "end_turn", "tool_calls": "tool_use", "length": "max_tokens",
                                 "stop_sequence": "stop_sequence", "content_filter": "refusal"}
CACHE_READ, CACHE_WRITE = "cache_read_input_tokens", "cache_creation_input_tokens"


def _count(usage: Mapping[str, Any], key: str) -> int | None:
    value = usage.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_usage(usage: Any, known: Usage | None = None) -> Usage:
    """Anthropic's counts as neutral ones; `known`: those said before (a stream's opening), which
    a count said again replaces."""
    said = usage if isinstance(usage, Mapping) else {}
    known = known or Usage()
    uncached = _count(said, "input_tokens")
    read = _count(said, CACHE_READ)
    read = known.cache_read_tokens if read is None else read
    written = _count(said, CACHE_WRITE)
    written = known.cache_write_tokens if written is None else written
    total = known.input_tokens if uncached is None else uncached + (read or 0) + (written or 0)
    output = _count(said, "output_tokens")
    return Usage(total, known.output_tokens if output is None else output, read, written)


def usage_counts(usage: Usage, *, whole: bool = True) -> dict[str, int]:
    """Neutral counts as Anthropic's: input_tokens without the cached ones, the cache counts where
    known. `whole`: an unknown input or output count is 0 (a message's usage needs both); else an
    unknown input count is left out (a stream's closing usage replaces the opening's where said)."""
    cached = (usage.cache_read_tokens or 0) + (usage.cache_write_tokens or 0)
    counts: dict[str, int] = {}
    if whole or usage.input_tokens is not None:
        counts["input_tokens"] = max((usage.input_tokens or 0) - cached, 0)
    counts["output_tokens"] = usage.output_tokens or 0
    if usage.cache_read_tokens is not None:
        counts[CACHE_READ] = usage.cache_read_tokens
    if usage.cache_write_tokens is not None:
        counts[CACHE_WRITE] = usage.cache_write_tokens
    return counts


def read_stop(reason: Any) -> Stop:
    """A stop reason as a neutral one (a reason of a newer API version: an ordinary end)."""
    return STOPS.get(reason, "end") if isinstance(reason, str) else "end"


def _text(body: Mapping[str, Any], key: str) -> str:
    value = body.get(key)
    return value if isinstance(value, str) else ""


def read_answer(body: Mapping[str, Any]) -> Answer:
    """An Anthropic message as the neutral answer; blocks of other types (a server tool's, which a
    translated request never declares) are left out."""
    content = body.get("content") if isinstance(body, Mapping) else None
    if not isinstance(content, list) or body.get("type") == "error":
        raise UpstreamUnavailable("the provider sent a message of the wrong shape")
    parts: list[Text | Thinking | ToolCall] = []
    for block in content:
        if not isinstance(block, Mapping):
            raise UpstreamUnavailable("the provider sent a message of the wrong shape (a block is no object)")
        try:
            part = assistant_part(block)
        except Malformed as exc:
            raise UpstreamUnavailable(f"the provider sent a message of the wrong shape: {exc}") from exc
        if part is not None:
            parts.append(part)
    sequence = body.get("stop_sequence")
    return Answer(_text(body, "id"), _text(body, "model"), tuple(parts), read_stop(body.get("stop_reason")),
                  read_usage(body.get("usage")), sequence if isinstance(sequence, str) else None)


def answer_block(part: Text | Thinking | ToolCall) -> dict[str, Any]:
    if isinstance(part, Text):
        return {"type": "text", "text": part.text}
    if isinstance(part, Thinking):
        return thinking_block(part)
    return tool_use_block(part)[0]  # arguments that are no JSON object: `{}`, for the client's tool to refuse


def write_answer(answer: Answer) -> dict[str, Any]:
    """The neutral answer as the message an Anthropic client gets."""
    return {"id": answer.answer_id, "type": "message", "role": "assistant", "model": answer.model,
            "content": [answer_block(part) for part in answer.parts], "stop_reason": STOP_REASONS[answer.stop],
            "stop_sequence": answer.stop_sequence, "usage": usage_counts(answer.usage)}
