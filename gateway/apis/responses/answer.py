"""Reading a Responses API answer, JSON or followed through its event stream, as one ModelTurn.

The readers check the shape the engine relies on (a malformed answer is the provider's fault: a
502) and leave everything else as the provider sent it. Output events pass on at once, except
those of tool-call items; the end of the answer waits for the engine's decision.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.engine.turn import ModelCall, ModelTurn, count, usage_of
from gateway.errors import UpstreamUnavailable
from gateway.translate.neutral import arguments_text

# Responses output items that are calls for the caller's side to run (the provider runs the others:
# web search, file search, code interpreter, MCP ...). Only a `function_call` can be the gateway's.
CALL_ITEMS = frozenset({"function_call", "custom_tool_call", "computer_call", "local_shell_call", "shell_call",
                        "apply_patch_call"})
OPENING_EVENTS = frozenset({"response.created", "response.in_progress", "response.queued"})


def _response_call(item: Mapping[str, Any]) -> ModelCall | None:
    kind = item.get("type")
    if kind not in CALL_ITEMS:
        return None
    named = kind not in ("function_call", "custom_tool_call") or isinstance(item.get("name"), str)
    if not named or not isinstance(item.get("call_id"), str):
        raise UpstreamUnavailable("the provider sent a response of the wrong shape (a tool call without a name)")
    if kind == "function_call" and not item.get("namespace"):
        return ModelCall(item["call_id"], item["name"], arguments_text(item.get("arguments")), item)
    return ModelCall(item["call_id"], str(item.get("name") or kind), str(item.get("input") or ""), item,
                     kind="client")


def _finish_reason(body: Mapping[str, Any], calls: tuple[ModelCall, ...]) -> str | None:
    """A response's status in Chat's terms, so that telemetry reads alike for both APIs: a
    completed response stopped or called tools; an incomplete one says why."""
    status = body.get("status")
    if status == "completed" or status is None:
        return "tool_calls" if calls else ("stop" if status else None)
    details = body.get("incomplete_details")
    reason = details.get("reason") if isinstance(details, dict) else None
    return str(reason or status)


def _arguments_as_text(item: dict[str, Any]) -> dict[str, Any]:
    """A function call whose arguments came as an object, with them as JSON text: output items go
    back upstream in the next round's input, where the API takes only text."""
    if item.get("type") != "function_call" or isinstance(item.get("arguments"), str):
        return item
    return {**item, "arguments": arguments_text(item.get("arguments"))}


def read_response(body: Any, headers: Mapping[str, str] | None = None) -> ModelTurn:
    """A Responses API response as a turn."""
    output = body.get("output") if isinstance(body, dict) else None
    if not isinstance(output, list) or not all(isinstance(item, dict) for item in output):
        raise UpstreamUnavailable("the provider sent a response of the wrong shape")
    usage = usage_of(body)
    output = [_arguments_as_text(item) for item in output]
    calls = tuple(call for item in output if (call := _response_call(item)) is not None)
    return ModelTurn("responses", body, tuple(output), calls, _finish_reason(body, calls), usage, headers or {},
                     count(usage, "input_tokens"), count(usage, "output_tokens"))


_LIFECYCLE_END = frozenset({"response.completed", "response.incomplete"})


def opens_response(piece: Mapping[str, Any]) -> bool:
    """A Responses event that opens the response (created, in progress ...) rather than shows output."""
    return piece.get("type") in OPENING_EVENTS


class ResponsesStreamReader:
    """Follows a Responses event stream: output events pass on at once, except those of tool-call
    items; the final response (from `response.completed`) becomes the turn."""

    def __init__(self) -> None:
        self._calls: set[Any] = set()  # output indexes of tool-call items
        self._final: Any = None

    def absorb(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """Take one event; returns it when the client may see it now, else None."""
        kind = event.get("type")
        if not isinstance(kind, str):
            return None  # not a Responses event: nothing a client could read
        if kind in _LIFECYCLE_END:
            self._final = event.get("response")
            return None
        if kind == "response.failed":
            response = event.get("response")
            error = response.get("error") if isinstance(response, dict) else None
            reason = error.get("message") if isinstance(error, dict) else None
            raise UpstreamUnavailable(f"the provider's response failed: {reason or 'no reason given'}")
        if kind == "error":
            raise UpstreamUnavailable(f"the provider reported an error mid-stream: {event.get('message', 'unknown')}")
        index = event.get("output_index")
        item = event.get("item")
        if kind == "response.output_item.added" and isinstance(item, dict) and item.get("type") in CALL_ITEMS:
            self._calls.add(index)
        return None if index is not None and index in self._calls else event

    def turn(self, headers: Mapping[str, str] | None = None) -> ModelTurn:
        """The response the stream completed, as one turn; a stream cut short raises."""
        if self._final is None:
            raise UpstreamUnavailable("the provider's stream ended before its response was complete")
        return read_response(self._final, headers)
