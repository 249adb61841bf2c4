"""The tool loop, once for every API and both stream modes: an async generator of events.

Each round calls the provider (gateway.engine.rounds), reads its answer as a ModelTurn (passing on,
when streamed, what the client may see at once), asks `decide` what next, and runs the gateway's
calls. The routes render the events: Visible pieces as they come, the gateway's calls as they start
and once they ran, Keepalive while tools run, then Finished. One request's loop is one `_Run`: what
it has done so far lives there, not in long lists of parameters.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from gateway.caller import Caller
from gateway.client_tools.handed import HandedChecks
from gateway.engine.decide import Decision, Finish, HandBack, RunTools, after_tools, decide, enforced, is_final
from gateway.engine.events import Event, Finished, Keepalive, Opened, ToolRun, ToolsRan, ToolsStarted, Visible
from gateway.engine.history import Conversation
from gateway.engine.plan import Plan
from gateway.engine.replays import Replays
from gateway.engine.retries import RetryPolicy
from gateway.engine.rounds import RoundEvent, Rounds
from gateway.engine.turn import ModelCall, ModelTurn
from gateway.guardrails.client import ClientResultMode, ClientResults
from gateway.instrumentation import Instrumentation
from gateway.limits import Limiter, RateLimited
from gateway.provider.upstreams import Upstreams
from gateway.settings.parts import ClientCheckMode
from gateway.state import StateStore
from gateway.tools import ToolCall, ToolExecutor, ToolOutcome


class Engine:
    """Runs plans: the provider calls, the tool executor, the checks of the client's calls, the
    held-turn store and the observer. The executor's guardrails guard the client's tools too: its
    calls, in their check (`client_checks`), and its results, which the routes put through
    `client_results` (None: no guardrail is configured, or `client_result_guardrails` is off)."""

    def __init__(self, upstreams: Upstreams, executor: ToolExecutor, held: StateStore,
                 instrumentation: Instrumentation, max_rounds: int, keepalive_seconds: float,
                 retries: RetryPolicy | None = None, client_check: ClientCheckMode = "observe",
                 limiter: Limiter | None = None, client_results: ClientResultMode = "mask") -> None:
        self.upstreams = upstreams
        self.rounds = Rounds(upstreams, instrumentation, held, retries or RetryPolicy(), keepalive_seconds)
        self.client_checks = HandedChecks(executor.hooks, client_check, executor.guardrails)
        self.client_results = ClientResults.configured(executor.guardrails, client_results)
        self.executor = executor
        self.held = held
        self.instrumentation = instrumentation
        self.max_rounds = max_rounds
        self.keepalive_seconds = keepalive_seconds
        self.limiter = limiter  # the gateway keys' limits, when any is configured

    def run(self, plan: Plan, caller: Caller) -> AsyncGenerator[Event, None]:
        """The rounds of one request, as events."""
        limiter = self.limiter
        rounds = self.max_rounds if limiter is None else limiter.max_rounds(caller.principal, self.max_rounds)
        return _Run(self, plan, caller, plan.conversation, Replays(self.held, caller.principal, plan), rounds).events()


@dataclass(frozen=True)
class _Acted:
    """A turn's calls dealt with: the decision once they were, the gateway's calls among them
    (a call the check refused included), and their outcomes in the model's order."""

    decision: RunTools | HandBack
    mine: Sequence[ModelCall]
    outcomes: list[ToolOutcome]


