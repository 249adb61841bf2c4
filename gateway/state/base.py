"""What the state holds and answers, whichever store it is in: the held turn, what a lookup found,
how much each table keeps, and the interface of the failure records."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from gateway.errors import NotFound, Unavailable

# What a shared store keeps, each kind under keys of its own: held turns, the items their clients
# saw, response aliases, response owners, failure records, the marker that tells a Redis that lost
# its data, the sets of entries by last use (the metric of unreadable values counts by these), and
# the client calls handed back whose results have not come yet, Messages threads, upstreams
# cooling down (gateway.state.redis_cooldowns), and the counts of gateway keys' limits
# (gateway.state.redis_limits).
StateKind = Literal["turn", "item", "resp", "own", "fail", "epoch", "lru", "link", "answer", "rounds", "sent",
                    "thread", "cool", "origin", "limit"]

PREFIX = "tspan_"
RESPONSE_PREFIX = f"resp_{PREFIX}"  # ids of answers the gateway gave over several provider responses


@dataclass(frozen=True)
class HeldTurn:
    """What the gateway added to a conversation that the client's copy of it lacks, in the wire
    shape of the API it came from, to put back when the client sends the conversation again."""

    api: str  # "chat", "responses" or "messages": a turn is put back only into the API it came from
    calls: tuple[Mapping[str, Any], ...]  # what goes in place of the client's copy (messages / items)
    results: tuple[Mapping[str, Any], ...] = ()  # the gateway's results, before the client's own
    shown: tuple[str, ...] = ()  # Responses: ids of the items the client saw, by which it is found
    # Responses on an upstream that keeps no conversation, when a call waits for the client's approval:
    # the conversation before the gateway's rounds, for a follow-up by previous_response_id alone.
    before: tuple[Mapping[str, Any], ...] = ()


def client_call_id(token: str, original: str) -> str:
    """The id a client call of a held turn travels under."""
    return f"{PREFIX}{token}_{original}"


def split_call_id(call_id: object) -> tuple[str, str] | None:
    """(token, original id) of an id made by `client_call_id`, else None."""
    if not isinstance(call_id, str) or not call_id.startswith(PREFIX):
        return None
    token, sep, original = call_id[len(PREFIX):].partition("_")
    return (token, original) if sep and token else None


APPROVAL_PREFIX = "mcpr_"  # a Responses mcp_approval_request's id
DIGEST_HEAD = 32  # hex digits of the arguments' digest an approval id carries


def approval_id(token: str, call_id: str, digest: str) -> str:
    """The id of the client's approval of a held call: it names the held turn (`token`), the call,
    and the arguments approved (the head of their digest), so an edited id approves nothing."""
    return APPROVAL_PREFIX + client_call_id(token, f"{digest[:DIGEST_HEAD]}_{call_id}")


def split_approval_id(value: object) -> tuple[str, str, str] | None:
    """(token, call id, digest head) of an id made by `approval_id`, else None."""
    if not isinstance(value, str) or not value.startswith(APPROVAL_PREFIX):
        return None
    found = split_call_id(value[len(APPROVAL_PREFIX):])
    if found is None:
        return None
    token, rest = found
    digest, sep, call_id = rest.partition("_")
    hex_digits = len(digest) == DIGEST_HEAD and all(c in "0123456789abcdef" for c in digest)
    return (token, call_id, digest) if sep and call_id and hex_digits else None


@dataclass(frozen=True)
class Bounds:
    """How many entries of one kind a store keeps: in all, and for any one gateway key (past it the
    key's own least recently used go), each expiring `ttl_seconds` after its last use. Past the
    capacity what goes is chosen by gateway.state.fair, so that one key's traffic never pushes out
    an entry of a key within its fair share. Without gateway keys there is one caller, and only
    `capacity` applies."""

    capacity: int
    ttl_seconds: float
    per_key: int | None = None  # None: as many as `capacity`


OWNED_RESPONSES = Bounds(100_000, 30 * 86400.0, 25_000)  # as long as OpenAI keeps a stored response
# Call and response ids of answers the gateway gave, each naming its trajectory (gateway.trajectories):
# kept a day past their last use, as an agent's run may wait on a person that long.
TRAJECTORY_LINKS = Bounds(200_000, 86400.0, 50_000)
# The rounds done for a request whose provider then failed for good (gateway.engine.replays): kept
# for the client's replay of the same request, a few minutes at most.
REPLAYS = Bounds(10_000, 600.0, 2_500)
# The client calls an answer handed back, each with when and of which tool (gateway.client_tools.results):
# kept until its result comes, or as long as the links that name its trajectory.
SENT_CALLS = Bounds(200_000, 86400.0, 50_000)


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

    def take(self, token: str, api: str) -> HeldTurn | None:
        """The held turn (it stays held: a conversation may be sent again); None for one the
        gateway no longer holds (expired, pushed out, lost in a restart), or of another API."""
        turn = self.turns.get(token)
        return turn if turn is not None and turn.api == api else None

    def owner(self, item_id: str) -> str | None:
        """The token of the held turn whose client saw the item of this id, if any."""
        return self.owners.get(item_id)

    def resolve(self, response_id: str, keyed: bool = False) -> str | None:
        """The provider response to continue from, for a `previous_response_id` a client sent: None
        for an id the gateway made up and no longer knows (the request then goes on from its own
        input alone). Any other unknown id is the provider's, unless the caller has a gateway key
        (`keyed`): then only a response that key made may be continued, and any other is a 404, as
        if it did not exist."""
        if self.response is None and response_id.startswith(RESPONSE_PREFIX):
            return None
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
