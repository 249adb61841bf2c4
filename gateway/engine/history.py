"""The conversation as the engine sends it upstream: what each API's conversation (gateway.apis)
must do, and what they share. Values only: each step returns a new conversation."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from pydantic_core import to_jsonable_python

from gateway.engine.turn import ModelCall, ModelTurn
from gateway.state import HeldTurn
from gateway.tools import ToolOutcome

Take = Callable[[str], "HeldTurn | None"]  # a held turn by token (None: no longer held)
Owner = Callable[[str], "str | None"]  # the token of the held turn whose client saw the item of this id


class Conversation(Protocol):
    """What the engine needs of a conversation, whichever API it is in."""

    @property
    def tool_choice(self) -> Any:
        """The tool_choice the next round goes with."""

    def request(self, final: bool, stream: bool) -> dict[str, Any]:
        """The body of the next provider call (`final`: the last one, with no tools allowed)."""

    def continued(self, turn: ModelTurn, outcomes: Sequence[ToolOutcome], tool_choice: Any) -> Conversation:
        """The conversation after the gateway ran `turn`'s calls with these outcomes."""

    def held(self, turn: ModelTurn, mine: Sequence[ModelCall], theirs: Sequence[ModelCall],
             outcomes: Sequence[ToolOutcome]) -> HeldTurn:
        """What to keep when `turn` hands the client its calls (`theirs`): everything the gateway
        added in this request, then `turn` with the gateway's calls that ran (`mine`; a call dropped
        at the round limit goes) and the client's, and the outcomes of the gateway's."""

    def answered(self) -> HeldTurn | None:
        """What to keep when the model has answered, if the client can send it back: the gateway's
        rounds, where the client saw items of them it may replay (Responses)."""

    def for_client(self, call: ModelCall, token: str | None, pause: ToolOutcome | None = None) -> Mapping[str, Any]:
        """A call as the client receives it: under an id naming the held turn, if any; with the
        message and data of its tool's Interrupt when the gateway's tool paused on it."""


INTERRUPT_FIELD = "toolspan_interrupt"  # on a call handed back because the gateway's tool paused


def paused(call: Mapping[str, Any], pause: ToolOutcome | None) -> Mapping[str, Any]:
    """`call` with the pause of its tool, when it paused: the Interrupt's message and its data."""
    if pause is None:
        return call
    data = to_jsonable_python(pause.interrupt_data, fallback=repr)
    return {**call, INTERRUPT_FIELD: {"message": pause.content_text(), "data": data}}


def without_tools(body: dict[str, Any], final: bool, none: Any = "none") -> dict[str, Any]:
    """The body of the last call the round limit allows: the model may call no tool (`none`: the
    API's tool_choice that says so)."""
    if final and "tools" in body:
        body["tool_choice"] = none
    return body
