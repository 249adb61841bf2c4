"""What the built-in scripted model answers to one request, whichever API it came in."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Reply:
    """What the scripted model answers to one request."""

    content: str | None = None
    tool_calls: Sequence[tuple[str, Any]] = ()  # (name, arguments: dict, or raw JSON text)
    finish_reason: str | None = None  # default: "tool_calls" when there are calls, else "stop"
    usage: tuple[int, int] = (10, 5)  # prompt, completion tokens
    status: int = 200  # anything else: an OpenAI error body with `error` as its message
    error: str = "scripted failure"
    headers: dict[str, str] = field(default_factory=dict)
    raw: bytes | None = None  # sent as the body instead (broken JSON, say), with any status
    raw_type: str = "application/json"  # the content type of `raw`
    raw_stream: bytes | None = None  # a streamed answer: these bytes, as they are (recorded SSE)
    break_stream_after: int | None = None  # close a stream abruptly after this many events
    hang: bool = False  # never answer (until the client gives up)
    pause_after: int | None = None  # stall a stream after this many events, until the client leaves
    reasoning: str | None = None  # Responses only: a reasoning summary, output before the rest
    # Responses only: output items as they are (mcp_list_tools, mcp_call, mcp_approval_request...),
    # after the reasoning and before the message; streamed as output_item.added then .done
    items: Sequence[dict[str, Any]] = ()

    def finish(self) -> str:
        return self.finish_reason or ("tool_calls" if self.tool_calls else "stop")
