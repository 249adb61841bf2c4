"""The tool loop, once for every API and both stream modes: an async generator of events.

Each round calls the provider, reads its answer as a ModelTurn (passing on, when streamed, what
the client may see at once), asks `decide` what next, and runs the gateway's calls. The routes
render the events: Visible pieces as they come, Keepalive while tools run, then Finished.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from gateway.caller import Caller
from gateway.client_tools.check import ClientTools, SchemaCache
from gateway.engine.decide import Finish, HandBack, RunTools, after_tools, decide, enforced, is_final
from gateway.engine.history import Conversation
from gateway.engine.plan import Plan
from gateway.engine.replays import Replays
from gateway.engine.retries import RetryPolicy
from gateway.engine.turn import ModelCall, ModelTurn
from gateway.errors import FailedAfterTools, GatewayError
from gateway.instrumentation import ChatTrace, Instrumentation
from gateway.provider.client import Upstream
from gateway.provider.paths import not_found_at
from gateway.settings.parts import ClientCheckMode
from gateway.state import StateStore
from gateway.tools import ToolCall, ToolExecutor, ToolOutcome
from gateway.tools.threads import ToolThreads


@dataclass(frozen=True)
class Visible:
    """A piece of a streamed answer the client may see now, as the provider sent it."""

    piece: Mapping[str, Any]
    round: int  # 0 for the first provider call


@dataclass(frozen=True)
class Opened:
    """The first provider stream answered: its headers, for the client's response (streams only)."""

    headers: Mapping[str, str]


@dataclass(frozen=True)
class Keepalive:
    """Gateway tools are still running (streams only)."""


@dataclass(frozen=True)
class Finished:
    """The loop is over: every round's answer, and what the client gets beyond what it saw."""

    turns: tuple[ModelTurn, ...]
    client_calls: tuple[Mapping[str, Any], ...]  # the client's calls, as the client receives them
    finish_reason: str | None
    limit_reached: bool  # the last call was the one the round limit allows, with no tools
    response_id: str | None = None  # Responses: the id the client knows the answer by
    held_turn_lost: bool = False  # it continued a turn the gateway no longer held (engine.plan.Plan)

    @property
    def rounds(self) -> int:
        """Provider calls made."""
        return len(self.turns)


Event = Opened | Visible | Keepalive | Finished
# Each check on it ends within its budget (gateway.tools.schema_bounds.OFF_LOOP); one, so that the
# event loop competes with a single thread for the interpreter's lock.
SCHEMA_THREADS = 1


