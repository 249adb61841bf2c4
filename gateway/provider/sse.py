"""Reading a streamed answer: the reads of its connection into lines, and its SSE `data:`
payloads into decoded JSON events, each bounded in size and nesting."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

import orjson

from gateway.errors import UpstreamUnavailable, stream_error
from gateway.provider.errors import ProviderErrors, too_deep
from gateway.wire.json_depth import nests_deeper

MAX_JSON_DEPTH = 64  # the default of the max_json_depth setting
MAX_EVENT_BYTES = 16 * 1024 * 1024  # one SSE event; a provider may send a whole tool call in one
_TOO_BIG = "the provider's stream holds an event larger than 16 MiB"


async def _lines(reads: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """The stream's lines, however long (aiohttp's own line reader stops at 128 KiB). Each read is
    searched once, and a line is joined once from the reads it spans: the work is linear in the
    bytes read whatever their size (searching all that is pending on every read made a large event
    cost the square of its size in small reads, on the event loop: see bench/sse_reader.py)."""
    parts: list[bytes] = []  # the reads (or their ends) of a line not yet complete
    pending = 0  # their length
    async for data in reads:
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            if parts:
                yield b"".join((*parts, data[start:end]))
                parts, pending = [], 0
            else:
                yield data[start:end]
            start = end + 1
        if start < len(data):
            parts.append(data[start:] if start else data)
            pending += len(data) - start
            if pending > MAX_EVENT_BYTES:
                raise UpstreamUnavailable(_TOO_BIG)
    if parts:
        yield b"".join(parts)


async def sse_events(reads: AsyncIterable[bytes], max_depth: int = MAX_JSON_DEPTH) -> AsyncIterator[dict[str, Any]]:
    """Decoded `data:` payloads of an SSE stream, given as the reads of its connection, up to
    `[DONE]` or the end of the stream (the engine checks that the answer was complete). A stream
    that breaks, holds something other than JSON objects, an event larger than MAX_EVENT_BYTES or
    nested deeper than `max_depth`, or carries an error object raises UpstreamUnavailable."""
    # Data lines are kept as views of the lines read and joined once (orjson reads bytes, and
    # checks their UTF-8): a 15 MiB event is copied once on its way to the decoder, not four times.
    data: list[memoryview] = []
    size = 0  # of the event's data so far: its lines may each be short and together unbounded
    with ProviderErrors("the provider's stream stalled", "the provider's stream broke"):
        async for raw_line in _lines(reads):
            line = memoryview(raw_line)[:-1] if raw_line.endswith(b"\r") else memoryview(raw_line)
            if raw_line.startswith(b"data:"):
                data.append(line[6:] if raw_line.startswith(b"data: ") else line[5:])
                size += len(raw_line)
                if size > MAX_EVENT_BYTES:
                    raise UpstreamUnavailable(_TOO_BIG)
                continue
            if line or not data:
                continue  # comments, other fields (event:), or blank lines between events
            payload, data, size = _joined(data), [], 0
            if payload == b"[DONE]":
                return
            yield _decode_event(payload, max_depth)
    if data and (payload := _joined(data)) != b"[DONE]":
        yield _decode_event(payload, max_depth)  # a last event without its blank line


def _joined(data: list[memoryview]) -> memoryview | bytes:
    return data[0] if len(data) == 1 else b"\n".join(data)


def _decode_event(payload: memoryview | bytes, max_depth: int) -> dict[str, Any]:
    try:
        event = orjson.loads(payload)
    except ValueError as exc:
        raise UpstreamUnavailable("the provider's stream holds an event that is not JSON") from exc
    if not isinstance(event, dict):
        raise UpstreamUnavailable("the provider's stream holds an event that is not a JSON object")
    if nests_deeper(event, max_depth):
        raise UpstreamUnavailable(too_deep("an event of its stream", max_depth))
    if isinstance(event.get("error"), dict):
        raise stream_error(event["error"])
    answer: dict[str, Any] = event
    return answer
