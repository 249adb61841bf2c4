"""An Anthropic Messages run's end as the client gets it: one message, or one event stream, and
errors in Anthropic's shape."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.apis.base import Frame, RoundIndexes
from gateway.engine import Finished, Plan, ToolsRan, ToolsStarted, Visible
from gateway.engine.turn import ModelTurn, summed_usage
from gateway.errors import GatewayError

# Anthropic's error types by status (its documented list); any other 4xx is the request's fault,
# any other 5xx the API's.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
               504: "timeout_error", 529: "overloaded_error"}


# What a message_delta says of the message besides its usage: how it ended, and the container a code
# execution tool ran in (the next request names it to reuse it).
DELTA_FIELDS = ("stop_reason", "stop_sequence", "stop_details", "container")


# Error codes Anthropic's API names in `error.details.error_code`, which its SDK acts on.
DETAILED_CODES = frozenset({"thread_not_found"})


def error_body(error: GatewayError) -> dict[str, Any]:
    """An error as Anthropic's API words it: `{"type": "error", "error": {"type", "message"}}`,
    and its `details` where the code is one Anthropic's SDK reads there."""
    detail = error.body().get("error")
    message = detail.get("message") if isinstance(detail, Mapping) else None
    kind = ERROR_TYPES.get(error.status, "invalid_request_error" if error.status < 500 else "api_error")
    said: dict[str, Any] = {"type": kind, "message": str(message or error.message)}
    if error.code in DETAILED_CODES:
        said["details"] = {"error_code": error.code}
    return {"type": "error", "error": said}


def visible_blocks(turn: ModelTurn) -> list[Mapping[str, Any]]:
    """The blocks of a round the client may see: every block but the tool calls."""
    return [block for block in turn.output if block.get("type") != "tool_use"]


def _stop_reason(finished: Finished) -> Any:
    """Why the answer ended, in the API's terms: the client's calls are a tool_use stop; calls the
    round limit dropped leave an end_turn; otherwise the provider's own reason."""
    if finished.client_calls:
        return "tool_use"
    reason = finished.turns[-1].body.get("stop_reason")
    return "end_turn" if reason == "tool_use" else reason


def _usage(turns: tuple[ModelTurn, ...]) -> dict[str, Any] | None:
    """Every round's token counts summed, under the last round's other fields (its service tier)."""
    summed = summed_usage(turns)
    return None if summed is None else {**(turns[-1].usage or {}), **summed}


def message(finished: Finished) -> dict[str, Any]:
    """The message the client gets: the provider's last one as it came, unless the gateway ran
    tools; then with every round's blocks but the gateway's calls, the client's calls, the stop
    reason the loop ended with, and the usage of every round."""
    turns = finished.turns
    last = turns[-1]
    if len(turns) == 1 and tuple(c.item for c in last.calls) == finished.client_calls:
        return dict(last.body)
    content = [block for turn in turns for block in visible_blocks(turn)] + list(finished.client_calls)
    first = turns[0].body  # the message is named as its stream's message_start names it: by its first round
    answer = {**last.body, **{key: first[key] for key in ("id", "model") if key in first}, "content": content,
              "stop_reason": _stop_reason(finished)}
    if (usage := _usage(turns)) is not None:
        answer["usage"] = usage
    return answer


def _call_events(call: Mapping[str, Any], index: int) -> list[Frame]:
    """The events of one client call, whole (it was held back while its round streamed)."""
    arguments = call.get("input")
    partial = orjson.dumps(arguments).decode() if arguments is not None else "{}"
    return [("content_block_start", {"type": "content_block_start", "index": index,
                                     "content_block": {**call, "input": {}}}),
            ("content_block_delta", {"type": "content_block_delta", "index": index,
                                     "delta": {"type": "input_json_delta", "partial_json": partial}}),
            ("content_block_stop", {"type": "content_block_stop", "index": index})]


@dataclass
class MessageEvents:
    """Engine events as one Messages stream: one `message_start` (the first round's, sent as it
    comes), block indexes counted across rounds, one `message_delta` with the stop reason and the
    summed usage, one `message_stop`. While the gateway's tools run, `ping` events keep it open."""

    plan: Plan
    begun: bool = False  # message_start sent
    index: RoundIndexes = field(default_factory=RoundIndexes)
    closing: bytes = b""

    def visible(self, event: Visible) -> Iterable[Frame]:
        piece = dict(event.piece)
        kind = str(piece.get("type"))
        if kind == "message_start":
            if self.begun:
                return []  # one message, however many rounds
            self.begun = True
        elif "index" in piece:
            piece["index"] = self.index(event.round, piece["index"])
        return [(kind, piece)]

    def started(self, event: ToolsStarted) -> Iterable[Frame]:
        return []  # the gateway's calls stay out of the client's message

    def ran(self, event: ToolsRan) -> Iterable[Frame]:
        return []

    def waiting(self) -> Iterable[Frame]:
        return [("ping", {"type": "ping"})] if self.begun else []

    def finished(self, event: Finished) -> Iterable[Frame]:
        frames: list[Frame] = []
        if not self.begun:  # nothing of the answer streamed (a replay that showed nothing yet)
            self.begun = True
            opening = {**event.turns[0].body, "content": [], "stop_reason": None, "stop_sequence": None}
            frames.append(("message_start", {"type": "message_start", "message": opening}))
        for i, call in enumerate(event.client_calls):
            frames += _call_events(call, self.index(-1, i))
        last = event.turns[-1].body
        ended = {k: last[k] for k in DELTA_FIELDS if k in last}  # as the last round's own message_delta said
        delta = {"type": "message_delta", "delta": {**ended, "stop_reason": _stop_reason(event),
                                                      "stop_sequence": last.get("stop_sequence")}}
        if (usage := _usage(event.turns)) is not None:
            delta["usage"] = usage
        return [*frames, ("message_delta", delta), ("message_stop", {"type": "message_stop"})]

    def error(self, error: GatewayError) -> Frame:
        return "error", error_body(error)
