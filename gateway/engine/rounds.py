"""One round of the tool loop on the provider's side: the request routed to an upstream by its
model and sent, its answer read as a turn (streamed or not), the move to the next upstream when one
fails before answering, the gateway's own retries of it once tools have run, and the provider
responses claimed for the caller's key."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager, aclosing, nullcontext
from types import TracebackType
from typing import Any, NoReturn

from gateway.caller import Caller
from gateway.engine.events import Keepalive, Opened, Visible
from gateway.engine.plan import Plan
from gateway.engine.replays import Replays
from gateway.engine.retries import RetryPolicy
from gateway.engine.turn import ModelTurn
from gateway.errors import FailedAfterTools, GatewayError
from gateway.instrumentation import ChatTrace, Instrumentation
from gateway.provider.client import ProviderStream, Upstream
from gateway.provider.paths import not_found_at
from gateway.provider.routing import Target
from gateway.provider.upstreams import Upstreams, fallback_reason, falls_back
from gateway.state import StateStore, StateUnavailable
from gateway.translate.pairs import Translation

RoundEvent = Opened | Visible | Keepalive | ModelTurn
log = logging.getLogger("toolspan.upstream")


class Rounds:
    """The provider calls of every run: the upstreams, the observer, the state store (for claims)
    and how a call is retried."""

    def __init__(self, upstreams: Upstreams, instrumentation: Instrumentation, held: StateStore,
                 retries: RetryPolicy, keepalive_seconds: float) -> None:
        self.upstreams = upstreams
        self.instrumentation = instrumentation
        self.held = held
        self.retries = retries
        self.keepalive_seconds = keepalive_seconds

    async def asked(self, plan: Plan, caller: Caller, body: dict[str, Any], round_: int, ran: Sequence[str],
                    replays: Replays) -> AsyncGenerator[RoundEvent, None]:
        """One round's provider call, streamed or not, ending in its turn. Once gateway tools have
        run (`ran`), a retryable failure is tried again here, as long as the client saw nothing of
        this round's answer; what still fails is final for the client (see FailedAfterTools), and
        the rounds done are kept for its replay."""
        retrying = self.retries.start()
        # One upstream and no key's limit on models: nothing to choose, and an answer not streamed
        # is awaited as it is (no generator between it and the run).
        alone = (not plan.stream and self.upstreams.only is not None and caller.models is None
                 and plan.api.name in self.upstreams.only_speaks)
        while True:
            try:
                if alone:
                    target = Target(self.upstreams.only or "", plan.model)
                    yield await self._answered(plan, caller, body, retrying.attempt, target, None)
                    return
                shown = _Shown()  # the client saw part of this attempt's answer: a retry would repeat it
                async with aclosing(self._routed(plan, caller, body, round_, retrying.attempt, shown)) as asked:
                    async for event in asked:
                        yield event
                return
            except GatewayError as exc:
                if not ran:
                    raise  # nothing ran yet: the client's own retries are harmless
                delay = None if not alone and shown.seen else retrying.wait(exc)
                if delay is None:
                    raise FailedAfterTools(exc, ran, retrying.attempt, await replays.keep()) from exc
            async with aclosing(self._pause(delay, plan.stream)) as pausing:
                async for keepalive in pausing:
                    yield keepalive

    async def _routed(self, plan: Plan, caller: Caller, body: dict[str, Any], round_: int, attempt: int,
                      shown: _Shown) -> AsyncGenerator[RoundEvent, None]:
        """One provider call, to the upstreams its model routes to in turn: a failure that another
        may not have (a connection, a timeout, a 429, a 5xx) moves it to the next one, as long as
        the client saw nothing of the answer; after that, the failure is the call's."""
        targets = await self._targets(plan, caller, body)
        moved: tuple[str, str] | None = None  # the upstream the call moved on from, and why
        last = targets[-1]
        for target in targets:
            self.upstreams.balancer.started(target.upstream)
            try:
                async with aclosing(self._attempt(plan, caller, body, round_, attempt, target, moved, shown,
                                                  target is last)) as attempted:
                    async for event in attempted:
                        yield event
            except GatewayError as exc:
                if not falls_back(exc):
                    raise
                await self.upstreams.failed(target)
                if target is last:
                    raise
                if shown.seen:  # said to the client: the answer it began to read cannot be another's
                    exc.message += "; it was not tried on another upstream: part of the answer had been sent"
                    raise
                moved = target.upstream, fallback_reason(exc)
                continue
            finally:
                self.upstreams.balancer.ended(target.upstream)
            await self.upstreams.answered(target)
            return

    async def _attempt(self, plan: Plan, caller: Caller, body: dict[str, Any], round_: int, attempt: int,
                       target: Target, moved: tuple[str, str] | None, shown: _Shown,
                       last: bool) -> AsyncGenerator[RoundEvent, None]:
        """One provider call to one target. Streamed, with another target after it, its opening is
        held until it shows part of the answer (see _opening_held)."""
        if not plan.stream:
            turn = await self._answered(plan, caller, body, attempt, target, moved)
            await self._made(plan, caller, turn, target)
            yield turn
            return
        streamed = self._streamed(plan, caller, body, round_, attempt, target, moved)
        async with aclosing(streamed if last else _opening_held(streamed, plan)) as asked:
            async for event in asked:
                shown.seen = shown.seen or (isinstance(event, Visible) and not plan.api.opens(event.piece))
                if isinstance(event, ModelTurn):
                    await self._made(plan, caller, event, target)
                yield event

    async def _targets(self, plan: Plan, caller: Caller, body: dict[str, Any]) -> list[Target]:
        """Where the call may go: its model's targets; a continuation of a provider response
        (previous_response_id), with several upstreams, only where that response was made."""
        targets = await self.upstreams.targets(plan.model, plan.api.name, caller.models)
        previous = body.get("previous_response_id") if plan.api.continues_by_id else None
        if self.upstreams.only is None and isinstance(previous, str):
            origin = (await self.held.origins.get(caller.principal, (previous,))).get(previous)
            if origin is not None and origin in self.upstreams.clients:
                return [t for t in targets if t.upstream == origin] or [Target(origin, plan.model)]
        return targets

    async def _made(self, plan: Plan, caller: Caller, turn: ModelTurn, target: Target) -> None:
        """With several upstreams, the upstream that made a provider response is remembered: its
        continuations, reads and deletion go there. Best effort: the answer is paid for and on its
        way, and a state store that is down must not lose it (a continuation then routes by model)."""
        if self.upstreams.only is None and plan.api.continues_by_id and turn.response_id is not None:
            try:
                await self.held.origins.put(caller.principal, {turn.response_id: target.upstream})
            except StateUnavailable:
                log.warning("the upstream of response %s was not remembered: the state store is unavailable",
                            turn.response_id)

    async def _pause(self, seconds: float, stream: bool) -> AsyncGenerator[Keepalive, None]:
        """The wait before a retry; a stream is kept open through it as while tools run."""
        deadline = asyncio.get_running_loop().time() + seconds
        while (left := deadline - asyncio.get_running_loop().time()) > 0:
            await asyncio.sleep(min(left, self.keepalive_seconds))
            if stream and deadline - asyncio.get_running_loop().time() > 0:
                yield Keepalive()

    async def _answered(self, plan: Plan, caller: Caller, body: dict[str, Any], attempt: int, target: Target,
                        moved: tuple[str, str] | None) -> ModelTurn:
        """One provider call, not streamed: its answer as a turn."""
        upstream = self.upstreams.clients[target.upstream]
        body = _for(body, target)
        with self._chat(plan, caller, False, target, attempt, moved) as trace:
            trace.sent(plan.api.genai, body)
            path = plan.path  # until the provider's path is known (a bad model name is refused first)
            try:
                path, sent, translation = self._outgoing(plan, body, target, upstream, trace)
                answer, headers = await upstream.post(path, sent, self._headers(upstream, caller, trace),
                                                      trace.resent)
                turn = plan.api.read(translation.answer(answer) if translation is not None else answer, headers)
            except GatewayError as exc:
                self._failed(upstream, trace, exc, path)
            trace.answered(turn)
        await self._claim(plan, caller, turn.response_id)
        return turn

    async def _streamed(self, plan: Plan, caller: Caller, body: dict[str, Any], round_: int, attempt: int,
                        target: Target, moved: tuple[str, str] | None
                        ) -> AsyncGenerator[Opened | Visible | ModelTurn, None]:
        """One streamed provider call: the pieces the client may see at once, then the turn."""
        reader = plan.api.stream_reader()
        claimed = False
        upstream = self.upstreams.clients[target.upstream]
        body = _for(body, target)
        with self._chat(plan, caller, True, target, attempt, moved) as trace:
            trace.sent(plan.api.genai, body)
            path = plan.path  # until the provider's path is known (a bad model name is refused first)
            try:
                path, sent, translation = self._outgoing(plan, body, target, upstream, trace)
                async with upstream.post_stream(path, sent, self._headers(upstream, caller, trace),
                                                trace.resent) as answer, _events(answer, translation) as events:
                    if round_ == 0:
                        yield Opened(answer.headers)
                    async for event in events:
                        if (piece := reader.absorb(event)) is not None:
                            if not claimed and plan.api.opens(piece):
                                claimed = await self._claim(plan, caller, plan.api.opened_id(piece))
                            yield Visible(piece, round_)
                turn = reader.turn(answer.headers)
            except GatewayError as exc:
                self._failed(upstream, trace, exc, path)
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

    def _outgoing(self, plan: Plan, body: dict[str, Any], target: Target, upstream: Upstream,
                  trace: ChatTrace) -> tuple[str, dict[str, Any], Translation | None]:
        """Where a call goes and what it sends: the client's request on the path of its API, or,
        to an upstream that speaks another, the request translated, on that API's path (the
        caller's query string and Azure surface are its own API's, and stay behind)."""
        if target.api is None:
            return upstream.path(plan.api.name, target.model, plan.query, plan.path), body, None
        translation = Translation(plan.api.name, target.api)
        sent, dropped = translation.request(body)
        trace.translated(translation.name, dropped)
        return upstream.path(target.api, target.model, "", ""), sent, translation

    def _chat(self, plan: Plan, caller: Caller, stream: bool, target: Target, attempt: int,
              moved: tuple[str, str] | None) -> AbstractContextManager[ChatTrace]:
        """The span of one provider call: its upstream, how it came there, its trajectory."""
        chat = self.instrumentation.chat(plan.model, stream, target.upstream, self.upstreams.providers[target.upstream],
                                         caller.trajectory_id, caller.principal)
        return chat if attempt == 1 and moved is None else _Traced(chat, attempt, moved)

    def _failed(self, upstream: Upstream, trace: ChatTrace, exc: GatewayError, path: str) -> NoReturn:
        """Raises the error a failed provider call ends with, recorded on its trace: a 404 names the
        path called."""
        error = not_found_at(exc, "POST", upstream.url(path))
        trace.failed(error.status, error.type, error.message)
        if error is exc:
            raise exc
        raise error from exc

    def _headers(self, upstream: Upstream, caller: Caller, trace: ChatTrace) -> dict[str, str]:
        """A provider call's headers: its credentials and the trace context of its span."""
        headers = upstream.headers(caller.upstream_headers)
        trace.inject(headers)
        return headers


