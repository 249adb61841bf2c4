"""What a run of the tool loop gives its route, in order: the stream opened, pieces the client may
see at once, the gateway's calls of a round as they start and once they ran (streams only),
keepalives while tools run or a retry waits, and the end."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from gateway.engine.turn import ModelCall, ModelTurn
from gateway.tools import ToolOutcome


@dataclass(frozen=True)
class Visible:
    """A piece of a streamed answer the client may see now, as the provider sent it."""

    piece: Mapping[str, Any]
    round: int  # 0 for the first provider call


@dataclass(frozen=True)
class Opened:
    """The first provider stream answered: its headers, for the client's response (streams only)."""

    headers: Mapping[str, str]


@dataclass(frozen=True)
class Keepalive:
    """Gateway tools are still running, or a retry waits (streams only)."""


@dataclass(frozen=True)
class ToolsStarted:
    """The gateway is about to run these calls of round `round`'s turn (streams only: an answer not
    streamed shows them from Finished.tool_runs)."""

    round: int
    calls: tuple[ModelCall, ...]
    turn: ModelTurn  # the round's answer, where each call's item sits


@dataclass(frozen=True)
class ToolsRan:
    """The gateway ran these calls of round `round`: their outcomes, in the same order (streams only)."""

    round: int
    calls: tuple[ModelCall, ...]
    outcomes: tuple[ToolOutcome, ...]
    turn: ModelTurn


class ToolRun(NamedTuple):
    """One call of the model's that the gateway answered, in the round it came in, and how it ended
    (a call paused for review ends `interrupted`)."""

    round: int
    call: ModelCall
    outcome: ToolOutcome


@dataclass(frozen=True)
class Finished:
    """The loop is over: every round's answer, and what the client gets beyond what it saw."""

    turns: tuple[ModelTurn, ...]
    client_calls: tuple[Mapping[str, Any], ...]  # the client's calls, as the client receives them
    finish_reason: str | None
    limit_reached: bool  # the last call was the one the round limit allows, with no tools
    response_id: str | None = None  # Responses: the id the client knows the answer by
    held_turn_lost: bool = False  # it continued a turn the gateway no longer held (engine.plan.Plan)
    tool_runs: tuple[ToolRun, ...] = ()  # every call the gateway answered, a replay's earlier rounds' too

    @property
    def rounds(self) -> int:
        """Provider calls made."""
        return len(self.turns)


Event = Opened | Visible | Keepalive | ToolsStarted | ToolsRan | Finished
