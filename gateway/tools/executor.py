"""Runs one assistant turn's tool calls: lookup, allowlist, parse, execute, in the model's order."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence
from dataclasses import replace

from gateway.guardrails import GuardedCall, Guardrails
from gateway.guardrails.chain import Guard
from gateway.tools.approvals import ApprovalAsk, ApprovalDecision, ApprovalGate, arguments_digest, decided_outcome
from gateway.tools.function import Tool
from gateway.tools.hooks import NoHooks, ToolCall, ToolCallTrace, ToolHooks, Turn
from gateway.tools.params import suggest
from gateway.tools.registry import ToolRegistry
from gateway.tools.repair import RepairPolicy, repaired
from gateway.tools.results import Parsed, Rejection, Repair, ToolContext, ToolOutcome, masked_content, rejected
from gateway.tools.threads import ToolThreads

_NAME_SHOWN = 80  # a model can send any string as a tool name; quote only this much of it


class ToolExecutor:
    """Concurrent tools of a turn run together, the others one at a time; outcomes come back
    in the order the model sent the calls. Nothing a tool or a model does makes it raise.

    Sync bodies run on the executor's own pool of `threads` threads; when all are taken (by
    bodies that outlived their timeout, say) a sync call's outcome is an error of type
    `tool_busy`, at once. `aclose()` (or leaving `async with`) shuts the pool down.

    With a `gate`, a call that needs a reviewer's approval (its tool's `approval`, or its body's
    Interrupt) waits there for the decision; without one, an Interrupt's outcome is left to the
    caller (the engine hands the call back to the client) and `approval` tools ask it the same way."""

    def __init__(self, registry: ToolRegistry, hooks: ToolHooks | None = None,
                 default_timeout: float | None = 30.0, threads: int = 16, gate: ApprovalGate | None = None,
                 approval_timeout: float = 300.0, guardrails: Guardrails | None = None,
                 repair: RepairPolicy | None = None) -> None:
        self.registry = registry
        self.repair = repair  # None: no repair is configured, and a rejected call spends nothing on it
        self.guardrails = guardrails  # None: no guardrail is configured, and a call spends nothing on them
        self.hooks: ToolHooks = hooks if hooks is not None else NoHooks()
        self.default_timeout = default_timeout
        self.threads = ToolThreads(threads)
        self.gate = gate
        self.approval_timeout = approval_timeout

    async def __aenter__(self) -> ToolExecutor:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Take no more sync calls; bodies still running are not waited for (they cannot be stopped)."""
        self.threads.close()
        if self.guardrails is not None:
            self.guardrails.close()

    async def run_turn(self, calls: Sequence[ToolCall], turn: Turn | None = None,
                       allowed: Collection[str] | None = None) -> list[ToolOutcome]:
        """The outcomes of one assistant turn's calls, in the model's order."""
        turn = turn or Turn()
        outcomes: dict[int, ToolOutcome] = {}
        batch: list[int] = []

        async def flush() -> None:
            if len(batch) == 1:  # the common case needs no task of its own
                outcomes[batch[0]] = await self.run_call(calls[batch[0]], turn, allowed)
            elif batch:
                done = await asyncio.gather(*(self.run_call(calls[i], turn, allowed) for i in batch))
                outcomes.update(zip(batch, done, strict=True))
            batch.clear()

        for index, call in enumerate(calls):
            tool = self.registry.get(call.name)
            if tool is None or tool.concurrent:
                batch.append(index)  # an unknown name runs no body, so it cannot conflict
                continue
            await flush()
            outcomes[index] = await self.run_call(call, turn, allowed)
        await flush()
        return [outcomes[i] for i in range(len(calls))]

    async def run_call(self, call: ToolCall, turn: Turn, allowed: Collection[str] | None = None) -> ToolOutcome:
        """One call: lookup, allowlist, parse, execute, inside its trace."""
        tool = self._found(call.name, turn)
        async with self.hooks.tool_call(call, tool, turn) as trace:
            outcome = await self._handle(call, tool, turn, allowed, trace)
            trace.finish(outcome)
        return outcome

    async def _handle(self, call: ToolCall, tool: Tool | None, turn: Turn,
                      allowed: Collection[str] | None, trace: ToolCallTrace) -> ToolOutcome:
        if tool is None or (allowed is not None and tool.name not in allowed):
            return rejected(call.id, call.name, self._refusal(call.name, tool, turn, allowed))
        context = turn.context(call.id)
        repair: Repair | None = None
        with trace.step("parse"):
            parsed = await tool.parse_arguments(call.arguments, context)
            if isinstance(parsed, Rejection) and self.repair is not None:
                parsed, repair = await self._repaired(call, tool, turn, context, parsed)
        if isinstance(parsed, Rejection):
            refused = rejected(call.id, call.name, parsed)
            return refused if repair is None else replace(refused, repair=repair)
        outcome = await self._guarded_or_run(call, tool, turn, parsed, context, trace)
        return outcome if repair is None else replace(outcome, repair=repair)

    async def _repaired(self, call: ToolCall, tool: Tool, turn: Turn, context: ToolContext,
                        rejection: Rejection) -> tuple[Parsed | Rejection, Repair | None]:
        """Arguments the parse step refused, mended where the fix is sure (gateway.tools.repair): in
        mode apply, their parse; in observe, the rejection, with the fix recorded beside it."""
        assert self.repair is not None
        mode = self.repair.mode(tool, turn.principal)
        found = None if mode == "off" else await repaired(tool, call.arguments, rejection, context, mode == "apply")
        if found is None:
            return rejection, None
        repair, parsed = found
        return (parsed if repair.applied else rejection), repair

    async def _guarded_or_run(self, call: ToolCall, tool: Tool, turn: Turn, parsed: Parsed, context: ToolContext,
                              trace: ToolCallTrace) -> ToolOutcome:
        if self.guardrails is not None and (chain := self.guardrails.for_tool(tool, turn.principal)):
            outcome = await self._guarded(call, tool, turn, parsed, context, trace, chain)
        else:
            outcome = await self._run_parsed(call, tool, turn, parsed, context, trace)
        if parsed.aliases:  # the names the model used, counted whatever the call's outcome
            outcome = replace(outcome, aliases=parsed.aliases)
        # values the parse step could not check: the span says why, whatever the call's outcome
        return outcome if parsed.unchecked is None else replace(outcome, unchecked=parsed.unchecked)

    async def _guarded(self, call: ToolCall, tool: Tool, turn: Turn, parsed: Parsed, context: ToolContext,
                       trace: ToolCallTrace, chain: Sequence[Guard]) -> ToolOutcome:
        """A call that guardrails check: its arguments before it runs, its result after."""
        assert self.guardrails is not None
        server = tool.origin.server if tool.origin is not None else None
        guarded = GuardedCall(tool.name, call.id, parsed.arguments, "gateway", turn.principal, turn.trajectory_id,
                              server)
        before = await self.guardrails.before(chain, guarded)
        if before.records:
            trace.guarded(before.records, before.hidden)
        if before.decision == "deny":
            return rejected(call.id, call.name, Rejection("guardrail_denied", before.message or "denied"))
        if before.arguments is not None:  # rewritten: the new arguments pass the parse step too
            reparsed = await tool.parse_arguments(before.arguments, context)
            if isinstance(reparsed, Rejection):
                return rejected(call.id, call.name, Rejection(
                    "guardrail_denied", f"Tool '{tool.name}' was not run: a guardrail rewrote its arguments into "
                                        f"ones the tool refuses. {reparsed.message}"))
            parsed = reparsed
            guarded = replace(guarded, arguments=parsed.arguments)
        asked = (before.message or "") if before.decision == "ask" else None
        outcome = await self._run_parsed(call, tool, turn, parsed, context, trace, asked)
        if outcome.status not in ("ok", "error"):  # nothing of the tool's reaches the model
            return outcome
        after = await self.guardrails.after(chain, guarded, outcome.content_text())
        if after.records:
            trace.guarded(after.records, after.hidden)
        if after.decision == "block":
            return replace(outcome, status="error", content=after.message or "withheld", processed_content=None,
                           error_type="guardrail_blocked")
        if after.decision == "mask" and after.result is not None:
            return replace(outcome, content=masked_content(outcome.content, after.result), processed_content=None)
        return outcome

    async def _run_parsed(self, call: ToolCall, tool: Tool, turn: Turn, parsed: Parsed, context: ToolContext,
                          trace: ToolCallTrace, asked: str | None = None) -> ToolOutcome:
        """`asked`: a guardrail asked for a reviewer, and this is what the reviewer is told."""
        if tool.name in turn.asks_client and (held := self._client_held(call, tool, turn, parsed)) is not None:
            return held  # not approved by the client (yet): the operator's gate comes only after the client's
        if tool.approval or asked is not None:
            pending = self._asking(call, tool, parsed)
            if self.gate is None:
                return pending  # handed back to the client, which answers in the reviewer's place
            decision = await self.gate.decided(ApprovalAsk(call, "before_run", parsed.arguments, asked or None,
                                                           timeout=tool.approval_timeout,
                                                           digest=arguments_digest(tool.name, parsed.arguments)),
                                               turn, trace)
            if decision.decision != "approve":
                return decided_outcome(pending, decision, self._limit(tool))
        with trace.step("execute"):
            outcome = await tool.execute(parsed, context, self.default_timeout, self.threads)
        if outcome.status != "interrupted" or self.gate is None:
            return outcome
        decision = await self.gate.decided(ApprovalAsk(call, "interrupt", parsed.arguments, outcome.content_text(),
                                                       outcome.interrupt_data, tool.approval_timeout,
                                                       arguments_digest(tool.name, parsed.arguments)), turn, trace)
        return decided_outcome(outcome, decision, self._limit(tool))

    def _limit(self, tool: Tool) -> float:
        return tool.approval_timeout if tool.approval_timeout is not None else self.approval_timeout

    @staticmethod
    def _asking(call: ToolCall, tool: Tool, parsed: Parsed) -> ToolOutcome:
        """A call of an `approval` tool before its decision: paused, as an Interrupt pauses, its
        arguments the reviewer's to see."""
        return ToolOutcome(call.id, tool.name, "interrupted", f"Tool '{tool.name}' needs a reviewer's approval.",
                           arguments=parsed.arguments, interrupt_data={"arguments": parsed.arguments},
                           display_text=tool.display_text)

    def _client_held(self, call: ToolCall, tool: Tool, turn: Turn, parsed: Parsed) -> ToolOutcome | None:
        """The outcome of a call the client is to approve, when it does not run: paused (no decision,
        or an approval of other arguments than these: the client is asked anew about what would
        run), or denied. None: the client approved these very arguments."""
        digest = arguments_digest(tool.name, parsed.arguments)
        decision = turn.decided.get(call.id)
        if decision is None or (decision.approve and not decision.approves(digest)):
            return self._asking_client(call, tool, parsed, digest)
        if not decision.approve:
            return decided_outcome(self._asking_client(call, tool, parsed, digest),
                                   ApprovalDecision("deny", 0.0, reason=decision.reason), self._limit(tool))
        return None

    @staticmethod
    def _asking_client(call: ToolCall, tool: Tool, parsed: Parsed, digest: str) -> ToolOutcome:
        """A call the client is to approve before it runs: paused, and handed back to the client with
        the digest of the arguments its approval must name."""
        return ToolOutcome(call.id, tool.name, "interrupted", f"Tool '{tool.name}' needs the client's approval.",
                           arguments=parsed.arguments, interrupt_data={"client_approval": digest},
                           display_text=tool.display_text)

    def _found(self, name: str, turn: Turn) -> Tool | None:
        """The tool a call names, as this turn knows it: one offered only on request exists only for
        a turn that declared it (so no request learns of another's servers)."""
        if name not in turn.declared and self.registry.on_request(name):
            return None
        return self.registry.get(name)

    def _refusal(self, name: str, tool: Tool | None, turn: Turn, allowed: Collection[str] | None) -> Rejection:
        available = [n for n in self.registry.names() if (allowed is None or n in allowed)
                     and (n in turn.declared or not self.registry.on_request(n))]
        return refusal(name, available, known=tool is not None)


def refusal(name: str, available: Sequence[str], *, known: bool = False) -> Rejection:
    """The rejection of a call of a tool that is not among `available`: `unknown_tool`, or
    `not_allowed` when the tool exists (`known`) but this caller may not use it. (The check of
    client tool calls, gateway.client_tools.check, words an undeclared tool the same way.)"""
    shown = name if len(name) <= _NAME_SHOWN else name[:_NAME_SHOWN] + "..."
    listing = ", ".join(available) if available else "(none)"
    hint = suggest(name, available) if len(name) <= _NAME_SHOWN else None
    maybe = f" Did you mean '{hint}'?" if hint else ""
    if not known:
        return Rejection("unknown_tool", f"There is no tool named '{shown}'.{maybe} Available tools: {listing}.")
    return Rejection("not_allowed", f"Tool '{shown}' is not available to this caller.{maybe} "
                                    f"Available tools: {listing}.")
