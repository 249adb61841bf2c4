"""What the executor tells whoever watches it (telemetry), without knowing who that is."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from gateway.tools.results import ToolContext, ToolOutcome

if TYPE_CHECKING:
    from gateway.guardrails.verdicts import GuardrailRecord
    from gateway.tools.approvals import ApprovalDecision, ClientDecision
    from gateway.tools.function import Tool

Step = Literal["parse", "execute"]
# Whose tool a call is: the gateway runs its own; a client tool's calls go to the client, and the
# gateway only checks them (gateway.client_tools.check).
Side = Literal["gateway", "client"]


@dataclass(frozen=True)
class ToolCall:
    """One call as the model sent it: `arguments` is the raw JSON text."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Turn:
    """Who is calling, and where in the trajectory this assistant turn sits."""

    trajectory_id: str | None = None
    request_id: str | None = None
    principal: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    round: int = 1
    # The tools offered only on request (gateway.mcp.declared) that this request declared: any other of
    # them is, to this turn, no tool at all.
    declared: frozenset[str] = frozenset()
    # Of those, the tools whose calls wait for the client's own approval (a Responses mcp tool's
    # require_approval), and the client's decisions so far, by the model's call id.
    asks_client: frozenset[str] = frozenset()
    decided: Mapping[str, ClientDecision] = field(default_factory=dict)

    def context(self, tool_call_id: str) -> ToolContext:
        """What a tool (and its parser) is told about one call of this turn."""
        return ToolContext(tool_call_id=tool_call_id, trajectory_id=self.trajectory_id, request_id=self.request_id,
                           principal=self.principal, metadata=self.metadata)


@dataclass(frozen=True)
class ClientResult:
    """The result of a call of the client's own tool, as a later request brought it: the client's
    execute step, seen from the gateway (gateway.client_tools.results)."""

    call_id: str  # the model's, as the check of the call named it
    tool: str
    # when the answer that handed the call to the client was given (epoch seconds); None: not known
    # (the gateway did not hand it over, or forgot), and the result is reported for its guardrails only
    sent_at: float | None
    size: int  # bytes of the result as the request carried it
    error: bool  # the client said the call failed (where the configured rule says so)
    guardrails: tuple[GuardrailRecord, ...] = ()  # what the guardrails decided on the result (gateway.guardrails)
    hidden: tuple[str, ...] = ()  # values they found that nothing recorded of the call may show


class ToolCallTrace(Protocol):
    """The trace of one tool call, open while it runs."""

    def step(self, name: Step) -> AbstractContextManager[None]:
        """The scope of the parse or the execute step."""

    def finish(self, outcome: ToolOutcome) -> None:
        """How the call ended; recorded when its scope ends."""

    def asked(self, approval_id: str) -> None:
        """The call waits for a reviewer's approval (gateway.tools.approvals)."""

    def decided(self, decision: ApprovalDecision) -> None:
        """The wait for approval ended: the decision (or why there was none), who made it, how long it took."""

    def guarded(self, records: Sequence[GuardrailRecord], hidden: Sequence[str]) -> None:
        """Guardrails decided on the call (gateway.guardrails), at one moment; `hidden`: values they
        found that nothing recorded of the call may show."""


class ToolHooks(Protocol):
    """What the executor tells its observer about each tool call."""

    def tool_call(self, call: ToolCall, tool: Tool | None, turn: Turn,
                  side: Side = "gateway") -> AbstractAsyncContextManager[ToolCallTrace]:
        """The scope of one call from lookup to outcome; `tool` is None for an unknown name (and for
        every call of a client tool, `side="client"`, whose scope is its parse step only).
        Asynchronous: entering and leaving it may read and write the retry state (gateway.state)."""

    def client_result(self, result: ClientResult, turn: Turn) -> None:
        """A request brought the result of a client call an earlier answer handed back."""

    def mcp_server_state(self, server: str, up: bool, disconnected: bool) -> None:
        """An MCP server whose tools are in the registry came up, or is not up (`disconnected`:
        it was up, and the connection was lost)."""

    def inject_context(self, carrier: dict[str, str]) -> None:
        """Write the current trace context into `carrier`: a tool body that calls another program
        (an MCP server's tool) hands it on, so that program's spans join the trace."""


class _NoTrace:
    def step(self, name: Step) -> AbstractContextManager[None]:
        return nullcontext()

    def finish(self, outcome: ToolOutcome) -> None:
        return None

    def asked(self, approval_id: str) -> None:
        return None

    def decided(self, decision: ApprovalDecision) -> None:
        return None

    def guarded(self, records: Sequence[GuardrailRecord], hidden: Sequence[str]) -> None:
        return None


class NoHooks:
    """Telemetry off."""

    @asynccontextmanager
    async def tool_call(self, call: ToolCall, tool: Tool | None, turn: Turn,
                        side: Side = "gateway") -> AsyncIterator[ToolCallTrace]:
        yield _NoTrace()

    def client_result(self, result: ClientResult, turn: Turn) -> None:
        return None

    def mcp_server_state(self, server: str, up: bool, disconnected: bool) -> None:
        return None

    def inject_context(self, carrier: dict[str, str]) -> None:
        return None
