"""The guardrails' before_execute on the client's calls a turn hands back (gateway.client_tools.handed):
after the schema check, in the same tool.call span, for the calls the check let through; a deny
is the gateway's answer in reject mode (not on the last round), recorded only in observe mode;
a rewrite or an ask is recorded, never applied."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field

from gateway.caller import Caller
from gateway.client_tools.handed import HandedChecks
from gateway.guardrails import Chains, GuardedCall, Guardrail, GuardrailRecord, Guardrails, Verdict, ask, rewrite
from gateway.settings.parts import ClientCheckMode
from gateway.tools import NoHooks, Tool, ToolCall, ToolCallTrace, ToolOutcome, Turn
from gateway.tools.approvals import ApprovalDecision
from gateway.tools.hooks import Side, Step
from tests.client_tools.guards import EXAMPLE_KEY, Credentials

TOOLS = [{"type": "function", "function": {"name": "deploy", "parameters": {
    "type": "object", "properties": {"token": {"type": "string"}, "target": {"type": "string"}},
    "required": ["target"]}}}]
DENIED = ToolCall("call_1", "deploy", json.dumps({"target": "prod", "token": EXAMPLE_KEY}))
FINE = ToolCall("call_2", "deploy", json.dumps({"target": "staging"}))
MISSING = ToolCall("call_3", "deploy", json.dumps({"token": EXAMPLE_KEY}))  # the check rejects it first


@dataclass
class Trace:
    """One client call's trace: its steps, the guardrails' records on it, its outcome."""

    call: ToolCall
    steps: list[str] = field(default_factory=list)
    decisions: list[tuple[tuple[GuardrailRecord, ...], tuple[str, ...]]] = field(default_factory=list)
    outcome: ToolOutcome | None = None

    @contextmanager
    def step(self, name: Step) -> Iterator[None]:
        self.steps.append(name)
        yield

    def finish(self, outcome: ToolOutcome) -> None:
        self.outcome = outcome

    def asked(self, approval_id: str) -> None:
        raise AssertionError("a client call is never held for approval")

    def decided(self, decision: ApprovalDecision) -> None:
        raise AssertionError("a client call is never held for approval")

    def guarded(self, records: Sequence[GuardrailRecord], hidden: Sequence[str]) -> None:
        self.decisions.append((tuple(records), tuple(hidden)))


class Traces(NoHooks):
    """Each client call's trace, as telemetry would get it."""

    def __init__(self) -> None:
        self.traces: list[Trace] = []

    @asynccontextmanager
    async def tool_call(self, call: ToolCall, tool: Tool | None, turn: Turn,
                        side: Side = "gateway") -> AsyncIterator[ToolCallTrace]:
        assert side == "client"
        self.traces.append(trace := Trace(call))
        yield trace


def checks(mode: ClientCheckMode, *chain: object) -> tuple[HandedChecks, Traces]:
    hooks = Traces()
    return HandedChecks(hooks, mode, Guardrails(Chains(), gateway=chain or (Credentials(),))), hooks


CALLER = Caller("traj-1", "req-1", principal="key-a")


async def test_reject_mode_answers_a_denied_call_with_the_guardrails_words() -> None:
    handed, hooks = checks("reject")
    refused = await handed.refused(TOOLS, CALLER, [DENIED, FINE, MISSING], 1, final=False)
    denied, fine, missing = refused
    assert denied is not None
    assert denied.rejection is not None
    assert denied.rejection.reason == "guardrail_denied"
    assert "guardrail 'credentials' denied the call" in denied.content_text()
    assert "name the key's variable instead of its value" in denied.content_text()
    assert fine is None
    assert missing is not None
    assert missing.rejection is not None
    assert missing.rejection.reason == "missing_arguments"  # the check's rejection stands; no guardrail ran
    first, second, third = hooks.traces
    assert first.steps == ["parse"]
    assert first.outcome is denied
    [(records, hidden)] = first.decisions
    assert [(r.guardrail, r.moment, r.decision, r.side) for r in records] == [
        ("credentials", "before", "deny", "client")]
    assert hidden == (EXAMPLE_KEY,)
    assert [r.decision for r in second.decisions[0][0]] == ["allow"]
    assert second.outcome is not None
    assert second.outcome.status == "ok"
    assert third.decisions == []


async def test_observe_mode_and_the_last_round_only_record_a_deny() -> None:
    for mode, final in (("observe", False), ("reject", True)):
        handed, hooks = checks(mode)  # type: ignore[arg-type]
        assert await handed.refused(TOOLS, CALLER, [DENIED], 1, final=final) == [None]
        [trace] = hooks.traces
        assert [r.decision for r in trace.decisions[0][0]] == ["deny"]
        assert trace.outcome is not None
        assert trace.outcome.status == "ok"


class Steering(Guardrail):
    name = "steering"

    def __init__(self) -> None:
        self.seen: list[GuardedCall] = []

    def before_execute(self, call: GuardedCall) -> Verdict | None:
        self.seen.append(call)
        return rewrite({"target": "staging"}) if call.arguments.get("target") == "prod" else ask("a person looks")


async def test_a_rewrite_or_an_ask_is_recorded_and_not_applied() -> None:
    steering = Steering()
    handed, hooks = checks("reject", steering)
    odd = ToolCall("call_4", "deploy", "[1, 2]")  # not an object: the check rejects it, no guardrail sees it
    unknown = ToolCall("call_5", "elsewhere", "{}")
    refused = await handed.refused(TOOLS, CALLER, [DENIED, FINE, odd, unknown], 2, final=False)
    assert refused[:2] == [None, None]
    assert [[r.decision for r in trace.decisions[0][0]] for trace in hooks.traces[:2]] == [["rewrite"], ["ask"]]
    assert [call.call_id for call in steering.seen] == ["call_1", "call_2"]
    assert steering.seen[0].arguments == {"target": "prod", "token": EXAMPLE_KEY}
    assert (steering.seen[0].principal, steering.seen[0].trajectory_id, steering.seen[0].side) == (
        "key-a", "traj-1", "client")


async def test_arguments_the_check_could_not_read_reach_the_guardrails_as_an_empty_object() -> None:
    steering = Steering()
    handed, _ = checks("observe", steering)
    custom = [{"type": "custom", "custom": {"name": "free_text"}}]  # not a function tool: unchecked
    await handed.refused(custom, CALLER, [ToolCall("c", "free_text", "plain words")], 1, final=False)
    assert steering.seen[0].arguments == {}


async def test_without_guardrails_or_with_the_check_off_no_guardrail_runs() -> None:
    credentials = Credentials()
    off = HandedChecks(Traces(), "off", Guardrails(Chains(), gateway=[credentials]))
    assert await off.refused(TOOLS, CALLER, [DENIED], 1, final=False) == [None]
    plain = HandedChecks(hooks := Traces(), "reject")
    assert await plain.refused(TOOLS, CALLER, [DENIED], 1, final=False) == [None]
    assert hooks.traces[0].decisions == []
    assert credentials.calls == []
