"""What Messages requests and answers share: the assistant's content blocks (text, thinking, tool
calls), read into neutral parts and written from them, tool-call arguments as JSON text, and the
call ids Anthropic accepts.

Anthropic takes a `tool_use` id only when it matches `^[a-zA-Z0-9_-]+$`; other APIs' ids may hold
any character (`functions.get_weather:0`). Such an id travels as ENCODED followed by the base64url
form of its UTF-8 bytes, without padding (base64url's alphabet is Anthropic's), and is decoded
where it comes back. An id that already starts with ENCODED is encoded too, so that decoding is
never ambiguous: the mapping is a bijection between neutral ids and ids of Anthropic's shape."""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from typing import Any

from gateway.errors import BadRequest
from gateway.translate.neutral import Image, Text, Thinking, ToolCall

ANTHROPIC_CALL_ID = re.compile(r"[a-zA-Z0-9_-]+")
ENCODED = "ts64_"  # a prefix Anthropic's own ids (toolu_, srvtoolu_) never have


class Malformed(Exception):
    """A block of the wrong shape; the reader says whose fault it is (`field`: the key, if one)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def anthropic_call_id(call_id: str) -> str:
    """A neutral call id as a `tool_use` id Anthropic accepts."""
    if ANTHROPIC_CALL_ID.fullmatch(call_id) and not call_id.startswith(ENCODED):
        return call_id
    return ENCODED + base64.urlsafe_b64encode(call_id.encode()).decode().rstrip("=")


def neutral_call_id(block_id: str) -> str:
    """A `tool_use` id as the neutral id it was written from (itself, unless anthropic_call_id
    encoded it)."""
    if not block_id.startswith(ENCODED):
        return block_id
    encoded = block_id[len(ENCODED):]
    try:
        decoded = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    except (binascii.Error, ValueError):  # not base64, or not UTF-8: an id of its own
        return block_id
    return decoded if anthropic_call_id(decoded) == block_id else block_id


def arguments_text(value: Mapping[str, Any]) -> str:
    """A tool's input as compact JSON text, its keys in their order."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def arguments_object(text: str) -> dict[str, Any] | None:
    """JSON arguments as the object a `tool_use` input is; no arguments at all are `{}`; None when
    the text is not a JSON object."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _text(block: Mapping[str, Any], key: str) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise Malformed(f"a {block.get('type')} block needs `{key}` as a string", key)
    return value


def assistant_part(block: Mapping[str, Any]) -> Text | Thinking | ToolCall | None:
    """A text, thinking, redacted thinking or tool_use block as its neutral part; None for a block
    of any other type."""
    kind = block.get("type")
    if kind == "text":
        return Text(_text(block, "text"))
    if kind == "thinking":
        signature = block.get("signature")
        return Thinking(_text(block, "thinking"), signature if isinstance(signature, str) and signature else None)
    if kind == "redacted_thinking":
        return Thinking(_text(block, "data"), redacted=True)
    if kind == "tool_use":
        arguments = block.get("input", {})
        if isinstance(arguments, str):  # a few compatible servers send the JSON text itself
            text = arguments
        elif isinstance(arguments, Mapping):
            text = arguments_text(arguments)
        else:
            raise Malformed("a tool_use block needs `input` as an object", "input")
        return ToolCall(neutral_call_id(_text(block, "id")), _text(block, "name"), text)
    return None


def thinking_block(part: Thinking) -> dict[str, Any]:
    """Thinking as a block: redacted thinking keeps its data, other thinking its signature (empty
    when the model's provider gave none)."""
    if part.redacted:
        return {"type": "redacted_thinking", "data": part.text}
    return {"type": "thinking", "thinking": part.text, "signature": part.signature or ""}


def tool_use_block(call: ToolCall) -> tuple[dict[str, Any], bool]:
    """A call as a `tool_use` block, and whether its arguments could be said: arguments that are
    not a JSON object (the model's own malformed output) become `{}`."""
    arguments = arguments_object(call.arguments)
    return ({"type": "tool_use", "id": anthropic_call_id(call.call_id), "name": call.name,
             "input": {} if arguments is None else arguments}, arguments is not None)


def read_image(block: Mapping[str, Any]) -> Image:
    """An image block: base64 data of a media type, or a URL (a file of Anthropic's Files API
    exists only there)."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, Mapping) else None
    if kind == "base64" and isinstance(data := source.get("data"), str) and isinstance(  # type: ignore[union-attr]
            media_type := source.get("media_type"), str):  # type: ignore[union-attr]
        return Image(data=data, media_type=media_type)
    if kind == "url" and isinstance(url := source.get("url"), str):  # type: ignore[union-attr]
        return Image(url=url)
    raise Malformed(f"an image source of type `{kind}` cannot be said to an upstream of another API (base64 "
                    "data and URLs can)", "source")


def image_block(image: Image) -> dict[str, Any]:
    """An image as a block: base64 data (a `data:` URL's too), or a URL for Anthropic to fetch."""
    if image.data is not None and image.media_type:
        return {"type": "image", "source": {"type": "base64", "media_type": image.media_type, "data": image.data}}
    url = image.url or ""
    if not url.startswith("data:"):
        if not url:
            raise BadRequest("image: an image needs a URL, or base64 data and its media type", param="image")
        return {"type": "image", "source": {"type": "url", "url": url}}
    header, _, data = url.partition(",")
    media_type, *parameters = header[len("data:"):].split(";")
    if not media_type or parameters[-1:] != ["base64"]:
        raise BadRequest("image: Anthropic takes a data: URL only as base64 data of a media type "
                         "(data:image/png;base64,...)", param="image")
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
