"""The Chat Completions API (POST /v1/chat/completions) as one adapter: its request (request.py),
its answers (answer.py), its conversation (history.py) and what the client gets (render.py)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from gateway.apis.base import Asked, StreamRenderer
from gateway.apis.chat.answer import ChatStreamReader, read_chat
from gateway.apis.chat.render import ChatChunks, completion
from gateway.apis.chat.request import ChatRequest, call_ids, plan_chat, results
from gateway.apis.fields import validate
from gateway.caller import Caller
from gateway.engine import Finished, Plan
from gateway.engine.decide import relaxed_tool_choice
from gateway.engine.plan import NO_OPTIONS, Offering
from gateway.engine.turn import Api, ModelTurn, StreamReader
from gateway.errors import GatewayError
from gateway.state import StateStore
from gateway.tools import ToolRegistry


class ChatApi:
    """Chat Completions: messages in, a chat completion (or its chunks) out."""

    name: Api = "chat"
    continues_by_id = False  # a chat completion's id names nothing a later request can continue

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
        return Asked(chat.metadata, call_ids(chat.messages), None, results(chat.messages))

    async def plan(self, body: dict[str, Any], caller: Caller, registry: ToolRegistry, held: StateStore,
                   query: str = "", path: str = "", offer: Offering = NO_OPTIONS) -> Plan:
        return await plan_chat(self, body, caller, registry, held, query, path, offer)

    def as_json(self, plan: Plan, finished: Finished) -> Mapping[str, Any]:
        return completion(finished)

    def renderer(self, plan: Plan) -> StreamRenderer:
        return ChatChunks(plan)

    def error_body(self, error: GatewayError) -> Mapping[str, Any]:
        return error.body()

    def handed(self, call: Mapping[str, Any]) -> tuple[str, str] | None:
        function = call.get("function") if call.get("type", "function") == "function" else call.get("custom")
        call_id, name = call.get("id"), function.get("name") if isinstance(function, Mapping) else None
        return (call_id, name) if isinstance(call_id, str) and isinstance(name, str) else None


CHAT = ChatApi()
