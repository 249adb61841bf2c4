"""Scripted sessions for the trajectory store and report tests: every outcome, every rejection
reason, a verbatim-retry loop, a trajectory spanning two requests and the decisions of guardrails
(a call denied, a result masked), all through the gateway."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry import baggage
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from gateway.demo.model import Reply
from gateway.guardrails import GuardedCall, Guardrail, Verdict, deny, mask
from gateway.tools import Tool, ToolRegistry
from telemetry import names
from telemetry.instrument import Telemetry
from telemetry.metrics import Metrics
from telemetry.store.records import stored_id
from telemetry.tracing import build_provider, tracer_of
from tests.conftest import TEST_KEY, USER, Stack, StackFactory, every_outcome_registry

ALLOWED = ["read_file", "add", "locked", "crash", "slow", "review", "strict", "checked", "deploy",
           "fetch_page"]  # not "admin": not_allowed
KEYS = {"agent": {"key": TEST_KEY, "tools": ALLOWED}}
ACROSS = "traj-across-requests"  # the X-Trajectory-Id two requests share
STORED_ACROSS = stored_id("agent", ACROSS)  # the store's id of that trajectory: the key's and the id's

LEAKED = "ghp_" + "k3" * 18  # a credential the guardrails below find, and hide


class NoProduction(Guardrail):
    name = "no_production"

    def before_execute(self, call: GuardedCall) -> Verdict | None:
        if call.arguments.get("host") == "prod":
            return deny("production is off limits; deploy to staging", hidden=(LEAKED,))
        return None


class MasksTokens(Guardrail):
    name = "masks_tokens"

    def after_execute(self, call: GuardedCall, result: str) -> Verdict | None:
        return mask(result.replace(LEAKED, "[masked]"), "credentials masked (a GitHub token)", hidden=(LEAKED,))


def guarded_registry() -> ToolRegistry:
    """every_outcome_registry() and two tools with guardrails of their own: `deploy` (denied on the
    production host) and `fetch_page` (its result masked)."""
    registry = every_outcome_registry()
    registry.register(Tool(name="deploy", function=lambda args: "deployed", guardrails=(NoProduction(),)))
    registry.register(Tool(name="fetch_page", function=lambda args: f"a page holding {LEAKED}",
                           guardrails=(MasksTokens(),)))
    return registry


# Each round's calls; the comment says what the span will say.
EVERY_OUTCOME: list[list[tuple[str, Any]]] = [
    [("read_file", {"file_path": "/a"}),  # rejected: missing_arguments, file_path -> path
     ("add", '{"a": 1,'),  # rejected: invalid_json
     ("strict", {"path": "relative"}),  # rejected: parser
     ("checked", {"n": "many"}),  # rejected: schema_violation
     ("no_such_tool", {}),  # rejected: unknown_tool
     ("admin", {}),  # rejected: not_allowed
     ("deploy", {"host": "prod", "note": f"with {LEAKED}"})],  # rejected: guardrail_denied, LEAKED hidden
    [("read_file", {"path": "/a"}),  # ok: a corrected retry, the recovery
     ("locked", {"password": "hunter22"}),  # error (ToolError); its password masked
     ("fetch_page", {})],  # ok: its result masked by a guardrail
    [("locked", {"password": "hunter22"})],  # error: verbatim retry 1
    [("locked", {"password": "hunter22"})],  # error: verbatim retry 2 -> stuck
    [("crash", {}), ("slow", {})],  # error (exception), timeout
    [("review", {})],  # interrupted: the loop pauses, the request ends here
]


@dataclass
class Session:
    stack: Stack
    db: sqlite3.Connection
    trace_ids: list[str]

    def spans(self) -> list[ReadableSpan]:
        return [s for t in self.trace_ids for s in self.stack.spans(t)]

    def tool_spans(self) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name == names.SPAN_TOOL_CALL]


def attr(span: ReadableSpan, key: str) -> Any:
    return (span.attributes or {}).get(key)


def stored_trajectory(span: ReadableSpan) -> str:
    """The store's id of a span's trajectory, as its attributes name it."""
    return stored_id(attr(span, names.ATTR_KEY_NAME), attr(span, names.ATTR_CONVERSATION_ID))


def hex_id(value: int, width: int = 16) -> str:
    return format(value, f"0{width}x")


async def drive(stack: Stack) -> list[str]:
    """The every-outcome session (one request), then a trajectory of two requests where the second
    retries and corrects the first's failed call. Returns the trace ids."""
    stack.script.then(*(Reply(tool_calls=calls) for calls in EVERY_OUTCOME))
    first = await stack.ask(False, messages=USER)
    stack.script.then(Reply(tool_calls=[("add", {"a": 1})]), Reply(content="oops"),
                      Reply(tool_calls=[("add", {"a": 1, "b": 2})]), Reply(content="3"))
    across = [await stack.ask(stream, messages=USER, extra_headers={"X-Trajectory-Id": ACROSS})
              for stream in (False, True)]
    await stack.store.flushed()
    return [answer.headers["x-trace-id"] for answer in (first, *across)]


@asynccontextmanager
async def scripted_session(make_stack: StackFactory) -> AsyncIterator[Session]:
    """The session the store tests read (and the page's, tests/ui): `drive`n through a stack."""
    stack = await make_stack(registry=guarded_registry(), keys=KEYS,
                             interrupt_mode="hand_back")  # `review` ends the request
    trace_ids = await drive(stack)
    db = sqlite3.connect(stack.store.path)
    try:
        yield Session(stack, db, trace_ids)
    finally:
        db.close()


@pytest.fixture
async def session(make_stack: StackFactory) -> AsyncIterator[Session]:
    async with scripted_session(make_stack) as found:
        yield found


# --- telemetry on its own, for the unit tests of telemetry/ -------------------------------------------

def with_baggage() -> Context:
    return baggage.set_baggage("user.id", "u 42", baggage.set_baggage("tenant", "acme"))


def telemetry(exporter: InMemorySpanExporter | None = None) -> Telemetry:
    processors = [SimpleSpanProcessor(exporter)] if exporter is not None else []
    return Telemetry(tracer_of(build_provider(processors=processors)), Metrics(CollectorRegistry()))
