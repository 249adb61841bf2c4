"""Reading an Anthropic Messages answer, JSON or assembled from its event stream, as one ModelTurn.

The readers check the shape the engine relies on (a malformed answer is the provider's fault: a
502) and leave everything else as the provider sent it: thinking blocks keep their text and
signature to the byte, which the provider checks when they come back. In a stream, every event
passes on at once but those of `tool_use` blocks (calls for the gateway or the client: they wait
for the engine's decision) and the end of the message (`message_delta`, `message_stop`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from gateway.engine.turn import ModelCall, ModelTurn, count, usage_of
from gateway.errors import UpstreamUnavailable, stream_error
from gateway.translate.neutral import arguments_text

# A message's stop reason in Chat's terms, so that telemetry and the engine read alike for every API.
STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_calls", "max_tokens": "length",
                "model_context_window_exceeded": "length", "refusal": "content_filter"}
INPUT_TOKENS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")  # all of the prompt
OPENING = "message_start"


def _call(block: Mapping[str, Any]) -> ModelCall | None:
    """A `tool_use` block as a call; the other blocks (`server_tool_use` among them: the provider
    runs those) are not calls to run here."""
    if block.get("type") != "tool_use":
        return None
    if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
        raise UpstreamUnavailable("the provider sent a message of the wrong shape (a tool_use block without a name)")
    return ModelCall(block["id"], block["name"], arguments_text(block.get("input")), block)


def read_message(body: Any, headers: Mapping[str, str] | None = None) -> ModelTurn:
    """A Messages API message as a turn: its content blocks are the output."""
    content = body.get("content") if isinstance(body, dict) else None
    if not isinstance(content, list) or not all(isinstance(block, dict) for block in content):
        raise UpstreamUnavailable("the provider sent a message of the wrong shape")
    calls = tuple(call for block in content if (call := _call(block)) is not None)
    reason = body.get("stop_reason")
    usage = usage_of(body)
    return ModelTurn("messages", body, tuple(content), calls,
                     STOP_REASONS.get(reason, reason) if isinstance(reason, str) else None, usage, headers or {},
                     count(usage, *INPUT_TOKENS), count(usage, "output_tokens"))


class MessagesStreamReader:
    """Assembles a streamed message: blocks from their start and deltas (text, thinking and its
    signature, tool input as partial JSON, citations), the stop reason and usage from
    `message_delta` (counts there are cumulative: they replace the opening's)."""

    def __init__(self) -> None:
        self._message: dict[str, Any] | None = None
        self._blocks: dict[int, dict[str, Any]] = {}
        self._inputs: dict[int, list[str]] = {}  # partial JSON of tool_use and server_tool_use blocks
        self._held: set[int] = set()  # indexes of tool_use blocks
        self._usage: dict[str, Any] = {}
        self._delta: dict[str, Any] = {}
        self._stopped = False

    def absorb(self, event: dict[str, Any]) -> dict[str, Any] | None:
        kind = event.get("type")
        if kind == OPENING:
            message = event.get("message")
            if not isinstance(message, dict):
                raise UpstreamUnavailable("the provider's stream opened without a message")
            self._message = message
            self._usage.update(usage_of(message) or {})
            return event
        if kind == "error":
            error = event.get("error")
            raise stream_error(error if isinstance(error, dict) else {})
        if kind == "message_delta":
            delta = event.get("delta")
            self._delta.update(delta if isinstance(delta, dict) else {})
            self._usage.update(usage_of(event) or {})
            return None
        if kind == "message_stop":
            self._stopped = True
            return None
        index = event.get("index")
        if not isinstance(index, int) or not kind or not str(kind).startswith("content_block_"):
            return event  # ping, and any event of a newer API version: the client's to read
        if kind == "content_block_start":
            self._started(index, event.get("content_block"))
        elif kind == "content_block_delta":
            self._added(index, event.get("delta"))
        return None if index in self._held else event

    def _started(self, index: int, block: Any) -> None:
        if not isinstance(block, dict):
            raise UpstreamUnavailable("the provider's stream started a content block of the wrong shape")
        self._blocks[index] = dict(block)
        if block.get("type") == "tool_use":
            self._held.add(index)

    def _added(self, index: int, delta: Any) -> None:
        block = self._blocks.get(index)
        if block is None or not isinstance(delta, dict):
            raise UpstreamUnavailable("the provider's stream sent a delta of a block it never started")
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = block.get("text", "") + str(delta.get("text", ""))
        elif kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + str(delta.get("thinking", ""))
        elif kind == "signature_delta":
            block["signature"] = block.get("signature", "") + str(delta.get("signature", ""))
        elif kind == "input_json_delta":
            self._inputs.setdefault(index, []).append(str(delta.get("partial_json", "")))
        elif kind == "citations_delta":
            if not isinstance(block.get("citations"), list):  # a start block may say `"citations": null`
                block["citations"] = []
            block["citations"].append(delta.get("citation"))

    def _block(self, index: int) -> dict[str, Any]:
        """A block whole: a tool's input parsed from its partial JSON (left as the text, for the
        gateway's parse step to refuse, when the model's JSON does not parse)."""
        block = self._blocks[index]
        if index in self._inputs and (text := "".join(self._inputs[index])):
            try:
                block["input"] = orjson.loads(text)
            except orjson.JSONDecodeError:
                block["input"] = text
        return block

    def turn(self, headers: Mapping[str, str] | None = None) -> ModelTurn:
        if self._message is None or not self._stopped:
            raise UpstreamUnavailable("the provider's stream ended before its message was complete")
        body = {**self._message, **self._delta, "content": [self._block(i) for i in sorted(self._blocks)]}
        if self._usage:
            body["usage"] = self._usage
        return read_message(body, headers)
