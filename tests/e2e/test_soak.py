"""A soak: a few thousand requests through the official openai client, both APIs, streamed and not,
with random tool outcomes, random provider faults (errors, rate limits, bodies that are not JSON,
streams cut off, a provider that never answers) and random client faults (bodies that are not
requests, hang-ups while the provider thinks and while a tool runs).

Afterwards the books must balance: every tool call the model made is one `tool.call` span and one
increment of `toolspan_tool_calls_total`, per outcome; every provider call is one `chat` span and
one increment of `toolspan_upstream_requests_total`; every request sent is one request span; no
answer is a 500; nothing is left in flight; the process's memory stayed within bounds."""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import openai
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.trace import SpanKind

from gateway.demo.model import Reply
from gateway.tools import Param, Tool
from telemetry import names
from tests.conftest import AUTH, StackFactory, every_outcome_registry, metric_sum

REQUESTS = 3000
CONCURRENCY = 8
SEED = 20261130
RSS_GROWTH_BOUND = 64 * 2**20  # bytes, from after the warm-up to the end

# Each kind of call the model makes: (tool name, arguments as sent, the outcome it must have).
CALLS: dict[str, tuple[str, Any, str]] = {
    "ok": ("add", {"a": 1, "b": 2}, "ok"),
    "ok_sync": ("read_file", {"path": "/etc/hosts"}, "ok"),
    "missing": ("add", {"a": 1, "bee": 2}, "rejected"),
    "bad_json": ("add", '{"a": 1,', "rejected"),
    "unknown": ("no_such_tool", {}, "rejected"),
    "parser": ("strict", {"path": "relative/path"}, "rejected"),
    "tool_error": ("locked", {}, "error"),
    "crash": ("crash", {}, "error"),
    "timeout": ("slow", {}, "timeout"),
    "interrupt": ("review", {}, "interrupted"),
}
RETRIES = 2  # the gateway's own retries of a provider call after its tools ran (the default)
PROVIDER_FAULTS = {
    "error_500": Reply(status=500, error="the model is down"),
    "rate_limit": Reply(status=429, error="slow down", headers={"retry-after-ms": "1"}),
    "not_json": Reply(raw=b"<html>bad gateway</html>", raw_type="text/html"),
    "cut_off": Reply(content="a stream that breaks", break_stream_after=1),
    "no_answer": Reply(hang=True),
}


@dataclass
class Plan:
    """One request: its API and mode, the model's turns, and what goes wrong."""

    number: int
    api: str
    stream: bool
    rounds: list[list[str]]  # the calls of each model turn before the answer
    provider_fault: str | None = None  # replaces the turn after `rounds` run
    client_fault: str | None = None  # "malformed", "hang_up_waiting" or "hang_up_in_tool"

    def expected_calls(self) -> Counter[str]:
        """The outcomes of the calls the model makes, as the gateway must record them."""
        outcomes: Counter[str] = Counter()
        for calls in self.rounds:
            outcomes.update(CALLS[kind][2] for kind in calls)
            if "interrupt" in calls:
                break
        if self.client_fault == "hang_up_in_tool":
            outcomes["cancelled"] += 1
        return outcomes if self.client_fault != "malformed" else Counter()

    def provider_calls(self) -> int:
        """The calls the gateway makes to the model for this request."""
        if self.client_fault == "malformed":
            return 0
        interrupted = next((i + 1 for i, calls in enumerate(self.rounds) if "interrupt" in calls), None)
        if interrupted is not None:
            return interrupted  # the loop pauses after the interrupted turn's calls
        if self.client_fault == "hang_up_in_tool":
            return len(self.rounds)  # the client leaves during the last turn's calls
        # The turns with calls, and the one that answers, fails or hangs; a failure after gateway tools
        # ran that says "again" is tried twice more by the gateway (a Responses stream cut off after
        # its opening event too: the client saw nothing of that round).
        again = self.provider_fault in ("error_500", "rate_limit") or (
            self.provider_fault == "cut_off" and self.api == "responses")
        return len(self.rounds) + 1 + (RETRIES if self.rounds and again else 0)


