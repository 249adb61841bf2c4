"""Mixed turns held for the client's follow-up.

When one assistant turn calls both gateway tools and client tools, the client only sees its own
calls. The gateway keeps its part (the full assistant message and its tool results) and gives
the client's calls ids that name the held turn, so that when the conversation comes back the
turn can be put together again. Held turns are bounded in number and expire when unused.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.errors import Conflict

PREFIX = "tspan_"


@dataclass(frozen=True)
class HeldTurn:
    assistant: dict[str, Any]  # the assistant message as the model sent it
    results: tuple[dict[str, Any], ...]  # the gateway's tool messages for it
    expires: float
    principal: str | None = None  # only the caller (gateway key) that got the turn may continue it


def _split(call_id: str) -> tuple[str, str] | None:
    """(token, original id) of an id this gateway rewrote, else None."""
    if not call_id.startswith(PREFIX):
        return None
    token, sep, original = call_id[len(PREFIX):].partition("_")
    return (token, original) if sep and token else None


class PendingTurns:
    def __init__(self, capacity: int, ttl_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._turns: OrderedDict[str, HeldTurn] = OrderedDict()
        self._capacity = capacity
        self._ttl = ttl_seconds
        self._clock = clock

    def __len__(self) -> int:
        return len(self._turns)

    def hold(self, assistant: dict[str, Any], results: Sequence[dict[str, Any]], principal: str | None = None) -> str:
        """Keep a mixed turn; returns the token to build client call ids with (`client_id`)."""
        now = self._clock()
        self._expire(now)
        while len(self._turns) >= self._capacity:
            self._turns.popitem(last=False)
        token = secrets.token_hex(6)
        self._turns[token] = HeldTurn(assistant, tuple(results), now + self._ttl, principal)
        return token

    @staticmethod
    def client_id(token: str, original: str) -> str:
        return f"{PREFIX}{token}_{original}"

    def restore(self, messages: Sequence[Any], principal: str | None = None) -> list[Any]:
        """The conversation with every held turn put back: the full assistant message, the
        gateway's results after it, and the client's results under their original ids.
        Raises Conflict when the conversation names a turn that is no longer held."""
        out: list[Any] = []
        now = self._clock()
        for message in messages:
            if not isinstance(message, dict):
                out.append(message)
                continue
            if message.get("role") == "tool" and isinstance(message.get("tool_call_id"), str):
                parts = _split(message["tool_call_id"])
                out.append({**message, "tool_call_id": parts[1]} if parts else message)
                continue
            token = self._token_of(message)
            if token is None:
                out.append(message)
                continue
            held = self._turns.get(token)
            if held is None or held.expires <= now or held.principal != principal:
                if held is not None and held.expires <= now:
                    self._turns.pop(token, None)
                raise Conflict(
                    "this conversation continues an assistant turn in which the gateway ran its own tools, "
                    "and the gateway no longer holds that turn (it expired or the gateway restarted); "
                    "resend the conversation from before that turn", code="turn_not_held", param="messages")
            self._turns[token] = HeldTurn(held.assistant, held.results, now + self._ttl, principal)  # in use
            self._turns.move_to_end(token)
            out.append(held.assistant)
            out.extend(held.results)
        return out

    @staticmethod
    def _token_of(message: dict[str, Any]) -> str | None:
        if message.get("role") != "assistant" or not isinstance(message.get("tool_calls"), list):
            return None
        for call in message["tool_calls"]:
            if isinstance(call, dict) and isinstance(call.get("id"), str) and (parts := _split(call["id"])):
                return parts[0]
        return None

    def _expire(self, now: float) -> None:
        stale = [token for token, held in self._turns.items() if held.expires <= now]
        for token in stale:
            del self._turns[token]
