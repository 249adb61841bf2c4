"""What the state stores hold and answer, whichever store it is: the held turn, what a lookup
found, how much each store keeps, and the interface both stores implement."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from gateway.errors import Conflict, NotFound, Unavailable

# What a shared store keeps, each kind under keys of its own: held turns, the items their clients
# saw, response aliases, response owners, failure records, the marker that tells a Redis that lost
# its data, and the sets of entries by last use (the metric of unreadable values counts by these).
StateKind = Literal["turn", "item", "resp", "own", "fail", "epoch", "lru"]

PREFIX = "tspan_"
RESPONSE_PREFIX = f"resp_{PREFIX}"  # ids of answers the gateway gave over several provider responses


@dataclass(frozen=True)
class HeldTurn:
    """What the gateway added to a conversation that the client's copy of it lacks, in the wire
    shape of the API it came from, to put back when the client sends the conversation again."""

    api: str  # "chat" or "responses": a turn is put back only into the API it came from
    calls: tuple[Mapping[str, Any], ...]  # what goes in place of the client's copy (messages / items)
    results: tuple[Mapping[str, Any], ...] = ()  # the gateway's results, before the client's own
    shown: tuple[str, ...] = ()  # Responses: ids of the items the client saw, by which it is found


def client_call_id(token: str, original: str) -> str:
    """The id a client call of a held turn travels under."""
    return f"{PREFIX}{token}_{original}"


def split_call_id(call_id: object) -> tuple[str, str] | None:
    """(token, original id) of an id made by `client_call_id`, else None."""
    if not isinstance(call_id, str) or not call_id.startswith(PREFIX):
        return None
    token, sep, original = call_id[len(PREFIX):].partition("_")
    return (token, original) if sep and token else None


@dataclass(frozen=True)
class Bounds:
    """How many entries of one kind a store keeps: in all, and for any one gateway key (so that one
    key's traffic cannot push every other key's entries out), each expiring `ttl_seconds` after its
    last use. Without gateway keys there is one caller, and only `capacity` applies."""

    capacity: int
    ttl_seconds: float
    per_key: int | None = None  # None: as many as `capacity`


OWNED_RESPONSES = Bounds(100_000, 30 * 86400.0, 25_000)  # as long as OpenAI keeps a stored response


@dataclass(frozen=True)
class FailureBounds:
    """How much failure state is kept: trajectories (least recently written dropped first), records
    per trajectory, records overall (memory only; in Redis at most trajectories x per trajectory),
    and how long an unwritten trajectory is kept."""

    trajectories: int = 10_000
    ttl_seconds: float = 3600.0
    tools_per_trajectory: int = 64
    records: int = 50_000


DEFAULT_FAILURE_BOUNDS = FailureBounds()

class StateUnavailable(Unavailable):
    def __init__(self) -> None:
        super().__init__("the gateway's state store (Redis) is unavailable, and this request continues a turn the "
                         "gateway holds there; retry shortly", code="state_unavailable", retry_after=2)


_NOT_HELD = ("this conversation continues a model turn in which the gateway ran its own tools, and the gateway no "
             "longer holds that turn (it expired or the gateway restarted); resend the conversation from before "
             "that turn")
_RESPONSE_NOT_HELD = ("this response was answered over several provider responses, and the gateway no longer knows "
                      "the last of them (it expired or the gateway restarted); resend the conversation instead of "
                      "continuing from it")


def no_such_response(response_id: str, param: str | None = None) -> NotFound:
    """What a gateway key hears of a response id it did not make: exactly what it hears of one
    that does not exist."""
    return NotFound(f"no response with id '{response_id}' was found", param=param, code="response_not_found")


@dataclass(frozen=True)
class Found:
    """What one request's lookup found: held turns by token, tokens by shown item id, the provider
    response behind the response id it sent, and whether the caller's key made that response."""

    turns: Mapping[str, HeldTurn] = field(default_factory=dict)
    owners: Mapping[str, str] = field(default_factory=dict)
    response: str | None = None
    owned: bool = False

    def take(self, token: str, param: str, api: str) -> HeldTurn:
        """The held turn (it stays held: a conversation may be sent again), or a 409."""
        turn = self.turns.get(token)
        if turn is None or turn.api != api:
            raise Conflict(_NOT_HELD, code="turn_not_held", param=param)
        return turn

    def owner(self, item_id: str) -> str | None:
        """The token of the held turn whose client saw the item of this id, if any."""
        return self.owners.get(item_id)

    def resolve(self, response_id: str, keyed: bool = False) -> str:
        """The provider response to continue from, for a `previous_response_id` a client sent. An id
        the gateway made up and no longer knows is a 409; any other unknown id is the provider's,
        unless the caller has a gateway key (`keyed`): then only a response that key made may be
        continued, and any other is a 404, as if it did not exist."""
        if self.response is None and response_id.startswith(RESPONSE_PREFIX):
            raise Conflict(_RESPONSE_NOT_HELD, code="response_not_held", param="previous_response_id")
        if keyed and not self.owned:
            raise no_such_response(response_id, "previous_response_id")
        return self.response or response_id


NOTHING = Found()


class FailureBook(Protocol):
    """The last failed call of each tool in a trajectory, as text telemetry gives and reads back."""

    async def failure(self, principal: str | None, trajectory_id: str, tool: str) -> str | None:
        """The record of `tool`'s last failed call in the principal's trajectory, if held."""

    async def remember_failure(self, principal: str | None, trajectory_id: str, tool: str,
                               record: str | None) -> None:
        """Hold `record` as `tool`'s last failure in the trajectory (None: forget it), refreshing
        the trajectory's expiry."""


class StateStore(FailureBook, Protocol):
    async def hold(self, turn: HeldTurn, principal: str | None) -> str:
        """Keep `turn`; returns the token its client calls' ids carry (see `client_call_id`)."""

    async def alias(self, client_id: str, provider_id: str, principal: str | None) -> None:
        """Remember that the response the client knows as `client_id` continues at `provider_id`."""

    async def claim(self, response_ids: Collection[str], principal: str) -> None:
        """Remember that the gateway key `principal` made these provider responses: only it may read,
        continue or delete them."""

    async def lookup(self, principal: str | None, tokens: Collection[str], item_ids: Collection[str] = (),
                     response_id: str | None = None) -> Found:
        """The held turns of these tokens and of these shown items, and the response behind
        `response_id` (and whether the principal made it), each as the principal's own and with its
        expiry refreshed."""

    async def status(self) -> str | None:
        """None for a store in memory; else "up" or "unavailable"."""

    async def aclose(self) -> None:
        """Let go of connections."""
