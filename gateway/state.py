"""What the gateway remembers between requests: mixed turns held for the client's follow-up, and
the provider response a client-facing response id stands for.

When one model turn calls both gateway tools and client tools, the client only sees its own
calls. The gateway keeps its part (its calls and their results) under a token, and gives the
client's calls ids that name the token, so that the turn can be put together again when the
conversation comes back. Entries are bounded in number, expire when unused, and belong to the
gateway key that made them.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from gateway.errors import Conflict

PREFIX = "tspan_"
RESPONSE_PREFIX = f"resp_{PREFIX}"  # ids of answers the gateway gave over several provider responses
V = TypeVar("V")


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
class _Entry(Generic[V]):
    value: V
    principal: str | None
    expires: float


class _Bounded(Generic[V]):
    """Values by key: least recently used dropped past `capacity`, expired after `ttl` unused."""

    def __init__(self, capacity: int, ttl_seconds: float, clock: Callable[[], float]) -> None:
        self._items: OrderedDict[str, _Entry[V]] = OrderedDict()
        self._capacity = capacity
        self._ttl = ttl_seconds
        self._clock = clock

    def __len__(self) -> int:
        return len(self._items)

    def put(self, key: str, value: V, principal: str | None) -> None:
        now = self._clock()
        stale = [k for k, entry in self._items.items() if entry.expires <= now]
        for k in stale:
            del self._items[k]
        while len(self._items) >= self._capacity:
            self._items.popitem(last=False)
        self._items[key] = _Entry(value, principal, now + self._ttl)

    def get(self, key: str, principal: str | None) -> V | None:
        """The value, its expiry refreshed; None when absent, expired, or another caller's."""
        now = self._clock()
        entry = self._items.get(key)
        if entry is None:
            return None
        if entry.expires <= now:
            del self._items[key]
            return None
        if entry.principal != principal:
            return None
        self._items[key] = replace(entry, expires=now + self._ttl)
        self._items.move_to_end(key)
        return entry.value


class HeldTurns:
    """Held turns, found by token or by the ids of the items their client saw, and the provider
    response behind each answer id the gateway made up. Memory only, for now: one process."""

    def __init__(self, capacity: int, ttl_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._turns: _Bounded[HeldTurn] = _Bounded(capacity, ttl_seconds, clock)
        self._items: _Bounded[str] = _Bounded(capacity, ttl_seconds, clock)  # shown item id -> token
        self._responses: _Bounded[str] = _Bounded(capacity, ttl_seconds, clock)

    def __len__(self) -> int:
        return len(self._turns)

    def hold(self, turn: HeldTurn, principal: str | None) -> str:
        """Keep `turn`; returns the token its client calls' ids carry (see `client_call_id`)."""
        token = secrets.token_hex(6)
        self._turns.put(token, turn, principal)
        for item_id in turn.shown:
            self._items.put(item_id, token, principal)
        return token

    def take(self, token: str, principal: str | None, param: str, api: str) -> HeldTurn:
        """The held turn (it stays held: a conversation may be sent again), or a 409."""
        turn = self._turns.get(token, principal)
        if turn is None or turn.api != api:
            raise Conflict(
                "this conversation continues a model turn in which the gateway ran its own tools, and the "
                "gateway no longer holds that turn (it expired or the gateway restarted); resend the "
                "conversation from before that turn", code="turn_not_held", param=param)
        return turn

    def owner(self, item_id: str, principal: str | None) -> str | None:
        """The token of the held turn whose client saw the item of this id, if any."""
        return self._items.get(item_id, principal)

    def alias(self, client_id: str, provider_id: str, principal: str | None) -> None:
        """Remember that the response the client knows as `client_id` continues at `provider_id`."""
        self._responses.put(client_id, provider_id, principal)

    def resolve(self, response_id: str, principal: str | None) -> str:
        """The provider response to continue from, for a `previous_response_id` a client sent. An id
        the gateway made up and no longer knows is a 409; any other unknown id is the provider's."""
        found = self._responses.get(response_id, principal)
        if found is None and response_id.startswith(RESPONSE_PREFIX):
            raise Conflict("this response was answered over several provider responses, and the gateway no longer "
                           "knows the last of them (it expired or the gateway restarted); resend the conversation "
                           "instead of continuing from it", code="response_not_held", param="previous_response_id")
        return found or response_id