class _Shown:
    """Whether the client saw part of an attempt's answer (then neither another upstream nor a
    retry may answer it again)."""

    __slots__ = ("seen",)

    def __init__(self) -> None:
        self.seen = False


class _Traced:
    """A provider call's span, told on entry which attempt it is and where the call moved on from."""

    __slots__ = ("_attempt", "_chat", "_moved")

    def __init__(self, chat: AbstractContextManager[ChatTrace], attempt: int, moved: tuple[str, str] | None) -> None:
        self._chat, self._attempt, self._moved = chat, attempt, moved

    def __enter__(self) -> ChatTrace:
        trace = self._chat.__enter__()
        if self._attempt > 1:
            trace.retried(self._attempt)
        if self._moved is not None:
            trace.fell_back(*self._moved)
        return trace

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
                 ) -> bool | None:
        return self._chat.__exit__(kind, exc, tb)


async def _opening_held(events: AsyncGenerator[Opened | Visible | ModelTurn, None], plan: Plan
                        ) -> AsyncGenerator[Opened | Visible | ModelTurn, None]:
    """A streamed call that another upstream may still take: what only opens its answer (the
    provider's headers, Responses' response.created, Messages' message_start) waits for the first
    piece that shows some of it, or for its turn. A call that fails before then goes nowhere, and
    the client's answer is opened once, by the upstream that answers."""
    held: list[Opened | Visible] | None = []
    async with aclosing(events):
        async for event in events:
            if held is not None:
                if isinstance(event, Opened) or (isinstance(event, Visible) and plan.api.opens(event.piece)):
                    held.append(event)
                    continue
                for waiting in held:
                    yield waiting
                held = None
            yield event


def _events(answer: ProviderStream, translation: Translation | None
            ) -> AbstractAsyncContextManager[AsyncIterator[dict[str, Any]]]:
    """A streamed answer's events as the client's API has them: translated, when the call was."""
    if translation is None:
        return nullcontext(answer.events)
    return aclosing(translation.events(answer.events))


def _for(body: dict[str, Any], target: Target) -> dict[str, Any]:
    """The request body as `target`'s upstream gets it: its name for the model (an alias's)."""
    return body if body.get("model") == target.model else {**body, "model": target.model}
