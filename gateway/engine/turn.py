"""A provider's answer as the engine sees it, whichever wire API it came in: one ModelTurn, its
calls as ModelCalls. Each API's adapter (gateway.apis) reads its own answers into these; the
engine decides on them without knowing the API.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

Api = Literal["chat", "responses", "messages"]


@dataclass(frozen=True)
class ModelCall:
    """One tool call of a model turn. A `client` call can only be the client's: a kind of call the
    gateway never offers (free-form tools, namespaced functions, computer, shell, patch ...)."""

    id: str  # Chat: the tool call's id; Responses: the item's call_id; Messages: the tool_use block's id
    name: str
    arguments: str  # the JSON text (or a custom tool's input) as the model sent it
    item: Mapping[str, Any]  # the call as the provider sent it
    kind: Literal["function", "client"] = "function"


@dataclass(frozen=True)
class ModelTurn:
    """One provider answer, whichever API and mode it came in."""

    api: Api
    body: Mapping[str, Any]  # the whole answer (assembled, when streamed)
    output: tuple[Mapping[str, Any], ...]  # Chat: the message; Responses: the output items; Messages: the blocks
    calls: tuple[ModelCall, ...] = ()
    finish_reason: str | None = None  # in Chat's terms (stop, tool_calls, length ...), whatever the API
    usage: Mapping[str, Any] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)  # the provider's, those that may reach the client
    input_tokens: int | None = None  # as the provider counted them, cached ones included
    output_tokens: int | None = None

    @property
    def response_id(self) -> str | None:
        """The provider's id of its answer."""
        value = self.body.get("id")
        return value if isinstance(value, str) else None

    @property
    def model(self) -> str | None:
        """The model that answered."""
        value = self.body.get("model")
        return value if isinstance(value, str) else None


class StreamReader(Protocol):
    """Follows one streamed answer: says which events the client may see at once (text, reasoning
    and other output pass; tool calls wait for the engine's decision, and so does the end of the
    answer), and assembles the whole answer."""

    def absorb(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """Take one event; returns what the client may see now, or None."""

    def turn(self, headers: Mapping[str, str] | None = None) -> ModelTurn:
        """The stream as one turn; a stream that ended before its answer was whole raises."""


def count(usage: Mapping[str, Any] | None, *keys: str) -> int | None:
    """The sum of these token counts of `usage`; None when the first is missing."""
    if usage is None:
        return None
    first = usage.get(keys[0]) if keys else None
    if not _is_count(first):
        return None
    return sum((value for key in keys if isinstance(value := usage.get(key), int) and _is_count(value)), 0)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def usage_of(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    usage = body.get("usage")
    return usage if isinstance(usage, dict) else None


def add_usage(total: dict[str, Any], usage: Mapping[str, Any] | None) -> None:
    """Sum token counts into `total`, nested detail objects included."""
    for key, value in (usage or {}).items():
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):  # a tuple: `int | float` would be built anew at every call
            total[key] = total.get(key, 0) + value
        elif isinstance(value, dict):
            add_usage(total.setdefault(key, {}), value)


def summed_usage(turns: Sequence[ModelTurn]) -> Mapping[str, Any] | None:
    """Usage over every round; None when no round reported any. One round's is the provider's own,
    as it came (the fields that are no count too)."""
    if len(turns) == 1:
        return turns[0].usage
    total: dict[str, Any] = {}
    for turn in turns:
        add_usage(total, turn.usage)
    return total if any(turn.usage is not None for turn in turns) else None
