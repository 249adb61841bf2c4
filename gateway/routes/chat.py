"""POST /v1/chat/completions: the Chat Completions API over the engine, and its rendering."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from gateway.app_keys import HELD, REGISTRY
from gateway.engine import Finished, Plan, Visible, plan_chat
from gateway.engine.turn import summed_usage
from gateway.errors import GatewayError
from gateway.routes import render
from gateway.routes.common import caller_of, read_object, validate


class _Function(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    name: str = Field(min_length=1)


class _ToolSpec(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    type: str
    function: _Function | None = None  # tools of other types (custom, ...) are the provider's business


class ChatRequest(BaseModel):
    """The fields the gateway relies on; everything else goes to the provider untouched. Strict
    types, as OpenAI's API has them: `"stream": "true"` or `"n": 1.0` is refused, not coerced."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str = Field(min_length=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[_ToolSpec] | None = None
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    n: int | None = Field(None, ge=1)
    metadata: dict[str, Any] | None = None


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/chat/completions."""
    body = await read_object(request)
    chat = validate(ChatRequest, body, "a chat completion request")
    caller = caller_of(request, chat.metadata)
    plan = plan_chat(body, caller, request.app[REGISTRY], request.app[HELD])
    return await render.answer(request, caller, plan, completion, partial(ChatChunks, plan))


def _joined(turns: Iterable[Any], key: str) -> str | None:
    parts = [text for turn in turns if isinstance(text := turn.output[0].get(key), str)]
    return "".join(parts) or None


def completion(finished: Finished) -> dict[str, Any]:
    """The chat completion the client gets: the provider's last one as it came, unless the
    gateway ran tools; then with every round's content, the client's calls, the finish reason the
    loop ended with, and the usage of every round."""
    turns = finished.turns
    last = turns[-1]
    if len(turns) == 1 and tuple(c.item for c in last.calls) == finished.client_calls:
        return dict(last.body)
    choice = dict(last.body["choices"][0])
    message = {**choice["message"], "content": _joined(turns, "content")}
    if (refusal := _joined(turns, "refusal")) is not None:
        message["refusal"] = refusal
    message.pop("tool_calls", None)
    if finished.client_calls:
        message["tool_calls"] = list(finished.client_calls)
    choice.update(message=message, finish_reason=finished.finish_reason)
    answer = {**last.body, "choices": [choice]}
    if (usage := summed_usage(turns)) is not None:
        answer["usage"] = usage
    return answer


@dataclass
class ChatChunks:
    """Engine events as chat.completion.chunk events: one assistant message over every round, in
    the identity (id, created, model) of the first chunk the client saw."""

    plan: Plan
    identity: dict[str, Any] = field(default_factory=dict)
    closing: bytes = b"data: [DONE]\n\n"

    def _chunk(self, delta: Mapping[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {**self.identity, "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}

    def visible(self, event: Visible) -> Iterable[render.Frame]:
        chunk = dict(event.piece)
        if not self.identity:
            self.identity = {k: chunk[k] for k in ("id", "created", "model") if k in chunk}
        chunk.update(self.identity)
        if event.round > 0:  # one assistant message, however many rounds: its role was said once
            choice = chunk["choices"][0]
            delta = {k: v for k, v in choice["delta"].items() if k != "role"}
            if not delta or delta == {"content": ""}:
                return []
            chunk["choices"] = [{**choice, "delta": delta}]
        return [(None, chunk)]

    def waiting(self) -> Iterable[render.Frame]:
        return []

    def finished(self, event: Finished) -> Iterable[render.Frame]:
        if not self.identity:
            first = event.turns[0].body
            self.identity = {k: first[k] for k in ("id", "created", "model") if k in first}
        frames: list[render.Frame] = [(None, self._chunk({"tool_calls": [{"index": i, **call}]}))
                                   for i, call in enumerate(event.client_calls)]
        frames.append((None, self._chunk({}, event.finish_reason)))
        if self.plan.include_usage:
            usage = summed_usage(event.turns) or {}
            frames.append((None, {**self.identity, "object": "chat.completion.chunk", "choices": [], "usage": usage}))
        return frames

    def error(self, error: GatewayError) -> render.Frame:
        return None, error.body()