def make_plan(rng: random.Random, number: int) -> Plan:
    rounds = [rng.sample(sorted(CALLS), rng.randint(1, 3)) for _ in range(rng.choice([0, 1, 1, 2]))]
    plan = Plan(number, rng.choice(["chat", "responses"]), rng.random() < 0.5, rounds)
    roll = rng.random()
    if roll < 0.15:
        plan.provider_fault = rng.choice(sorted(PROVIDER_FAULTS))
        if plan.provider_fault == "cut_off":
            plan.stream = True
    elif roll < 0.20:
        plan.client_fault = "malformed"
    elif roll < 0.26:
        # The client leaves while the model thinks about its answer, or during the last call of
        # a turn; no interrupt may end the loop before that.
        plan.client_fault = "hang_up_waiting" if roll < 0.23 else "hang_up_in_tool"
        plan.rounds = [kept for calls in plan.rounds if (kept := [kind for kind in calls if kind != "interrupt"])]
        if plan.client_fault == "hang_up_in_tool" and not plan.rounds:
            plan.rounds = [[]]
    return plan


class Books(SpanProcessor):
    """Counts the spans that end, and wakes whoever waits for a number of request spans."""

    def __init__(self) -> None:
        self.tool_calls: Counter[str] = Counter()
        self.chats = 0
        self.requests = 0
        self.requests_wanted: tuple[int, asyncio.Event] | None = None

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        attributes = span.attributes or {}
        if span.name == names.SPAN_TOOL_CALL:
            self.tool_calls[str(attributes.get(names.ATTR_OUTCOME))] += 1
        elif span.name.startswith(names.SPAN_CHAT_PREFIX):
            self.chats += 1
        elif span.kind is SpanKind.SERVER:
            self.requests += 1
            if self.requests_wanted is not None and self.requests >= self.requests_wanted[0]:
                self.requests_wanted[1].set()

    async def requests_reach(self, count: int) -> None:
        ended = asyncio.Event()
        self.requests_wanted = (count, ended)
        if self.requests < count:
            await asyncio.wait_for(ended.wait(), 30)


def rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@dataclass
class Soak:
    plans: dict[int, Plan]
    tool_started: dict[int, asyncio.Event] = field(default_factory=dict)
    provider_waiting: dict[int, asyncio.Event] = field(default_factory=dict)
    statuses: Counter[int] = field(default_factory=Counter)
    error_types: Counter[str] = field(default_factory=Counter)

    def event(self, table: dict[int, asyncio.Event], number: int) -> asyncio.Event:
        return table.setdefault(number, asyncio.Event())

    def policy(self, body: dict[str, Any]) -> Reply:
        """The model: which plan the request belongs to is in the user's message."""
        messages = body.get("messages") or []
        plan = self.plans[int(str(messages[0]["content"]).split()[-1])]
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        if turn < len(plan.rounds):
            calls = [CALLS[kind][:2] for kind in plan.rounds[turn]]
            if plan.client_fault == "hang_up_in_tool" and turn == len(plan.rounds) - 1:
                calls.append(("gate", {"plan": plan.number}))  # last: the calls before it have run
            return Reply(tool_calls=[(name, args if isinstance(args, str) else dict(args)) for name, args in calls])
        if plan.client_fault == "hang_up_waiting":
            self.event(self.provider_waiting, plan.number).set()
            return Reply(hang=True)
        if plan.provider_fault is not None:
            return PROVIDER_FAULTS[plan.provider_fault]
        return Reply(content=f"done {plan.number}")

    async def gate(self, args: dict[str, Any]) -> str:
        self.event(self.tool_started, int(args["plan"])).set()
        await asyncio.Event().wait()  # until the client hangs up
        return "never"


