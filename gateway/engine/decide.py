"""What happens after a model turn: every decision of the tool loop, for both APIs, made here.

Pure functions of the turn and the request; nothing here talks to the provider or runs a tool.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.engine.turn import ModelCall, ModelTurn


@dataclass(frozen=True)
class RunTools:
    """Run the gateway's calls, add their results, and call the model again."""

    calls: tuple[ModelCall, ...]
    tool_choice: Any  # the tool_choice of the next round


@dataclass(frozen=True)
class HandBack:
    """Run the gateway's calls and hold them; hand the client its own calls."""

    gateway_calls: tuple[ModelCall, ...]
    client_calls: tuple[ModelCall, ...]
    finish_reason: str = "tool_calls"


@dataclass(frozen=True)
class Finish:
    """The model answered, or called only the client's tools: the answer goes to the client."""

    client_calls: tuple[ModelCall, ...]
    finish_reason: str | None


Decision = RunTools | HandBack | Finish


def is_final(tool_rounds: int, max_rounds: int) -> bool:
    """After `max_rounds` rounds of gateway tools, the model is called once more with no tools."""
    return tool_rounds >= max_rounds


def _is_clients(call: ModelCall, client_names: Collection[str]) -> bool:
    # Any function name the client did not declare is the gateway's to handle, so an invented
    # name is rejected back to the model instead of reaching the client. The gateway has no
    # free-form (custom) tools: those calls are the client's.
    return call.kind == "custom" or call.name in client_names


def decide(turn: ModelTurn, client_names: Collection[str], final: bool, tool_choice: Any) -> Decision:
    """The next step after `turn`. `final`: this turn answered the last call the round limit allows."""
    theirs = tuple(c for c in turn.calls if _is_clients(c, client_names))
    mine = tuple(c for c in turn.calls if not _is_clients(c, client_names))
    if final or not mine:
        reason = turn.finish_reason
        if theirs:
            reason = "tool_calls"
        elif reason == "tool_calls":
            reason = "stop"  # its calls were the gateway's, dropped at the round limit
        return Finish(theirs, reason)
    if theirs:
        return HandBack(mine, theirs)
    return RunTools(mine, relaxed_tool_choice(tool_choice, {c.name for c in mine}))


def _forced_name(choice: Any) -> str | None:
    """The tool a tool_choice forces: Chat `{"type": "function", "function": {"name"}}`,
    Responses `{"type": "function", "name"}`."""
    if not isinstance(choice, Mapping):
        return None
    function = choice.get("function")
    name = function.get("name") if isinstance(function, Mapping) else choice.get("name")
    return name if isinstance(name, str) else None


def relaxed_tool_choice(choice: Any, ran: Collection[str]) -> Any:
    """The tool_choice for the round after the gateway ran `ran`: forcing a call again would
    loop for ever, so "required", or a forced tool that ran, becomes "auto"."""
    if choice == "required" or (_forced_name(choice) in ran):
        return "auto"
    return choice
