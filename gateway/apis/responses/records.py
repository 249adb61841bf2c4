"""What the gateway keeps of a Responses answer it gave over several provider responses: the
response the client was given, the input the client sent, and the provider responses behind it
(one a round). Kept in the state store beside the answer's alias, with the same bounds, so that
GET, input_items and DELETE of the answer's id (gateway.routes.response_ids) can answer for it."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from gateway.engine import Event, Finished
from gateway.errors import BadRequest
from gateway.state import StateStore

_TEXT = {"assistant": "output_text"}  # a message's text part by role; input_text for every other role


@dataclass(frozen=True)
class AnswerRecord:
    """`response` and `input` are None when they were too large to keep (then the provider is
    asked); `rounds` holds the provider response ids behind the answer, when the provider stored them."""

    rounds: tuple[str, ...]
    response: Mapping[str, Any] | None = None
    input: tuple[Mapping[str, Any], ...] | None = None

    def dump(self, max_bytes: int) -> str:
        """The record as JSON within `max_bytes`: without the input, then without the response,
        when it would be larger (the ids of the rounds are always kept)."""
        for kept in ({"response": self.response, "input": self.input}, {"response": self.response}, {}):
            text = json.dumps({"rounds": self.rounds, **kept}, separators=(",", ":"))
            if len(text) <= max_bytes or not kept:
                return text
        raise AssertionError("unreachable")

    @staticmethod
    def load(text: str) -> AnswerRecord | None:
        """The record `dump` wrote; None for anything else (a store's garbage is missing)."""
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            return None
        rounds = data.get("rounds") if isinstance(data, dict) else None
        if not isinstance(rounds, list) or not all(isinstance(r, str) and r for r in rounds):
            return None
        response, items = data.get("response"), data.get("input")
        if not isinstance(response, dict):
            response = None
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            items = None
        return AnswerRecord(tuple(rounds), response, None if items is None else tuple(items))


def gateway_made(finished: Finished) -> bool:
    """The answer goes by an id that is not its last provider response's: the gateway aliased it."""
    last = finished.turns[-1].response_id if finished.turns else None
    return finished.response_id is not None and finished.response_id != last


def _part(text: str, role: object) -> dict[str, Any]:
    return {"type": _TEXT.get(str(role), "input_text"), "text": text}


def input_items(sent: object, response_id: str) -> tuple[Mapping[str, Any], ...]:
    """The client's input as the Responses API lists it: a string is one user message; a message's
    string content is one text part; an item without an id gets one of the answer's."""
    listed = [{"role": "user", "content": sent}] if isinstance(sent, str) else sent if isinstance(sent, list) else []
    stem = response_id.removeprefix("resp_")
    items = []
    for index, item in enumerate(i for i in listed if isinstance(i, dict)):
        shown = dict(item)
        if "role" in shown:
            shown.setdefault("type", "message")
            if isinstance(shown.get("content"), str):
                shown["content"] = [_part(shown["content"], shown["role"])]
        shown.setdefault("id", f"msg_{stem}_{index}")
        items.append(shown)
    return tuple(items)


async def remembered(events: AsyncGenerator[Event, None], state: StateStore, principal: str | None,
                     response_of: Callable[[Finished], Mapping[str, Any]], sent: object, stored: bool,
                     max_bytes: int) -> AsyncGenerator[Event, None]:
    """`events`, and before an answer under a gateway-made id reaches its client (who may ask for
    it at once), its record kept. `stored`: the provider kept each round's response."""
    async with aclosing(events) as running:
        async for event in running:
            if isinstance(event, Finished) and gateway_made(event):
                assert event.response_id is not None  # gateway_made says so
                rounds = tuple(t.response_id for t in event.turns if t.response_id) if stored else ()
                record = AnswerRecord(tuple(dict.fromkeys(rounds)), response_of(event),
                                      input_items(sent, event.response_id))
                await state.answers.put(principal, {event.response_id: record.dump(max_bytes)})
            yield event


def _limit(query: Mapping[str, str]) -> int:
    raw = query.get("limit", "20")
    if not raw.isdigit() or not 1 <= int(raw) <= 100:
        raise BadRequest(f"limit must be an integer from 1 to 100, not {raw[:20]!r}", param="limit")
    return int(raw)


def page(items: tuple[Mapping[str, Any], ...], query: Mapping[str, str]) -> dict[str, Any]:
    """One page of input items, as the Responses API lists them: `order` (desc by default),
    `limit` (20), and `after` (the id of the item the page follows)."""
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise BadRequest(f"order must be 'asc' or 'desc', not {order[:20]!r}", param="order")
    limit = _limit(query)
    ordered = list(items) if order == "asc" else list(reversed(items))
    if (after := query.get("after")) is not None:
        ids = [item.get("id") for item in ordered]
        if after not in ids:
            raise BadRequest(f"no input item with id '{after[:100]}' in this response", param="after")
        ordered = ordered[ids.index(after) + 1:]
    data = ordered[:limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(ordered) > limit}
