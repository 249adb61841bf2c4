"""What a wire API's adapter gives the routes, beside what it gives the engine (engine.plan.Wire):
its routes, reading a request, planning it, keeping what it keeps of its answers, and showing the
run's end as one JSON answer, as a stream, or as an error, each in the API's own shape; its tools
as it declares them. Chat Completions, Responses and Messages are three peers (gateway.apis.chat,
.responses, .messages); a fourth API is one more adapter and one line in gateway.apis.registry."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from gateway.caller import Caller
from gateway.engine import Event, Finished, Plan, ToolsRan, ToolsStarted, Visible
from gateway.engine.plan import NO_OPTIONS, Offering, Wire
from gateway.errors import GatewayError
from gateway.guardrails.client import ResultPlace
from gateway.state import StateStore
from gateway.tools import Tool, ToolRegistry

Frame = tuple[str | None, Mapping[str, Any]]  # (SSE event name, JSON payload)


class StreamRenderer(Protocol):
    """How one API shows engine events in a stream."""

    def visible(self, event: Visible) -> Iterable[Frame]: ...

    def started(self, event: ToolsStarted) -> Iterable[Frame]:
        """What to show of the gateway's calls as they start (most APIs keep them from the client)."""

    def ran(self, event: ToolsRan) -> Iterable[Frame]:
        """What to show of the gateway's calls once they ran."""

    def waiting(self) -> Iterable[Frame]:
        """What to send before the stream waits for the gateway's tools."""

    def finished(self, event: Finished) -> Iterable[Frame]: ...

    def error(self, error: GatewayError) -> Frame: ...

    @property
    def closing(self) -> bytes:
        """What ends the stream after the last event (Chat's `data: [DONE]`)."""


@dataclass
class RoundIndexes:
    """The indexes a stream shows its client, counted across rounds: each (round, the provider's
    index) gets the next one, the first time it is seen."""

    given: dict[tuple[int, Any], int] = field(default_factory=dict)

    def __call__(self, round_: int, index: Any) -> int:
        return self.given.setdefault((round_, index), len(self.given))


@dataclass(frozen=True)
class Asked:
    """What the route needs of a checked request before planning it."""

    metadata: object = None  # the request's metadata, which may name the trajectory
    call_ids: list[str] = field(default_factory=list)  # calls it answers or repeats, the latest first
    previous_response_id: str | None = None
    # (call id, content, is_error) of the latest results of the client's calls (those of its last
    # turn, the latest first); is_error None: the API has no flag
    results: list[tuple[str, Any, bool | None]] = field(default_factory=list)
    trajectory_id: str | None = None  # the trajectory the metadata names, an id the gateway accepts


class Keeping(NamedTuple):
    """What an API's bookkeeping around one request's run may use (made for every request: a
    named tuple, cheaper to make than a frozen dataclass)."""

    plan: Plan
    body: Mapping[str, Any]  # the request as the loop read it
    state: StateStore
    principal: str | None
    max_bytes: int  # the largest record kept of an answer (answer_record_max_bytes)


class WireApi(Wire, Protocol):
    """One wire API, as the routes use it."""

    @property
    def title(self) -> str:
        """The API as an operator reads it, with its path."""

    @property
    def paths(self) -> tuple[str, ...]:
        """The routes its requests come on (its /v1 path first, then the Azure-style ones)."""

    def tool_spec(self, tool: Tool) -> dict[str, Any]:
        """A gateway tool as the API declares a tool."""

    async def opened(self, body: dict[str, Any], state: StateStore, principal: str | None) -> dict[str, Any]:
        """The body as the loop reads it (a Messages thread: the conversation it continues, put back)."""

    def kept(self, events: AsyncGenerator[Event, None], keeping: Keeping) -> AsyncGenerator[Event, None]:
        """The run's events, what the API keeps of the answer kept before its client sees the end
        (Responses: an answer under the gateway's id; Messages: a thread)."""

    def checked(self, body: dict[str, Any], params: Mapping[str, str]) -> Asked:
        """`body` checked (a 400 saying what is wrong); `params`: the path's (an Azure deployment)."""

    def result_places(self, body: Mapping[str, Any]) -> list[ResultPlace]:
        """Where each result of the client's calls sits in a checked `body`, every one (the client
        resends them all), in the conversation's order: for the guardrails to read and mask them."""

    async def plan(self, body: dict[str, Any], caller: Caller, registry: ToolRegistry, held: StateStore,
                   query: str = "", path: str = "", offer: Offering = NO_OPTIONS) -> Plan:
        """The checked request as a plan."""

    def as_json(self, plan: Plan, finished: Finished) -> Mapping[str, Any]:
        """The answer the client gets when it did not stream."""

    def renderer(self, plan: Plan) -> StreamRenderer:
        """The renderer of one streamed answer."""

    def error_body(self, error: GatewayError) -> Mapping[str, Any]:
        """An error in the API's shape."""

    def handed(self, call: Mapping[str, Any]) -> tuple[str, str] | None:
        """(call id, tool name) of a client call as the client gets it."""
