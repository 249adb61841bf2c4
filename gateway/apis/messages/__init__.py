"""Anthropic's Messages API (POST /v1/messages) as one adapter: its request (request.py), its
answers (answer.py), its conversation (history.py), what the client gets (render.py) and the
threads the gateway holds for it (threads.py). The provider speaks Messages too
(`upstream_kind = "anthropic"`, or any server with that API)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Collection, Mapping
from typing import Any

from gateway.apis.base import Asked, Keeping, StreamRenderer
from gateway.apis.fields import validate
from gateway.apis.messages import threads
from gateway.apis.messages.answer import OPENING, MessagesStreamReader, read_message
from gateway.apis.messages.genai import AnthropicMessages
from gateway.apis.messages.render import MessageEvents, error_body, message
from gateway.apis.messages.request import MessagesRequest, call_ids, plan_messages, result_places, results, tool_spec
from gateway.caller import Caller
from gateway.engine import Event, Finished, Plan
from gateway.engine.plan import NO_OPTIONS, Offering
from gateway.engine.turn import Api, ModelTurn, StreamReader
from gateway.guardrails.client import ResultPlace
from gateway.state import StateStore
from gateway.tools import Tool, ToolRegistry
from gateway.wire.headers import named_trajectory

AUTO = {"type": "auto"}


def relaxed_choice(choice: Any, ran: Collection[str]) -> Any:
    """The tool_choice after the gateway ran `ran`: `any`, or `tool` naming one that ran, becomes
    `auto` (keeping disable_parallel_tool_use); a choice that forces nothing stays."""
    if not isinstance(choice, Mapping):
        return choice
    if choice.get("type") == "any" or (choice.get("type") == "tool" and choice.get("name") in ran):
        return {**{k: v for k, v in choice.items() if k != "name"}, **AUTO}
    return choice


class MessagesApi:
    """Anthropic Messages: messages in, a message (or its events) out."""

    name: Api = "messages"
    title = "Anthropic's Messages (/v1/messages)"
    paths = ("/v1/messages",)  # Anthropic's SDK and Claude Code post here
    provider_path = "messages"
    continues_by_id = False  # a message's id names nothing a later request can continue
    genai = AnthropicMessages()

    def tool_spec(self, tool: Tool) -> dict[str, Any]:
        return tool_spec(tool)

    async def opened(self, body: dict[str, Any], state: StateStore, principal: str | None) -> dict[str, Any]:
        """A continued thread's request with its conversation put back."""
        return await threads.whole(body, state, principal) if "thread" in body else body

    def kept(self, events: AsyncGenerator[Event, None], keeping: Keeping) -> AsyncGenerator[Event, None]:
        """A threaded request's answer is kept with its conversation, for the thread's next turn."""
        if keeping.body.get("thread") is None:
            return events
        return threads.kept(events, keeping.state, keeping.principal, keeping.body, keeping.max_bytes)

    def read(self, body: Any, headers: Mapping[str, str] | None = None) -> ModelTurn:
        return read_message(body, headers)

    def stream_reader(self) -> StreamReader:
        return MessagesStreamReader()

    def opens(self, piece: Mapping[str, Any]) -> bool:
        return piece.get("type") in (OPENING, "ping")  # neither shows anything of the answer

    def opened_id(self, piece: Mapping[str, Any]) -> str | None:
        opened = piece.get("message")
        found = opened.get("id") if isinstance(opened, Mapping) else None
        return found if isinstance(found, str) else None

    def relaxed_tool_choice(self, choice: Any, ran: Collection[str]) -> Any:
        return relaxed_choice(choice, ran)

    def checked(self, body: dict[str, Any], params: Mapping[str, str]) -> Asked:
        checked = validate(MessagesRequest, body, "a Messages API request")
        return Asked(checked.metadata, call_ids(checked.messages), None, results(checked.messages),
                     named_trajectory(checked.metadata) if checked.metadata else None)

    def result_places(self, body: Mapping[str, Any]) -> list[ResultPlace]:
        return result_places(body.get("messages"))

    async def plan(self, body: dict[str, Any], caller: Caller, registry: ToolRegistry, held: StateStore,
                   query: str = "", path: str = "", offer: Offering = NO_OPTIONS) -> Plan:
        return await plan_messages(self, body, caller, registry, held, query, path, offer)

    def as_json(self, plan: Plan, finished: Finished) -> Mapping[str, Any]:
        return message(finished)

    def renderer(self, plan: Plan) -> StreamRenderer:
        return MessageEvents(plan)

    error_body = staticmethod(error_body)

    def handed(self, call: Mapping[str, Any]) -> tuple[str, str] | None:
        call_id, name = call.get("id"), call.get("name")
        return (call_id, name) if isinstance(call_id, str) and isinstance(name, str) else None


MESSAGES = MessagesApi()