async def send(soak: Soak, client: openai.AsyncOpenAI, http: Any, plan: Plan) -> None:
    """One request as the plan says; records the status the client saw."""
    user = [{"role": "user", "content": f"soak plan {plan.number}"}]
    if plan.client_fault == "malformed":
        body = [b'{"model": "m", "messages": ', b'[1, 2]', b'{"model": 7}'][plan.number % 3]
        path = "/v1/responses" if plan.api == "responses" else "/v1/chat/completions"
        response = await http.post(path, data=body, headers={**AUTH, "Content-Type": "application/json"})
        soak.statuses[response.status] += 1
        soak.error_types[(await response.json())["error"]["type"]] += 1
        return

    async def ask() -> None:
        if plan.api == "chat":
            answer: Any = await client.chat.completions.create(model="soak", messages=user,  # type: ignore[arg-type]
                                                               stream=plan.stream)
        else:
            answer = await client.responses.create(model="soak", input=user, stream=plan.stream,  # type: ignore[arg-type]
                                                   store=False)
        if plan.stream:
            async for _ in answer:
                pass

    waiting_for = {"hang_up_waiting": soak.provider_waiting, "hang_up_in_tool": soak.tool_started}.get(
        plan.client_fault or "")
    if waiting_for is not None:
        asking = asyncio.ensure_future(ask())
        reached = asyncio.ensure_future(soak.event(waiting_for, plan.number).wait())
        await asyncio.wait([asking, reached], timeout=30, return_when=asyncio.FIRST_COMPLETED)
        assert reached.done(), (plan, asking.done() and asking.exception())
        asking.cancel()
        await asyncio.gather(asking, return_exceptions=True)
        soak.statuses[499] += 1
        return
    try:
        await ask()
        soak.statuses[200] += 1
    except openai.APIStatusError as failed:
        soak.statuses[failed.status_code] += 1
        soak.error_types[str((failed.body or {}).get("type") if isinstance(failed.body, dict) else "")] += 1
    except openai.APIError as failed:  # an error event in a stream
        soak.statuses[200] += 1
        soak.error_types[f"stream:{failed.type}"] += 1


async def run_all(plans: list[Plan], one: Callable[[Plan], Awaitable[None]]) -> None:
    queue = list(reversed(plans))

    async def worker() -> None:
        while queue:
            await one(queue.pop())

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))


async def test_soak_balances_the_books(make_stack: StackFactory) -> None:
    rng = random.Random(SEED)
    plans = [make_plan(rng, number) for number in range(REQUESTS)]
    soak = Soak({plan.number: plan for plan in plans})
    registry = every_outcome_registry()
    registry.register(Tool(name="gate", function=soak.gate, parameters=[Param("plan", "integer", required=True)]))
    # 2 s: a provider that never answers ends soon, and a busy machine never makes one look so.
    stack = await make_stack(registry=registry, upstream_timeout_seconds=2.0, upstream_retry_attempts=RETRIES,
                             upstream_retry_backoff_seconds=0.001, interrupt_mode="hand_back")  # `review` hands back
    stack.model.policy = soak.policy
    books = Books()
    provider = stack.observability.provider
    assert isinstance(provider, TracerProvider)
    provider.add_span_processor(books)

    def send_one(plan: Plan) -> Awaitable[None]:
        return send(soak, stack.client, stack.http, plan)

    warm_up = 300
    await run_all(plans[:warm_up], send_one)
    stack.exporter.clear()
    rss_after_warm_up = rss()
    for start in range(warm_up, REQUESTS, 500):
        await run_all(plans[start:start + 500], send_one)
        stack.exporter.clear()  # the test's own memory of spans; the books keep the counts
    await books.requests_reach(REQUESTS)

    # Every request answered, none with a 500, each leaving exactly one request span.
    assert sum(soak.statuses.values()) == REQUESTS
    assert soak.statuses[500] == 0, soak.statuses
    assert books.requests == REQUESTS
    assert stack.metric(names.METRIC_REQUESTS_IN_FLIGHT) == 0
    # Tool calls: what the model asked for = spans = metric increments, per outcome.
    expected: Counter[str] = sum((plan.expected_calls() for plan in plans), Counter())
    counted = Counter({outcome: int(metric_sum(stack.metrics, names.METRIC_TOOL_CALLS, outcome=outcome))
                       for outcome in names.OUTCOMES})
    assert books.tool_calls == expected
    assert +counted == expected
    # Provider calls: the model's count = chat spans = upstream request increments.
    provider_calls = sum(plan.provider_calls() for plan in plans)
    assert books.chats == provider_calls
    assert metric_sum(stack.metrics, names.METRIC_UPSTREAM_REQUESTS) == provider_calls
    # The faults happened as planned, and memory stayed bounded.
    faults = Counter(plan.provider_fault or plan.client_fault for plan in plans)
    assert faults["malformed"] == soak.statuses[400]
    assert soak.statuses[499] == (
        faults["hang_up_waiting"] + faults["hang_up_in_tool"])
    assert rss() - rss_after_warm_up < RSS_GROWTH_BOUND
    print(json.dumps({"requests": REQUESTS, "statuses": dict(soak.statuses), "faults": dict(faults),
                      "tool_calls": dict(expected), "provider_calls": provider_calls,
                      "rss_growth_mib": round((rss() - rss_after_warm_up) / 2**20, 1)}))