@dataclass
class _Run:
    """One request's loop: the conversation as it goes upstream next, the turns so far, the names
    of the gateway tools run (or run by the failed request it replays), and whether the client saw
    output of the first provider response as it streamed."""

    engine: Engine
    plan: Plan
    caller: Caller
    conversation: Conversation
    replays: Replays
    max_rounds: int  # the engine's, or the lower limit of the caller's key
    turns: list[ModelTurn] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)
    shown_first: bool = False
    pieces: list[Mapping[str, Any]] = field(default_factory=list)  # what the client saw of this round
    tool_runs: tuple[ToolRun, ...] = ()  # the gateway's answers to the model's calls, for Finished

    async def events(self) -> AsyncGenerator[Event, None]:
        async with aclosing(self._started()) as starting:
            async for step in starting:
                yield step
                if isinstance(step, Finished):
                    return
        while True:
            final = is_final(len(self.turns), self.max_rounds)
            await self._may_call()
            async with aclosing(self._asked(final)) as asked:
                async for event in asked:
                    if self._seen(event):
                        yield event
            await self._spent()
            decision = self._decided(self.turns[-1], len(self.turns) - 1)
            if isinstance(decision, Finish):
                yield await self._answered(decision.finish_reason, final)
                return
            acted = _Acted(decision, (), [])
            async with aclosing(self._acted(decision, final)) as acting:
                async for done in acting:
                    if isinstance(done, _Acted):
                        acted = done
                    else:
                        yield done
            if isinstance(acted.decision, HandBack):
                yield await self._handed_back(acted, final)
                return
            self.replays.done(self.turns[-1], acted.outcomes, self.pieces)
            self.conversation = self.conversation.continued(self.turns[-1], acted.outcomes,
                                                            acted.decision.tool_choice)

    async def _started(self) -> AsyncGenerator[Event, None]:
        """What comes before the first provider call: a replay's earlier rounds shown again, and the
        calls the client decided on run (the model waits for their outcomes)."""
        for again in await self._resumed():
            yield again
        if self.plan.resumed:
            async with aclosing(self._decided_calls()) as deciding:
                async for step in deciding:
                    yield step

    async def _decided_calls(self) -> AsyncGenerator[Event, None]:
        """The held calls the client approved or denied, run (or refused) before the provider is
        called, as a round of their own: a turn made of the held calls. A call paused again (its
        approval named other arguments) goes back to the client at once, with no provider call."""
        calls = self.plan.resumed
        # No provider answered this round: its body stands in for one, should the answer end with it.
        body = {"object": "response", "created_at": int(time.time()), "status": "completed", "model": self.plan.model,
                "output": [call.item for call in calls], "parallel_tool_calls": True, "tool_choice": "auto",
                "tools": []}
        self.turns.append(ModelTurn(self.plan.api.name, body, tuple(call.item for call in calls), calls,
                                    "tool_calls"))
        acted = _Acted(RunTools(calls, self.conversation.tool_choice), (), [])
        async with aclosing(self._acted(acted.decision, False)) as acting:
            async for done in acting:
                if isinstance(done, _Acted):
                    acted = done
                else:
                    yield done
        if isinstance(acted.decision, HandBack):
            yield await self._handed_back(acted, False)
            return
        self.conversation = self.conversation.continued(self.turns[-1], acted.outcomes, self.conversation.tool_choice)

    def _decided(self, turn: ModelTurn, tool_rounds: int) -> Decision:
        return decide(turn, self.plan.client_names, tool_rounds, self.max_rounds,
                      self.conversation.tool_choice, self.plan.api.relaxed_tool_choice)

    async def _may_call(self) -> None:
        """Before a later provider call, with limits: refused (RateLimited) when the key has spent
        a window, the loop ending there with its rounds kept for a retry to resume after. The call's
        tokens are estimated as the last one's input (the conversation only grows)."""
        # The first call's windows were checked as the request was admitted (gateway.routes.quota).
        if (limiter := self.engine.limiter) is not None and self.turns:
            estimate = self.turns[-1].input_tokens or 0
            try:
                await limiter.before_call(self.caller.principal, estimate)
            except RateLimited as limited:
                raise await self._resumable(limited) from None

    async def _resumable(self, refused: RateLimited) -> RateLimited:
        """A limit reached inside the loop: the rounds done kept for the same request, sent again
        once the limit allows, to resume after (no tool runs twice), and the refusal says so."""
        if self.replays.rounds and await self.replays.keep():
            ran = ", ".join(dict.fromkeys(self.ran))
            refused.message += (f"; the gateway had already run its tools for this request ({ran}): sending the same "
                                "request again once the limit allows resumes after them")
        return refused

    async def _spent(self) -> None:
        """After a provider call, with limits: what it used, against the key's windows."""
        if (limiter := self.engine.limiter) is not None:
            turn = self.turns[-1]
            await limiter.after_call(self.caller.principal, self.plan.model, turn.input_tokens or 0,
                                     turn.output_tokens or 0)

    def _asked(self, final: bool) -> AsyncGenerator[RoundEvent, None]:
        """One provider call (gateway.engine.rounds)."""
        body = self.conversation.request(final, self.plan.stream)
        self.pieces = []
        return self.engine.rounds.asked(self.plan, self.caller, body, len(self.turns), self.ran, self.replays)

    def _seen(self, event: RoundEvent) -> TypeGuard[Opened | Visible | Keepalive]:
        """Whether the client sees `event`: its turn joins the run instead, and what the client saw
        of the round is kept for a replay."""
        if isinstance(event, ModelTurn):
            self.turns.append(event)
            return False
        if isinstance(event, Visible):
            self.pieces.append(event.piece)
            self.shown_first = self.shown_first or (event.round == 0 and not self.plan.api.opens(event.piece))
        return True

    async def _acted(self, decision: RunTools | HandBack,
                     final: bool) -> AsyncGenerator[ToolsStarted | Keepalive | ToolsRan | _Acted, None]:
        """The checks of the client's calls handed back and the gateway's calls run (for a stream,
        with their start, keepalives meanwhile and their end); last, the decision once they are done
        and the gateway's outcomes, in the model's order."""
        turn = self.turns[-1]
        refused: dict[int, ToolOutcome] = {}
        if isinstance(decision, HandBack):
            refused = await self._refused(decision.client_calls, final)
            if refused:
                decision = enforced(decision, turn, refused.keys(), self.conversation.tool_choice,
                                    self.plan.api.relaxed_tool_choice)
        mine = decision.calls if isinstance(decision, RunTools) else decision.gateway_calls
        to_run = [call for call in mine if id(call) not in refused]
        if self.engine.limiter is not None:  # the key's tool calls: the gateway's to run, the client's handed back
            handed = len(decision.client_calls) if isinstance(decision, HandBack) else 0
            try:
                await self.engine.limiter.tool_calls(self.caller.principal, len(to_run) + handed)
            except RateLimited as limited:
                raise await self._resumable(limited) from None
        outcomes: list[ToolOutcome] = []
        if to_run:
            async with aclosing(self._tools(to_run)) as running:
                async for ran in running:
                    if isinstance(ran, list):
                        outcomes = ran
                    else:
                        yield ran
        if refused:  # in the model's order, the check's rejections among the gateway's outcomes
            done = iter(outcomes)
            outcomes = [refused[id(call)] if id(call) in refused else next(done) for call in mine]
        self.ran += [call.name for call in to_run]
        if mine:
            self.tool_runs += _runs(len(self.turns) - 1, mine, outcomes)
        yield _Acted(after_tools(decision, turn, outcomes) if mine else decision, mine, outcomes)

    async def _refused(self, calls: Sequence[ModelCall], final: bool) -> dict[int, ToolOutcome]:
        """The parse step of each call of the client's own tools handed back; in reject mode, the
        rejected ones (by `id()` of the call) for the gateway to answer in their place."""
        checked = await self.engine.client_checks.refused(
            self.plan.client_tools, self.caller, [ToolCall(c.id, c.name, c.arguments) for c in calls],
            len(self.turns), final)
        return {id(call): outcome for call, outcome in zip(calls, checked, strict=True) if outcome is not None}

    async def _tools(self, calls: Sequence[ModelCall]
                     ) -> AsyncGenerator[ToolsStarted | Keepalive | ToolsRan | list[ToolOutcome], None]:
        """The outcomes of the gateway's calls of one turn. For a stream, first that they start,
        then a Keepalive every few seconds while it waits, so that proxies keep the line open, and
        that they ran."""
        batch = [ToolCall(c.id, c.name, c.arguments) for c in calls]
        plan = self.plan
        executor = self.engine.executor
        turn = self.caller.turn(len(self.turns), plan.declared, plan.asks_client, plan.decided)
        if not self.plan.stream:
            yield await executor.run_turn(batch, turn, self.caller.allowed)
            return
        round_, answer, shown = len(self.turns) - 1, self.turns[-1], tuple(calls)
        yield ToolsStarted(round_, shown, answer)
        task = asyncio.ensure_future(executor.run_turn(batch, turn, self.caller.allowed))
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self.engine.keepalive_seconds)
                if done:
                    outcomes = task.result()
                    yield ToolsRan(round_, shown, tuple(outcomes), answer)
                    yield outcomes
                    return
                yield Keepalive()
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def _answered(self, finish_reason: str | None, final: bool) -> Finished:
        """The end of a loop whose model answered."""
        if (answered := self.conversation.answered()) is not None:
            await self.engine.held.hold(answered, self.caller.principal)
        return await self._finished((), finish_reason, final, False)

    async def _handed_back(self, acted: _Acted, final: bool) -> Finished:
        """The end of a loop that hands the client calls: its own, and any gateway call that paused."""
        decision = acted.decision
        assert isinstance(decision, HandBack)
        token = None
        if decision.hold:
            results = [o for o in acted.outcomes if o.call_id not in decision.paused]
            held = self.conversation.held(self.turns[-1], acted.mine, decision.client_calls, results)
            token = await self.engine.held.hold(held, self.caller.principal)
        calls = tuple(self.conversation.for_client(c, token, decision.paused.get(c.id)) for c in decision.client_calls)
        return await self._finished(calls, "tool_calls", final, bool(acted.mine))

    async def _finished(self, calls: tuple[Mapping[str, Any], ...], finish_reason: str | None, final: bool,
                        ran_last: bool) -> Finished:
        """The end of the loop. A Responses answer for which the gateway ran tools gets an id of the
        gateway's own, which continues from the provider's last response (unless the client already
        knows the first response's id, because it streamed output: then that one does)."""
        turns, plan = self.turns, self.plan
        answer_id = turns[0].response_id
        if plan.api.continues_by_id and (len(turns) > 1 or ran_last):
            answer_id = answer_id if self.shown_first and answer_id else plan.answer_id
            if answer_id and turns[-1].response_id and answer_id != turns[-1].response_id:
                await self.engine.held.aliases.put(self.caller.principal, {answer_id: turns[-1].response_id})
        return Finished(tuple(turns), calls, finish_reason, final, answer_id, plan.held_turn_lost, self.tool_runs)

    async def _resumed(self) -> list[Opened | Visible]:
        """Where a request starts: afresh, or, replaying one that failed after gateway tools ran,
        after the rounds that run did (with what the client saw of them, to show again). Only a
        request offered gateway tools can have run any."""
        shown: list[Opened | Visible] = []
        for done in await self.replays.resumed() if self.plan.gateway_names else ():
            decision = self._decided(done.turn, len(self.turns))
            if isinstance(decision, Finish):  # not a round that ran tools: the record is not this request's
                break
            if self.plan.stream:
                shown += [Opened(done.turn.headers)] if not self.turns else []
                shown += [Visible(piece, len(self.turns)) for piece in done.pieces]
            decision = after_tools(decision, done.turn, list(done.outcomes))
            choice = decision.tool_choice if isinstance(decision, RunTools) else self.conversation.tool_choice
            self.conversation = self.conversation.continued(done.turn, done.outcomes, choice)
            by_id = {call.id: call for call in done.turn.calls}
            self.tool_runs += tuple(ToolRun(len(self.turns), by_id[o.call_id], o) for o in done.outcomes
                                    if o.call_id in by_id)
            self.turns.append(done.turn)
            self.ran += [outcome.tool_name for outcome in done.outcomes]
        # The client saw output of the first provider response as it streamed.
        self.shown_first = any(isinstance(e, Visible) and e.round == 0 and not self.plan.api.opens(e.piece)
                               for e in shown)
        return shown


def _runs(round_: int, calls: Sequence[ModelCall], outcomes: Sequence[ToolOutcome]) -> tuple[ToolRun, ...]:
    """The gateway's answers to `calls` of one round."""
    return tuple(ToolRun(round_, call, outcome) for call, outcome in zip(calls, outcomes, strict=True))
