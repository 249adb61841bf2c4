"""Approvals of tool calls (issue 38), through the official openai client and the HTTP routes: a
call of a tool declared `approval=True`, or whose body raised Interrupt, waits while its request
holds its connection (a stream keeps alive), and a decision made at /v1/approvals resumes it; the
client sees one ordinary answer. Approved, denied, timed out, the client hanging up, keys' views
and rights, hand-back mode, and what telemetry says of each."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import SecretStr

from gateway.demo.model import Reply
from gateway.settings.parts import GatewayKey
from telemetry import names
from tests.conftest import (
    PAID,
    STREAM,
    USER,
    Stack,
    StackFactory,
    approval_registry,
    decide,
    first_pending,
    pending,
    tool_call_spans,
    until,
    while_asking,
)


@STREAM
async def test_an_approved_call_runs_and_the_client_gets_one_ordinary_answer(make_stack: StackFactory,
                                                                             stream: bool) -> None:
    stack = await make_stack(registry=approval_registry(), keepalive_seconds=0.05)
    PAID.clear()
    stack.script.then(Reply(tool_calls=[("pay", {"to": "ACME", "amount": 12.5})]), Reply(content="Paid."))

    async def reviewer() -> None:
        approval = await first_pending(stack)
        assert (approval["tool"], approval["arguments"], approval["status"]) == (
            "pay", {"to": "ACME", "amount": 12.5}, "pending")
        assert PAID == []  # nothing ran before the decision
        assert await decide(stack, approval["id"], decision="approve") == (200, {**approval, "status": "approved"})

    answer = await while_asking(lambda: stack.ask(stream, messages=USER), reviewer)
    assert (answer.content, answer.finish_reason, answer.tool_calls) == ("Paid.", "stop", [])
    assert PAID == [{"to": "ACME", "amount": 12.5}]
    assert [m["content"] for m in stack.upstream_requests[-1]["messages"] if m["role"] == "tool"] == [
        "paid 12.5 to ACME"]
    [call] = tool_call_spans(stack, answer.headers["x-trace-id"])
    attributes = call.attributes or {}
    assert (attributes[names.ATTR_OUTCOME], attributes[names.ATTR_TOOL_DECISION]) == ("ok", "approve")
    assert attributes[names.ATTR_APPROVAL_WAIT_MS] > 0
    assert [e.attributes[names.ATTR_EVENT_DECISION] for e in call.events  # type: ignore[index]
            if e.name == names.EVENT_TOOL_DECISION] == ["require_approval", "allow"]
    assert stack.metric("toolspan_approval_decisions_total", tool="pay", decision="approve") == 1
    assert stack.metric("toolspan_approvals_pending") == 0
    assert await pending(stack) == []


@STREAM
async def test_a_denied_call_never_runs_and_the_model_hears_why(make_stack: StackFactory, stream: bool) -> None:
    stack = await make_stack(registry=approval_registry(), keepalive_seconds=0.05)
    PAID.clear()
    stack.script.then(Reply(tool_calls=[("pay", {"to": "ACME", "amount": 900})]), Reply(content="I could not pay."))

    async def reviewer() -> None:
        approval = await first_pending(stack)
        assert (await decide(stack, approval["id"], decision="deny", reason="over the limit"))[0] == 200

    answer = await while_asking(lambda: stack.ask(stream, messages=USER), reviewer)
    assert answer.content == "I could not pay."
    assert PAID == []
    [told] = [m["content"] for m in stack.upstream_requests[-1]["messages"] if m["role"] == "tool"]
    assert told == "denied by the reviewer: over the limit"
    [call] = tool_call_spans(stack, answer.headers["x-trace-id"])
    assert ((call.attributes or {})[names.ATTR_OUTCOME], (call.attributes or {})[names.ATTR_TOOL_DECISION]) == (
        "denied", "deny")


@STREAM
async def test_nobody_deciding_in_time_is_told_to_the_model(make_stack: StackFactory, stream: bool) -> None:
    stack = await make_stack(registry=approval_registry(timeout=0.3), keepalive_seconds=0.05)
    stack.script.then(Reply(tool_calls=[("pay", {"to": "ACME", "amount": 1})]), Reply(content="No answer came."))
    answer = await stack.ask(stream, messages=USER)
    assert answer.content == "No answer came."
    [told] = [m["content"] for m in stack.upstream_requests[-1]["messages"] if m["role"] == "tool"]
    assert "nobody decided within 0.3 s" in told
    assert await pending(stack) == []
    assert stack.metric("toolspan_approval_decisions_total", tool="pay", decision="timeout") == 1


async def test_an_interrupt_waits_and_the_reviewers_output_is_its_result(make_stack: StackFactory) -> None:
    stack = await make_stack(registry=approval_registry())
    stack.script.then(Reply(tool_calls=[("refund", {"order": "A-17"})]), Reply(content="Refunded A-17."))

    async def reviewer() -> None:
        approval = await first_pending(stack)
        assert (approval["kind"], approval["message"]) == ("interrupt", "a manager must confirm the refund")
        assert approval["data"] == {"order": "A-17", "api_key": "[REDACTED]"}  # the data, its secrets masked
        assert (await decide(stack, approval["id"], decision="approve", output={"refunded": True}))[0] == 200

    answer = await while_asking(lambda: stack.ask(False, messages=USER), reviewer)
    assert answer.content == "Refunded A-17."
    [result] = [m["content"] for m in stack.upstream_requests[-1]["messages"] if m["role"] == "tool"]
    assert result == '{"refunded": true}'  # what the reviewer gave, never the Interrupt's data


async def test_a_client_hanging_up_while_waiting_leaves_nothing_pending(make_stack: StackFactory) -> None:
    stack = await make_stack(registry=approval_registry())
    stack.script.then(Reply(tool_calls=[("pay", {"to": "ACME", "amount": 3})]))
    asking = asyncio.ensure_future(stack.ask(False, messages=USER))
    await first_pending(stack)
    asking.cancel()
    await asyncio.gather(asking, return_exceptions=True)
    async def gone() -> bool:
        return not await pending(stack) and stack.metric("toolspan_approvals_pending") == 0

    await until(stack, gone)
    assert stack.metric("toolspan_approval_decisions_total", tool="pay", decision="cancelled") == 1


async def test_keys_see_their_own_approvals_and_only_approvers_decide(make_stack: StackFactory) -> None:
    keys = {"agent": GatewayKey(key=SecretStr("sk-agent-1")), "other": GatewayKey(key=SecretStr("sk-other-1")),
            "boss": GatewayKey(key=SecretStr("sk-boss-01"), operator=True),
            "self": GatewayKey(key=SecretStr("sk-self-01"), approver=True)}
    stack = await make_stack(registry=approval_registry(), keys=keys)
    agent, other, boss = ({"Authorization": f"Bearer {k}"} for k in ("sk-agent-1", "sk-other-1", "sk-boss-01"))
    stack.script.then(Reply(tool_calls=[("pay", {"to": "ACME", "amount": 5})]), Reply(content="Paid."))
    stack.client.api_key = "sk-agent-1"

    async def reviewer() -> None:
        approval = await first_pending(stack, agent)
        assert await pending(stack, other) == []  # another key's: not even listed
        missing = await stack.http.get(f"/v1/approvals/{approval['id']}", headers=other)
        assert missing.status == 404
        assert (await decide(stack, approval["id"], agent, decision="approve"))[0] == 403  # not an approver
        assert [a["key"] for a in await pending(stack, boss)] == ["agent"]  # the operator sees every key's
        assert (await decide(stack, approval["id"], boss, decision="approve"))[0] == 200
        status, body = await decide(stack, approval["id"], boss, decision="deny")
        assert (status, body["error"]["code"]) in {(409, "approval_decided"), (404, "approval_not_found")}

    answer = await while_asking(lambda: stack.ask(False, messages=USER), reviewer)
    assert answer.content == "Paid."
    [call] = tool_call_spans(stack, answer.headers["x-trace-id"])
    assert (call.attributes or {})[names.ATTR_DECIDED_BY] == "boss"


async def test_an_output_is_taken_only_for_a_call_whose_tool_paused(make_stack: StackFactory) -> None:
    stack = await make_stack(registry=approval_registry())
    PAID.clear()
    stack.script.then(Reply(tool_calls=[("pay", {"to": "ACME", "amount": 2})]), Reply(content="Paid."))

    async def reviewer() -> None:
        approval = await first_pending(stack)
        status, body = await decide(stack, approval["id"], decision="approve", output="paid by hand")
        assert (status, body["error"]["code"]) == (400, "output_not_taken")  # its body gives the result
        assert [a["status"] for a in await pending(stack)] == ["pending"]
        assert (await decide(stack, approval["id"], decision="approve"))[0] == 200

    answer = await while_asking(lambda: stack.ask(False, messages=USER), reviewer)
    assert answer.content == "Paid."
    assert PAID == [{"to": "ACME", "amount": 2}]


async def test_a_bad_decision_is_a_400_and_an_unknown_id_a_404(stack: Stack) -> None:
    status, body = await decide(stack, "appr_nothing", decision="approve")
    assert (status, body["error"]["code"]) == (404, "approval_not_found")
    status, body = await decide(stack, "appr_nothing", decision="maybe")
    assert (status, body["error"]["type"]) == (400, "invalid_request_error")


@pytest.mark.parametrize("declared", [False, True], ids=["undeclared", "declared-by-the-client"])
@pytest.mark.parametrize(("tool", "arguments"), [("pay", {"to": "ACME", "amount": 7}), ("refund", {"order": "A-1"})],
                         ids=["approval", "interrupt"])
async def test_hand_back_mode_gives_the_call_to_the_client_which_may_declare_it(
        make_stack: StackFactory, declared: bool, tool: str, arguments: dict[str, Any]) -> None:
    stack = await make_stack(registry=approval_registry(), interrupt_mode="hand_back")
    PAID.clear()
    stack.script.then(Reply(tool_calls=[(tool, arguments)]), Reply(content="Done."))
    tools = [{"type": "function", "function": {"name": tool, "parameters": {"type": "object"}}}] if declared else []
    first = await stack.ask(False, messages=USER, **({"tools": tools} if tools else {}))
    [call] = first.tool_calls
    assert call["function"]["name"] == tool
    assert PAID == []
    assert [t["function"]["name"] for t in stack.upstream_requests[0]["tools"]].count(tool) == 1
    messages = [*USER, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call["id"], "content": "the user approved: paid by hand"}]
    answer = await stack.ask(False, messages=messages, **({"tools": tools} if tools else {}))
    assert answer.content == "Done."
    assert await pending(stack) == []
