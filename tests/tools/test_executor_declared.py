"""The executor and tools offered only on request (a Responses request's declared `mcp` servers):
undeclared they are no tool at all; declared with the client's approval, a call waits for it, runs
only with the very arguments approved, and the operator's gate still follows."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from typing import Any

import pytest

from gateway.guardrails.verdicts import GuardrailRecord
from gateway.tools import Tool, ToolCall, ToolExecutor, ToolOutcome, ToolRegistry, Turn
from gateway.tools.approvals import ApprovalAsk, ApprovalDecision, ClientDecision, arguments_digest
from gateway.tools.hooks import ClientResult, NoHooks, Side, Step, ToolCallTrace

BOUND = 5.0  # seconds; only ever reached when the behaviour under test is broken
SOURCE = "mcp:files"
DECLARED = "files__read_file"


class _Trace:
    def __init__(self, steps: list[str]) -> None:
        self.steps = steps

    @contextmanager
    def _step(self, name: Step) -> Iterator[None]:
        self.steps.append(name)
        yield

    def step(self, name: Step) -> AbstractContextManager[None]:
        return self._step(name)

    def finish(self, outcome: ToolOutcome) -> None:
        self.steps.append(f"finish:{outcome.status}")

    def asked(self, approval_id: str) -> None:
        return None

    def decided(self, decision: ApprovalDecision) -> None:
        return None

    def guarded(self, records: Sequence[GuardrailRecord], hidden: Sequence[str]) -> None:
        return None


class StepHooks(NoHooks):
    """Notes each call's tool (None: looked up as no tool) and its steps."""

    def __init__(self) -> None:
        self.seen: list[str | None] = []
        self.steps: list[str] = []

    @asynccontextmanager
    async def tool_call(self, call: ToolCall, tool: Tool | None, turn: Turn,
                        side: Side = "gateway") -> AsyncIterator[ToolCallTrace]:
        self.seen.append(tool.name if tool is not None else None)
        yield _Trace(self.steps)

    def client_result(self, result: ClientResult, turn: Turn) -> None:
        return None


class OperatorGate:
    """The operator's approvals: every ask is noted and gets `answer`."""

    def __init__(self, answer: str = "approve") -> None:
        self.answer = answer
        self.asks: list[ApprovalAsk] = []

    async def decided(self, ask: ApprovalAsk, turn: Turn, trace: ToolCallTrace) -> ApprovalDecision:
        self.asks.append(ask)
        return ApprovalDecision(self.answer, 0.0, approval_id="appr_1")  # type: ignore[arg-type]


def setup(ran: list[dict[str, Any]], gate: OperatorGate | None = None,
          operator_approval: bool = False) -> tuple[ToolExecutor, StepHooks]:
    def read_file(args: dict[str, Any]) -> str:
        ran.append(args)
        return f"read {args['path']}"

    registry = ToolRegistry([Tool(name="echo", function=lambda args: "echo")])
    registry.replace_source(SOURCE, [
        Tool(name=DECLARED, function=read_file, approval=operator_approval,
             parameters_schema={"type": "object", "properties": {"path": {"type": "string"}}}),
        Tool(name="files__write_file", function=read_file)], on_request=True)
    hooks = StepHooks()
    return ToolExecutor(registry, hooks, gate=gate), hooks


def call(path: str = "a.txt", call_id: str = "call_1", name: str = DECLARED) -> ToolCall:
    return ToolCall(call_id, name, json.dumps({"path": path}))


async def run(ex: ToolExecutor, turn: Turn, *calls: ToolCall) -> list[ToolOutcome]:
    return await asyncio.wait_for(ex.run_turn(list(calls) or [call()], turn), timeout=BOUND)


def asking(*decisions: ClientDecision) -> Turn:
    return Turn(declared=frozenset({DECLARED}), asks_client=frozenset({DECLARED}),
                decided={d.call_id: d for d in decisions})


@pytest.mark.parametrize("turn", [Turn(), Turn(declared=frozenset({"files__write_file"}))],
                         ids=["nothing declared", "another tool declared"])
async def test_an_undeclared_tool_offered_on_request_is_no_tool_and_not_listed(turn: Turn) -> None:
    ran: list[dict[str, Any]] = []
    ex, hooks = setup(ran)

    [outcome] = await run(ex, turn)

    assert outcome.status == "rejected"
    assert outcome.rejection is not None
    assert outcome.rejection.reason == "unknown_tool"
    assert f"There is no tool named '{DECLARED}'." in outcome.content
    listed = outcome.content_text().split("Available tools: ", 1)[1]
    assert DECLARED not in listed
    assert "echo" in listed
    assert ("files__write_file" in listed) == ("files__write_file" in turn.declared)
    assert hooks.seen == [None]  # its trace is an unknown name's: nothing of the tool's origin shows
    assert hooks.steps == ["finish:rejected"]
    assert ran == []


async def test_a_declared_tool_runs_like_any_other() -> None:
    ran: list[dict[str, Any]] = []
    ex, hooks = setup(ran)

    [outcome] = await run(ex, Turn(declared=frozenset({DECLARED})))

    assert (outcome.status, outcome.content, ran) == ("ok", "read a.txt", [{"path": "a.txt"}])
    assert hooks.steps == ["parse", "execute", "finish:ok"]


