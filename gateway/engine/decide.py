"""What happens after a model turn: every decision of the tool loop, for every API, made here.

Pure functions of the turn and the request; nothing here talks to the provider or runs a tool.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.engine.turn import ModelCall, ModelTurn
from gateway.tools import ToolOutcome


@dataclass(frozen=True)
class RunTools:
    """Run the gateway's calls, add their results, and call the model again."""

    calls: tuple[ModelCall, ...]
    tool_choice: Any  # the tool_choice of the next round


@dataclass(frozen=True)
class HandBack:
    """Run the gateway's calls (if any), then hand the client its own calls. When the gateway
    added anything to the conversation in this request, that is held for the client's follow-up.
    A gateway call whose tool paused (Interrupt) is handed back too, with the pause in `paused`."""

    gateway_calls: tuple[ModelCall, ...]
    client_calls: tuple[ModelCall, ...]
    hold: bool
    paused: Mapping[str, ToolOutcome] = field(default_factory=dict)  # by call id


@dataclass(frozen=True)
class Finish:
    """The model answered: the answer goes to the client."""

    finish_reason: str | None


Decision = RunTools | HandBack | Finish
Relax = Callable[[Any, Collection[str]], Any]  # the tool_choice after the gateway ran some tools (Wire's)


def is_final(tool_rounds: int, max_rounds: int) -> bool:
    """After `max_rounds` rounds of gateway tools, the model is called once more with no tools."""
    return tool_rounds >= max_rounds


def _is_clients(call: ModelCall, client_names: Collection[str]) -> bool:
    # Any function name the client did not declare is the gateway's to handle, so an invented
    # name is rejected back to the model instead of reaching the client.
    return call.kind == "client" or call.name in client_names


def decide(turn: ModelTurn, client_names: Collection[str], tool_rounds: int, max_rounds: int,
           tool_choice: Any, relax: Relax) -> Decision:
    """The next step after `turn`, the answer to a request that has had `tool_rounds` rounds of
    gateway tools so far; `relax`: how the API relaxes a tool_choice that forced what ran."""
    theirs = tuple(c for c in turn.calls if _is_clients(c, client_names))
    mine = tuple(c for c in turn.calls if not _is_clients(c, client_names))
    if is_final(tool_rounds, max_rounds):
        mine = ()  # the last call allowed no tools: a gateway call it made anyway is dropped
    if theirs:
        return HandBack(mine, theirs, hold=bool(mine) or tool_rounds > 0)
    if mine:
        return RunTools(mine, relax(tool_choice, {c.name for c in mine}))
    reason = turn.finish_reason
    return Finish("stop" if reason == "tool_calls" else reason)  # its calls were dropped at the round limit


def enforced(decision: HandBack, turn: ModelTurn, refused: Collection[int], tool_choice: Any,
             relax: Relax) -> RunTools | HandBack:
    """`decision` once the check of the client's calls refused some (`refused`: the `id()` of each
    such call, in reject mode): the gateway answers those itself, as it answers its own calls (their
    outcomes are the check's rejections), and they never reach the client. With no client call
    left, the loop goes on; with some, they are handed back and what the gateway answered is held."""
    answered = tuple(c for c in turn.calls if id(c) in refused or any(c is m for m in decision.gateway_calls))
    kept = tuple(c for c in decision.client_calls if id(c) not in refused)
    if not kept:
        ran = {c.name for c in decision.gateway_calls}
        return RunTools(answered, relax(tool_choice, ran))
    return HandBack(answered, kept, hold=True, paused=decision.paused)


def after_tools(decision: RunTools | HandBack, turn: ModelTurn,
                outcomes: Sequence[ToolOutcome]) -> RunTools | HandBack:
    """The step once the gateway's calls have run: a call whose tool raised Interrupt ends the loop
    as a client call would, its result left to the client (the pause's message and data go with
    it); the gateway's other calls stay run and held."""
    paused = {o.call_id: o for o in outcomes if o.status == "interrupted"}
    if not paused:
        return decision
    mine = decision.calls if isinstance(decision, RunTools) else decision.gateway_calls
    theirs = () if isinstance(decision, RunTools) else decision.client_calls
    handed = {id(call) for call in theirs} | {id(call) for call in mine if call.id in paused}
    ordered = tuple(call for call in turn.calls if id(call) in handed)  # the model's order
    return HandBack(tuple(call for call in mine if call.id not in paused), ordered, True, paused)
