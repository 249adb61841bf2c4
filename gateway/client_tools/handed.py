"""The parse step of the client's calls that a model turn hands back, each in its `tool.call` span
(side "client"), the calls themselves unchanged: in reject mode, which of them the gateway answers
itself (gateway.client_tools.check does the checking). The guardrails' before_execute moment
follows the check, in the same span, for each call the check did not reject."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gateway.caller import Caller
from gateway.client_tools.check import MAX_INLINE_ARGUMENTS, ClientCheck, ClientTools, SchemaCache
from gateway.guardrails import GuardedCall, Guardrails
from gateway.guardrails.chain import Before, Guard
from gateway.settings.parts import ClientCheckMode
from gateway.tools import ToolCall, ToolCallTrace, ToolHooks, ToolOutcome, Turn
from gateway.tools.arguments import read_arguments
from gateway.tools.results import Rejection, rejected
from gateway.tools.threads import ToolsBusy, ToolThreads

# Each check on it ends within its budget (gateway.tools.schema_bounds.OFF_LOOP); one, so that the
# event loop competes with a single thread for the interpreter's lock.
SCHEMA_THREADS = 1


class HandedChecks:
    """The checks of handed-back calls for every request: the schemas compiled once each, the
    thread for checks past the event loop's budget (it starts when needed), the gateway's
    client_tool_check mode, which a caller's key may override, and the guardrails (None: none is
    configured, and a call spends nothing on them)."""

    def __init__(self, hooks: ToolHooks, mode: ClientCheckMode = "observe",
                 guardrails: Guardrails | None = None) -> None:
        self.hooks = hooks
        self.mode = mode
        self.guardrails = guardrails
        self.schemas = SchemaCache()
        self.threads = ToolThreads(SCHEMA_THREADS)

    async def refused(self, declared: Sequence[object], caller: Caller, calls: Sequence[ToolCall], round_: int,
                      final: bool) -> list[ToolOutcome | None]:
        """Each call checked against the tools the request `declared`, then by the guardrails'
        before_execute; for each, in order, its rejection when the gateway answers it in the
        client's place (reject mode, and not the last round the limit allows: then the client gets
        its calls as they are), else None."""
        mode = caller.client_check(self.mode)
        if mode == "off":
            return [None] * len(calls)
        tools = ClientTools(declared, self.schemas)
        turn = caller.turn(round_)
        chain = self._chain(caller.principal)
        answers = mode == "reject" and not final
        refused: list[ToolOutcome | None] = []
        for call in calls:
            async with self.hooks.tool_call(call, None, turn, side="client") as trace:
                with trace.step("parse"):
                    checked = await tools.check_bounded(call.name, call.arguments, self.threads)
                outcome = checked.outcome_of(call.id, call.name)
                if outcome.status != "rejected" and chain:
                    outcome = await self._guarded(call, turn, chain, trace, checked, outcome, answers)
                trace.finish(outcome)
            refused.append(outcome if outcome.status == "rejected" and answers else None)
        return refused

    def _chain(self, principal: str | None) -> tuple[Guard, ...]:
        if self.guardrails is None:
            return ()
        return tuple(guard for guard in self.guardrails.for_client(principal) if guard.before is not None)

    async def _guarded(self, call: ToolCall, turn: Turn, chain: Sequence[Guard], trace: ToolCallTrace,
                       check: ClientCheck, checked: ToolOutcome, answers: bool) -> ToolOutcome:
        """The guardrails' word on a client call the check let through: recorded on its span
        always; a deny is the call's rejection when the gateway `answers` (reject mode, not the
        last round), which the model is told as it is told a check's rejection.

        A rewrite or an ask is recorded and not applied: the call is the client's to run, as the
        model made it (the gateway cannot change what the client's tool receives, nor hold the
        client's call for a reviewer); a guardrail that must stop a call denies it."""
        assert self.guardrails is not None
        arguments = check.arguments if check.arguments is not None else await self._arguments(call, checked)
        before: Before = await self.guardrails.before(chain, GuardedCall(
            call.name, call.id, arguments, "client", turn.principal, turn.trajectory_id))
        if before.records:
            trace.guarded(before.records, before.hidden)
        if before.decision == "deny" and answers:
            return rejected(call.id, call.name, Rejection("guardrail_denied", before.message or "denied"))
        return checked

    async def _arguments(self, call: ToolCall, checked: ToolOutcome) -> Mapping[str, Any]:
        """The arguments of a call the check did not read (its tool's schema unchecked), as a
        guardrail sees them: the JSON object decoded (long ones on the check's thread), else {}
        (not an object, too complex for the check to read, or no thread)."""
        if checked.unchecked == "too_complex" or not isinstance(call.arguments, str):
            return {}
        if len(call.arguments) <= MAX_INLINE_ARGUMENTS:
            decoded = read_arguments(call.name, call.arguments)
        else:
            try:
                decoded = await self.threads.run(lambda: read_arguments(call.name, call.arguments))
            except ToolsBusy:
                return {}
        return decoded if isinstance(decoded, dict) else {}

    def close(self) -> None:
        self.threads.close()