async def test_the_key_allowlist_still_applies_to_a_declared_tool() -> None:
    ran: list[dict[str, Any]] = []
    ex, _ = setup(ran)

    [outcome] = await ex.run_turn([call()], Turn(declared=frozenset({DECLARED})), allowed={"echo"})

    assert outcome.rejection is not None
    assert outcome.rejection.reason == "not_allowed"
    assert ran == []


async def test_a_call_the_client_is_to_approve_pauses_with_the_digest_of_its_arguments() -> None:
    ran: list[dict[str, Any]] = []
    gate = OperatorGate()
    ex, hooks = setup(ran, gate)

    [outcome] = await run(ex, asking())

    assert outcome.status == "interrupted"
    assert outcome.interrupt_data == {"client_approval": arguments_digest(DECLARED, {"path": "a.txt"})}
    assert outcome.arguments == {"path": "a.txt"}
    assert hooks.steps == ["parse", "finish:interrupted"]  # no execute step
    assert (ran, gate.asks) == ([], [])  # the operator is asked only after the client approved


@pytest.mark.parametrize("reason", [None, "not that file"])
async def test_a_denial_is_told_to_the_model_and_nothing_runs(reason: str | None) -> None:
    ran: list[dict[str, Any]] = []
    ex, hooks = setup(ran)
    digest = arguments_digest(DECLARED, {"path": "a.txt"})

    [outcome] = await run(ex, asking(ClientDecision("call_1", False, digest[:32], reason)))

    assert (outcome.status, outcome.error_type) == ("denied", "denied")
    assert "denied" in outcome.content
    assert (reason is None or reason in outcome.content)
    assert hooks.steps == ["parse", "finish:denied"]
    assert ran == []


@pytest.mark.parametrize("named", [32, 64], ids=["the id's head", "the whole digest"])
async def test_an_approval_of_these_arguments_runs_the_call(named: int) -> None:
    ran: list[dict[str, Any]] = []
    ex, hooks = setup(ran)
    digest = arguments_digest(DECLARED, {"path": "a.txt"})

    [outcome] = await run(ex, asking(ClientDecision("call_1", True, digest[:named], copy_digest=digest)))

    assert (outcome.status, ran) == ("ok", [{"path": "a.txt"}])
    assert hooks.steps == ["parse", "execute", "finish:ok"]


@pytest.mark.parametrize(("approved", "copy"), [
    ({"path": "b.txt"}, None),  # the approval names other arguments than these
    ({"path": "a.txt"}, {"path": "b.txt"}),  # the client's resent copy of the request was edited
], ids=["other arguments", "edited copy"])
async def test_an_approval_of_other_arguments_asks_anew_and_nothing_runs(approved: dict[str, Any],
                                                                         copy: dict[str, Any] | None) -> None:
    ran: list[dict[str, Any]] = []
    ex, hooks = setup(ran)
    digest = arguments_digest(DECLARED, approved)
    copy_digest = arguments_digest(DECLARED, copy) if copy is not None else None

    [outcome] = await run(ex, asking(ClientDecision("call_1", True, digest[:32], copy_digest=copy_digest)))

    assert outcome.status == "interrupted"
    assert outcome.interrupt_data == {"client_approval": arguments_digest(DECLARED, {"path": "a.txt"})}
    assert hooks.steps == ["parse", "finish:interrupted"]
    assert ran == []


@pytest.mark.parametrize("named", ["", "0" * 31])
async def test_an_approval_naming_too_little_of_a_digest_approves_nothing(named: str) -> None:
    ran: list[dict[str, Any]] = []
    ex, _ = setup(ran)

    [outcome] = await run(ex, asking(ClientDecision("call_1", True, named)))

    assert (outcome.status, ran) == ("interrupted", [])


async def test_a_decision_applies_only_to_its_own_call() -> None:
    ran: list[dict[str, Any]] = []
    ex, _ = setup(ran)
    digest = arguments_digest(DECLARED, {"path": "a.txt"})

    first, second = await run(ex, asking(ClientDecision("call_1", True, digest)), call(), call(call_id="call_2"))

    assert (first.status, second.status, len(ran)) == ("ok", "interrupted", 1)


@pytest.mark.parametrize(("answer", "status", "runs"), [("approve", "ok", 1), ("deny", "denied", 0)])
async def test_the_operators_gate_still_applies_after_the_clients_approval(answer: str, status: str,
                                                                           runs: int) -> None:
    ran: list[dict[str, Any]] = []
    gate = OperatorGate(answer)
    ex, _ = setup(ran, gate, operator_approval=True)
    digest = arguments_digest(DECLARED, {"path": "a.txt"})

    [outcome] = await run(ex, asking(ClientDecision("call_1", True, digest)))

    assert [(ask.call.id, ask.kind, dict(ask.arguments)) for ask in gate.asks] == [
        ("call_1", "before_run", {"path": "a.txt"})]
    assert (outcome.status, len(ran)) == (status, runs)
