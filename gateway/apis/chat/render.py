"""A Chat Completions run's end as the client gets it: one chat completion, or chunks."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.apis.base import Frame
from gateway.apis.chat.answer import annotates, says_nothing
from gateway.engine import Finished, Plan, ToolsRan, ToolsStarted, Visible
from gateway.engine.turn import summed_usage
from gateway.errors import GatewayError

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

    def _named(self, chunk: dict[str, Any]) -> list[Frame]:
        """`chunk` (a copy of the provider's) under the answer's identity, after any frame that
        waited for it."""
        frames: list[Frame] = []
        if self.waiting_for_identity:
            waiting, self.waiting_for_identity = self.waiting_for_identity, []
            frames = [(None, {**frame, **self.identity, "object": "chat.completion.chunk"}) for frame in waiting]
        chunk.update(self.identity)
        chunk["object"] = "chat.completion.chunk"
        frames.append((None, chunk))
        return frames

    def visible(self, event: Visible) -> Iterable[Frame]:
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

    def started(self, event: ToolsStarted) -> Iterable[Frame]:
        return []  # Chat has no item for a call its client does not run

    def ran(self, event: ToolsRan) -> Iterable[Frame]:
        return []

    def waiting(self) -> Iterable[Frame]:
        return []

    def finished(self, event: Finished) -> Iterable[Frame]:
        if not self.identity:
            first = event.turns[0].body
            self.identity = {k: first[k] for k in ("id", "created", "model") if k in first}
        last = event.turns[-1].body
        waiting = self.waiting_for_identity
        self.waiting_for_identity = []
        frames: list[Frame] = [(None, {**frame, **self.identity, "object": "chat.completion.chunk"})
                                      for frame in waiting]
        frames += [(None, self._chunk(last, {"tool_calls": [{"index": i, **call}]}))
                   for i, call in enumerate(event.client_calls)]
        frames.append((None, self._chunk(last, {}, event.finish_reason)))
        if self.plan.include_usage:
            closing = self._chunk(last, {})
            frames.append((None, {**closing, "choices": [], "usage": summed_usage(event.turns) or {}}))
        return frames

    def error(self, error: GatewayError) -> Frame:
        return None, error.body()
