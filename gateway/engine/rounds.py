"""One round of the tool loop on the provider's side: the request sent, its answer read as a turn
(streamed or not), the gateway's own retries of it once tools have run, and the provider responses
claimed for the caller's key."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from typing import Any, NoReturn

from gateway.caller import Caller
from gateway.engine.events import Keepalive, Opened, Visible
from gateway.engine.plan import Plan
from gateway.engine.replays import Replays
from gateway.engine.retries import RetryPolicy
from gateway.engine.turn import ModelTurn
from gateway.errors import FailedAfterTools, GatewayError
from gateway.instrumentation import ChatTrace, Instrumentation
from gateway.provider.client import Upstream
from gateway.provider.paths import not_found_at
from gateway.state import StateStore

RoundEvent = Opened | Visible | Keepalive | ModelTurn


class Rounds:
    """The provider calls of every run: the provider client, the observer, the state store (for
    claims) and how a call is retried."""

    def __init__(self, upstream: Upstream, instrumentation: Instrumentation, held: StateStore,
                 retries: RetryPolicy, keepalive_seconds: float) -> None:
        self.upstream = upstream
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
            trace.sent(plan.api.genai, body)
            if attempt > 1:
                trace.retried(attempt)
            path = plan.path  # until the provider's path is known (a bad model name is refused first)
            try:
                path = self.upstream.path(plan.api.name, plan.model, plan.query, plan.path)
                answer, headers = await self.upstream.post(path, body, self._headers(caller, trace), trace.resent)
                turn = plan.api.read(answer, headers)
            except GatewayError as exc:
                self._failed(trace, exc, path)
            trace.answered(turn)
        await self._claim(plan, caller, turn.response_id)
        return turn

    async def _streamed(self, plan: Plan, caller: Caller, body: dict[str, Any], round_: int,
                        attempt: int = 1) -> AsyncGenerator[Opened | Visible | ModelTurn, None]:
        """One streamed provider call: the pieces the client may see at once, then the turn."""
        reader = plan.api.stream_reader()
        claimed = False
        with self.instrumentation.chat(plan.model, True) as trace:
            trace.sent(plan.api.genai, body)
            if attempt > 1:
                trace.retried(attempt)
            path = plan.path  # until the provider's path is known (a bad model name is refused first)
            try:
                path = self.upstream.path(plan.api.name, plan.model, plan.query, plan.path)
                async with self.upstream.post_stream(path, body, self._headers(caller, trace),
                                                     trace.resent) as answer:
                    if round_ == 0:
                        yield Opened(answer.headers)
                    async for event in answer.events:
                        if (piece := reader.absorb(event)) is not None:
                            if not claimed and plan.api.opens(piece):
                                claimed = await self._claim(plan, caller, plan.api.opened_id(piece))
                            yield Visible(piece, round_)
                turn = reader.turn(answer.headers)
            except GatewayError as exc:
                self._failed(trace, exc, path)
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

    def _failed(self, trace: ChatTrace, exc: GatewayError, path: str) -> NoReturn:
        """Raises the error a failed provider call ends with, recorded on its trace: a 404 names the
        path called."""
        error = not_found_at(exc, "POST", self.upstream.url(path))
        trace.failed(error.status, error.type, error.message)
        if error is exc:
            raise exc
        raise error from exc

    def _headers(self, caller: Caller, trace: ChatTrace) -> dict[str, str]:
        """A provider call's headers: its credentials and the trace context of its span."""
        headers = self.upstream.headers(caller.upstream_headers)
        trace.inject(headers)
        return headers