class Engine:
    """Runs plans: the provider client, the tool executor, the held-turn store and the observer."""

    def __init__(self, upstream: Upstream, executor: ToolExecutor, held: StateStore, instrumentation: Instrumentation,
                 max_rounds: int, keepalive_seconds: float, retries: RetryPolicy | None = None,
                 client_check: ClientCheckMode = "observe") -> None:
        self.upstream = upstream
        self.client_check = client_check  # what becomes of a call of the client's tool that does not fit it
        self.client_schemas = SchemaCache()  # the client tools' schemas, compiled once each
        # Checks of client calls past the budget the event loop gives them; threads start when needed
        self.schema_threads = ToolThreads(SCHEMA_THREADS)
        self.retries = retries or RetryPolicy()
        self.executor = executor
        self.held = held
        self.instrumentation = instrumentation
        self.max_rounds = max_rounds
        self.keepalive_seconds = keepalive_seconds

    async def run(self, plan: Plan, caller: Caller) -> AsyncGenerator[Event, None]:
        """The rounds of one request, as events."""
        replays = Replays(self.held, caller.principal, plan)
        # tools_ran: the gateway tools run for this request so far (or by the failed run it replays)
        conversation, turns, tools_ran, resumed = await self._resumed(plan, replays)
        for again in resumed:
            yield again
        # The client saw output of the first provider response as it streamed.
        shown_first = any(isinstance(e, Visible) and e.round == 0 and not plan.api.opens(e.piece) for e in resumed)
        while True:
            final = is_final(len(turns), self.max_rounds)
            body = conversation.request(final, plan.stream)
            pieces: list[Mapping[str, Any]] = []  # what the client saw of this round, for a replay
            async with aclosing(self._asked(plan, caller, body, len(turns), tools_ran, replays)) as asked:
                async for event in asked:
                    if isinstance(event, ModelTurn):
                        turns.append(event)
                        continue
                    if isinstance(event, Visible):
                        pieces.append(event.piece)
                        shown_first = shown_first or (event.round == 0 and not plan.api.opens(event.piece))
                    yield event
            turn = turns[-1]
            decision = decide(turn, plan.client_names, len(turns) - 1, self.max_rounds, conversation.tool_choice,
                              plan.api.relaxed_tool_choice)
            if isinstance(decision, Finish):
                if (answered := conversation.answered()) is not None:
                    await self.held.hold(answered, caller.principal)
                yield await self._finished(plan, caller, turns, (), decision.finish_reason, final, shown_first, False)
                return
            refused: dict[int, ToolOutcome] = {}
            if isinstance(decision, HandBack):
                refused = await self._check_client_calls(plan, caller, decision.client_calls, len(turns), final)
                if refused:
                    decision = enforced(decision, turn, refused.keys(), conversation.tool_choice,
                                        plan.api.relaxed_tool_choice)
            mine = decision.calls if isinstance(decision, RunTools) else decision.gateway_calls
            to_run = [call for call in mine if id(call) not in refused]
            outcomes: list[ToolOutcome] = []
            if to_run and plan.stream:
                async with aclosing(self._run_tools_streamed(to_run, caller, len(turns))) as running:
                    async for ran in running:
                        if isinstance(ran, Keepalive):
                            yield ran
                        else:
                            outcomes = ran
            elif to_run:
                outcomes = await self._run_tools(to_run, caller, len(turns))
            if refused:  # in the model's order, the check's rejections among the gateway's outcomes
                done = iter(outcomes)
                outcomes = [refused[id(call)] if id(call) in refused else next(done) for call in mine]
            tools_ran += [call.name for call in to_run]
            decision = after_tools(decision, turn, outcomes) if mine else decision
            if isinstance(decision, RunTools):
                replays.done(turn, outcomes, pieces)
                conversation = conversation.continued(turn, outcomes, decision.tool_choice)
                continue
            yield await self._handed_back(plan, caller, conversation, turns, decision, mine, outcomes, final,
                                          shown_first)
            return

    async def _handed_back(self, plan: Plan, caller: Caller, conversation: Conversation, turns: list[ModelTurn],
                     decision: HandBack, ran: Sequence[ModelCall], outcomes: list[ToolOutcome], final: bool,
                     shown_first: bool) -> Finished:
        """The end of a loop that hands the client calls: its own, and any gateway call that paused."""
        token = None
        if decision.hold:
            results = [o for o in outcomes if o.call_id not in decision.paused]
            held = conversation.held(turns[-1], ran, decision.client_calls, results)
            token = await self.held.hold(held, caller.principal)
        calls = tuple(conversation.for_client(c, token, decision.paused.get(c.id)) for c in decision.client_calls)
        return await self._finished(plan, caller, turns, calls, "tool_calls", final, shown_first, bool(ran))

    async def _finished(self, plan: Plan, caller: Caller, turns: list[ModelTurn], calls: tuple[Mapping[str, Any], ...],
                  finish_reason: str | None, final: bool, shown_first: bool, ran_last: bool) -> Finished:
        """The end of the loop. A Responses answer for which the gateway ran tools gets an id of the
        gateway's own, which continues from the provider's last response (unless the client already
        knows the first response's id, because it streamed output: then that one does)."""
        answer_id = turns[0].response_id
        if plan.api.continues_by_id and (len(turns) > 1 or ran_last):
            answer_id = answer_id if shown_first and answer_id else plan.answer_id
            if answer_id and turns[-1].response_id and answer_id != turns[-1].response_id:
                await self.held.aliases.put(caller.principal, {answer_id: turns[-1].response_id})
        return Finished(tuple(turns), calls, finish_reason, final, answer_id, plan.held_turn_lost)

    async def _resumed(self, plan: Plan, replays: Replays
                       ) -> tuple[Conversation, list[ModelTurn], list[str], list[Opened | Visible]]:
        """Where a request starts: afresh, or, replaying one that failed after gateway tools ran,
        after the rounds that run did (with what the client saw of them, to show again). Only a
        request offered gateway tools can have run any."""
        turns: list[ModelTurn] = []
        ran: list[str] = []
        shown: list[Opened | Visible] = []
        conversation = plan.conversation
        for done in await replays.resumed() if plan.gateway_names else ():
            decision = decide(done.turn, plan.client_names, len(turns), self.max_rounds, conversation.tool_choice,
                              plan.api.relaxed_tool_choice)
            if isinstance(decision, Finish):  # not a round that ran tools: the record is not this request's
                break
            if plan.stream:
                shown += [Opened(done.turn.headers)] if not turns else []
                shown += [Visible(piece, len(turns)) for piece in done.pieces]
            decision = after_tools(decision, done.turn, list(done.outcomes))
            choice = decision.tool_choice if isinstance(decision, RunTools) else conversation.tool_choice
            conversation = conversation.continued(done.turn, done.outcomes, choice)
            turns.append(done.turn)
            ran += [outcome.tool_name for outcome in done.outcomes]
        return conversation, turns, ran, shown

    async def _asked(self, plan: Plan, caller: Caller, body: dict[str, Any], round_: int, ran: Sequence[str],
                     replays: Replays) -> AsyncGenerator[Opened | Visible | Keepalive | ModelTurn, None]:
        """One round's provider call, streamed or not, ending in its turn. Once gateway tools have
        run (`ran`), a retryable failure is tried again here, as long as the client saw nothing of
        this round's answer; what still fails is final for the client (see FailedAfterTools), and
        the rounds done are kept for its replay."""
        retrying = self.retries.start()
        while True:
            shown = False  # the client saw part of this attempt's answer: a retry would repeat it
            try:
                if not plan.stream:
                    yield await self._answered(plan, caller, body, retrying.attempt)
                    return
                async with aclosing(self._streamed(plan, caller, body, round_, retrying.attempt)) as asked:
                    async for event in asked:
                        shown = shown or (isinstance(event, Visible) and not plan.api.opens(event.piece))
                        yield event
                return
            except GatewayError as exc:
                if not ran:
                    raise  # nothing ran yet: the client's own retries are harmless
                delay = None if shown else retrying.wait(exc)
                if delay is None:
                    raise FailedAfterTools(exc, ran, retrying.attempt, await replays.keep()) from exc
            async with aclosing(self._pause(delay, plan.stream)) as pausing:
                async for keepalive in pausing:
                    yield keepalive

    async def _pause(self, seconds: float, stream: bool) -> AsyncGenerator[Keepalive, None]:
        """The wait before a retry; a stream is kept open through it as while tools run."""
        deadline = asyncio.get_running_loop().time() + seconds
        while (left := deadline - asyncio.get_running_loop().time()) > 0:
            await asyncio.sleep(min(left, self.keepalive_seconds))
            if stream and deadline - asyncio.get_running_loop().time() > 0:
                yield Keepalive()

    async def _answered(self, plan: Plan, caller: Caller, body: dict[str, Any], attempt: int = 1) -> ModelTurn:
        """One provider call, not streamed: its answer as a turn."""
        with self.instrumentation.chat(plan.model, False) as trace:
            trace.sent(plan.api.name, body)
            if attempt > 1:
                trace.retried(attempt)
            path = plan.path  # until the provider's path is known (a bad model name is refused first)
            try:
                path = self.upstream.path(plan.api.name, plan.model, plan.query, plan.path)
                answer, headers = await self.upstream.post(path, body, self._headers(caller, trace), trace.resent)
                turn = plan.api.read(answer, headers)
            except GatewayError as exc:
                error = self._failed(trace, exc, path)
                if error is exc:
                    raise
                raise error from exc
            trace.answered(turn)
        await self._claim(plan, caller, turn.response_id)
        return turn

    async def _streamed(self, plan: Plan, caller: Caller, body: dict[str, Any], round_: int,
                        attempt: int = 1) -> AsyncGenerator[Opened | Visible | ModelTurn, None]:
        """One streamed provider call: the pieces the client may see at once, then the turn."""
        reader = plan.api.stream_reader()
        with self.instrumentation.chat(plan.model, True) as trace:
            trace.sent(plan.api.name, body)
            if attempt > 1:
                trace.retried(attempt)
            path = plan.path  # until the provider's path is known (a bad model name is refused first)
            try:
                path = self.upstream.path(plan.api.name, plan.model, plan.query, plan.path)
                async with self.upstream.post_stream(path, body, self._headers(caller, trace),
                                                     trace.resent) as answer:
                    if round_ == 0:
                        yield Opened(answer.headers)
                    claimed = False
                    async for event in answer.events:
                        if (piece := reader.absorb(event)) is not None:
                            if not claimed and plan.api.opens(piece):
                                claimed = await self._claim(plan, caller, plan.api.opened_id(piece))
                            yield Visible(piece, round_)
                turn = reader.turn(answer.headers)
            except GatewayError as exc:
                error = self._failed(trace, exc, path)
                if error is exc:
                    raise
                raise error from exc
            trace.answered(turn)
        if not claimed:  # a stream that opened with no response (only its completion named it)
            await self._claim(plan, caller, turn.response_id)
        yield turn

    async def _claim(self, plan: Plan, caller: Caller, response_id: str | None) -> bool:
        """With gateway keys, the key that made a provider response is remembered before its client
        can learn the response's id: only that key may read, continue or delete it. Whether there
        was an id to remember."""
        if not plan.api.continues_by_id or caller.principal is None or response_id is None:
            return False
        await self.held.owners.put(caller.principal, {response_id: True})
        return True

    def _failed(self, trace: ChatTrace, exc: GatewayError, path: str) -> GatewayError:
        """The error a failed provider call ends with, recorded on its trace: a 404 names the path called."""
        error = not_found_at(exc, "POST", self.upstream.url(path))
        trace.failed(error.status, error.type, error.message)
        return error

    def _headers(self, caller: Caller, trace: ChatTrace) -> dict[str, str]:
        """A provider call's headers: its credentials and the trace context of its span."""
        headers = self.upstream.headers(caller.upstream_headers)
        trace.inject(headers)
        return headers

    async def _check_client_calls(self, plan: Plan, caller: Caller, calls: Sequence[ModelCall], round_: int,
                                  final: bool) -> dict[int, ToolOutcome]:
        """The parse step of each call of the client's own tools handed back (`calls`), each in
        its `tool.call` span (side "client"); the calls themselves are not changed. In reject mode,
        the rejected ones (by `id()` of the call) for the gateway to answer in their place, unless
        this was the last round the limit allows: then the client gets them as they are."""
        mode = caller.client_check(self.client_check)
        if mode == "off":
            return {}
        tools = ClientTools(plan.client_tools, self.client_schemas)
        turn = caller.turn(round_)
        refused: dict[int, ToolOutcome] = {}
        for call in calls:
            async with self.executor.hooks.tool_call(ToolCall(call.id, call.name, call.arguments), None, turn,
                                                     side="client") as trace:
                with trace.step("parse"):
                    checked = await tools.check_bounded(call.name, call.arguments, self.schema_threads)
                outcome = checked.outcome_of(call.id, call.name)
                trace.finish(outcome)
            if outcome.status == "rejected" and mode == "reject" and not final:
                refused[id(call)] = outcome
        return refused

    async def _run_tools(self, calls: Sequence[ModelCall], caller: Caller, round_: int) -> list[ToolOutcome]:
        """The outcomes of the gateway's calls of one turn."""
        batch = [ToolCall(c.id, c.name, c.arguments) for c in calls]
        return await self.executor.run_turn(batch, caller.turn(round_), caller.allowed)

    async def _run_tools_streamed(self, calls: Sequence[ModelCall], caller: Caller,
                                  round_: int) -> AsyncGenerator[Keepalive | list[ToolOutcome], None]:
        """The same, while a stream waits: a Keepalive every few seconds so that proxies keep the
        line open, then the outcomes."""
        task = asyncio.ensure_future(self._run_tools(calls, caller, round_))
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self.keepalive_seconds)
                if done:
                    yield task.result()
                    return
                yield Keepalive()
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
