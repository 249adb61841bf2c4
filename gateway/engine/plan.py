"""A request as the engine works on it (Plan), and what every API's planning shares: which tools
are offered, whose tools are whose, and what goes upstream of the client's request. Each API's
adapter (gateway.apis) plans its own requests with these."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.engine.history import Conversation
from gateway.engine.turn import Api, ModelCall, ModelTurn, StreamReader
from gateway.errors import BadRequest
from gateway.instrumentation import MessageView
from gateway.mcp.declared import DeclaredServers
from gateway.tools.approvals import ClientDecision


class Wire(Protocol):
    """What the engine needs of a wire API (gateway.apis has one adapter per API)."""

    @property
    def name(self) -> Api:
        """chat, responses or messages."""

    @property
    def continues_by_id(self) -> bool:
        """A later request can continue from the provider's answer by its id (Responses'
        previous_response_id): such ids belong to the gateway key that made them, and an answer
        over several rounds gets an id of the gateway's own."""

    def read(self, body: Any, headers: Mapping[str, str] | None = None) -> ModelTurn:
        """A provider's JSON answer as a turn (a malformed answer is the provider's fault: a 502)."""

    def stream_reader(self) -> StreamReader:
        """A reader of one streamed answer."""

    def opens(self, piece: Mapping[str, Any]) -> bool:
        """A streamed piece that opens the answer rather than shows any of it."""

    def opened_id(self, piece: Mapping[str, Any]) -> str | None:
        """The id of the answer an opening piece names."""

    def relaxed_tool_choice(self, choice: Any, ran: Collection[str]) -> Any:
        """The tool_choice for the round after the gateway ran the tools `ran`: forcing a call
        again would loop for ever, so a choice that requires a call, or forces one of `ran`, is
        relaxed to the API's auto."""

    @property
    def provider_path(self) -> str:
        """Where the API's requests go under the provider's base URL (chat/completions ...)."""

    @property
    def genai(self) -> MessageView:
        """How its requests and answers read as GenAI messages, for the chat spans."""


@dataclass(frozen=True)
class Plan:
    """A request as the engine works on it."""

    api: Wire
    model: str
    stream: bool
    conversation: Conversation
    client_names: frozenset[str]  # the client's own tools: their calls go back to the client
    gateway_names: frozenset[str]  # the gateway's tools offered to the model
    include_usage: bool = False  # Chat streams: the client asked for a usage chunk
    previous_response_id: str | None = None  # Responses: the id the client continued from, as it sent it
    answer_id: str | None = None  # Responses: the id of the answer, should it take several provider responses
    query: str = ""  # the caller's query string, which goes with every provider call
    path: str = ""  # the path the caller addressed (an Azure surface names the provider's)
    held_turn_lost: bool = False  # it continues a turn (or gateway response) the gateway no longer holds
    client_tools: Sequence[Any] = ()  # the client's own tools as it declared them (gateway.client_tools.check)
    # Tools of MCP servers the request declared (gateway.mcp.declared): offered to it alone; of those,
    # the ones whose calls wait for the client's approval; and the client's decisions on held calls.
    declared: frozenset[str] = frozenset()
    asks_client: frozenset[str] = frozenset()
    decided: Mapping[str, ClientDecision] = field(default_factory=dict)  # by the model's call id
    resumed: tuple[ModelCall, ...] = ()  # the held calls decided on: run before the provider is called


@dataclass(frozen=True)
class Offering:
    """How the gateway offers its tools to a request."""

    on_empty: bool = False  # offer them to a request that sends `tools: []` (offer_tools_on_empty_tools)
    # Gateway tools a client may declare too: the gateway still answers their calls, under the
    # client's declaration (interrupt_mode hand_back: tools that pause for a reviewer, whom the client stands in for).
    shared: frozenset[str] = frozenset()
    # The MCP servers a Responses request may declare (responses_mcp_servers); None: none are listed,
    # and nothing of a request's `mcp` tools is read.
    mcp: DeclaredServers | None = None
    # Whether the provider runs the `mcp` tools of requests for this model (responses_mcp_runner
    # provider, and every upstream of the model OpenAI's): then they pass through untouched.
    provider_runs_mcp: Callable[[str], bool] | None = None
    whole_max_bytes: int = 0  # answer_record_max_bytes: the most of a conversation held for an approval's follow-up


NO_OPTIONS = Offering()


def offers_tools(body: Mapping[str, Any], offer_on_empty: bool) -> bool:
    """Whether the gateway offers its tools: not to a request that sends `tools: []`, which asks
    for an answer without tools on purpose (the Codex CLI's compaction does), unless the
    `offer_tools_on_empty_tools` setting says otherwise. Without `tools`, it does."""
    tools = body.get("tools")
    return offer_on_empty or not (isinstance(tools, list) and not tools)


def check_clash(client_names: frozenset[str], gateway_names: frozenset[str], param: str) -> None:
    """A 400 when the client declares a tool of the same name as one the gateway offers."""
    if client_names and (clash := sorted(client_names & gateway_names)):
        raise BadRequest(f"tool '{clash[0]}' is provided by the gateway; rename or remove your own tool of that "
                         "name", param=param, code="tool_name_conflict")


def without_own_fields(body: Mapping[str, Any], drop: tuple[str, ...]) -> dict[str, Any]:
    """The request without the fields each round sets itself and those only the gateway reads:
    `metadata.trajectory_id` (and `metadata`, when nothing else is left in it)."""
    base = {k: v for k, v in body.items() if k not in drop}
    metadata = base.get("metadata")
    if isinstance(metadata, dict) and "trajectory_id" in metadata:
        rest = {k: v for k, v in metadata.items() if k != "trajectory_id"}
        if rest:
            base["metadata"] = rest
        else:
            del base["metadata"]
    return base


def upstream_base(body: Mapping[str, Any], drop: tuple[str, ...], name_of: Callable[[Any], str | None],
                  offered: list[dict[str, Any]], gateway_names: frozenset[str],
                  shared: frozenset[str] = frozenset()) -> tuple[dict[str, Any], frozenset[str]]:
    """What goes upstream of the request, its tools followed by the gateway's offered ones; and
    the names of the client's own tools (one named like a gateway tool is a 400, but for the
    `shared` ones: those stay the gateway's, offered as the client declared them)."""
    caller_tools = list(body.get("tools") or [])
    declared = frozenset(n for t in caller_tools if (n := name_of(t)))
    check_clash(declared - shared, gateway_names, "tools")
    if standing_in := declared & shared:
        offered = [spec for spec in offered if name_of(spec) not in standing_in]
    base = without_own_fields(body, drop)
    if caller_tools or offered:
        base["tools"] = [*caller_tools, *offered]
    return base, declared - shared
