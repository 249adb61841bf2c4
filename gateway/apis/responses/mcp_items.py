"""The Responses API's own items for the calls of MCP servers a request declared (`"type": "mcp"`
tools, run by the gateway for any upstream): `mcp_call` and `mcp_approval_request`, and the streamed
events of these and of `mcp_list_tools`, in the shapes and the order OpenAI's answers use.

Upstream, such a call is a `function_call` of the registered name (`<entry>__<tool>`); the client
sees it as the server's: its label and the tool's own name. Event payloads here are without `type`
and `sequence_number`, which the stream renderer adds (gateway.apis.responses.render).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.apis.responses.answer import CALL_ITEMS
from gateway.engine import Finished, ModelCall, ModelTurn, ToolRun
from gateway.mcp.connection import UNAVAILABLE
from gateway.tools import ToolOutcome

Events = list[tuple[str, dict[str, Any]]]  # (event type, payload)
PROTOCOL_ERROR = -32603  # JSON-RPC's internal error: the server refused the call
UNAVAILABLE_STATUS = 503  # the gateway could not reach the server


@dataclass(frozen=True)
class McpShown:
    """What an answer shows of the declared servers' calls: which registered names are theirs (the
    gateway's own tools stay hidden), which of them may pause for the client's approval, the
    approval request each approved call answers, and the tool lists to show first."""

    by_name: Mapping[str, tuple[str, str]]  # registered name -> (server_label, the tool's name on its server)
    asks: frozenset[str] = frozenset()  # names whose calls may pause for the client's approval
    approvals: Mapping[str, str] = field(default_factory=dict)  # call id -> mcp_approval_request id
    lists: tuple[Mapping[str, Any], ...] = ()  # mcp_list_tools items

    def running(self, call: ModelCall) -> dict[str, Any]:
        """The `mcp_call` item of `call`, before its outcome."""
        label, remote = self.by_name[call.name]
        return {"type": "mcp_call", "id": f"mcp_{call.id}", "server_label": label, "name": remote,
                "arguments": call.arguments, "output": None, "error": None, "status": "in_progress",
                "approval_request_id": self.approvals.get(call.id)}

    def item(self, call: ModelCall, outcome: ToolOutcome) -> dict[str, Any]:
        """The `mcp_call` item of `call`, once it ran."""
        error = call_error(outcome)
        return {**self.running(call), "output": outcome.content_text() if error is None else None,
                "error": error, "status": "completed" if error is None else "failed"}

    def shows_early(self, name: str) -> bool:
        """Whether a call of `name` shows as it starts; a call that may pause for the client's
        approval shows once it ran (a paused one becomes an approval request instead)."""
        return name in self.by_name and name not in self.asks

    def shows(self, call: ModelCall, outcome: ToolOutcome) -> bool:
        """Whether the answer shows `call` as an `mcp_call`: a declared server's, unless it paused
        for the client's approval before it showed, or the client denied it (the model is told; no
        call ran to show)."""
        return call.name in self.by_name and (outcome.status not in ("interrupted", "denied")
                                              or self.shows_early(call.name))


def call_error(outcome: ToolOutcome) -> dict[str, Any] | None:
    """A call's failure as OpenAI's `mcp_call.error` (None: it succeeded). The server's refusal is
    a protocol error, a server out of reach an HTTP error, anything else (an `isError` result, a
    rejection, a timeout, a denial) the text the model was given."""
    if outcome.status == "ok":
        return None
    text = outcome.content_text()
    if outcome.error_type == "mcp_error":
        return {"type": "mcp_protocol_error", "code": PROTOCOL_ERROR, "message": text}
    if outcome.error_type == UNAVAILABLE:
        return {"type": "http_error", "code": UNAVAILABLE_STATUS, "message": text}
    content = outcome.content if isinstance(outcome.content, list) else [{"type": "text", "text": text}]
    return {"type": "mcp_tool_execution_error", "content": content}


def approval_item(approval_id: str, label: str, remote: str, arguments: str) -> dict[str, Any]:
    """An `mcp_approval_request`: the client approves or denies the call in its next request."""
    return {"type": "mcp_approval_request", "id": approval_id, "server_label": label, "name": remote,
            "arguments": arguments}


def _item_event(kind: str, item: Mapping[str, Any], index: int) -> tuple[str, dict[str, Any]]:
    return kind, {"item_id": str(item.get("id", "")), "output_index": index}


def call_started(item: Mapping[str, Any], index: int) -> Events:
    """A call's first events: added (empty arguments, no outcome), in progress, then its arguments
    whole, in one delta."""
    arguments = str(item.get("arguments", ""))
    added = {**item, "arguments": "", "output": None, "error": None, "status": "in_progress"}
    ids = {"item_id": str(item.get("id", "")), "output_index": index}
    return [("response.output_item.added", {"item": added, "output_index": index}),
            ("response.mcp_call.in_progress", ids),
            ("response.mcp_call_arguments.delta", {**ids, "delta": arguments}),
            ("response.mcp_call_arguments.done", {**ids, "arguments": arguments})]


def call_ended(item: Mapping[str, Any], index: int) -> Events:
    """A call's last events: completed or failed, then the whole item."""
    ended = "response.mcp_call.failed" if item.get("status") == "failed" else "response.mcp_call.completed"
    return [_item_event(ended, item, index), ("response.output_item.done", {"item": item, "output_index": index})]


def list_events(item: Mapping[str, Any], index: int) -> Events:
    """An `mcp_list_tools` item's events: added (no tools yet), in progress, completed (failed, when
    the item carries an error), then the whole item."""
    ended = "response.mcp_list_tools.failed" if item.get("error") else "response.mcp_list_tools.completed"
    return [("response.output_item.added", {"item": {**item, "tools": []}, "output_index": index}),
            _item_event("response.mcp_list_tools.in_progress", item, index),
            _item_event(ended, item, index),
            ("response.output_item.done", {"item": item, "output_index": index})]


def approval_events(item: Mapping[str, Any], index: int) -> Events:
    """An `mcp_approval_request` has no events of its own: added, then done, both whole."""
    return [("response.output_item.added", {"item": item, "output_index": index}),
            ("response.output_item.done", {"item": item, "output_index": index})]


def position(turn: ModelTurn, call: ModelCall) -> Any:
    """Where `call`'s item sits in its turn's output (the provider's output index when streamed);
    its id when it is not found there, which still numbers it once."""
    for i, item in enumerate(turn.output):
        if item.get("type") == "function_call" and item.get("call_id") == call.id:
            return i
    return call.id


def shown_output(finished: Finished, mcp: McpShown) -> list[Mapping[str, Any]]:
    """Every round's output the client sees: the tool lists first, then each round's items with the
    declared servers' calls as `mcp_call` items (those paused for approval left out: they come as
    approval requests) and every other call left out, as ever."""
    runs = {(run.round, run.call.id): run for run in finished.tool_runs if mcp.shows(run.call, run.outcome)}
    output: list[Mapping[str, Any]] = list(mcp.lists)
    for round_, turn in enumerate(finished.turns):
        output += _round_output(round_, turn.output, runs, mcp)
    return output


def _round_output(round_: int, items: Sequence[Mapping[str, Any]], runs: Mapping[tuple[int, str], ToolRun],
                  mcp: McpShown) -> list[Mapping[str, Any]]:
    shown: list[Mapping[str, Any]] = []
    for item in items:
        if item.get("type") not in CALL_ITEMS:
            shown.append(item)
        elif (run := runs.get((round_, str(item.get("call_id"))))) is not None:
            shown.append(mcp.item(run.call, run.outcome))
    return shown
