"""The parse step of the client's calls that a model turn hands back, each in its `tool.call` span
(side "client"), the calls themselves unchanged: in reject mode, which of them the gateway answers
itself (gateway.client_tools.check does the checking)."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.caller import Caller
from gateway.client_tools.check import ClientTools, SchemaCache
from gateway.settings.parts import ClientCheckMode
from gateway.tools import ToolCall, ToolHooks, ToolOutcome
from gateway.tools.threads import ToolThreads

# Each check on it ends within its budget (gateway.tools.schema_bounds.OFF_LOOP); one, so that the
# event loop competes with a single thread for the interpreter's lock.
SCHEMA_THREADS = 1


class HandedChecks:
    """The checks of handed-back calls for every request: the schemas compiled once each, the
    thread for checks past the event loop's budget (it starts when needed), and the gateway's
    client_tool_check mode, which a caller's key may override."""

    def __init__(self, hooks: ToolHooks, mode: ClientCheckMode = "observe") -> None:
        self.hooks = hooks
        self.mode = mode
        self.schemas = SchemaCache()
        self.threads = ToolThreads(SCHEMA_THREADS)

    async def refused(self, declared: Sequence[object], caller: Caller, calls: Sequence[ToolCall], round_: int,
                      final: bool) -> list[ToolOutcome | None]:
        """Each call checked against the tools the request `declared`; for each, in order, its
        rejection when the gateway answers it in the client's place (reject mode, and not the last
        round the limit allows: then the client gets its calls as they are), else None."""
        mode = caller.client_check(self.mode)
        if mode == "off":
            return [None] * len(calls)
        tools = ClientTools(declared, self.schemas)
        turn = caller.turn(round_)
        refused: list[ToolOutcome | None] = []
        for call in calls:
            async with self.hooks.tool_call(call, None, turn, side="client") as trace:
                with trace.step("parse"):
                    checked = await tools.check_bounded(call.name, call.arguments, self.threads)
                outcome = checked.outcome_of(call.id, call.name)
                trace.finish(outcome)
            refused.append(outcome if outcome.status == "rejected" and mode == "reject" and not final else None)
        return refused

    def close(self) -> None:
        self.threads.close()
