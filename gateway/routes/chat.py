"""POST /v1/chat/completions: the Chat Completions API over the engine, and its rendering."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from gateway import client_results, linking
from gateway.app_keys import HELD, INSTRUMENTATION, REGISTRY, SETTINGS
from gateway.engine import Finished, Plan, Visible, plan_chat
from gateway.engine.turn import annotates, says_nothing, summed_usage
from gateway.errors import GatewayError
from gateway.routes import render
from gateway.routes.common import JsonObjects, NonEmptyJsonObjects, caller_of, read_object, validate


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
    messages: NonEmptyJsonObjects
    tools: list[_ToolSpec] | None = None
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    n: int | None = Field(None, ge=1)
    metadata: dict[str, Any] | None = None
    functions: JsonObjects | None = None  # the legacy form of tools


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/chat/completions."""
    body = await read_object(request)
    if deployment := request.match_info.get("deployment"):
        body["model"] = deployment  # an Azure-style path names the model
    chat = validate(ChatRequest, body, "a chat completion request")
    caller = await linking.joined(caller_of(request, chat.metadata), request.app[HELD],
                                  linking.chat_call_ids(chat.messages))
    settings = request.app[SETTINGS]
    if caller.client_check(settings.client_tool_check) != "off":
        await client_results.report_results(request.app[HELD], request.app[INSTRUMENTATION], caller,
                                            client_results.chat_results(chat.messages),
                                            settings.client_tool_error_prefix)
    plan = await plan_chat(body, caller, request.app[REGISTRY], request.app[HELD],
                           caller.provider_query(request.query_string), request.path,
                           request.app[SETTINGS].offer_tools_on_empty_tools)
    return await render.answer(request, caller, plan, completion, partial(ChatChunks, plan))


_TEXTS = ("content", "refusal", "reasoning_content", "reasoning")  # message fields written over several rounds


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
    message = dict(choice["message"])
    for key in _TEXTS:
        if (text := _joined(turns, key)) is not None or key == "content":
            message[key] = text
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
    waiting_for_identity: list[dict[str, Any]] = field(default_factory=list)  # frames before any chunk named it
    closing: bytes = b"data: [DONE]\n\n"

    def _chunk(self, last: Mapping[str, Any], delta: Mapping[str, Any],
               finish_reason: str | None = None) -> dict[str, Any]:
        """A chunk of the gateway's own, with the provider's fields of its `last` answer."""
        top = {k: v for k, v in last.items() if k not in ("choices", "usage", "object")}
        choice = {k: v for k, v in last["choices"][0].items() if k not in ("message", "finish_reason")}
        return {**top, **self.identity, "object": "chat.completion.chunk",
                "choices": [{**choice, "index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}

    def _named(self, chunk: dict[str, Any]) -> list[render.Frame]:
        """`chunk` (a copy of the provider's) under the answer's identity, after any frame that
        waited for it."""
        frames: list[render.Frame] = []
        if self.waiting_for_identity:
            waiting, self.waiting_for_identity = self.waiting_for_identity, []
            frames = [(None, {**frame, **self.identity, "object": "chat.completion.chunk"}) for frame in waiting]
        chunk.update(self.identity)
        chunk["object"] = "chat.completion.chunk"
        frames.append((None, chunk))
        return frames

    def visible(self, event: Visible) -> Iterable[render.Frame]:
        chunk = dict(event.piece)
        if not self.identity:
            if not chunk.get("id"):  # an annotation frame ahead of the answer (Azure's prompt filter)
                self.waiting_for_identity.append(chunk)
                return []
            self.identity = {k: chunk[k] for k in ("id", "created", "model") if k in chunk}
        if event.round > 0 and chunk.get("choices"):  # one assistant message, however many rounds: one role
            choice = chunk["choices"][0]
            delta = {k: v for k, v in choice["delta"].items() if k != "role"}
            if says_nothing(delta) and not annotates(choice):
                return []
            chunk["choices"] = [{**choice, "delta": delta}]
        return self._named(chunk)  # one answer, named alike in every chunk

    def waiting(self) -> Iterable[render.Frame]:
        return []

    def finished(self, event: Finished) -> Iterable[render.Frame]:
        if not self.identity:
            first = event.turns[0].body
            self.identity = {k: first[k] for k in ("id", "created", "model") if k in first}
        last = event.turns[-1].body
        waiting = self.waiting_for_identity
        self.waiting_for_identity = []
        frames: list[render.Frame] = [(None, {**frame, **self.identity, "object": "chat.completion.chunk"})
                                      for frame in waiting]
        frames += [(None, self._chunk(last, {"tool_calls": [{"index": i, **call}]}))
                   for i, call in enumerate(event.client_calls)]
        frames.append((None, self._chunk(last, {}, event.finish_reason)))
        if self.plan.include_usage:
            closing = self._chunk(last, {})
            frames.append((None, {**closing, "choices": [], "usage": summed_usage(event.turns) or {}}))
        return frames

    def error(self, error: GatewayError) -> render.Frame:
        return None, error.body()
