"""A Responses API run's end as the client gets it: one response, or one event stream."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.apis.base import Frame, RoundIndexes
from gateway.apis.responses.answer import CALL_ITEMS, opens_response
from gateway.apis.responses.history import ResponsesConversation
from gateway.apis.responses.mcp_items import (
    McpShown,
    approval_events,
    call_ended,
    call_started,
    list_events,
    position,
    shown_output,
)
from gateway.engine import Finished, Plan, ToolsRan, ToolsStarted, Visible
from gateway.engine.turn import ModelTurn, summed_usage
from gateway.errors import GatewayError
from gateway.state import approval_id

LISTS_ROUND = -2  # the round the declared servers' tool lists are numbered in: before any provider round


def visible_output(turn: ModelTurn) -> list[Mapping[str, Any]]:
    """The output items of a round the client may see: every item but the tool calls."""
    return [item for item in turn.output if item.get("type") not in CALL_ITEMS]




def _is_gateway_tool(plan: Plan, spec: Any) -> bool:
    return isinstance(spec, dict) and spec.get("type") == "function" and spec.get("name") in plan.gateway_names


def mcp_shown(plan: Plan) -> McpShown | None:
    """What the answer shows of the MCP servers the request declared (None: it declared none the
    gateway runs): their lists, their calls, and which approval each approved call answers."""
    conversation = plan.conversation
    offer = conversation.mcp if isinstance(conversation, ResponsesConversation) else None
    if offer is None:
        return None
    approvals = {d.call_id: approval_id(d.token, d.call_id, d.digest) for d in plan.decided.values() if d.approve}
    return McpShown(offer.by_name, offer.approval, approvals, offer.lists)


def as_client_sees(plan: Plan, response: Mapping[str, Any], response_id: str | None) -> dict[str, Any]:
    """A provider response object under the id the client knows, continuing what the client
    continued, with the tool choice and tools the client sent (not the gateway's)."""
    shown = {**response, "previous_response_id": plan.previous_response_id}
    if response_id is not None:
        shown["id"] = response_id
    conversation = plan.conversation
    if isinstance(conversation, ResponsesConversation) and conversation.mcp is not None:
        shown["tools"] = list(plan.client_tools)  # its mcp tools, as it declared them
        shown["tool_choice"] = conversation.client_choice or "auto"
        return shown
    if "tool_choice" in response and plan.conversation.tool_choice is not None:
        shown["tool_choice"] = plan.conversation.tool_choice
    if isinstance(response.get("tools"), list):
        shown["tools"] = [t for t in response["tools"] if not _is_gateway_tool(plan, t)]
    return shown


def final_response(plan: Plan, finished: Finished, mcp: McpShown | None = None) -> dict[str, Any]:
    """One response for every round: the last one's fields under the answer's id, every round's
    visible output (with `mcp`: the declared MCP servers' lists and calls too) followed by the
    client's calls, and the usage of every round."""
    turns = finished.turns
    shown = as_client_sees(plan, turns[-1].body, finished.response_id)
    output = [item for turn in turns for item in visible_output(turn)] if mcp is None else shown_output(finished, mcp)
    shown["output"] = output + list(finished.client_calls)
    if (usage := summed_usage(turns)) is not None:
        shown["usage"] = usage
    return shown


def _call_events(call: Mapping[str, Any], index: int) -> list[tuple[str, dict[str, Any]]]:
    """The events of one client call, whole (it was held back while its round streamed)."""
    if call.get("type") == "mcp_approval_request":
        return approval_events(call, index)
    item_id = str(call.get("id", ""))
    added = {**call, "status": "in_progress"}
    middle: list[tuple[str, dict[str, Any]]] = []
    if call.get("type") == "custom_tool_call":
        added["input"] = ""
        middle = [("response.custom_tool_call_input.delta", {"delta": call.get("input", "")}),
                  ("response.custom_tool_call_input.done", {"input": call.get("input", "")})]
    elif call.get("type") == "function_call":
        added["arguments"] = ""
        middle = [("response.function_call_arguments.delta", {"delta": call.get("arguments", "")}),
                  ("response.function_call_arguments.done", {"arguments": call.get("arguments", "")})]
    return [("response.output_item.added", {"item": added, "output_index": index}),
            *((kind, {**payload, "item_id": item_id, "output_index": index}) for kind, payload in middle),
            ("response.output_item.done", {"item": call, "output_index": index})]


@dataclass
class ResponseEvents:
    """Engine events as one Responses stream: one `response.created`, one `response.completed`,
    one response id, and output indexes and sequence numbers counted across rounds.

    The opening events wait for the first output of the first round, which then names the
    response; if the gateway runs tools first, the answer goes by an id of the gateway's own.

    With `mcp`, the declared MCP servers' tool lists follow the opening events, and their calls
    show as `mcp_call` items as they run, each at its place in its round (a call comes after the
    text of its turn, as models put them)."""

    plan: Plan
    mcp: McpShown | None = None
    sequence: int = 0
    index: RoundIndexes = field(default_factory=RoundIndexes)
    opening: list[dict[str, Any]] | None = field(default_factory=list)  # held back; None once sent
    closing: bytes = b""

    def _frame(self, kind: str, payload: Mapping[str, Any]) -> Frame:
        frame = {**payload, "type": kind, "sequence_number": self.sequence}
        self.sequence += 1
        return kind, frame

    def _opened(self, response_id: str | None) -> list[Frame]:
        """The held-back opening events, under the id the answer goes by."""
        held, self.opening = self.opening or [], None
        frames = [self._frame(str(piece["type"]), {**piece, "response": as_client_sees(self.plan, piece["response"],
                                                                                        response_id)})
                  for piece in held if isinstance(piece.get("response"), dict)]
        if self.mcp is not None:
            frames += [self._frame(kind, payload) for i, listed in enumerate(self.mcp.lists)
                       for kind, payload in list_events(listed, self.index(LISTS_ROUND, i))]
        return frames

    def visible(self, event: Visible) -> Iterable[Frame]:
        piece = dict(event.piece)
        if opens_response(piece):
            if self.opening is not None and event.round == 0:
                self.opening.append(piece)
            return []  # the client's response is opened once, for every round
        frames = self._opened(None if event.round == 0 else self.plan.answer_id) if self.opening is not None else []
        if "output_index" in piece:
            piece["output_index"] = self.index(event.round, piece["output_index"])
        return [*frames, self._frame(str(piece.get("type")), piece)]

    def started(self, event: ToolsStarted) -> Iterable[Frame]:
        mcp = self.mcp
        if mcp is None:
            return []
        early = [call for call in event.calls if mcp.shows_early(call.name)]
        if not early:
            return []
        frames = self._opened(self.plan.answer_id) if self.opening is not None else []
        for call in early:
            index = self.index(event.round, position(event.turn, call))
            frames += [self._frame(kind, payload) for kind, payload in call_started(mcp.running(call), index)]
        return frames

    def ran(self, event: ToolsRan) -> Iterable[Frame]:
        mcp = self.mcp
        if mcp is None:
            return []
        frames: list[Frame] = []
        for call, outcome in zip(event.calls, event.outcomes, strict=True):
            if not mcp.shows(call, outcome):
                continue  # the gateway's own tool, or a call paused for approval (it comes as a request)
            if self.opening is not None:
                frames += self._opened(self.plan.answer_id)
            item, index = mcp.item(call, outcome), self.index(event.round, position(event.turn, call))
            ended = call_ended(item, index)
            shown = ended if mcp.shows_early(call.name) else [*call_started(item, index), *ended]
            frames += [self._frame(kind, payload) for kind, payload in shown]
        return frames

    def waiting(self) -> Iterable[Frame]:
        # Tools are running: the answer will go by the gateway's id, unless output already named it.
        return self._opened(self.plan.answer_id) if self.opening is not None else []

    def finished(self, event: Finished) -> Iterable[Frame]:
        final = final_response(self.plan, event, self.mcp)
        if self.opening == []:  # no provider call opened it (calls handed back again at once): open it here
            self.opening = [{"type": kind, "response": {**event.turns[-1].body, "status": "in_progress", "output": []}}
                            for kind in ("response.created", "response.in_progress")]
        frames = self._opened(event.response_id) if self.opening is not None else []
        frames += [self._frame(kind, payload) for i, call in enumerate(event.client_calls)
                   for kind, payload in _call_events(call, self.index(-1, i))]
        closing = "response.incomplete" if final.get("status") == "incomplete" else "response.completed"
        frames.append(self._frame(closing, {"response": final}))
        return frames

    def error(self, error: GatewayError) -> Frame:
        detail = error.body()["error"]
        return self._frame("error", {"code": detail.get("code"), "message": detail["message"],
                                     "param": detail.get("param")})
