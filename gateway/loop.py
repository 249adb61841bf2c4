"""The tool loop: call the model, run the gateway's tool calls, append the results, call again,
until the model answers, calls a client tool, or the round limit ends it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import orjson

from gateway.errors import BadRequest, GatewayError, UpstreamUnavailable
from gateway.instrumentation import Instrumentation
from gateway.streaming import Round, call_chunks, chunk
from gateway.tools import ToolCall, ToolExecutor, ToolOutcome, ToolRegistry, Turn
from gateway.turns import PendingTurns
from gateway.upstream import Upstream

T = TypeVar("T")


@dataclass(frozen=True)
class Caller:
    """Who sent the request and what it may use."""

    trajectory_id: str
    request_id: str
    authorization: str | None = None
    principal: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    allowed: frozenset[str] | None = None  # None: every registered tool

    def turn(self, round_: int) -> Turn:
        return Turn(trajectory_id=self.trajectory_id, request_id=self.request_id, principal=self.principal,
                    metadata=self.metadata, round=round_)


@dataclass
class Plan:
    """The request as the loop works on it: the upstream body and whose tools are whose."""

    body: dict[str, Any]
    messages: list[Any]
    client_names: frozenset[str]
    gateway_names: frozenset[str]
    include_usage: bool

    @property
    def model(self) -> str:
        return str(self.body.get("model", ""))


@dataclass(frozen=True)
class LoopResult:
    rounds: int  # upstream calls made
    limit_reached: bool


class ChunkSink(Protocol):
    """Where a streamed answer goes (the client's SSE response)."""

    async def send(self, chunk: dict[str, Any]) -> None: ...

    async def comment(self, text: str) -> None: ...


def add_usage(total: dict[str, Any], usage: Any) -> None:
    """Sum token counts, nested detail objects included."""
    if not isinstance(usage, dict):
        return
    for key, value in usage.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            total[key] = total.get(key, 0) + value
        elif isinstance(value, dict):
            add_usage(total.setdefault(key, {}), value)


def _tool_message(outcome: ToolOutcome) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": outcome.call_id, "content": outcome.content}


def _assistant(message: Mapping[str, Any], calls: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant turn as it goes back into the conversation (response-only fields dropped)."""
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("refusal"):
        out["refusal"] = message["refusal"]
    if calls:
        out["tool_calls"] = calls
    return out


def _arguments(call: Mapping[str, Any]) -> str:
    """The call's arguments as JSON text (some compatible providers send an object instead)."""
    function = call.get("function")
    arguments = function.get("arguments") if isinstance(function, Mapping) else None
    if arguments is None or isinstance(arguments, str):
        return arguments or ""
    return orjson.dumps(arguments).decode()


def _name(call: Mapping[str, Any]) -> str:
    function = call.get("function")
    return str(function.get("name", "")) if isinstance(function, Mapping) else ""


class ToolLoop:
    def __init__(self, upstream: Upstream, executor: ToolExecutor, registry: ToolRegistry,
                 instrumentation: Instrumentation, pending: PendingTurns, max_rounds: int,
                 keepalive_seconds: float) -> None:
        self.upstream = upstream
        self.executor = executor
        self.registry = registry
        self.instrumentation = instrumentation
        self.pending = pending
        self.max_rounds = max_rounds
        self.keepalive_seconds = keepalive_seconds

    # --- planning ------------------------------------------------------------------------------

    def plan(self, body: dict[str, Any], caller: Caller) -> Plan:
        caller_tools = body.get("tools") or []
        client_names = frozenset(n for t in caller_tools if isinstance(t, Mapping) and (n := _name(t)))
        exposed = self.registry.openai_tools(caller.allowed)
        gateway_names = frozenset(t["function"]["name"] for t in exposed)
        if clash := sorted(client_names & gateway_names):
            raise BadRequest(f"tool '{clash[0]}' is provided by the gateway; rename or remove your own "
                             "tool of that name", param="tools", code="tool_name_conflict")
        if gateway_names and (body.get("n") or 1) != 1:
            raise BadRequest("n must be 1 when the gateway offers tools", param="n")
        upstream_body = {k: v for k, v in body.items() if k not in ("messages", "stream", "stream_options")}
        if caller_tools or exposed:
            upstream_body["tools"] = [*caller_tools, *exposed]
        options = body.get("stream_options")
        include_usage = isinstance(options, Mapping) and bool(options.get("include_usage"))
        messages = self.pending.restore(body["messages"], caller.principal)
        return Plan(upstream_body, messages, client_names, gateway_names, include_usage)

    def _round_body(self, plan: Plan, final: bool, stream: bool) -> dict[str, Any]:
        body = {**plan.body, "messages": plan.messages}
        if final and "tools" in body:
            body["tool_choice"] = "none"
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}  # we sum usage over rounds ourselves
        return body

    def _split(self, plan: Plan, calls: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(gateway's, client's). Any name the client did not declare is the gateway's to handle,
        so an invented name is rejected back to the model instead of reaching the client."""
        mine = [c for c in calls if _name(c) not in plan.client_names]
        theirs = [c for c in calls if _name(c) in plan.client_names]
        return mine, theirs

    def _after_tools(self, plan: Plan, assistant: dict[str, Any], outcomes: list[ToolOutcome]) -> None:
        plan.messages.extend([assistant, *(_tool_message(o) for o in outcomes)])
        choice = plan.body.get("tool_choice")
        forced = _name(choice) if isinstance(choice, Mapping) else None
        ran = {o.tool_name for o in outcomes}
        if choice == "required" or (forced and forced in ran):
            plan.body["tool_choice"] = "auto"  # forcing again would loop for ever

    def _hold(self, assistant: dict[str, Any], outcomes: list[ToolOutcome], client_calls: list[dict[str, Any]],
              caller: Caller) -> list[dict[str, Any]]:
        """Keep the gateway's half of a mixed turn; the client's calls get ids that name it."""
        token = self.pending.hold(assistant, [_tool_message(o) for o in outcomes], caller.principal)
        return [{**c, "id": PendingTurns.client_id(token, str(c.get("id", "")))} for c in client_calls]

    async def _run_tools(self, calls: list[dict[str, Any]], caller: Caller, round_: int) -> list[ToolOutcome]:
        batch = [ToolCall(str(c.get("id", "")), _name(c), _arguments(c)) for c in calls]
        return await self.executor.run_turn(batch, caller.turn(round_), caller.allowed)

    def _headers(self, caller: Caller) -> dict[str, str]:
        return self.upstream.auth_headers(caller.authorization)

    # --- non-streamed ---------------------------------------------------------------------------

    async def complete(self, plan: Plan, caller: Caller) -> tuple[dict[str, Any], LoopResult]:
        usage: dict[str, Any] = {}
        rounds = tool_rounds = 0
        while True:
            final = tool_rounds >= self.max_rounds
            response = await self._chat(plan, caller, final)
            rounds += 1
            add_usage(usage, response.get("usage"))
            message = response["choices"][0].get("message") or {}
            mine, theirs = self._split(plan, list(message.get("tool_calls") or []))
            if not mine or final:
                if final and mine:  # the model ignored tool_choice "none": never show it our tools
                    self._strip(response, theirs)
                break
            outcomes = await self._run_tools(mine, caller, rounds)
            assistant = _assistant(message, [*mine, *theirs])
            if theirs:
                message["tool_calls"] = self._hold(assistant, outcomes, theirs, caller)
                break
            self._after_tools(plan, assistant, outcomes)
            tool_rounds += 1
        if usage:
            response["usage"] = usage
        return response, LoopResult(rounds, final)

    @staticmethod
    def _strip(response: dict[str, Any], theirs: list[dict[str, Any]]) -> None:
        choice = response["choices"][0]
        choice["message"]["tool_calls"] = theirs or None
        if not theirs:
            choice["finish_reason"] = "stop"

    async def _chat(self, plan: Plan, caller: Caller, final: bool) -> dict[str, Any]:
        with self.instrumentation.chat(plan.model, False) as trace:
            headers = self._headers(caller)
            trace.inject(headers)
            try:
                response = await self.upstream.chat(self._round_body(plan, final, False), headers)
            except GatewayError as exc:
                trace.failed(exc.status, exc.type, exc.message)
                raise
            trace.response(response)
            return response

    # --- streamed -----------------------------------------------------------------------------

    async def stream(self, plan: Plan, caller: Caller, sink: ChunkSink) -> LoopResult:
        usage: dict[str, Any] = {}
        identity: dict[str, Any] = {}
        rounds = tool_rounds = 0
        while True:
            final = tool_rounds >= self.max_rounds
            round_ = await self._stream_round(plan, caller, sink, final, identity, first=rounds == 0)
            rounds += 1
            add_usage(usage, round_.usage)
            mine, theirs = self._split(plan, round_.tool_calls())
            if final:
                mine = []
            if mine:
                outcomes = await self._keepalive(self._run_tools(mine, caller, rounds), sink)
                assistant = round_.message()
                if not theirs:
                    self._after_tools(plan, assistant, outcomes)
                    tool_rounds += 1
                    continue
                theirs = self._hold(assistant, outcomes, theirs, caller)
            for part in call_chunks(identity, theirs):
                await sink.send(part)
            finish = round_.finish_reason or "stop"
            if theirs:
                finish = "tool_calls"
            elif finish == "tool_calls":
                finish = "stop"  # its calls were the gateway's, dropped at the round limit
            await sink.send(chunk(identity, {}, finish))
            break
        if plan.include_usage:
            await sink.send({**identity, "object": "chat.completion.chunk", "choices": [], "usage": usage})
        return LoopResult(rounds, final)

    async def _stream_round(self, plan: Plan, caller: Caller, sink: ChunkSink, final: bool,
                            identity: dict[str, Any], first: bool) -> Round:
        round_ = Round()
        with self.instrumentation.chat(plan.model, True) as trace:
            headers = self._headers(caller)
            trace.inject(headers)
            try:
                async with self.upstream.chat_stream(self._round_body(plan, final, True), headers) as chunks:
                    async for part in chunks:
                        visible = round_.absorb(part)
                        if not identity and round_.id:
                            identity.update(id=round_.id, created=round_.created, model=round_.model)
                        if visible and not first:
                            visible.pop("role", None)  # one assistant message, however many rounds
                        if visible:
                            await sink.send(chunk(identity, visible))
            except GatewayError as exc:
                trace.failed(exc.status, exc.type, exc.message)
                raise
            trace.response(self._summary(round_))
        if round_.finish_reason is None:
            raise UpstreamUnavailable("the provider's stream ended without a finish reason")
        return round_

    @staticmethod
    def _summary(round_: Round) -> dict[str, Any]:
        return {"id": round_.id, "model": round_.model, "usage": round_.usage,
                "choices": [{"finish_reason": round_.finish_reason}]}

    async def _keepalive(self, work: Awaitable[T], sink: ChunkSink) -> T:
        """Await `work`, writing an SSE comment every few seconds so proxies keep the line open."""
        task = asyncio.ensure_future(work)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self.keepalive_seconds)
                if done:
                    return task.result()
                await sink.comment("toolspan: running tools")
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
