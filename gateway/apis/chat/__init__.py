"""The Chat Completions API (POST /v1/chat/completions) as one adapter: its request (request.py),
its answers (answer.py), its conversation (history.py) and what the client gets (render.py)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Collection, Mapping
from typing import Any

from gateway.apis.base import Asked, Keeping, StreamRenderer
from gateway.apis.chat.answer import ChatStreamReader, read_chat
from gateway.apis.chat.genai import ChatMessages
from gateway.apis.chat.render import ChatChunks, completion
from gateway.apis.chat.request import ChatRequest, call_ids, plan_chat, result_places, results, tool_spec
from gateway.apis.fields import validate
from gateway.apis.tool_choice import relaxed_tool_choice
from gateway.caller import Caller
from gateway.engine import Event, Finished, Plan
from gateway.engine.plan import NO_OPTIONS, Offering
from gateway.engine.turn import Api, ModelTurn, StreamReader
from gateway.errors import openai_body
from gateway.guardrails.client import ResultPlace
from gateway.state import StateStore
from gateway.tools import Tool, ToolRegistry
from gateway.wire.headers import named_trajectory


class ChatApi:
    """Chat Completions: messages in, a chat completion (or its chunks) out."""

    name: Api = "chat"
    title = "Chat Completions (/v1/chat/completions)"
    # Its own path, and the same as Azure OpenAI clients (openai.AzureOpenAI) address it.
    paths = ("/v1/chat/completions", "/openai/deployments/{deployment}/chat/completions", "/openai/v1/chat/completions")
    provider_path = "chat/completions"
    continues_by_id = False  # a chat completion's id names nothing a later request can continue
    genai = ChatMessages()

    def tool_spec(self, tool: Tool) -> dict[str, Any]:
        return tool_spec(tool)

    async def opened(self, body: dict[str, Any], state: StateStore, principal: str | None) -> dict[str, Any]:
        return body

    def kept(self, events: AsyncGenerator[Event, None], keeping: Keeping) -> AsyncGenerator[Event, None]:
        return events  # nothing a later request names

    def read(self, body: Any, headers: Mapping[str, str] | None = None) -> ModelTurn:
        return read_chat(body, headers)

    def stream_reader(self) -> StreamReader:
        return ChatStreamReader()

    def opens(self, piece: Mapping[str, Any]) -> bool:
        return False  # every chunk shows something of the answer

    def opened_id(self, piece: Mapping[str, Any]) -> str | None:
        return None

    def relaxed_tool_choice(self, choice: Any, ran: Collection[str]) -> Any:
        return relaxed_tool_choice(choice, ran)

    def checked(self, body: dict[str, Any], params: Mapping[str, str]) -> Asked:
        if deployment := params.get("deployment"):
            body["model"] = deployment  # an Azure-style path names the model
        chat = validate(ChatRequest, body, "a chat completion request")
        return Asked(chat.metadata, call_ids(chat.messages), None, results(chat.messages),
                     named_trajectory(chat.metadata) if chat.metadata else None)

    def result_places(self, body: Mapping[str, Any]) -> list[ResultPlace]:
        return result_places(body.get("messages"))

    async def plan(self, body: dict[str, Any], caller: Caller, registry: ToolRegistry, held: StateStore,
                   query: str = "", path: str = "", offer: Offering = NO_OPTIONS) -> Plan:
        return await plan_chat(self, body, caller, registry, held, query, path, offer)

    def as_json(self, plan: Plan, finished: Finished) -> Mapping[str, Any]:
        return completion(finished)

    def renderer(self, plan: Plan) -> StreamRenderer:
        return ChatChunks(plan)

    error_body = staticmethod(openai_body)  # the very function, by which error_response knows OpenAI's statuses

    def handed(self, call: Mapping[str, Any]) -> tuple[str, str] | None:
        function = call.get("function") if call.get("type", "function") == "function" else call.get("custom")
        call_id, name = call.get("id"), function.get("name") if isinstance(function, Mapping) else None
        return (call_id, name) if isinstance(call_id, str) and isinstance(name, str) else None


CHAT = ChatApi()
