"""The Responses API (POST /v1/responses) as one adapter: its request (request.py), its answers
(answer.py), its conversation (history.py) and what the client gets (render.py). Its other routes
(GET, DELETE, input_items, cancel) are gateway.routes.response_ids'."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Collection, Mapping
from functools import partial
from typing import Any

from gateway.apis.base import Asked, Keeping, StreamRenderer
from gateway.apis.fields import validate
from gateway.apis.responses.answer import ResponsesStreamReader, opens_response, read_response
from gateway.apis.responses.genai import ResponsesMessages
from gateway.apis.responses.records import remembered
from gateway.apis.responses.render import ResponseEvents, final_response, mcp_shown
from gateway.apis.responses.request import ResponsesRequest, call_ids, plan_responses, result_places, results, tool_spec
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


class ResponsesApi:
    """The Responses API: input items in, a response (or its events) out."""

    name: Api = "responses"
    title = "Responses (/v1/responses)"
    # Its own path, and the same as Azure OpenAI clients address it.
    paths = ("/v1/responses", "/openai/responses", "/openai/v1/responses")
    provider_path = "responses"
    continues_by_id = True  # previous_response_id
    genai = ResponsesMessages()

    def tool_spec(self, tool: Tool) -> dict[str, Any]:
        return tool_spec(tool)

    async def opened(self, body: dict[str, Any], state: StateStore, principal: str | None) -> dict[str, Any]:
        return body

    def kept(self, events: AsyncGenerator[Event, None], keeping: Keeping) -> AsyncGenerator[Event, None]:
        """An answer under an id of the gateway's is kept, for GET, input_items and DELETE of that id."""
        shown = partial(final_response, keeping.plan, mcp=mcp_shown(keeping.plan))
        return remembered(events, keeping.state, keeping.principal, shown,
                          keeping.body.get("input"), keeping.body.get("store") is not False, keeping.max_bytes)

    def read(self, body: Any, headers: Mapping[str, str] | None = None) -> ModelTurn:
        return read_response(body, headers)

    def stream_reader(self) -> StreamReader:
        return ResponsesStreamReader()

    def opens(self, piece: Mapping[str, Any]) -> bool:
        return opens_response(piece)

    def opened_id(self, piece: Mapping[str, Any]) -> str | None:
        response = piece.get("response")
        found = response.get("id") if isinstance(response, Mapping) else None
        return found if isinstance(found, str) else None

    def relaxed_tool_choice(self, choice: Any, ran: Collection[str]) -> Any:
        return relaxed_tool_choice(choice, ran)

    def checked(self, body: dict[str, Any], params: Mapping[str, str]) -> Asked:
        checked = validate(ResponsesRequest, body, "a Responses API request")
        return Asked(checked.metadata, call_ids(checked.input), checked.previous_response_id, results(checked.input),
                     named_trajectory(checked.metadata) if checked.metadata else None)

    def result_places(self, body: Mapping[str, Any]) -> list[ResultPlace]:
        return result_places(body.get("input"))

    async def plan(self, body: dict[str, Any], caller: Caller, registry: ToolRegistry, held: StateStore,
                   query: str = "", path: str = "", offer: Offering = NO_OPTIONS) -> Plan:
        return await plan_responses(self, body, caller, registry, held, query, path, offer)

    def as_json(self, plan: Plan, finished: Finished) -> Mapping[str, Any]:
        return final_response(plan, finished, mcp_shown(plan))

    def renderer(self, plan: Plan) -> StreamRenderer:
        return ResponseEvents(plan, mcp_shown(plan))

    error_body = staticmethod(openai_body)  # the very function, by which error_response knows OpenAI's statuses

    def handed(self, call: Mapping[str, Any]) -> tuple[str, str] | None:
        call_id, name = call.get("call_id"), call.get("name")
        return (call_id, name) if isinstance(call_id, str) and isinstance(name, str) else None


RESPONSES = ResponsesApi()
