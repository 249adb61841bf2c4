"""One streamed round: content deltas pass through at once, tool-call deltas are assembled."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Call:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)

    def message_form(self) -> dict[str, Any]:
        function = {"name": self.name, "arguments": "".join(self.arguments)}
        return {"id": self.id, "type": "function", "function": function}


@dataclass
class Round:
    """What one upstream stream said, assembled."""

    id: str | None = None
    model: str | None = None
    created: int | None = None
    content: list[str] = field(default_factory=list)
    refusal: list[str] = field(default_factory=list)
    calls: dict[int, _Call] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None

    def absorb(self, chunk: dict[str, Any]) -> dict[str, Any] | None:
        """Take one upstream chunk; returns the part the client should see now (content,
        refusal, role), or None. Tool calls and the finish wait for the loop's decision."""
        self.id = self.id or chunk.get("id")
        self.model = self.model or chunk.get("model")
        self.created = self.created or chunk.get("created")
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return None
        choice = choices[0]
        raw_delta = choice.get("delta")
        delta: dict[str, Any] = raw_delta if isinstance(raw_delta, dict) else {}
        if choice.get("finish_reason"):
            self.finish_reason = str(choice["finish_reason"])
        parts = delta.get("tool_calls")
        for part in parts if isinstance(parts, list) else []:
            self._absorb_call(part)
        visible = {k: v for k, v in delta.items() if k in ("role", "content", "refusal") and v is not None}
        if isinstance(visible.get("content"), str):
            self.content.append(visible["content"])
        if isinstance(visible.get("refusal"), str):
            self.refusal.append(visible["refusal"])
        if not visible or visible == {"content": ""}:
            return None
        return visible

    def _absorb_call(self, part: Any) -> None:
        if not isinstance(part, dict):
            return
        index = part.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            # No index (some compatible providers): a fragment with an id starts a call, one
            # without continues the last.
            starts = bool(part.get("id")) or not self.calls
            index = len(self.calls) if starts else max(self.calls)
        call = self.calls.setdefault(index, _Call())
        call.id = call.id or str(part.get("id") or "")
        raw_function = part.get("function")
        function: dict[str, Any] = raw_function if isinstance(raw_function, dict) else {}
        call.name = call.name or str(function.get("name") or "")
        if isinstance(function.get("arguments"), str):
            call.arguments.append(function["arguments"])

    def tool_calls(self) -> list[dict[str, Any]]:
        return [self.calls[i].message_form() for i in sorted(self.calls)]

    def message(self) -> dict[str, Any]:
        """The assistant message this round amounts to, ready to send back upstream."""
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if self.refusal:
            message["refusal"] = "".join(self.refusal)
        if self.calls:
            message["tool_calls"] = self.tool_calls()
        return message


def chunk(base: dict[str, Any], delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    """A chat.completion.chunk in the response's identity (`base`: id, created, model)."""
    return {**base, "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}


def call_chunks(base: dict[str, Any], calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Client tool calls, each whole in one delta (they were held back while the round streamed)."""
    return [chunk(base, {"tool_calls": [{"index": i, **call}]}) for i, call in enumerate(calls)]
