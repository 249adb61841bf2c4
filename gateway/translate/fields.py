"""What the readers of the OpenAI APIs' requests share (gateway.translate.chat_request,
.responses_request): their refusals, the list of what they left out, and the checks of a field."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gateway.errors import BadRequest
from gateway.translate.neutral import Image, Part, Role, ToolResult, Turn

UNSUPPORTED = "unsupported_parameter"  # the code OpenAI gives a parameter a model does not take
DATA_URL = re.compile(r"data:([^;,]+);base64,(.*)", re.DOTALL)


def cannot(param: str, what: str) -> BadRequest:
    """What the upstream's API cannot be asked: a 400 naming the field."""
    return BadRequest(f"{param}: {what} cannot be translated: the upstream's API cannot express it",
                      param=param, code=UNSUPPORTED)


def invalid(param: str, expected: str) -> BadRequest:
    return BadRequest(f"{param} must be {expected}", param=param, code="invalid_type")


class Dropped:
    """The names of what was left out, once each, in the order met (for `dropped`)."""

    def __init__(self) -> None:
        self.names: dict[str, None] = {}

    def add(self, name: str) -> None:
        self.names[name] = None


def optional(body: Mapping[str, Any], key: str, kinds: tuple[type, ...], expected: str) -> Any:
    """The field, None when absent, of one of `kinds` (a boolean is no number here)."""
    value = body.get(key)
    if value is not None and (not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)):
        raise invalid(key, expected)
    return value


def number(body: Mapping[str, Any], key: str) -> float | None:
    value = optional(body, key, (int, float), "a number")
    return float(value) if value is not None else None


def image_of(url: str) -> Image:
    """An image URL: a `data:` URL's base64 and media type, or the URL as it is."""
    if found := DATA_URL.fullmatch(url):
        return Image(data=found[2], media_type=found[1])
    return Image(url=url)


class Turns:
    """Turns gathered as a request's messages are read: parts of one role in a row are one turn
    (Anthropic needs the roles to alternate), and a user's turn opens with its tool results
    (Anthropic's order, which the other sides write too)."""

    def __init__(self) -> None:
        self._turns: list[tuple[Role, list[Part]]] = []

    def turns(self) -> tuple[Turn, ...]:
        return tuple(Turn(role, (*(p for p in parts if isinstance(p, ToolResult)),
                                 *(p for p in parts if not isinstance(p, ToolResult))))
                     for role, parts in self._turns)

    def _append(self, role: Role, parts: list[Part]) -> None:
        if not parts:
            return
        if self._turns and self._turns[-1][0] == role:
            self._turns[-1][1].extend(parts)
        else:
            self._turns.append((role, parts))
